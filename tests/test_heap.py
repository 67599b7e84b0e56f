"""Lifetime without the heap (issue 24): nothing scales with the Python
heap, the object graph is stable as micrograd's, and a failed backward()
changes nothing.

Big heaps are tested by ratio: the same work with and without 1M extra
small objects alive, in one process, so that only growth with the heap
(not the machine's speed) can fail them."""
import gc
import math
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import pygrad
from pygrad import Value, engine, nn
from pygrad._core import lib

from helpers import micrograd_style_tanh
from interrupts import PYGRAD_CODE, Interrupter
import internals

_tanh = micrograd_style_tanh(Value)


def live() -> int:
    gc.collect()
    engine.settle()
    return internals.live_nodes()


def walk(root):
    """A drawing helper's trace: by identity, through _prev."""
    seen, out, stack = set(), [], [root]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        out.append(v)
        stack.extend(v._prev)
    return out


def chain_graph(n):
    a = Value(0.5, label="a")
    x = a
    for i in range(n):
        x = (x * 1.01 + a).relu() - 0.25 * x
    return x


# -- a stable object graph --------------------------------------------------------

def test_walking_twice_meets_the_same_objects_though_the_user_dropped_them():
    root = chain_graph(100)
    gc.collect()
    engine.settle()                      # every dropped interior Value is gone
    first = walk(root)
    gc.collect()
    engine.settle()
    second = walk(root)
    assert len(first) == len(second) == 1 + 100 * 7
    assert all(a is b for a, b in zip(first, second))
    # attributes set in one walk are there in the next
    for i, v in enumerate(first):
        v.seen = i
    assert [v.seen for v in walk(root)] == list(range(len(first)))


def test_prev_hands_out_the_held_values():
    a, b = Value(2.0), Value(3.0)
    c = a * b
    assert c._prev == {a, b} and all(v in (a, b) for v in c._prev)
    d = c + 1.0
    e = d * a
    assert any(v is c for v in d._prev)
    engine.settle()
    assert any(v is d for v in e._prev) and any(v is a for v in e._prev)


def test_identity_holds_after_gc_freeze():
    gc.collect()
    gc.freeze()
    try:
        a, b = Value(1.5), Value(-2.0)
        c = a * b
        d = c.relu() + c
        gc.collect()
        engine.settle()
        assert c in d._prev and a in c._prev
        first = walk(d)
        assert all(x is y for x, y in zip(first, walk(d)))
        before = internals.live_nodes()
        del first, d, c
        gc.collect()
        engine.settle()
        assert internals.live_nodes() < before           # frozen or not, dropped goes
    finally:
        gc.unfreeze()


def test_prev_from_threads_hands_out_the_values_each_thread_holds():
    errors = []

    def work(seed):
        try:
            w = Value(0.1 * seed)
            for _ in range(2000):
                x = Value(float(seed))
                y = x * w
                z = y + x
                if not (any(v is y for v in z._prev) and any(v is x for v in z._prev)):
                    errors.append("a Value that is not the one this thread holds")
                    return
        except BaseException as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_thread_that_ends_lets_its_segment_go():
    before = live()

    def work():
        y = Value(1.0)
        for _ in range(100):
            y = y * 1.0001 + 0.5
        assert y.data > 1.0

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert live() == before


# -- lifetime ----------------------------------------------------------------------

def mul_chain(n: int) -> Value:
    """A forward-only chain of n products (2n nodes)."""
    y = Value(1.0)
    for _ in range(n):
        y = y * 1.0000001
    return y


def test_a_graph_dropped_without_backward_is_freed_at_del():
    before = live()
    y = mul_chain(50_000)
    assert internals.live_nodes() - before >= 100_000
    del y
    assert internals.live_nodes() == before           # no collection, no settle()


def test_micrograd_style_custom_graphs_hold_flat_memory_without_settle():
    before = live()
    for _ in range(30):
        y = Value(0.2)
        for _ in range(300):
            y = _tanh(y * 0.9 + 0.1)
        y.backward()
        del y
    gc.collect()
    assert internals.live_nodes() == before          # closures' cycles: one collection


