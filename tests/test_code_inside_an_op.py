"""Python code that runs inside an op, between its C call and the store of
its Value: a garbage collection's callbacks and finalizers (the op allocates
its Value), a signal handler.  Such code may make nodes until the op's
segment is full, or call settle(), and so settle the segment the op's node
sits in before the op has stored its Value.  The node must live on, and the
op's result be whole: its claim holds its node from the moment C makes it
(csrc/memory.c)."""
import gc
import os
import random
import sys
import threading

import pytest

import pygrad
from pygrad import Value, engine, nn
from pygrad.data import to_values
from pygrad.functional import dot, logsumexp
from pygrad.functional import sum as vsum
from pygrad._core import lib

from helpers import micrograd_style_tanh, run_python, square_function
import internals

SEG_NODES = lib.PG_SEG_NODES


def live() -> int:
    gc.collect()
    engine.settle()
    return internals.live_nodes()


def fill_and_settle() -> None:
    """What a finalizer that copies a model does, at worst: nodes enough to
    close this thread's segment, then a settle."""
    made = [Value(0.5) for _ in range(SEG_NODES + 8)]
    del made
    engine.settle()


class AtTheNthCollection:
    """A gc callback that runs ``action`` at the n-th collection after it is
    armed, once."""

    def __init__(self, action) -> None:
        self.action = action
        self.left = 0

    def __call__(self, phase, info) -> None:
        if phase == "start" and self.left > 0:
            self.left -= 1
            if self.left == 0:
                self.action()

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)


def with_code_inside(op, action, n: int = 1):
    """op() with ``action`` run at the n-th collection inside it (one comes
    at every allocation): op's result, and whether ``action`` ran."""
    threshold = gc.get_threshold()
    with AtTheNthCollection(action) as hook:
        gc.set_threshold(1)
        hook.left = n
        try:
            made = op()
        finally:
            gc.set_threshold(*threshold)
        fired = hook.left == 0
        hook.left = 0
    return made, fired


def with_code_at_return(op, c_function: str, action):
    """op() with ``action`` run as op's call of C function ``c_function``
    returns, before op goes on (a profile hook, standing in for a signal
    handler that lands there: the same instruction on every Python)."""
    armed = [True]

    def profile(frame, event, arg):
        if event == "c_return" and armed[0] and getattr(arg, "__name__", "") == c_function:
            armed[0] = False
            action()

    sys.setprofile(profile)
    try:
        made = op()
    finally:
        sys.setprofile(None)
    return made, not armed[0]


def outputs_of(made):
    return made if isinstance(made, list) else [made]


def leaves_and_op(kind: str):
    """Fresh leaves and an op over them (returns one Value, or a list)."""
    random.seed(7)
    a, b = Value(0.75), Value(-1.25)
    xs = [Value(0.1 * i - 0.3) for i in range(3)]
    tanh = micrograd_style_tanh(Value)
    ops = {
        "mul": lambda: a * b,
        "add number": lambda: a + 2.0,
        "number minus": lambda: 2.0 - a,
        "unary": lambda: a.exp(),
        "relu": lambda: a.relu(),
        "pow number": lambda: a ** 3,
        "pow Value": lambda: a ** b,
        "dot": lambda: dot(xs, [a, b, 0.5]),
        "sum": lambda: vsum(xs),
        "logsumexp": lambda: logsumexp(xs),
        "Function": lambda: square_function().apply(a),
        "above a custom op": lambda: tanh(a) * b,
        "layer": lambda: nn.Layer(3, 4)(xs),
        "mlp": lambda: nn.MLP(3, [4, 4, 2])(xs),
        "to_values": lambda: to_values([[0.25, 0.5], [0.75, 1.0]])[1],
    }
    return [a, b] + xs, ops[kind]


KINDS = ["mul", "add number", "number minus", "unary", "relu", "pow number", "pow Value",
         "dot", "sum", "logsumexp", "Function", "above a custom op", "layer", "mlp",
         "to_values"]


def reading(outs, leaves):
    """Every output's data, then the leaves' grads after a backward from
    the outputs' sum (the Values must be whole for either)."""
    data = [o.data for o in outs]
    total = outs[0]
    for o in outs[1:]:
        total = total + o
    total.backward()
    return data, [v.grad for v in leaves]


@pytest.mark.parametrize("kind", KINDS)
def test_a_settle_at_any_collection_inside_an_op_leaves_its_result_whole(kind):
    before = live()
    leaves, op = leaves_and_op(kind)
    expected = reading(outputs_of(op()), leaves)
    n = 1
    while True:
        leaves, op = leaves_and_op(kind)
        made, fired = with_code_inside(op, fill_and_settle, n)
        outs = outputs_of(made)
        for o in outs:
            assert lib.pg_alive(o._h), f"{kind}: collection {n} freed the result's node"
        assert reading(outs, leaves) == expected, f"{kind}: collection {n}"
        del made, outs, o
        if not fired:
            break             # the op makes fewer collections than n: all were tried
        n += 1
    assert n > 1
    del leaves, op
    assert live() == before


