"""Keeps attacked: node lifetime under threads, finalizers, the collector,
fork() and users who write pygrad's internal attributes (pygrad/_lifetime.py,
csrc/pygrad.h's top comment).

The rules of this file: no test depends on timing.  Another thread acts at
a chosen point (an event set from inside a custom op's ``_backward``, an lr
schedule run by ``train_step``, a weak-reference callback run by the
collector, a ``__float__`` run by a setter), never by a race; where two
threads do overlap, the assertion holds under every interleaving.  Every
test compares real numbers, exactly, against the same work done alone.

Freed reads are caught two ways: the ASan core (``.ci/sanitize``), and, in
any build, ``guarded()``, which checks that every node pointer the engine
hands to C's reads and writes (and, for a node's own gradient rule, its
children) lies in node memory Python still holds (tests/internals.py's
record of node arrays): it raises ``DeadNode`` instead of calling C.
"""
import contextlib
import os
import gc
import pickle
import threading
import weakref

import numpy as np
import pytest

import pygrad
import pygrad.engine as engine
from pygrad import Value, nn, optim
from pygrad._core import ffi, lib
from pygrad.reference import Value as RefValue

from helpers import run_python
import internals


# -- a freed-node detector for any build ----------------------------------------------

class DeadNode(AssertionError):
    """The engine was about to hand C a node whose memory Python freed."""


def _live_ranges():
    return internals.live_ranges()


def _is_live(ptr, ranges) -> bool:
    p = int(ffi.cast("uintptr_t", lib.pg_node_ptr(ptr)))
    return any(lo <= p < hi for lo, hi in ranges)


_GUARDED = {"_describe": False, "_node_backward": True}
# Value's number fields, from the engine's own factory over the C calls.
_FIELDS = {"data": (lib.pg_data, lib.pg_set_data), "grad": (lib.pg_grad, lib.pg_set_grad)}


@contextlib.contextmanager
def guarded():
    """Within: every node engine passes to pg_data/pg_set_data/pg_grad/
    pg_set_grad/pg_describe/pg_node_backward must be live (for
    pg_node_backward, its children too), else DeadNode; yields the list
    of refusals."""
    refused = []
    real = {name: getattr(engine, name) for name in _GUARDED}
    internals.live_nodes()           # forgets the arrays already freed

    def checked(name, fn, kids):
        def call(node, *args):
            ranges = _live_ranges()
            dead = not _is_live(node, ranges)
            if not dead and kids:
                dead = any(not _is_live(lib.pg_kid(node, i), ranges)
                           for i in range(lib.pg_nkids(node)))
            if dead:
                refused.append(name)
                raise DeadNode(f"{name} was handed a node (or a child of it) that Python freed")
            return fn(node, *args)
        return call

    for name, kids in _GUARDED.items():
        setattr(engine, name, checked(name, real[name], kids))
    fields = {name: Value.__dict__[name] for name in _FIELDS}
    for name, (get, put) in _FIELDS.items():
        setattr(Value, name, engine._number_field(checked(f"pg_{name}", get, False),
                                                  checked(f"pg_set_{name}", put, False),
                                                  f"Value.{name}", ""))
    try:
        yield refused
    finally:
        for name, fn in real.items():
            setattr(engine, name, fn)
        for name, prop in fields.items():
            setattr(Value, name, prop)


def custom(a, factor, hook=None, cls=Value):
    """micrograd's way of adding an op: a Value with a Python _backward
    (`factor * a`); hook() runs first in its _backward."""
    out = cls(a.data * factor, (a,), "scale")

    def _backward():
        g = out.grad
        if hook is not None:
            hook()
        a.grad += factor * g
    out._backward = _backward
    return out


# -- 1. two backward() calls at once over shared nodes --------------------------------

