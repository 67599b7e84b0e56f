"""Adversarial cases for issue 51's changes: ``_prev`` and ``_op`` in C,
train_step's node-list optimizer, compiles that wait in tries, the
CallLock, per_length tracing outside its lock, and the .data guard that is
checked only while some thread traces.

No test depends on timing: thread switches are forced at chosen points
(events, a trace function), signals are raised by the code itself, and a
fork is made while the other thread waits on an event.  The review found
nine bugs; all are fixed, and their cases are plain tests now.
"""
import copy
import gc
import inspect
import os
import pickle
import signal
import sys
import threading

import numpy as np
import pytest

import pygrad
from pygrad import Value, engine, nn, optim
from pygrad import reference
from pygrad.replay import Inputs

import internals
from helpers import micrograd_backward, run_python

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
needs_signals = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")


def ids(values):
    return {id(v) for v in values}


# --- 1. _prev: the C getset and its cache -------------------------------------

def test_prev_reentered_from_a_subclass_hash_gives_one_set():
    """A subclass operand's __hash__ reads the parent's _prev again, runs the
    collector, and deletes the cache, while the outer read is building its
    set: every read afterwards gives one and the same set of the operands."""
    state = {"depth": 0, "parent": None, "inner": None}

    class H(Value):
        def __hash__(self):
            p = state["parent"]
            if p is not None and state["depth"] == 0:
                state["depth"] += 1
                gc.collect()
                state["inner"] = p._prev            # re-entrant read
                del p._pg_kids                      # and the cache dropped
                state["depth"] -= 1
            return id(self) >> 4

        def __eq__(self, other):
            return self is other

    a, b = H(1.5), H(-2.0)
    for make in (lambda: a * b, lambda: a * 3.0, lambda: 2.0 - b, lambda: a ** 2):
        c = make()
        state["parent"], state["inner"] = c, None
        s = c._prev
        state["parent"] = None
        assert state["inner"] is not None
        assert s is c._prev and isinstance(s, set)
        kids = list(s)
        assert ids(kids) & ids([a, b])            # the user's own objects
        assert all(isinstance(k, Value) for k in kids)
        # every child is a distinct node of c's node
        assert {internals.node_of(k) for k in kids} == \
            {pygrad._core.lib.pg_kid_addr(id(c), i)
             for i in range(pygrad._core.lib.pg_nkids_v(id(c)))}


def test_prev_raises_what_hash_raises_and_then_caches():
    class R(Value):
        fail = 2

        def __hash__(self):
            if R.fail:
                R.fail -= 1
                raise KeyError("boom")
            return 1

    x = R(1.0)
    y = x * 2.0 + x
    for _ in range(2):
        with pytest.raises(KeyError):
            y._prev
    s = y._prev
    assert s is y._prev and ids(s) >= {id(x)}


def test_prev_read_in_another_thread_while_this_one_hashes():
    """A thread switch in the middle of _prev (inside a subclass's __hash__):
    the other thread reads the same _prev, builds and drops graphs and runs
    the collector; both threads end with the one cached set."""
    go, back = threading.Event(), threading.Event()
    parent = {}

    class S(Value):
        first = True

        def __hash__(self):
            if S.first and "c" in parent:
                S.first = False
                go.set()
                assert back.wait(60)
            return id(self) >> 4

        def __eq__(self, other):
            return self is other

    a, b = S(0.25), S(4.0)
    target = a * b
    parent["c"] = target
    other = []

    def reader():
        assert go.wait(60)
        for _ in range(3):
            junk = [Value(float(i)) * 2.0 for i in range(200)]
            junk = pygrad.sum(junk).tanh()
            del junk
            gc.collect()
        other.append(target._prev)
        back.set()

    t = threading.Thread(target=reader)
    t.start()
    mine = target._prev
    t.join(60)
    assert other and other[0] is mine is target._prev
    assert ids(mine) == {id(a), id(b)}