def test_a_finalizer_that_copies_the_model_inside_an_op_leaves_it_whole():
    """As users write it: an object in a reference cycle whose __del__ keeps a
    copy of the parameters (a checkpoint) and settles.  The collector frees
    it at some allocation of the ops that follow: in a chain, the only
    allocations are the ops' Values, between their C calls and stores."""
    import copy
    model = nn.MLP(2, [8, 1])
    saved = []

    class Checkpoint:
        def __init__(self):
            self.me = self                       # a cycle: only the collector frees it

        def __del__(self):
            saved.append(copy.deepcopy(model.parameters()))
            fill_and_settle()

    threshold = gc.get_threshold()
    rng = random.Random(3)
    w = Value(0.5)
    bad = 0
    try:
        for i in range(300):
            y = model([Value(0.1 * i), Value(-0.2)])
            Checkpoint()
            gc.set_threshold(rng.randint(1, 12))
            for _ in range(20):
                y = y * w + 0.25
            gc.set_threshold(*threshold)
            if not lib.pg_alive(y._h):
                bad += 1
                continue
            y.backward()
            del saved[:]
    finally:
        gc.set_threshold(*threshold)
    assert bad == 0
    live()


def test_a_settle_in_another_thread_while_code_runs_inside_an_op():
    """The code inside the op closes its segment, then waits for another
    thread that settles: that thread must see the op under way here."""
    def elsewhere():
        t = threading.Thread(target=engine.settle)
        made = [Value(0.5) for _ in range(SEG_NODES + 8)]
        t.start()
        t.join()
        del made

    a, b = Value(1.5), Value(2.0)
    for n in range(1, 4):
        c, _ = with_code_inside(lambda: a * b, elsewhere, n)
        assert lib.pg_alive(c._h)
        assert c.data == 3.0
        c.backward()
        assert (a.grad, b.grad) == (2.0 * n, 1.5 * n)
    live()


def test_a_signal_handler_that_makes_nodes_and_settles_at_any_bytecode_of_an_op():
    """A handler (a progress report that evaluates the model, say) can run
    at any bytecode of an op, between its C call and its store too: run
    there by a trace function at each bytecode of pygrad's code in turn."""
    from interrupts import PYGRAD_CODE, Interrupter
    w = Value(0.5)

    def handler():
        """Nodes in this thread's segment, the segment closed under the op
        (as SEG_NODES more nodes would, for a fraction of the time), more
        nodes, and a collection that frees the handler's own."""
        made = [Value(0.5) * 2.0 for _ in range(8)]
        lib.pg_close_current()
        made += [Value(0.5) * 2.0 for _ in range(8)]
        del made
        gc.collect(0)

    def op():
        return (Value(1.0) * w + 0.25).tanh()

    expected = op().data
    counter = Interrupter(None, opcodes=True, prefixes=(PYGRAD_CODE,))
    sys.settrace(counter)
    try:
        op()
    finally:
        sys.settrace(None)
    assert counter.events > 20
    for n in range(1, counter.events + 1):
        tracer = Interrupter(n, opcodes=True, prefixes=(PYGRAD_CODE,), action=handler)
        sys.settrace(tracer)
        try:
            y = op()
        finally:
            sys.settrace(None)
        assert tracer.fired is not None
        assert lib.pg_alive(y._h) and y.data == expected, tracer.fired
        w.grad = 0.0
        y.backward()
        assert w.grad != 0.0
    live()


def test_a_finalizer_that_settles_while_a_settle_looks_at_the_stacks_does_not_hang():
    """Looking at every thread's stack (sys._current_frames) makes frame
    objects under an interpreter lock that is not re-entrant; a collection
    there whose finalizer settles would come back for that lock and hang.
    Code inside an op (a profile hook standing in for a signal handler, at
    the same instruction every time) closes the op's segment and settles;
    an object in a cycle whose __del__ settles is freed by the n-th
    collection inside that settle.  Run apart: a hang fails, not stalls."""
    script = """
        import gc, sys
        from pygrad import Value, engine
        from pygrad._core import lib

        class Checkpoint:
            def __init__(self):
                self.me = self

            def __del__(self):
                engine.settle()

        left = [0]
        def at_nth_collection(phase, info):
            if phase == "start" and left[0] > 0:
                left[0] -= 1
                if left[0] == 0:
                    Checkpoint()          # garbage this very collection frees

        def inside_the_op(n):
            keep = [Value(0.25) for _ in range(lib.PG_SEG_NODES + 8)][::2]
            left[0] = n
            threshold = gc.get_threshold()
            gc.set_threshold(1)
            try:
                engine.settle()
            finally:
                gc.set_threshold(*threshold)
            return keep

        gc.callbacks.append(at_nth_collection)
        for n in range(1, 8):
            a, b = Value(1.5), Value(2.0)
            armed = [True]
            def profile(frame, event, arg):
                if event == "c_return" and armed[0] and getattr(arg, "__name__", "") == "pg_binary_MUL":
                    armed[0] = False
                    profile.kept = inside_the_op(n)
            sys.setprofile(profile)
            c = a * b
            sys.setprofile(None)
            assert lib.pg_alive(c._h) and c.data == 3.0, n
            c.backward()
            assert (a.grad, b.grad) == (2.0, 1.5), n
        print("ok")
    """
    assert run_python(script).strip() == "ok"