def test_a_dropped_graph_is_freed_by_gc_collect_as_micrographs_is():
    # micrograd's closures make cycles, so its dropped graph goes at a
    # collection; pygrad's goes at the same one (a full-collection callback
    # settles), whether its top is in an open segment or not.
    before = live()
    y = mul_chain(50_000)
    assert internals.live_nodes() - before >= 100_000
    del y
    gc.collect()
    assert internals.live_nodes() == before
    # custom ops (Python-held, closure cycles): freed by one collection too
    y = Value(0.3)
    for _ in range(3_000):
        y = _tanh(y * 0.9 + 0.1)
    y.backward()
    assert internals.live_nodes() - before >= 9_000
    del y
    gc.collect()
    assert internals.live_nodes() == before


def test_backward_does_not_record_for_a_custom_op_elsewhere():
    keep = _tanh(Value(0.3))             # a closure alive, not below the root
    assert internals.runs_python_backward(keep)
    x = Value(2.0)
    y = x * x
    sweeps = []
    real = pygrad.engine.record_backward
    pygrad.engine.record_backward = lambda *args: sweeps.append(args) or real(*args)
    try:
        y.backward()
        (keep * x).backward()
    finally:
        pygrad.engine.record_backward = real
    assert len(sweeps) == 1               # only the root above the closure recorded
    assert x.grad == 4.0 + keep.data


def test_a_failing_closure_leaves_every_grad_as_it_was():
    w = Value(0.4)
    a = Value(-1.5)

    def failing(x):
        out = Value(x.data * 2, (x,), "boom")

        def _backward():
            x.grad += 2 * out.grad
            raise RuntimeError("boom")
        out._backward = _backward
        return out

    y = (failing(w * a - a / w) + w * 3.0) * a
    w.grad, a.grad = 0.25, -0.5
    with pytest.raises(RuntimeError, match="boom"):
        y.backward()
    assert (w.grad, a.grad, y.grad) == (0.25, -0.5, 0.0)
    # and the hidden grads of - and / too: a later good pass is exact
    z = (w * a - a / w) * a
    z.backward()
    r = pygrad.reference.Value
    rw, ra = r(0.4), r(-1.5)
    rz = (rw * ra - ra / rw) * ra
    rz.backward()
    assert (w.grad - 0.25, a.grad + 0.5) == pytest.approx((rw.grad, ra.grad), rel=1e-15)


def test_an_interrupted_backward_leaves_every_grad_as_it_was():
    w = Value(0.7)
    x = w
    for _ in range(20):
        x = _tanh(x * 1.1)

    calls = []
    target = x

    def interrupt():
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
    for v in walk(x):
        if v._op == "mytanh":
            fn = v._backward

            def wrapped(fn=fn):
                interrupt()
                fn()
            v._backward = wrapped
    with pytest.raises(KeyboardInterrupt):
        target.backward()
    assert len(calls) == 5
    assert w.grad == 0.0 and target.grad == 0.0


def _interrupt_every_point_of_backward(graph):
    """backward() from graph()'s root with a Ctrl-C injected at each
    bytecode of pygrad's code in turn (before, around and right after the
    C sweep), checked against a twin graph that only ever ran the passes
    that finished: a pass is applied whole or not at all, every grad
    (interior ones too) stays equal, and a retry after all that is exact."""
    (w, y), (w2, y2) = graph(), graph()
    counter = Interrupter(None, opcodes=True, prefixes=(PYGRAD_CODE,))
    sys.settrace(counter)
    try:
        y.backward()
    finally:
        sys.settrace(None)
    y2.backward()
    assert (w.grad, y.grad) == (w2.grad, y2.grad)
    assert counter.events > 5
    interrupted = 0
    n = 0
    while True:         # until a call runs to its end (its events vary a little by Python)
        n += 1
        assert n <= 4 * counter.events, "backward() never ran to its end"
        before = (w.grad, y.grad)
        tracer = Interrupter(n, opcodes=True, prefixes=(PYGRAD_CODE,))
        sys.settrace(tracer)
        raised = False
        try:
            y.backward()
        except KeyboardInterrupt:
            raised = True
        finally:
            sys.settrace(None)
        assert raised == (tracer.fired is not None), tracer.fired     # never swallowed
        if (w.grad, y.grad) != before:      # the pass ran (and then the interrupt rose)
            y2.backward()
        assert (w.grad, y.grad) == (w2.grad, y2.grad), (n, tracer.fired)
        if not raised:                      # every point covered
            break
        interrupted += 1
    assert interrupted >= 5
    y.backward()
    y2.backward()
    assert (w.grad, y.grad) == (w2.grad, y2.grad)