def test_prev_from_many_threads_on_shared_graphs_meets_one_object_per_node():
    """Threads read _prev of one graph (number operands: C makes their
    leaves' Values) in turns forced by a barrier: the walk meets one object
    per node, whoever read first."""
    a = Value(1.25)
    y = a
    for k in range(30):
        y = (y * 1.5 + float(k)).tanh() - 0.5
    n = 4
    barrier = threading.Barrier(n)
    seen = [None] * n

    def walk(i):
        barrier.wait(60)
        found, stack = {}, [y]
        while stack:
            v = stack.pop()
            node = internals.node_of(v)
            if node in found:
                assert found[node] is v
                continue
            found[node] = v
            stack.extend(v._prev)
        seen[i] = found

    ts = [threading.Thread(target=walk, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert all(s is not None for s in seen)
    for s in seen[1:]:
        assert s.keys() == seen[0].keys()
        assert all(s[k] is seen[0][k] for k in s)


def test_a_resurrected_value_keeps_its_prev():
    keep = []

    class Phoenix(Value):
        _pygrad_result_class = Value

        def __del__(self):
            if not keep:
                self._prev                  # read during dealloc
                keep.append(self)

    a = Value(3.0)
    p = Phoenix(2.0)
    q = p * a
    kids = q._prev
    del p, kids
    q2 = q + 1.0
    del q
    gc.collect()
    assert keep == []                      # q2 holds q holds p
    del q2
    gc.collect()
    assert len(keep) == 1
    assert keep[0]._prev == set() and keep[0].data == 2.0
    y = keep[0] * 5.0
    y.backward()
    assert keep[0].grad == 5.0
    keep.clear()


def test_a_value_whose_init_never_ran():
    v = Value.__new__(Value)
    assert v._prev == set() and v._op == ""
    with pytest.raises(TypeError):
        v.data
    with pytest.raises(TypeError):
        v + 1.0
    with pytest.raises(TypeError):
        Value(1.0) * v
    with pytest.raises(TypeError):
        pygrad.sum([v, Value(1.0)])
    with pytest.raises(TypeError):
        optim.SGD([v], lr=0.1)
    with pytest.raises((TypeError, ValueError)):
        pygrad.compile(v)


def test_prev_read_before_init_is_not_stale_after_init():
    a, b = Value(1.0), Value(2.0)
    v = Value.__new__(Value)
    v._prev                                     # (hasattr(v, '_prev') does the same)
    Value.__init__(v, 3.0, (a, b), "f")
    assert ids(v._prev) == {id(a), id(b)}
    assert v._children == (a, b)


def test_writing_back_the_empty_cache_keeps_prev_a_set():
    a, b = Value(1.0), Value(2.0)
    v = a * b
    try:
        v._pg_kids = v._pg_kids                 # None: nothing cached yet
    except (TypeError, AttributeError):
        pass
    assert isinstance(v._prev, set) and ids(v._prev) == {id(a), id(b)}


def test_odd_objects_as_the_cache_do_not_reach_c():
    """_pg_kids set to odd objects: _prev hands them out (it is the cache),
    and nothing in C reads them (backward, compile, grad)."""
    want = reference.Value(0.5)
    wy = (want * 2.0).tanh() * want
    wy.backward()
    for odd in (0, "", (), frozenset(), {1: 2}, "self"):
        a = Value(0.5)
        y = (a * 2.0).tanh() * a
        odd = y if odd == "self" else odd
        y._pg_kids = odd
        assert y._prev is odd
        y.backward()
        assert a.grad == want.grad
        assert pygrad.compile(y).forward() == wy.data
        assert pygrad.grad(y, [a])[0].data == want.grad
        del y._pg_kids
        assert id(a) in ids(y._prev)


def test_the_fixed_prev_set_cant_be_emptied_through_init():
    a, b = Value(1.0), Value(2.0)
    v = a + b
    s = v._prev
    s.__init__()
    s.__init__([Value(3.0)])
    assert ids(v._prev) == {id(a), id(b)}
    leaf = Value(4.0)
    leaf._prev.__init__([a])
    assert leaf._prev == set()


def test_class_assignment_and_getattribute_do_not_confuse_prev():
    class Loud(Value):
        reads = 0

        def __getattribute__(self, name):
            if name == "_prev":
                Loud.reads += 1
            return super().__getattribute__(name)

    class Quiet(Value):
        pass

    a = Value(2.0)
    x = Loud(3.0)
    y = x * a + 1.0
    assert type(y) is Loud
    s = y._prev
    y.__class__ = Quiet
    assert y._prev is s and Loud.reads == 1
    x.__class__ = Quiet
    assert y._prev is s
    y.backward()
    r = reference.Value(3.0)
    (r * reference.Value(2.0) + 1.0).backward()
    assert x.grad == r.grad


def test_copies_and_pickles_after_prev_was_read():
    m = nn.MLP(2, [3, 2])
    x = [Value(0.5), Value(-0.25)]
    outs = m(x)
    a = Value(2.0)
    y = a * 3.0
    for obj in (outs[0], y):
        kids = obj._prev
        for f in (copy.copy, copy.deepcopy, lambda z: pickle.loads(pickle.dumps(z))):
            c = f(obj)
            assert c._prev == set() and c._op == "" and c.data == obj.data
            cs = f(kids)
            if f is copy.copy:                      # the same Values
                assert ids(cs) == ids(kids)
            else:                                   # new leaves
                assert len(cs) == len(kids) and all(k._prev == set() for k in cs)
            with pytest.raises(TypeError):
                cs.add(Value(1.0))
        assert obj._prev is kids


def test_children_in_order_with_a_subclass_that_compares_by_data():
    class ByData(Value):
        def __eq__(self, other):
            return isinstance(other, Value) and self.data == other.data

        def __hash__(self):
            return hash(self.data)

    a, b = ByData(2.0), ByData(2.0)
    z = a * b
    assert z._children == (a, b)
    assert z._local_grads == (2.0, 2.0)


def test_a_thread_switch_in_the_fused_table_gives_one_object_per_hidden_node():
    m = nn.MLP(2, [3, 2])
    m.set_data(np.linspace(0.1, 0.9, len(m.parameters())))   # every ReLU alive
    x = [Value(0.5), Value(0.25)]
    o0, o1 = m(x)
    code = engine._kids_of.__code__
    lines, first = inspect.getsourcelines(engine._kids_of)
    # where a Value is made for a node the table did not have
    made = [first + i for i, line in enumerate(lines) if "_new(" in line]
    switched = []

    def other_thread_reads():
        t = threading.Thread(target=lambda: o1._prev)
        t.start()
        t.join(60)

    def local(frame, event, arg):
        # a switch once a table look-up missed (kid None) and before the
        # Value made for it is stored: what the interpreter may do there
        if event == "line" and not switched and frame.f_lineno in made \
                and frame.f_locals.get("table") is not None:
            switched.append(True)
            other_thread_reads()
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is code else None

    sys.settrace(tracer)
    try:
        k0 = o0._prev
    finally:
        sys.settrace(None)
    assert switched
    k1 = o1._prev
    by_node = {}
    for k in list(k0) + list(k1):
        by_node.setdefault(internals.node_of(k), set()).add(id(k))
    assert all(len(objs) == 1 for objs in by_node.values()), "two objects for one node"
    # what it does to micrograd's backward(), against the reference engine
    _micrograd_backward_matches_the_reference(m, o0, o1)


def _micrograd_backward_matches_the_reference(m, o0, o1):
    micrograd_backward(o0 + o1)
    rm = nn.MLP(2, [3, 2], engine="reference")
    rm.set_data(m.get_data())
    r0, r1 = rm([reference.Value(0.5), reference.Value(0.25)])
    (r0 + r1).backward()
    assert [p.grad for p in m.parameters()] == \
        pytest.approx([p.grad for p in rm.parameters()], rel=1e-12)


def test_fused_table_walk_in_one_thread_matches_the_reference():
    m = nn.MLP(2, [3, 2])
    m.set_data(np.linspace(0.1, 0.9, len(m.parameters())))
    o0, o1 = m([Value(0.5), Value(0.25)])
    _micrograd_backward_matches_the_reference(m, o0, o1)


def test_number_operand_graphs_match_the_reference_bit_for_bit_after_prev_reads():
    """Graphs of ops with number operands (whose leaves only _prev shows),
    every _prev read (and a hidden leaf's grad read), then backward():
    data and grads are the reference engine's bits."""
    def build(V, fused_sum):
        a, b = V(0.7), V(-1.3)
        y = ((a * 3.0 + 2.0) / b - 1.5) ** 2
        y = (2.0 - y) * a + (1.0 / (b ** 3 + 4.0)) + 2 ** a + a ** 0.5
        y = y.tanh() * 5.0 - (b - 0.25).exp() + fused_sum([a, b, 2.0])
        return a, b, y

    a, b, y = build(Value, pygrad.sum)
    ra, rb, ry = build(reference.Value, reference.sum)
    stack, seen = [y], set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        v._op
        for k in v._prev:
            k.grad                          # the leaf Values C made: readable
            stack.append(k)
    y.backward()
    ry.backward()
    assert y.data == ry.data
    assert (a.grad, b.grad) == (ra.grad, rb.grad)


# --- 2. _op: every op kind ------------------------------------------------------

PLAIN_OPS = {
    "add": lambda a, b, m: a + b, "radd": lambda a, b, m: 2 + a, "sub": lambda a, b, m: a - b,
    "rsub": lambda a, b, m: 2 - a, "div": lambda a, b, m: a / b, "rdiv": lambda a, b, m: 2 / a,
    "neg": lambda a, b, m: -a, "pow2": lambda a, b, m: a ** 2, "pow2f": lambda a, b, m: a ** 2.0,
    "pow_half": lambda a, b, m: a ** 0.5, "pow_neg": lambda a, b, m: a ** -1,
    "pow_negzero": lambda a, b, m: a ** -0.0, "pow_value": lambda a, b, m: a ** b,
    "rpow": lambda a, b, m: 2 ** a, "pow_bool": lambda a, b, m: a ** True,
    "pow_big": lambda a, b, m: a ** (10 ** 17 + 1), "pow_np": lambda a, b, m: a ** np.float32(1.5),
    "exp": lambda a, b, m: a.exp(), "relu": lambda a, b, m: a.relu(),
    "abs": lambda a, b, m: abs(a), "tanh": lambda a, b, m: a.tanh(),
    "sigmoid": lambda a, b, m: a.sigmoid(), "log": lambda a, b, m: a.log(),
    "custom": lambda a, b, m: type(a)(1.0, (a, b), "myop"),
    "microgpt": lambda a, b, m: type(a)(1.0, (a, b), (2.0, 3.0)),
    "custom_empty": lambda a, b, m: type(a)(1.0, (), "named"),
}


@pytest.mark.parametrize("name", sorted(PLAIN_OPS))
def test_op_name_of_every_plain_op_is_the_references(name):
    make = PLAIN_OPS[name]
    c = make(Value(0.3), Value(0.7), pygrad)
    r = make(reference.Value(0.3), reference.Value(0.7), reference)
    assert c._op == r._op
    assert c.data == r.data
    c._op = "renamed"                       # a name set on the Value comes first
    assert c._op == "renamed"
    del c._op
    assert c._op == ("" if name.startswith("custom") else r._op)


def test_op_names_of_fused_nodes_and_functions():
    a, b = Value(0.3), Value(0.7)
    assert pygrad.dot([a], [b])._op == "linear"
    for act in ("relu", "tanh", "sigmoid"):
        assert pygrad.dot([a], [b], b=1.0, act=act)._op.startswith("linear+")
    assert pygrad.sum([a, b])._op == "sum"
    assert pygrad.logsumexp([a, b])._op == "logsumexp"
    assert pygrad.detached_max([a, b])._op == "max"
    m = nn.MLP(2, [3, 1])
    out = m([a, b])
    assert out._op == "linear"
    for k in out._prev:
        assert k._op in ("", "linear+ReLU")
    descr = Value.__dict__["_op"]
    assert descr.__get__(None, Value) is descr
    assert descr.__get__(object(), object) == ""          # no node: ""


# --- 3. train_step: the optimizer from a node list --------------------------------

def _regression(seed=0):
    rng = np.random.default_rng(seed)
    w = [Value(float(v)) for v in rng.uniform(-1, 1, 3)]
    x0, x1 = Value(0.0), Value(0.0)
    y = (w[0] * x0 + w[1] * x1 + w[2]).tanh()
    prog = pygrad.compile(y, inputs=[x0, x1])
    rows = rng.uniform(-1, 1, (40, 2))
    return w, prog, rows, np.full(len(rows), 1 / len(rows))


def _step(prog, rows, gw, opt, fused):
    """One training step: train_step's one call, or its three."""
    if fused:
        prog.train_step(rows, gw, opt)
    else:
        opt.zero_grad()
        prog.map(rows, grad=gw)
        opt.step()


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_train_step_with_state_swapped_between_steps_is_the_three_calls(kind):
    results = []
    for fused in (True, False):
        w, prog, rows, gw = _regression()
        opt = (optim.SGD(w, lr=0.1, momentum=0.9) if kind == "sgd"
               else optim.Adam(w, lr=0.05))
        for step in range(6):
            if step == 2:        # fresh arrays with the same numbers
                for name in opt._STATE:
                    setattr(opt, name, getattr(opt, name).copy())
            if step == 4:        # the state restarted
                for name in opt._STATE:
                    setattr(opt, name, np.zeros(len(w)))
            _step(prog, rows, gw, opt, fused)
        results.append(([p.data for p in w], [getattr(opt, n).tolist() for n in opt._STATE],
                        opt.steps))
    assert results[0] == results[1]


def test_train_step_with_a_swapped_parameter_pack_refuses_or_steps_its_own():
    from pygrad._lifetime import pack
    w, prog, rows, gw = _regression()
    opt = optim.SGD(w, lr=0.1, momentum=0.9)
    more = w + [Value(1.0)]
    opt._packed = pack(more)        # one more than the state has
    before = [p.data for p in more]
    with pytest.raises(ValueError):
        prog.train_step(rows, gw, opt)
    assert [p.data for p in more] == before and opt.steps == 0


@pytest.mark.parametrize("where", ["train_step", "per_length"])
def test_a_momentum_property_that_evaluates_runs_outside_the_lock(where):
    w, prog, rows, gw = _regression()
    P = [Value(0.5 + i) for i in range(4)]
    train = None

    class Warm(optim.SGD):
        @property
        def momentum(self):
            if where == "train_step":
                prog.map(rows)                       # a plateau rule, as an lr schedule may
            else:
                train.loss([1])
            return self._mom

        @momentum.setter
        def momentum(self, m):
            self._mom = m

    if where == "train_step":
        prog.train_step(rows, gw, Warm(w, lr=0.1, momentum=0.5))
    else:
        train = pygrad.per_length(lambda toks: pygrad.pick(P, toks[0]) * 2.0, 4,
                                  Warm(P, lr=0.1, momentum=0.5))
        assert train.step([2]) == 2 * 2.5


@pytest.mark.parametrize("attr", ["steps", "_packed"])
def test_train_step_reads_no_subclass_attribute_under_its_lock(attr):
    """A subclass's ``steps`` or ``_packed`` that evaluates the model (a
    property) runs before the Program's lock is taken: the step is the
    three calls', and no RuntimeError for a re-entered lock."""
    results = []
    for fused in (True, False):
        w, prog, rows, gw = _regression()
        ran = []

        class Peeking(optim.SGD):
            pass

        def peek(self, _name=attr):
            ran.append(prog.map(rows)[0])            # the model, as a plateau rule reads it
            return (optim.Optimizer.steps.fget(self) if _name == "steps"
                    else self.__dict__["_p"])

        def put(self, v, _name=attr):
            if _name == "steps":
                optim.Optimizer.steps.fset(self, v)
            else:
                self.__dict__["_p"] = v

        setattr(Peeking, attr, property(peek, put))
        opt = Peeking(w, lr=0.1, momentum=0.5)
        for _ in range(3):
            _step(prog, rows, gw, opt, fused)
        results.append([p.data for p in w])
        assert opt.steps == 3
        assert ran or not fused
    assert results[0] == results[1]


# --- 4. compiles that wait in tries -----------------------------------------------

@pytest.mark.skipif(not hasattr(pygrad._core.lib, "pg_test_hold_sweep_lock"),
                    reason="needs a test build's hooks (PYGRAD_TEST_HOOKS=1: .ci/sanitize)")
def test_a_refused_compile_waiting_for_the_sweep_lock_names_its_node():
    """A compile that must wait (another thread holds the sweep lock) and is
    then refused names the node by its op and label, as without a wait."""
    lib = pygrad._core.lib
    a = Value(0.5)
    c = Value(a.data * 2, (a,), "mine", label="the custom op")
    y = (c * 3.0).tanh()
    with pytest.raises(ValueError) as plain:
        pygrad.compile(y)
    held, release, waited = threading.Event(), threading.Event(), []

    def holder():
        lib.pg_test_hold_sweep_lock(1)
        held.set()
        release.wait(60)
        waited.append(lib.pg_sweep_lock_waits())
        lib.pg_test_hold_sweep_lock(0)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(60)
    got = []

    def compile_it():
        try:
            pygrad.compile(y)
        except ValueError as e:
            got.append(str(e))

    c2 = threading.Thread(target=compile_it)
    c2.start()
    while not lib.pg_sweep_lock_waits() and c2.is_alive():   # until it found the lock taken
        c2.join(0.001)
    release.set()
    t.join(60)
    c2.join(60)
    assert waited and waited[0] > 0
    assert got == [str(plain.value)] and "'mine'" in got[0] and "the custom op" in got[0]


# --- 5. per_length: tracing outside the lock -----------------------------------------

def test_a_loss_function_that_raises_leaves_numbers_readable_and_the_collector_on():
    P = [Value(0.5 + i) for i in range(4)]
    calls = []

    def loss(toks):
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("first trace fails")
        return pygrad.pick(P, toks[0]) * 2.0

    train = pygrad.per_length(loss, 4)
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError):
        train.loss([3])
    assert gc.isenabled() and P[0].data == 0.5
    assert train.loss([3]) == 7.0 and train.lengths == [1]


def test_two_threads_trace_one_length_interleaved():
    """Thread A is inside the loss function when the main thread traces and
    runs the same length; A then finishes its own trace.  The first program
    is kept, both get the eager number, and each thread reads numbers again
    once its own trace is over (the count of tracers is back to 0)."""
    P = [Value(0.5 + i) for i in range(4)]
    inside, go = threading.Event(), threading.Event()
    first = []

    def loss(toks):
        if threading.current_thread() is not threading.main_thread() and not first:
            first.append(1)
            inside.set()
            assert go.wait(60)
            with pytest.raises(ValueError):
                P[0].data                     # still tracing in this thread
        return pygrad.pick(P, toks[0]) * pygrad.pick(P, toks[1])

    train = pygrad.per_length(loss, 4)
    got = {}

    def a():
        got["a"] = train.loss([1, 2])
        got["a_reads"] = P[0].data

    t = threading.Thread(target=a)
    t.start()
    assert inside.wait(60)
    assert P[0].data == 0.5                   # this thread does not trace
    got["main"] = train.loss([1, 2])
    kept = train._programs[2]
    go.set()
    t.join(60)
    assert got == {"a": 1.5 * 2.5, "a_reads": 0.5, "main": 1.5 * 2.5}
    assert train._programs[2] is kept and gc.isenabled()
    P[1].data = 10.0
    assert train.loss([1, 2]) == 10.0 * 2.5


@needs_signals
def test_a_signal_handler_uses_the_per_length_it_interrupted_during_a_trace():
    """The handler runs in the tracing thread (no lock held there): it traces
    and runs another length; the interrupted trace then completes."""
    P = [Value(0.5 + i) for i in range(4)]
    seen = []

    def handler(signum, frame):
        seen.append(train.loss([2]))

    def loss(toks):
        if len(toks) == 3 and not seen:
            signal.raise_signal(signal.SIGUSR1)
        return pygrad.pick(P, toks[0]) * pygrad.pick(P, toks[-1])

    train = pygrad.per_length(loss, 4)
    old = signal.signal(signal.SIGUSR1, handler)
    try:
        assert train.loss([1, 0, 3]) == 1.5 * 3.5
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert seen == [2.5 * 2.5] and train.lengths == [1, 3]
    assert gc.isenabled() and P[0].data == 0.5


def test_a_loss_function_that_runs_another_per_length():
    P = [Value(0.5 + i) for i in range(4)]
    inner = pygrad.per_length(lambda toks: pygrad.pick(P, toks[0]) * 3.0, 4,
                              optim.SGD(P, lr=0.0))
    steps = []

    def loss(toks):
        steps.append(inner.step([2]))         # traces inner's length 1, and steps
        return pygrad.pick(P, toks[0]) * 2.0

    outer = pygrad.per_length(loss, 4)
    assert outer.loss([3]) == 7.0 and inner.lengths == [1] and steps == [7.5]
    assert P[3].data == 3.5 and gc.isenabled()


@needs_fork
def test_a_fork_inside_the_loss_function_completes_in_both_processes():
    out = run_python("""
        import os, gc, pygrad
        from pygrad import Value
        P = [Value(0.5 + i) for i in range(4)]
        pid = []
        def loss(toks):
            if not pid:
                pid.append(os.fork())
            return pygrad.pick(P, toks[0]) * 2.0
        train = pygrad.per_length(loss, 4)
        got = train.loss([3])
        if pid[0] == 0:
            ok = got == 7.0 and gc.isenabled() and P[0].data == 0.5 and train.loss([1]) == 3.0
            os._exit(0 if ok else 5)
        _, status = os.waitpid(pid[0], 0)
        print(os.WEXITSTATUS(status), got == 7.0 and gc.isenabled())
    """, timeout=120)
    assert out.split() == ["0", "True"]


@needs_fork
def test_a_forked_child_of_a_tracing_thread_traces_and_steps():
    """Another thread is inside a trace (waiting) when the main thread forks:
    the child traces, steps and reads numbers as usual."""
    out = run_python("""
        import os, threading, pygrad
        from pygrad import Value, optim
        P = [Value(0.5 + i) for i in range(4)]
        inside, go = threading.Event(), threading.Event()
        def loss(toks):
            if threading.current_thread() is not threading.main_thread():
                inside.set(); go.wait(60)
            return pygrad.pick(P, toks[0]) * 2.0
        train = pygrad.per_length(loss, 4, optim.SGD(P, lr=0.5))
        t = threading.Thread(target=lambda: train.loss([1, 2]))
        t.start(); inside.wait(60)
        pid = os.fork()
        if pid == 0:
            ok = train.step([3]) == 7.0 and P[3].data == 3.5 - 0.5 * 2.0
            os._exit(0 if ok else 4)
        go.set(); t.join(60)
        _, status = os.waitpid(pid, 0)
        print(os.WEXITSTATUS(status))
    """, timeout=120)
    assert out.split() == ["0"]


@needs_fork
def test_a_child_forked_during_another_threads_trace_has_the_collector_on():
    out = run_python("""
        import os, gc, threading, pygrad
        from pygrad import Value
        P = [Value(0.5 + i) for i in range(4)]
        inside, go = threading.Event(), threading.Event()
        def loss(toks):
            inside.set(); go.wait(60)
            return pygrad.pick(P, toks[0]) * 2.0
        train = pygrad.per_length(loss, 4)
        assert gc.isenabled()
        t = threading.Thread(target=lambda: train.loss([1]))
        t.start(); inside.wait(60)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if gc.isenabled() else 3)
        go.set(); t.join(60)
        _, status = os.waitpid(pid, 0)
        print(os.WEXITSTATUS(status))
    """, timeout=120)
    assert out.split() == ["0"]


def test_a_bulk_read_inside_a_trace_is_refused_as_data_is():
    P = [Value(1.0), Value(2.0), Value(3.0)]
    inputs = Inputs(P)

    def loss(toks):
        scale = float(inputs.get().sum())
        return pygrad.pick(P, toks[0]) * scale

    train = pygrad.per_length(loss, 3)
    with pytest.raises(ValueError):
        train.loss([1])                       # today: the sum is frozen at 6.0


def test_token_ids_are_checked_against_the_compiled_vocab():
    P = [Value(float(i + 1)) for i in range(4)]
    train = pygrad.per_length(
        lambda toks: pygrad.pick(P, toks[0]) * 10.0 + pygrad.pick(P, toks[1]), 4)
    assert train.loss([1, 2]) == 23.0
    with pytest.raises(AttributeError):
        train.vocab = 8                       # fixed: the programs are compiled for 4
    with pytest.raises(ValueError):
        train.loss([5, 0])
    with pytest.raises(ValueError):
        train._programs[2].run([5, 0], False)  # and the program checks its own


# --- 6. the .data guard, only while some thread traces --------------------------------

def test_data_is_readable_in_other_threads_while_one_traces_and_after():
    P = [Value(0.5 + i) for i in range(4)]
    inside, go = threading.Event(), threading.Event()
    results = {}

    def loss(toks):
        inside.set()
        assert go.wait(60)
        for name, f in (("data", lambda: P[0].data), ("grad", lambda: P[0].grad)):
            with pytest.raises(ValueError):
                f()
        with pytest.raises(ValueError):
            P[0].data = 1.0
        return pygrad.pick(P, toks[0]) * 2.0

    train = pygrad.per_length(loss, 4)
    t = threading.Thread(target=lambda: results.setdefault("loss", train.loss([2])))
    t.start()
    assert inside.wait(60)
    # the main thread does not trace: reads and writes work, during the trace
    P[1].data = 1.5
    assert (P[0].data, P[1].data, P[0].grad) == (0.5, 1.5, 0.0)
    w = Value(3.0)
    (w * w).backward()
    assert w.grad == 6.0
    go.set()
    t.join(60)
    assert results == {"loss": 5.0}
    assert P[0].data == 0.5 and gc.isenabled()
