"""Replay's deferred write-back (csrc/replay.c): a compiled program's run
leaves the interior nodes' numbers in its own arrays, and they go back into
the nodes before anything reads or writes a node's numbers.  Every way a
user reaches a number shows the last run's, as if each run had written
them as it went: .data/.grad, a new op over an interior Value, a bulk
read, backward(), a custom op's sweep, a copy, a forked child, another
program over the same nodes, and after the program is gone."""
import copy
import os
import pickle
import threading

import pytest

import pygrad
from pygrad import Value
from pygrad._backend import backend_named
from pygrad._lifetime import pack

from helpers import assert_same_doubles


def graph(xs):
    """A small graph over leaves xs and every interior Value of it, in the
    order made."""
    a, b, c = xs
    h = (a * b + c).tanh()
    k = h * a - c.exp()
    m = (k * k + 1.0).log() + h.relu()
    out = m * b + k
    return out, [h, k, m, out]


def leaves(*xs):
    return [Value(x) for x in xs]


def fresh(xs, backward=True):
    """The graph's Values built from scratch at xs, backward run."""
    out, made = graph(leaves(*xs))
    if backward:
        out.backward()
    return made


def numbers(made):
    return [v.data for v in made] + [v.grad for v in made]


def compiled(xs):
    ls = leaves(*xs)
    out, made = graph(ls)
    return ls, made, pygrad.compile(out)


def set_leaves(ls, xs):
    for v, x in zip(ls, xs):
        v.data, v.grad = x, 0.0


X0, X1 = (0.5, -1.25, 0.75), (-0.3, 0.9, 1.5)


def test_data_and_grad_reads_show_the_last_run():
    ls, made, program = compiled(X0)
    set_leaves(ls, X1)
    program.forward()
    program.backward()
    assert_same_doubles(numbers(made), numbers(fresh(X1)))


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_an_optimizer_step_between_runs_leaves_the_last_runs_numbers(optimizer):
    """A step over the leaves (a bulk write of parameters only, which settles
    no program: csrc/value_binding.h, as_own_list) then reads of interior
    nodes: they show the run before the step, as an eager graph built at
    the old leaves and then stepped would; the next run starts from the
    stepped leaves."""
    from pygrad import optim
    ls, made, program = compiled(X0)
    set_leaves(ls, X1)
    opt = getattr(optim, optimizer)(ls, lr=0.1)
    program.forward()
    program.backward()
    want = numbers(fresh(X1))
    opt.step()
    opt.zero_grad()
    stepped = [v.data for v in ls]
    assert_same_doubles(numbers(made), want)
    program.forward()
    program.backward()
    assert_same_doubles(numbers(made), numbers(fresh(stepped)))


def test_forward_alone_shows_new_data_and_the_old_grads():
    ls, made, program = compiled(X0)
    program.forward()
    program.backward()
    grads = [v.grad for v in made]
    set_leaves(ls, X1)
    program.forward()
    assert_same_doubles([v.data for v in made], [v.data for v in fresh(X1, backward=False)])
    assert_same_doubles([v.grad for v in made], grads)


def test_a_new_op_over_an_interior_value_reads_the_last_run():
    ls, made, program = compiled(X0)
    set_leaves(ls, X1)
    program.forward()
    h = made[0]
    z = h * 2.0 + made[1]            # C reads h's and k's nodes
    want = fresh(X1, backward=False)
    assert z.data == want[0].data * 2.0 + want[1].data


@pytest.mark.parametrize("how", ["gather", "copy", "pickle", "repr"])
def test_other_readers_show_the_last_run(how):
    ls, made, program = compiled(X0)
    packed = pack(made)              # (before the run: the bulk reads alone must settle)
    want = fresh(X1)
    set_leaves(ls, X1)
    program.forward()
    program.backward()
    if how == "gather":
        got = list(backend_named("c").gather_data(packed))
        assert_same_doubles(got, [v.data for v in want])
        got = list(backend_named("c").gather_grad(packed))
        assert_same_doubles(got, [v.grad for v in want])
    elif how == "copy":
        assert_same_doubles([copy.copy(v).data for v in made], [v.data for v in want])
    elif how == "pickle":
        got = [pickle.loads(pickle.dumps(v)) for v in made]
        assert_same_doubles([v.data for v in got] + [v.grad for v in got], numbers(want))
    else:
        assert [repr(v) for v in made] == [repr(v) for v in want]


def test_backward_over_replayed_nodes_starts_from_the_last_run():
    ls, made, program = compiled(X0)
    set_leaves(ls, X1)
    program.forward()
    program.backward()
    y = made[-1] * made[0]           # eager, above the compiled graph
    y.backward()
    want_ls = leaves(*X1)
    out, want = graph(want_ls)
    out.backward()                   # the replayed grads, as a fresh graph's
    wy = out * want[0]
    wy.backward()
    assert_same_doubles(numbers(made) + [v.grad for v in ls],
                        numbers(want) + [v.grad for v in want_ls])