def shared_graphs(n):
    """Two roots over one shared chain of n steps: leaves x, w; the
    chain's end s; root A = s * 2 + chain of its own, root B = s * 5 + ..."""
    x, w = Value(0.3), Value(0.999)
    s = x
    for i in range(n):
        s = (s * w + 0.001).tanh() if i % 2 else s * w + 0.5
    ra, rb = s * 2.0, s * 5.0
    for _ in range(n // 4):
        ra = ra * w + 0.25
        rb = (rb * w).tanh()
    return x, w, s, ra, rb


def grads(x, w, s, ra, rb):
    return (x.grad, w.grad, s.grad, ra.grad, rb.grad, ra.data, rb.data)


def serially(order, n):
    g = shared_graphs(n)
    for r in order:
        (g[3] if r == "A" else g[4]).backward()
    return grads(*g)


def test_two_threads_backward_over_shared_nodes_equal_one_serial_order():
    """Both threads wait at a barrier, then call backward() on their own
    root (graphs of 36k nodes sharing 24k): the grads are those of the
    two calls one after the other, in one of the two orders, bit for bit."""
    n = 6000
    orders = {serially("AB", n), serially("BA", n)}
    assert len(orders) == 2                  # the order matters: the test can tell
    for _ in range(3):
        g = shared_graphs(n)
        barrier = threading.Barrier(2)

        def go(root):
            barrier.wait()
            root.backward()

        t = threading.Thread(target=go, args=(g[4],))
        t.start()
        go(g[3])
        t.join()
        assert grads(*g) in orders


def _custom_shared():
    """Shared x -> s = tanh(x*x); root A has a custom op over s, root B is
    plain C over s."""
    def build(hook=None):
        x = Value(0.7)
        s = (x * x).tanh()
        ra = custom(s, 3.0, hook) * 2.0 + s
        rb = s * 5.0
        return x, s, ra, rb
    return build


def _b_during_a(build, fail):
    """Thread A's sweep stops in its custom op's _backward (a chosen point)
    and lets thread B run backward() over the shared nodes (a fixed core
    makes B wait for A's sweep: A then goes on after the bounded wait);
    with ``fail``, A's closure then raises.  The shared nodes' grads."""
    in_a, b_done = threading.Event(), threading.Event()

    def hook():
        in_a.set()
        b_done.wait(2)
        if fail:
            raise KeyError("the closure fails")

    x, s, ra, rb = build(hook)

    def thread_b():
        in_a.wait()
        rb.backward()
        b_done.set()

    t = threading.Thread(target=thread_b)
    t.start()
    try:
        if fail:
            with pytest.raises(KeyError):
                ra.backward()
        else:
            ra.backward()
    finally:
        t.join()
    return x.grad, s.grad


def test_a_sweep_with_a_custom_op_and_another_over_shared_nodes_equal_one_serial_order():
    """A's sweep and B's, over shared nodes, with B started inside A's: the
    grads must be those of A then B, or of B then A."""
    build = _custom_shared()

    def serial(order):
        x, s, ra, rb = build()
        for r in order:
            (ra if r == "A" else rb).backward()
        return x.grad, s.grad

    assert _b_during_a(build, fail=False) in {serial("AB"), serial("BA")}


def test_a_failed_sweep_leaves_another_threads_backward_in_place():
    """A's custom op raises after B's backward() over the shared nodes had
    its chance: A's grads go back, B's stay, as B alone."""
    build = _custom_shared()
    x0, s0, _, rb0 = build()
    rb0.backward()
    assert _b_during_a(build, fail=True) == (x0.grad, s0.grad)


# -- 2. another thread drops, resurrects and pickles Values meanwhile -------------------

class Phoenix(Value):
    """A Value that keeps itself as it dies (ops on it return Phoenixes)."""
    saved: list = []

    def __del__(self):
        Phoenix.saved.append(self)


def vandal(held, pickled):
    """What the other thread does: drop every Value of ``held`` (the
    graph's interior), resurrect Phoenixes (plain and from a custom op's
    cycle), pickle and unpickle Values, collect."""
    for v in held[::7]:
        pickled.append((v.data, pickle.loads(pickle.dumps(v)).data))
    held.clear()
    p = Phoenix(4.0)
    c = custom(p, 2.0, cls=Phoenix)
    c.me = c
    del p, c
    gc.collect()
    junk = [Value(float(i)) * 2.0 for i in range(2000)]
    del junk
    gc.collect()


def phoenix_graph(hook, n=300):
    """A graph whose leaf is a Phoenix (so every op result is one), with a
    custom op in the middle: the root, the leaves, and the interior."""
    x, w = Phoenix(0.5), Value(0.75)
    held = []
    y = x
    for i in range(n):
        y = (y * w + 0.125).tanh() if i % 3 else y * 1.5 - w
        held.append(y)
        if i == n // 2:
            y = custom(y, 1.25, hook, cls=Phoenix)
            held.append(y)
    root = y * y
    return root, x, w, held


def interior_numbers(vs):
    return sorted((v.data, v.grad) for v in vs)


@pytest.mark.parametrize("wait", [True, False], ids=["at a chosen point", "overlapping"])
def test_drop_resurrect_and_pickle_during_backward(wait):
    """The other thread starts from inside the custom op's _backward (the
    sweep stopped half way); it drops the interior Values (Phoenixes that
    resurrect), resurrects more, pickles: the grads, and every resurrected
    interior Value's numbers, are those of the sweep run alone."""
    root0, x0, w0, held0 = phoenix_graph(None)
    root0.backward()
    alone = (root0.data, x0.grad, w0.grad)
    alone_graph = interior_numbers(reachable(root0))
    del root0, x0, w0, held0
    gc.collect()
    Phoenix.saved.clear()

    start, done = threading.Event(), threading.Event()

    def hook():
        start.set()
        if wait:
            done.wait()

    root, x, w, held = phoenix_graph(hook)
    pickled = []

    def other():
        start.wait()
        vandal(held, pickled)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    root.backward()
    t.join()
    assert (root.data, x.grad, w.grad) == alone
    assert pickled and all(a == b for a, b in pickled)
    rid = id(root)
    del root
    gc.collect()
    # the root came back (and holds the graph): every number in it is the
    # run alone's
    (back,) = [v for v in Phoenix.saved if id(v) == rid]
    assert interior_numbers(reachable(back)) == alone_graph
    Phoenix.saved.clear()


def reachable(root):
    """Every Value below root, through _prev (each once)."""
    seen, stack, out = set(), [root], []
    while stack:
        v = stack.pop()
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
            stack.extend(v._prev)
    return out


def fused_setup(seed):
    rng = np.random.default_rng(seed)
    model = nn.MLP(2, [6, 6, 1], fused=True)
    model.set_data(rng.uniform(-1, 1, len(model.parameters())))
    x = [Value(0.25), Value(-0.5)]
    t = Value(1.0)
    out = model(x)
    loss = (out - t) ** 2
    rows = rng.uniform(-1, 1, (64, 2))
    return model, x, out, loss, rows


def test_drop_resurrect_and_pickle_during_replay():
    """compile()'s forward()/backward() run without the GIL while another
    thread (started at a barrier) drops the Python Values of the graph,
    resurrects Phoenixes and pickles the parameters: every loss and grad
    is the run alone's."""
    def run(other):
        model, x, out, loss, _ = fused_setup(1)
        prog = pygrad.compile(loss)
        params = model.parameters()
        held = [out, loss] + list(out._prev)
        del out, loss
        results = []
        barrier = threading.Barrier(2) if other else None
        pickled = []
        if other:
            t = threading.Thread(target=lambda: (barrier.wait(), vandal(held, pickled)))
            t.start()
            barrier.wait()
        for k in range(20):
            x[0].data = k / 20.0
            results.append(prog.forward())
            for p in params:
                p.grad = 0.0
            prog.backward()
            results.append(tuple(p.grad for p in params))
        if other:
            t.join()
            assert all(a == b for a, b in pickled)
        return results

    assert run(True) == run(False)
    Phoenix.saved.clear()


def test_drop_resurrect_and_pickle_during_train_step():
    """An lr schedule (run by train_step before its C call: a chosen point)
    starts the other thread, which drops the graph's Values, resurrects and
    pickles while the step runs: every loss and parameter is the run
    alone's, bit for bit."""
    def run(other):
        model, x, out, loss, rows = fused_setup(2)
        prog = pygrad.compile(loss, inputs=x)
        held = [out, loss, *x] + list(out._prev)
        del out, loss
        pickled = []
        threads = []

        def schedule(step):
            if other and step == 2:
                threads.append(threading.Thread(target=vandal, args=(held, pickled)))
                threads[-1].start()
            return 0.05

        opt = optim.Adam(model.parameters(), lr=schedule)
        w = np.full(len(rows), 1.0 / len(rows))
        losses = [prog.train_step(rows, w, opt).tolist() for _ in range(6)]
        for t in threads:
            t.join()
        assert len(threads) == (1 if other else 0)
        assert all(a == b for a, b in pickled)
        return losses, model.get_data().tolist()

    assert run(True) == run(False)
    Phoenix.saved.clear()


# -- 3. users who write pygrad's internal attributes -----------------------------------

def _model_output():
    model = nn.MLP(2, [3, 2], fused=True)
    model.set_data(np.linspace(-1.0, 1.0, len(model.parameters())))
    outs = model([Value(0.5), Value(-1.5)])
    return outs, model


def _kind(kind):
    """A Value of each way pygrad makes one, and what only it holds of its
    children (the test drops that list)."""
    if kind == "leaf":
        return Value(1.5), []
    if kind == "op":
        a, b = Value(1.5), Value(-2.0)
        return (a * b).tanh() * b, [a, b]
    if kind == "op with a number":
        a = Value(1.5)
        return 2.0 - a, [a]
    if kind == "custom op":
        a, b = Value(1.5), Value(-2.0)
        out = Value(a.data * b.data, (a, b), "mine")

        def _backward():
            a.grad += b.data * out.grad
            b.grad += a.data * out.grad
        out._backward = _backward
        return out, [a, b]
    if kind == "pygrad.Function":
        from helpers import square_function
        a = Value(1.5)
        return square_function().apply(a), [a]
    if kind == "fused model output":
        outs, model = _model_output()
        return outs[1], [outs, model]
    if kind == "a number's leaf (from _prev)":
        a = Value(1.5)
        y = a * 2.0
        (k,) = [c for c in y._prev if c is not a]
        return k, [a, y]
    if kind == "fused hidden node (from _prev)":
        outs, model = _model_output()
        # a neuron by its parameters (ReLU makes ties of data)
        hidden = sorted(outs[0]._prev - set(model.parameters()),
                        key=lambda v: sorted(k.data for k in v._prev))
        return hidden[0], [outs, model, hidden]
    if kind == "data.to_values":
        rows = pygrad.data.to_values(np.array([[1.5, -2.0]]))
        return rows[0][1], [rows]
    raise AssertionError(kind)


KINDS = ["leaf", "op", "op with a number", "custom op", "pygrad.Function", "fused model output",
         "a number's leaf (from _prev)", "fused hidden node (from _prev)", "data.to_values"]
ATTRS = ["_pg_keep", "_pg_a", "_pg_b", "_pg_kids", "_pg_op"]
CLEAN = (TypeError, AttributeError, ValueError, RuntimeError)


def _steps(v, parent):
    """What a user does with a Value, in order: (name, on v itself?, thunk)."""
    def backward():
        v.backward()
        return v.grad

    def parent_backward():
        parent.backward()
        return parent.data, parent.grad

    return [("data", True, lambda: v.data), ("grad", True, lambda: v.grad),
            ("_prev", True, lambda: sorted(k.data for k in v._prev)),
            ("op on it", True, lambda: (v * 2.0 + v).data),
            ("backward", True, backward),
            ("parent", False, parent_backward),
            ("grad after", True, lambda: v.grad),
            ("text", None, lambda: (repr(v), v._op, v.label))]


def _outcomes(v, parent):
    got = {}
    for name, own, thunk in _steps(v, parent):
        try:
            got[name] = thunk()
        except CLEAN as e:
            got[name] = e
    return got


def _other():
    return Value(9.25) * 1.0


HOWS = ["None", "0", "another Value's keep", "del"]


@pytest.mark.parametrize("kind", KINDS)
def test_writing_internal_attributes_then_dropping_the_children(kind):
    """For each internal attribute and each way (set to None, 0, another
    Value's keep; delete), on a Value of this kind: write it, drop the
    Value's children (del and a collection), then use the Value and one
    above it.  Each step gives the numbers of an untouched copy or a clean
    exception, never a freed node (guarded(), ASan); the Value above is
    untouched.  With another Value's keep in _pg_keep, the steps on the
    Value give that other Value's numbers."""
    expect_v, kept = _kind(kind)
    expected = _outcomes(expect_v, expect_v * 3.0 + 1.0)
    expected_other = _outcomes(_other(), _other() * 3.0)
    del expect_v, kept

    cases = []
    for attr in ATTRS:
        for how in HOWS:
            v, kept = _kind(kind)
            parent = v * 3.0 + 1.0
            other = _other()
            written = True
            try:
                if how == "del":
                    delattr(v, attr)
                else:
                    setattr(v, attr, {"None": None, "0": 0,
                                      "another Value's keep": other._pg_keep}[how])
            except CLEAN:
                written = False  # refused: the steps below still run
            swapped = written and attr == "_pg_keep" and how == "another Value's keep"
            cases.append((attr, how, v, parent, swapped))
            del other, kept, v, parent
    gc.collect()
    for attr, how, v, parent, swapped in cases:
        with guarded() as refused:
            got = _outcomes(v, parent)
        assert refused == [], (attr, how)
        for name, own, _ in _steps(v, parent):
            if own is None:
                continue
            want = (expected_other if swapped and own else expected)[name]
            if isinstance(got[name], Exception):
                continue         # a clean exception is fine
            if swapped and name == "_prev" and got[name] == expected[name]:
                continue         # read before the swap: the same set on every read
            assert not isinstance(want, Exception), (attr, how, name, got[name], want)
            assert got[name] == want, (attr, how, name)


def test_writing_internal_attributes_from_another_thread_mid_sweep():
    """The sweep stops in a custom op's _backward (a chosen point); another
    thread writes or deletes the internal attributes of every interior
    Value, drops them and collects; the sweep goes on: the leaves' grads
    are the run alone's, and the touched Values read whole or raise."""
    def build(hook):
        x, w = Value(0.5), Value(-0.75)
        interior, y = [], x
        for i in range(200):
            y = (y * w + 0.5).tanh() if i % 2 else y - w * 0.25
            interior.append(y)
        y = custom(y, 1.5, hook)
        root = (y * x).tanh()
        return root, x, w, interior

    root0, x0, w0, _ = build(None)
    root0.backward()
    alone = (root0.data, x0.grad, w0.grad)

    start, done = threading.Event(), threading.Event()
    other = _other()
    writes = [(a, h) for a in ATTRS for h in ("None", "0", "keep", "del")]
    root, x, w, interior = build(lambda: (start.set(), done.wait()))
    touched = []

    def vandal_attrs():
        start.wait()
        for i, v in enumerate(interior):
            attr, how = writes[i % len(writes)]
            try:
                if how == "del":
                    delattr(v, attr)
                else:
                    setattr(v, attr, {"None": None, "0": 0, "keep": other._pg_keep}[how])
            except CLEAN:
                pass
            if i % 10 == 0:
                touched.append(v)
        interior.clear()
        gc.collect()
        done.set()

    t = threading.Thread(target=vandal_attrs)
    t.start()
    root.backward()
    t.join()
    assert (root.data, x.grad, w.grad) == alone
    with guarded() as refused:
        for v in touched:
            for _, _, thunk in _steps(v, v):
                try:
                    thunk()
                except CLEAN:
                    pass
    assert refused == []


# -- the two holes guarded() finds --------------------------------------------------------

@pytest.mark.parametrize("kind", ["op", "a number's leaf (from _prev)", "fused model output"])
def test_a_kept_backward_method_holds_what_it_touches(kind):
    """micrograd's own loop calls v._backward() for each node of a graph;
    a user who keeps the bound rule and drops the Values (legal Python:
    micrograd's closures hold their Values) must not reach freed nodes."""
    v, kept = _kind(kind)
    with guarded():
        rule = v._backward
        del v, kept
        gc.collect()
        rule()          # guarded: refuses (DeadNode) instead of writing freed memory


class DropsTheKeep(float):
    """A number whose float() drops a Value's keep (run by the setters)."""

    def __new__(cls, x, victim):
        self = super().__new__(cls, x)
        self.victim = [victim]
        return self

    def __float__(self):
        v = self.victim.pop()
        v._pg_keep = None
        gc.collect()
        return 5.0


@pytest.mark.parametrize("field", ["data", "grad"])
@pytest.mark.parametrize("kind", ["a number's leaf (from _prev)", "fused model output",
                                  "data.to_values"])
def test_a_setter_whose_number_drops_the_keep_writes_no_freed_node(kind, field):
    v, kept = _kind(kind)
    del kept
    gc.collect()
    with guarded():
        try:
            setattr(v, field, DropsTheKeep(1.0, v))
        except CLEAN:
            pass


# -- 4. the collector clears a cycle while a callback or a thread lists the heap --------

HEAP_WALK = """
    import gc, sys, threading, weakref
    from pygrad import Value
    from pygrad._core import ffi, lib

    def touch_all():
        n = 0
        for o in gc.get_objects():
            if isinstance(o, Value):
                for f in (lambda: o.data, lambda: o.grad, lambda: o._prev, o.backward,
                          lambda: [k.data for k in o._prev]):
                    try:
                        f()
                    except (TypeError, AttributeError, ValueError, RuntimeError):
                        pass
                n += 1
        return n

    def cycle(k):
        x = Value(0.5 + k)
        y = x
        for i in range(50):
            out = Value(y.data * 2.0, (y,), "double")
            def _backward(out=out, y=y):
                y.grad += 2.0 * out.grad
            out._backward = _backward
            out.me = out
            y = out * 1.0 + 0.25 if i % 2 else out
        y.me = y
        return x, y

    # a callback run by the collector, on a member of a dead cycle
    seen = []
    for k in range(MODE_ROUNDS):
        x, y = cycle(k)
        keep_ref = weakref.ref(y, lambda r: seen.append(touch_all()))
        # and on memory C reads (a custom op's list of children: node
        # memory, a bytes object, takes no weak reference), freed while the
        # cycle is torn down
        below = y._pg_keep
        while not isinstance(below[1], ffi.CData):
            below = below[1]
        node_ref = weakref.ref(below[1], lambda r: seen.append(touch_all()))
        del below
        del x, y
        gc.collect()
    assert len(seen) == 2 * MODE_ROUNDS, seen

    # a thread that lists the heap, released from inside the collection
    go, back = threading.Event(), threading.Event()
    walked = []
    def lister():
        for k in range(MODE_ROUNDS):
            go.wait(); go.clear()
            walked.append(touch_all())
            back.set()
    t = threading.Thread(target=lister); t.start()
    for k in range(MODE_ROUNDS):
        x, y = cycle(k)
        def cb(r):
            go.set(); back.wait(); back.clear()
        r = weakref.ref(y, cb)
        del x, y
        gc.collect()
    t.join()
    assert len(walked) == MODE_ROUNDS

    # what a run alone gives, after all that
    x, y = cycle(0)
    y.backward()
    print(x.grad, y.data)
"""


def test_a_heap_walk_while_the_collector_clears_a_cycle_of_custom_ops():
    out = run_python(HEAP_WALK, timeout=300, prelude="MODE_ROUNDS = 5\n").split()
    alone = run_python(HEAP_WALK.replace("MODE_ROUNDS", "0").replace(
        "assert len(walked) == 0", "pass"), timeout=300).split()
    assert out == alone and float(out[0]) != 0.0


# -- 5. fork() while one thread builds and another runs backward() -----------------------

FORK = """
    import os, threading
    from pygrad import Value

    def scale(a, k, hook):
        out = Value(a.data * k, (a,), "scale")
        def _backward():
            g = out.grad
            hook()
            a.grad += k * g
        out._backward = _backward
        return out

    def graph(hook):
        x, w = Value(0.5), Value(0.9)
        y = x
        for i in range(400):
            y = (y * w + 0.01).tanh()
            if i == 200:
                y = scale(y, 1.5, hook)
        return x, w, y

    def numbers(hook=lambda: None):
        x, w, y = graph(hook)
        y.backward()
        return (x.grad, w.grad, y.data)

    ALONE = numbers()
    stop = threading.Event()
    child = [False]
    forks = []

    def builder():
        while not stop.is_set():
            a = Value(2.0)
            for i in range(300):
                b = a * 1.0 + 1.0
            del a, b

    def fork_here():
        # a chosen point: the sweep of this thread has stopped in a custom op
        pid = os.fork()
        if pid == 0:
            child[0] = True          # this thread is the child's only one: it goes on
        else:
            forks.append(pid)

    def sweeper():
        for k in range(3):
            got = numbers(fork_here)
            if child[0]:
                # the child finishes the sweep it was forked in, then works alone
                ok = got == ALONE and numbers() == ALONE
                os._exit(0 if ok else 3)
            assert got == ALONE

    b = threading.Thread(target=builder); b.start()
    s = threading.Thread(target=sweeper); s.start()
    s.join()
    # and forks from the main thread while the builder runs
    for k in range(3):
        pid = os.fork()
        if pid == 0:
            os._exit(0 if numbers() == ALONE else 3)
        forks.append(pid)
    stop.set(); b.join()
    codes = [os.waitpid(p, 0)[1] for p in forks]
    print(codes.count(0), len(codes))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_fork_mid_sweep_while_another_thread_builds():
    """fork() from inside a custom op's _backward (the forking thread's
    sweep stopped half way) and from the main thread, while a third
    thread builds: each child finishes its sweep and computes alone the
    same numbers as the parent."""
    assert run_python(FORK, timeout=300).split() == ["6", "6"]


# -- 6. resurrection ---------------------------------------------------------------------

def test_resurrected_values_of_a_whole_graph_and_a_custom_op_cycle_compute_right():
    """Every Value of a dropped graph is a Phoenix (its leaf is one): all
    come back, the root's graph (through _prev) is whole, and a new graph
    over the resurrected root backpropagates the numbers of pygrad's
    reference engine; the same for a custom op in a cycle."""
    def build(V, leaf):
        x, w = leaf(0.5), V(-1.25)
        y = x
        for i in range(30):
            y = (y * w).tanh() + x if i % 2 else y * 0.5 - w
        out = leaf(y.data * 3.0, (y,), "triple")

        def _backward():
            y.grad += 3.0 * out.grad
        out._backward = _backward
        out.me = out                                 # a cycle
        return x, w, out

    rx, rw, rout = build(RefValue, RefValue)
    rz = (rout * rout + rw) * 0.5
    rz.backward()

    Phoenix.saved.clear()
    x, w, out = build(Value, Phoenix)
    oid, n = id(out), len(reachable(out))
    del out
    gc.collect()
    (back,) = [v for v in Phoenix.saved if id(v) == oid]
    assert len(reachable(back)) == n
    saved = {id(v) for v in Phoenix.saved}
    phoenixes = [v for v in reachable(back) if type(v) is Phoenix and v is not x]
    assert len(phoenixes) > 30 and all(id(v) in saved for v in phoenixes)
    z = (back * back + w) * 0.5
    z.backward()
    assert (z.data, back.data, x.grad, w.grad, back.grad) == \
        (rz.data, rout.data, rx.grad, rw.grad, rout.grad)
    Phoenix.saved.clear()


# -- 7. gc.freeze(); _prev after the Values were dropped ----------------------------------

def test_gc_freeze_then_graphs_built_and_dropped_with_cycles():
    gc.collect()
    before = internals.live_nodes()
    gc.freeze()
    try:
        for k in range(3):
            x = Value(float(k))
            y = custom(x * 2.0, 1.5)
            y.me = y                                 # a cycle the collector must find
            z = y.tanh()
            z.backward()
            rx = RefValue(float(k))
            rz = custom(rx * 2.0, 1.5, cls=RefValue).tanh()
            rz.backward()
            assert (x.grad, z.data) == (rx.grad, rz.data)
            del x, y, z
        gc.collect()
        assert internals.live_nodes() == before
    finally:
        gc.unfreeze()


def test_prev_walked_twice_after_the_values_were_dropped():
    """A fused model's outputs share hidden nodes, which _prev makes Values
    for on first read: after the model and its inputs are dropped, one walk
    meets each node as one Value, and a second walk meets the same ones."""
    outs, model = _model_output()
    del model
    gc.collect()

    def walk():
        seen = {}
        for v in reachable_all(outs):
            node = internals.node_of(v)
            assert seen.setdefault(node, v) is v     # one Value per node
        return seen

    first = walk()
    gc.collect()
    second = walk()
    assert first.keys() == second.keys()
    assert all(first[k] is second[k] for k in first)
    assert len(first) == 2 + 3 + 17 + 2              # outputs, hidden, parameters, inputs
    want = sorted(v.data for v in first.values())
    outs2, model2 = _model_output()
    assert sorted(internals.node_of(v) for v in first.values()) == sorted(first)
    assert want == sorted(v.data for v in reachable_all(outs2))


def reachable_all(roots):
    seen, out = set(), []
    for r in roots:
        for v in reachable(r):
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out