def test_a_ctrl_c_at_any_point_of_the_recorded_sweep_leaves_every_grad_whole():
    """The recorded sweep (a custom op lies below the root): a Ctrl-C that
    rises from it puts every grad back rather than leave them half applied
    (a retry would double them)."""
    def graph():
        w = Value(0.999)
        y = Value(1.0)
        for _ in range(2_000):
            y = y * w + 0.001
        return w, _tanh(y)          # a custom op on top: the recorded sweep

    _interrupt_every_point_of_backward(graph)


def test_a_ctrl_c_at_any_point_of_a_plain_c_sweep_leaves_it_whole():
    """With no custom op below the root, backward() is one call into C that
    no Ctrl-C can cut: one that rises around it finds every grad applied
    (as documented) or none, never half of them."""
    def graph():
        w = Value(0.999)
        y = Value(1.0)
        for _ in range(2_000):
            y = y * w + 0.001
        return w, y

    _interrupt_every_point_of_backward(graph)

# -- nothing grows with the heap ------------------------------------------------

def _loops():
    """Small versions of the issue's loops: (name, seconds)."""
    import random
    random.seed(0)
    out = {}
    model = nn.MLP(2, [8, 8, 1])
    kept = []
    t = time.perf_counter()
    for _ in range(40):
        xs = [[random.uniform(-1, 1), random.uniform(-1, 1)] for _ in range(4)]
        loss = sum(((model(x) - 1.0) ** 2 for x in xs), Value(0.0))
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data -= 0.01 * p.grad
        kept.append(loss)
    out["kept-loss loop"] = time.perf_counter() - t
    t = time.perf_counter()
    y = Value(1.0)
    for i in range(6000):
        y = y * 1.0001 + 0.1
        if i % 20 == 0:
            y._prev
    out["_prev every 20 ops"] = time.perf_counter() - t
    t = time.perf_counter()
    held = [Value(1.0)]
    for _ in range(30_000):
        held.append(held[-1] * 1.0001)
    out["holding every Value"] = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(3):
        walk(chain_graph(200))
    out["walks"] = time.perf_counter() - t
    return out


def test_no_loop_looks_at_the_heap(monkeypatch):
    """None of the loops calls a function that walks Python's heap (what
    their time does with 2M objects alive is measured by
    ``benchmarks/bench_dropin.py --heap``, not here)."""
    def refuse(*args, **kwargs):
        raise AssertionError("pygrad walked the Python heap")
    for name in ("get_referrers", "get_referents", "get_objects"):
        monkeypatch.setattr(gc, name, refuse)
    _loops()
    engine.settle()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc")
def test_keeping_one_interior_value_per_step_fits_1_gib_of_address_space():
    script = textwrap.dedent("""
        import resource, random
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from pygrad import Value
        random.seed(0)
        w = [Value(random.uniform(-1, 1)) for _ in range(3)]
        keep = []
        for step in range(20_000):
            x = Value(random.uniform(-1, 1))
            h = (w[0] * x + w[1]).relu()
            loss = ((h * w[2] + x) ** 2) * 0.5 + h
            loss.backward()
            keep.append(h)
            for p in w:
                p.grad = 0
        print("ok", len(keep))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600, cwd=os.path.dirname(os.path.abspath(__file__)),
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stdout + out.stderr


def test_building_while_keeping_every_value_costs_one_keep_each():
    """What once made this quadratic was work per segment that grew with the
    Values kept.  Now nothing scans: each kept Value holds its node object,
    and the graph's nodes are exactly the Values' nodes."""
    gc.collect()
    before = internals.live_nodes()
    held = [Value(1.0)]
    for i in range(100_000):
        held.append(held[-1] * 1.0000001)
    assert all(internals.node_of(v) for v in held)
    assert internals.live_nodes() - before == 2 * len(held) - 1   # each op's number is a leaf
    assert math.isfinite(held[-1].data)
    del held
    gc.collect()
    assert internals.live_nodes() == before


def test_a_falsy_value_subclass_is_settled_as_any_value():
    class Falsy(Value):
        def __bool__(self):
            return False

    keep = [Falsy(1.0) for _ in range(4106)]
    for _ in range(4096):
        Value(2.0) * 3.0
    gc.collect()
    engine.settle()
    assert all(v.data == 1.0 for v in keep)
    assert internals.live_nodes() >= len(keep)