def test_a_write_to_an_interior_node_is_not_undone_by_a_later_write_back():
    ls, made, program = compiled(X0)
    set_leaves(ls, X1)
    program.forward()
    program.backward()
    h, k = made[0], made[1]
    h.data = 7.0
    k.grad = -3.0
    _ = made[2].data                 # a read that would settle anything pending
    program.forward()                # a new run overwrites, as before
    program.backward()
    h2 = made[0].data
    h.grad = 0.5
    assert (k.data, h.grad) == (fresh(X1)[1].data, 0.5)
    assert h2 == fresh(X1, backward=False)[0].data
    ls2, made2, program2 = compiled(X0)
    set_leaves(ls2, X1)
    program2.forward()
    made2[0].data = 7.0
    made2[1].grad = -3.0
    assert (made2[0].data, made2[1].grad) == (7.0, -3.0)
    program2.backward()
    assert made2[1].grad == fresh(X1)[1].grad


@pytest.mark.parametrize("order", ["p_then_q", "q_then_p"])
def test_two_programs_over_shared_nodes_leave_the_last_run(order):
    ls = leaves(*X0)
    out, made = graph(ls)
    p = pygrad.compile(out)
    q = pygrad.compile(made[1])      # k's subgraph: h and k are shared
    first, second = (p, q) if order == "p_then_q" else (q, p)
    set_leaves(ls, X1)
    first.forward()
    first.backward()
    set_leaves(ls, X0)
    second.forward()
    second.backward()
    wanted = fresh(X0, backward=False)
    assert_same_doubles([made[0].data, made[1].data], [wanted[0].data, wanted[1].data])
    if second is q:                  # k is q's root: its grad 1
        assert made[1].grad == 1.0
    else:
        assert made[1].grad == fresh(X0)[1].grad


def test_a_dropped_program_writes_its_numbers_back():
    ls, made, program = compiled(X0)
    set_leaves(ls, X1)
    program.forward()
    program.backward()
    del program
    assert_same_doubles(numbers(made), numbers(fresh(X1)))


def test_a_custom_ops_closure_that_runs_a_program_is_seen_by_the_rest_of_the_sweep():
    """The closure runs a program over nodes whose rules the sweep runs
    after it; with or without a read inside the closure (which writes the
    numbers back at once), the sweep's later rules read the new numbers."""
    results = []
    for read_inside in (False, True):
        ls = leaves(*X0)
        out, made = graph(ls)
        program = pygrad.compile(out)
        a, h = ls[0], made[0]
        c = Value(a.data, (a,), "probe")      # its closure touches no replayed node

        def closure():
            set_leaves(ls, X1)
            program.forward()
            if read_inside:
                _ = made[0].data
            a.grad += c.grad

        c._backward = closure
        (h * c).backward()                    # h's rules run after the closure
        results.append([h.data] + [v.grad for v in ls])
    assert_same_doubles(results[0], results[1])
    assert results[0][0] == fresh(X1, backward=False)[0].data


def test_threads_reading_while_another_runs_end_with_the_last_run():
    ls, made, program = compiled(X0)
    go = threading.Event()
    reads = []

    def reader():
        go.wait(10)
        for _ in range(200):
            reads.append(made[0].data + made[2].grad)

    t = threading.Thread(target=reader)
    t.start()
    go.set()
    for i in range(200):
        set_leaves(ls, X1 if i % 2 else X0)
        program.forward()
        program.backward()
    t.join()
    assert len(reads) == 200
    assert_same_doubles(numbers(made), numbers(fresh(X1)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_sees_the_last_run():
    ls, made, program = compiled(X0)
    set_leaves(ls, X1)
    program.forward()
    program.backward()
    want = numbers(fresh(X1))
    pid = os.fork()
    if pid == 0:
        try:
            ok = numbers(made) == want
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_an_eager_backward_after_a_replayed_one_adds_as_after_an_eager_one():
    """micrograd makes a - b as a + b * -1 and a / b as a * b ** -1, whose
    hidden node keeps a grad that a second backward() adds to (ops.c): a
    replayed backward leaves it as a fresh graph's backward does, so an
    eager backward() above it, without zero_grad, adds as after two eager
    ones."""
    def sub_div(xs):
        a, b, c = xs
        h = (a - b * c).tanh()
        k = h / (c * c + 1.0) - a
        return k * h, [h, k]

    results = []
    for replayed in (True, False):
        ls = leaves(*X0)
        out, made = sub_div(ls)
        if replayed:
            program = pygrad.compile(out)
            set_leaves(ls, X1)
            program.forward()
            program.backward()
        else:
            set_leaves(ls, X1)
            out, made = sub_div(ls)
            out.backward()
        y = made[1] * made[0] - made[0] / ls[1]
        y.backward()
        results.append(numbers(made) + [v.grad for v in ls])
    assert_same_doubles(results[0], results[1])
