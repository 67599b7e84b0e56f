"""Node lifetime (csrc/memory.c): a kept Value pins only what micrograd
would pin, custom ops hold flat memory, and faults (MemoryError, fork,
interrupts, a refused munmap) leave the engine working and leak nothing.

Memory is asserted on live C nodes, which are exact, not on RSS."""
import functools
import gc
import os
import sys

import pytest

from pygrad import Value, engine
from pygrad._core import lib

from helpers import micrograd_style_tanh, run_python
import internals


def live() -> int:
    """Live C nodes once Python has dropped what it can: the cycles of
    custom ops (gc), and nodes whose Values are gone (settle)."""
    gc.collect()
    engine.settle()
    return internals.live_nodes()


def chain(w: Value, rounds: int, keep_at: int = -1):
    """y <- y * w + 1.0: three nodes a round (mul, the constant, add)."""
    y, kept = Value(1.0), None
    for i in range(rounds):
        y = y * w + 1.0
        if i == keep_at:
            kept = y
    return y, kept


# -- the scenarios of the object-model issue, on live C nodes --------------------

@pytest.mark.slow     # seconds: the default run stays near 90 s
def test_keeping_a_leaf_made_before_backward_pins_only_that_leaf():
    w = Value(0.999)
    before = live()
    kept = []
    for _ in range(100):
        y, _ = chain(w, 20_000 // 3)
        kept.append(Value(y.data))
        y.backward()
        del y
    assert live() - before == 100
    # Each kept leaf may keep the address space of its segment, no more.
    assert internals.live_segments() <= 100 + 4


def test_dropped_graphs_keep_a_bounded_number_of_segments_with_the_collector_on_or_off():
    """A loop whose graphs are dropped frees them at once (reference
    counting, no settle), with the collector on or off."""
    w = Value(0.999)
    was_enabled = gc.isenabled()
    try:
        for collector in (True, False):
            gc.enable() if collector else gc.disable()
            live()
            most_segments = 0
            for step in range(60):
                y, _ = chain(w, 4_000)          # 12,000 nodes: three segments a step
                y.backward()
                del y
                most_segments = max(most_segments, internals.live_segments())
            assert most_segments <= 12, (collector, most_segments)
    finally:
        gc.enable() if was_enabled else gc.disable()


def test_keeping_an_early_interior_node_pins_exactly_its_subgraph():
    w = Value(0.999)
    before = live()
    kept = []
    for _ in range(100):
        y, mid = chain(w, 300, keep_at=99)
        y.backward()
        kept.append(mid)
        del y, mid
    # each kept node reaches 100 rounds of 3 nodes, and the leaf y0
    assert live() - before == 100 * (100 * 3 + 1)
    assert all(k.grad != 0.0 for k in kept)
    del kept
    assert live() == before


def test_custom_ops_feeding_each_other_hold_flat_memory():
    tanh = micrograd_style_tanh(Value)
    w = Value(0.3)
    before = live()
    for _ in range(20):
        y = Value(0.1)
        for _ in range(500):
            y = tanh(y * w + 0.2)
        y.backward()
        del y
    assert live() == before


def test_moons_loop_keeping_each_loss_as_a_number_pins_only_those_leaves():
    from training import moons_model, train_moons
    model = moons_model(0, "eager")
    before = live()
    history = []
    train_moons(model, 0, "eager", steps=20, batch=8,
                after_step=lambda k: history.append(Value(k)))
    assert live() - before == 20


def _backward_reaching_through(kind: str):
    """A custom op whose closure reaches its Values a given way."""
    def op(x):
        out = Value(2 * x.data, (x,), "dbl")
        if kind == "cell":
            def fn():
                x.grad += 2 * out.grad
        elif kind == "dict":
            env = {"x": x, "out": out}

            def fn():
                env["x"].grad += 2 * env["out"].grad
        elif kind == "partial":
            def push(a, o):
                a.grad += 2 * o.grad
            fn = functools.partial(push, x, out)
        else:
            class Rule:
                def __init__(self):
                    self.a, self.o = x, out

                def run(self):
                    self.a.grad += 2 * self.o.grad
            fn = Rule().run
        out._backward = fn
        return out
    return op


@pytest.mark.parametrize("kind", ["cell", "dict", "partial", "bound method"])
def test_closures_reaching_values_any_way_hold_flat_memory(kind):
    op = _backward_reaching_through(kind)
    w = Value(0.5)
    before = live()
    for _ in range(10):
        y = Value(1.0)
        for _ in range(200):
            y = op(y * w)
        y.backward()
        assert y.grad == 1.0
        del y
    assert live() == before


def test_gradients_through_python_held_nodes_are_the_reference_engines():
    from pygrad import reference
    results = []
    for V in (Value, reference.Value):
        tanh = micrograd_style_tanh(V)
        w = V(0.3)
        y = V(0.1)
        for i in range(50):
            y = tanh(y * w + 0.2) if i % 2 else (y * w).tanh() + 0.1
        y.backward()
        results.append((y.data, w.grad))
    assert results[0] == results[1]


# -- the handle space -------------------------------------------------------------

def test_kept_leaves_pack_densely_and_never_open_graph_segments():
    segs = internals.live_segments()
    keep = [Value(float(i)) for i in range(3 * internals.SEG_NODES)]
    assert internals.live_segments() - segs <= 4
    assert keep[-1].data == 3 * internals.SEG_NODES - 1
    del keep
    gc.collect()
    assert internals.live_segments() - segs <= 1


@pytest.mark.test_hooks
def test_a_full_handle_space_says_so():
    keep = []
    lib.pg_limit_segments(internals.live_segments() + 2)
    try:
        with pytest.raises(MemoryError, match="handle space is full"):
            for _ in range(4 * internals.SEG_NODES):
                keep.append(Value(1.0))
    finally:
        lib.pg_limit_segments(0)
    del keep
    assert (Value(2.0) * 3.0).data == 6.0


# -- faults --------------------------------------------------------------------------

@pytest.mark.test_hooks
def test_a_refused_munmap_keeps_the_mapping_for_reuse():
    w = Value(0.5)
    failed = internals.unmap_failed()
    for n in range(1, 4):
        lib.pg_fail_unmap(n)
        y, _ = chain(w, 60 * internals.SEG_NODES // 3)   # more segments than the pool keeps
        y.backward()
        expected = w.grad
        del y
        engine.settle()
        lib.pg_fail_unmap(0)
        w.grad = 0.0
        y, _ = chain(w, 60 * internals.SEG_NODES // 3)
        y.backward()
        assert w.grad == expected
        del y
        w.grad = 0.0
    assert internals.unmap_failed() - failed == 3


# For the fork tests' scripts: a child that hangs (on a lock a vanished
# thread held) fails the run instead of hanging it.
WAIT_FOR_CHILD = """
def wait_for_child(pid, i, seconds):
    import os, time
    deadline = time.time() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            os.kill(pid, 9)
            raise SystemExit("child %d hung" % i)
        time.sleep(0.01)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def fork_children(n, child, seconds=20, pause=0.005):
    # n children in turn, each running child() (True: it went right)
    import os, time
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                good = child()
            except BaseException:
                good = False
            os._exit(0 if good else 3)
        wait_for_child(pid, i, seconds)
        time.sleep(pause)
    return n
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc")
def test_after_a_real_memory_error_dropping_the_graph_frees_it():
    out = run_python("""
        import gc, resource
        from pygrad import Value, engine
        from pygrad._core import lib
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * 4096
        limit = size + 400 * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        w = Value(0.5)
        before = lib.pg_live_nodes()
        for attempt in range(3):
            y = Value(1.0)
            try:
                while True:
                    y = y * w + 1.0
            except MemoryError:
                pass
            made = lib.pg_live_nodes() - before
            del y
            engine.settle()
            assert lib.pg_live_nodes() == before, lib.pg_live_nodes() - before
            a = Value(2.0)
            z = (a * a + a).tanh()
            z.backward()
            assert a.grad != 0.0 and made > 500_000, made
            del a, z
        print("ok", made)
    """)
    assert out.startswith("ok")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
def test_fork_while_another_thread_is_inside_backward():
    out = run_python("""
        import os, threading, time
        from pygrad import Value
        stop = False
        def busy():
            w = Value(0.999)
            while not stop:
                y = Value(1.0)
                for _ in range(20_000):
                    y = y * w + 1.0
                y.backward()
        t = threading.Thread(target=busy)
        t.start()
        time.sleep(0.2)
        def child():
            a = Value(2.0)
            y = a
            for _ in range(5000):
                y = (y * a + 1.0).relu()
            (a * a + a).backward()
            return a.grad == 5.0
        ok = fork_children(20, child)
        stop = True
        t.join()
        print("ok", ok)
    """, prelude=WAIT_FOR_CHILD)
    assert out.strip() == "ok 20"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
def test_fork_while_threads_register_custom_op_values():
    """Custom ops register under the lifetime lock, which a forked child
    remakes: a child forked while another thread held it makes custom ops
    and runs backward() through them (it would hang on the old lock)."""
    out = run_python("""
        import math, os, sys, threading, time, warnings
        warnings.simplefilter("ignore", DeprecationWarning)   # 3.12: fork with threads
        from pygrad import Value
        from helpers import micrograd_style_tanh, run_python
        sys.setswitchinterval(1e-5)
        tanh = micrograd_style_tanh(Value)
        stop = False
        def busy():
            while not stop:
                y = Value(0.3)
                for _ in range(200):
                    y = tanh(y)
                y.backward()
        threads = [threading.Thread(target=busy, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.1)
        def child():
            a = Value(0.5)
            tanh(tanh(a) * 2.0).backward()
            t1 = math.tanh(0.5)
            t2 = math.tanh(t1 * 2.0)
            return a.grad == (1 - t2 ** 2) * 2.0 * (1 - t1 ** 2)
        ok = fork_children(40, child, pause=0.002)
        stop = True
        for t in threads:
            t.join()
        print("ok", ok)
    """, prelude=WAIT_FOR_CHILD)
    assert out.strip() == "ok 40"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_fork_while_threads_are_inside_map_replay_optimizers_and_nn():
    """Children forked while four threads run Program.map, replay, optimizer
    steps and nn training use the same (inherited) program, model and
    optimizer: none hangs on a lock a vanished thread held, and every result
    is exact."""
    out = run_python("""
        import os, threading, time
        import warnings
        import numpy as np
        import pygrad
        from pygrad import Value, nn, optim
        warnings.simplefilter("ignore", DeprecationWarning)   # 3.12: fork with threads

        x0, x1, w = Value(0.0), Value(0.0), Value(0.5)
        batch = pygrad.compile((w * x0 - x1).tanh(), inputs=[x0, x1])
        rows = np.linspace(-1, 1, 20_000).reshape(-1, 2)
        expected_map = batch.map(rows[:4]).tolist()
        a = Value(1.5)
        replay = pygrad.compile((a * a + a).exp())
        model = nn.MLP(2, [8, 1])
        params = model.parameters()
        opt = optim.Adam(params, lr=0.01)
        stop = False

        def mapping():
            while not stop:
                batch.map(rows, grad=np.ones(len(rows)))
        def replaying():
            while not stop:
                replay.forward()
                replay.backward()
        def stepping():
            while not stop:
                opt.step()
                opt.zero_grad()
        def training():
            m = nn.MLP(2, [8, 8, 1])
            while not stop:
                m([0.5, -0.5]).backward()
        threads = [threading.Thread(target=f, daemon=True)     # a hung child ends the run
                   for f in (mapping, replaying, stepping, training)]
        for t in threads:
            t.start()
        time.sleep(0.2)
        def child():
            good = batch.map(rows[:4]).tolist() == expected_map
            replay.forward()
            good = good and replay.forward() == replay.output.data
            m2 = nn.MLP(2, [3, 1])
            before = [p.data for p in params]
            opt.zero_grad()
            model([1.0, 2.0]).backward()
            opt.step()
            good = good and [p.data for p in params] != before
            m2([1.0, 1.0]).backward()
            return good
        ok = fork_children(12, child, seconds=30, pause=0)
        stop = True
        for t in threads:
            t.join()
        print("ok", ok)
    """, timeout=300, prelude=WAIT_FOR_CHILD)
    assert out.strip() == "ok 12"


def _storm_step(V, params, x):
    tanh = micrograd_style_tanh(V)
    w1, w2, b = params
    h = tanh(w1 * x[0] + w2 * x[1] + b)
    y = (h * w1 - b).relu() + (h * h).exp() * 0.5
    for _ in range(3):
        y = tanh(y * w2) + y * 0.5
    return y


def test_an_interrupt_at_any_point_never_changes_results_or_leaks():
    """KeyboardInterrupt at each bytecode of pygrad's code in turn while a
    step builds (C ops, custom ops, a fused layer), backpropagates and
    replays: every completed step still gives the reference engine's
    gradients, and nothing is left behind.  (Injected at a chosen point
    by a trace function, so the machine's load can't change what runs.)"""
    import pygrad
    from pygrad import nn, reference
    from interrupts import PYGRAD_CODE, Interrupter

    x = (0.3, -0.2)
    rp = [reference.Value(0.5), reference.Value(-0.7), reference.Value(0.1)]
    _storm_step(reference.Value, rp, x).backward()
    expected = [p.grad for p in rp]
    params = [Value(0.5), Value(-0.7), Value(0.1)]
    layer = nn.Layer(2, 3)
    gc.collect()
    base = lib.pg_live_nodes()

    def attempt():
        for p in params:
            p.grad = 0.0
        _storm_step(Value, params, x).backward()
        got = [p.grad for p in params]
        z = sum(layer([Value(1.0), Value(-2.0)])) * params[0]
        prog = pygrad.compile(z)
        prog.forward()
        prog.backward()
        return got

    counter = Interrupter(None, opcodes=True, prefixes=(PYGRAD_CODE,))
    sys.settrace(counter)
    try:
        assert attempt() == expected
    finally:
        sys.settrace(None)
    assert counter.events > 200
    hits = 0
    for n in range(1, counter.events + 1, 3):
        tracer = Interrupter(n, opcodes=True, prefixes=(PYGRAD_CODE,))
        sys.settrace(tracer)
        raised = False
        try:
            attempt()
        except KeyboardInterrupt:
            raised = True
        finally:
            sys.settrace(None)
        assert raised == (tracer.fired is not None), tracer.fired   # never swallowed
        hits += raised
        assert attempt() == expected, tracer.fired      # the next step is exact
    assert hits >= counter.events // 4
    gc.collect()
    assert lib.pg_live_nodes() == base


@pytest.mark.skipif(sys.version_info[:2] == (3, 12),
                    reason="CPython 3.12's inlined comprehensions break the stdlib's own "
                           "imports under a tracer that reads f_locals (ast.py: KeyError: None)")
def test_importing_under_a_tracer_that_reads_f_locals_leaves_values_whole():
    """A trace function reading f_locals (a debugger, a variable snooper)
    while pygrad is imported changes nothing of what the Values made after
    it hold: a collection frees only the dead one."""
    out = run_python("""
        import gc, sys
        from helpers import micrograd_style_tanh, run_python
        def tracer(frame, event, arg):
            frame.f_locals
            return tracer
        sys.settrace(tracer)
        from pygrad import Value, engine
        from pygrad._core import lib
        sys.settrace(None)
        a = Value(3.0)                       # held by one name only
        y = micrograd_style_tanh(Value)(Value(0.5)) * 2.0
        tmp = Value(4.0) * 2.0
        del tmp
        gc.collect()
        engine.settle()
        assert lib.pg_alive(a._h) and lib.pg_alive(y._h)
        y.backward()
        print("ok", a.data, y.data)
    """)
    assert out.split()[:2] == ["ok", "3.0"]
