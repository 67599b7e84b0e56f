"""Sound lifetime: Python decides when a node dies (csrc/memory.c).

Each test is a way legal Python broke the reference-count settling that
came before: another thread listing the heap, finalizers that resurrect a
Value (plainly or from a cycle), ``gc.freeze()``, finalizers and signal
handlers that make nodes inside ops, ``fork()`` from a busy process, a
Ctrl-C at any instruction of an op.  Expected everywhere: no crash, no
wrong number, nothing leaked.  Thread tests run a fixed amount of work
(never "for n seconds") and pass under any interleaving; the ones that
could crash the interpreter run in a subprocess, so a crash fails the test.
"""
import gc
import os
import pathlib
import re
import sys
import threading
import weakref

import pytest

import pygrad
from pygrad import Value, nn
from pygrad._core import lib

from helpers import run_python
import internals

PACKAGE = pathlib.Path(pygrad.__file__).resolve().parent


def live() -> int:
    gc.collect()
    return internals.live_nodes()


# -- the principle, in the code ---------------------------------------------------

def test_pygrad_reads_no_reference_count_and_hooks_nothing_of_pythons():
    """pygrad learns that a node is dead only from an owner's deallocation:
    it reads no count, registers no collector callback, replaces no
    unraisable hook, walks no thread's frames and starts no thread."""
    banned = re.compile(r"getrefcount|gc\.callbacks|unraisablehook|_current_frames|"
                        r"threading\.Thread\b|threading\.Timer\b|_thread\.start_new|"
                        r"start_new_thread")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if banned.search(code):
                found.append(f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert found == []
    c = (PACKAGE.parent / "csrc").glob("*.c")
    assert not any("Py_REFCNT" in p.read_text(encoding="utf-8") for p in c)


# -- another thread lists the heap ----------------------------------------------------

HEAP_LISTERS = """
    import gc, sys, threading
    from pygrad import Value
    sys.setswitchinterval(1e-6)
    listers = LISTERS
    done = threading.Event()
    seen = [0]

    def builder():
        for round in range(6):
            a = Value(7.0)
            for i in range(3000):
                b = a * 1.0
                c = (b + 2.0).tanh()
            c.backward()
            assert a.grad != 0.0
            del a, b, c
        done.set()

    def lister(k):
        while not done.is_set():
            got = [o for o in gc.get_objects() if isinstance(o, Value)]
            if k % 2:
                got += [r for o in got[:50] for r in gc.get_referrers(o) if isinstance(r, Value)]
            for o in got:
                d = o.data
                assert d == d
                o.grad
                o._prev
            seen[0] += len(got)
            del got

    ts = [threading.Thread(target=builder)] + [threading.Thread(target=lister, args=(k,))
                                               for k in range(listers)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    print("ok")
"""


@pytest.mark.parametrize("listers", [1, 4])
def test_threads_listing_the_heap_while_graphs_are_built_and_dropped(listers):
    """gc.get_objects() and gc.get_referrers() in 1-4 other threads (what
    memory profilers and debuggers do) hand out every Value, live or about
    to die; each one read must be whole.  This crashed on 4 runs of 4."""
    out = run_python(HEAP_LISTERS, timeout=600, prelude=f"LISTERS = {listers}\n")
    assert out.strip() == "ok"


# -- resurrection ------------------------------------------------------------------

class Phoenix(Value):
    """A Value that keeps itself as it dies."""
    saved: list = []

    def __del__(self):
        Phoenix.saved.append(self)


def test_a_value_resurrected_by_its_del_keeps_its_node_and_data():
    Phoenix.saved.clear()
    p = Phoenix(42.0)
    del p
    gc.collect()
    filler = [Value(float(i)) * 2.0 for i in range(10_000)]
    del filler
    gc.collect()
    (v,) = [k for k in Phoenix.saved if k.data == 42.0]
    y = v * 2.0 + 1.0
    y.backward()
    assert (y.data, v.grad) == (85.0, 2.0)
    Phoenix.saved.clear()


def test_a_value_resurrected_from_a_cycle_keeps_its_node():
    """A micrograd-style custom op whose closure refers to its own node,
    resurrected by its __del__ when the collector finds the cycle."""
    Phoenix.saved.clear()
    x = Value(0.5)

    def custom(a):
        out = Phoenix(a.data * 3.0, (a,), "triple")

        def _backward():
            a.grad += 3.0 * out.grad
        out._backward = _backward           # the cycle: out -> closure -> out
        return out

    y = custom(x)
    top = Value(1.0) + y                  # a plain Value above it (the left class wins)
    del y, top
    gc.collect()
    filler = [Value(float(i)) * 2.0 for i in range(10_000)]
    del filler
    gc.collect()
    (v,) = [k for k in Phoenix.saved if k.data == 1.5]
    z = v * 2.0
    z.backward()
    assert (v.grad, x.grad) == (2.0, 6.0)
    Phoenix.saved.clear()
    del v, z
    before = live()
    assert before >= 0


def test_gc_freeze_keeps_what_it_froze_and_frees_the_rest():
    before = live()
    kept = Value(3.0) * Value(4.0)
    gc.freeze()
    try:
        for _ in range(5):
            y = kept * 2.0
            for _ in range(2000):
                y = y * 1.0
            y.backward()
            del y
        assert kept.data == 12.0 and kept.grad == 5.0 * 2.0
    finally:
        gc.unfreeze()
    del kept
    assert live() == before


# -- finalizers and handlers inside ops; fork; Ctrl-C -----------------------------------

def test_a_finalizer_that_makes_nodes_inside_every_op_leaves_results_whole():
    """A collection at every allocation, whose finalizer builds and drops
    a graph, while a model trains: the same numbers as without it."""
    class Noisy:
        def __init__(self):
            self.me = self

        def __del__(self):
            t = Value(1.0)
            for _ in range(50):
                t = t * 1.0001 + 0.5
            t.backward()

    def run(noisy):
        import random
        random.seed(3)
        model = nn.MLP(2, [4, 1])
        losses = []
        threshold = gc.get_threshold()
        if noisy:
            gc.set_threshold(1)
        try:
            for step in range(3):
                if noisy:
                    Noisy()
                out = model([Value(0.5), Value(-1.5)])
                loss = (out - 1.0) ** 2
                model.zero_grad()
                loss.backward()
                for p in model.parameters():
                    p.data -= 0.1 * p.grad
                losses.append(loss.data)
        finally:
            gc.set_threshold(*threshold)
        return losses, [p.data for p in model.parameters()]

    assert run(True) == run(False)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_fork_while_another_thread_builds():
    script = """
        import os, sys, threading
        from pygrad import Value
        stop = threading.Event()
        def builder():
            while not stop.is_set():
                a = Value(2.0)
                for i in range(200):
                    b = a * 1.0 + 1.0
                b.backward()
        t = threading.Thread(target=builder); t.start()
        codes = []
        for k in range(4):
            pid = os.fork()
            if pid == 0:
                x = Value(3.0)
                y = (x * x + 1.0).tanh()
                y.backward()
                os._exit(0 if x.grad > 0 and abs(y.data - 0.9999999958776927) < 1e-15 else 3)
            codes.append(os.waitpid(pid, 0)[1])
        stop.set(); t.join()
        print(codes.count(0))
    """
    assert run_python(script, timeout=600).strip() == "4"


def _ops_to_cut():
    a, b = Value(1.5), Value(-2.0)
    layer = nn.Layer(2, 3)
    return [
        ("mul", lambda: a * b), ("add number", lambda: a + 2.0), ("rsub", lambda: 3.0 - a),
        ("tanh", lambda: a.tanh()), ("pow", lambda: a ** 2), ("pow Value", lambda: a ** b),
        ("leaf", lambda: Value(0.25)), ("custom", lambda: Value(1.0, (a, b), "mine")),
        ("sum", lambda: pygrad.functional.sum([a, b, a])),
        ("layer", lambda: layer([a, b])),
    ]


@pytest.mark.parametrize("kind", [k for k, _ in _ops_to_cut()])
def test_a_ctrl_c_at_any_instruction_of_an_op_leaks_nothing_and_is_never_lost(kind):
    """A KeyboardInterrupt raised at the n-th bytecode instruction run by
    the op (a tracer counting opcodes: chosen points, not a race), for every
    n until the op completes: it always reaches the caller, the op's node
    goes with its claim, and a completed op's result is right."""
    ops = dict(_ops_to_cut())
    op = ops[kind]

    def warm(frame, event, arg):
        frame.f_trace_opcodes = True
        return warm

    # CPython 3.12 gives a code object opcode events only from its second
    # traced run on (its first gives lines): the expected run is traced.
    sys.settrace(warm)
    try:
        expected = op()
    finally:
        sys.settrace(None)
    want = expected[0].data if isinstance(expected, list) else expected.data
    del expected
    gc.collect()
    base = internals.live_nodes()
    # The suite's heap leaves the collector's sight: a custom op's cut is
    # collected below, and a full collection then walks only what the cuts
    # made (23 s to 1 s in a whole suite's heap).
    gc.freeze()
    try:
        _cut_at_every_instruction(kind, op, want, base)
    finally:
        gc.unfreeze()


def _cut_at_every_instruction(kind, op, want, base):
    n = 0
    while True:
        n += 1
        count = [0]

        def tracer(frame, event, arg):
            frame.f_trace_opcodes = True
            if event == "opcode" and frame.f_code.co_filename.startswith(str(PACKAGE)):
                count[0] += 1
                if count[0] == n:
                    raise KeyboardInterrupt
            return tracer

        sys.settrace(tracer)
        try:
            got = op()
        except KeyboardInterrupt:
            got = None
        finally:
            sys.settrace(None)
        if got is not None:
            assert count[0] < n, f"{kind}: the interrupt at opcode {n} was lost"
            value = got[0].data if isinstance(got, list) else got.data
            assert value == want
            del got
            gc.collect()
            assert internals.live_nodes() == base, kind
            break
        # No collection: an op makes no cycle, so what a cut leaves goes as
        # the exception unwinds (the last check, after one, would see more).
        # A custom op's Value and the handle its node keeps form one (as
        # micrograd's closures do): the collector frees it.
        if kind == "custom":
            gc.collect()
        assert internals.live_nodes() == base, f"{kind}: cut at opcode {n} leaked a node"
    assert n > 3


# -- micrograd's object model -------------------------------------------------------

def test_a_dropped_value_keeps_its_class_and_attributes_while_a_graph_holds_it():
    class Sub(Value):
        pass

    a = Sub(1.0)
    a.name = "x"
    b = a * 2
    del a
    gc.collect()
    c = [k for k in b._prev if k.data == 1.0][0]
    assert type(c) is Sub and c.name == "x"
    assert b._prev is b._prev and c in b._prev


def test_an_op_on_a_subclass_returns_that_subclass():
    """The recipe for projects with their own Value: subclass pygrad's and
    keep the extra methods; the left operand's class wins (the Value's,
    with a number on the left)."""
    class Mine(Value):
        def zero_grad(self):
            self.grad = 0.0

        def draw_dot(self):
            return sorted(k.data for k in self._prev)

    a, b = Mine(2.0), Value(3.0)
    for y in (a * b, a + 1, 1 - a, a ** 2, a.tanh(), -a, a / b):
        assert type(y) is Mine
    assert type(b * a) is Value
    y = (a * b).relu()
    assert y.draw_dot() == [6.0]
    y.backward()
    a.zero_grad()
    assert a.grad == 0.0 and b.grad == 2.0


# -- memory -------------------------------------------------------------------------

def test_a_kept_leaf_costs_its_own_node_only():
    """One leaf kept per 4,096 ops, 120 rounds: each kept leaf holds its own
    node and nothing of the graphs built over it (the issue's 2,000 rounds,
    in KB per leaf: benchmarks/bench_lifetime.py)."""
    w = Value(0.5)
    gc.collect()
    before = live()
    kept = []
    for r in range(120):
        x = Value(float(r))
        kept.append(x)
        y = x
        for _ in range(2048):
            y = y * w + 1.0
        del y
    assert live() - before == 120
    assert [v.data for v in kept] == [float(r) for r in range(120)]


def test_a_kept_interior_value_costs_what_it_reaches():
    """An EMA of the loss kept as a Value across steps holds its own chain
    (two nodes a step, and their numbers' leaves), not the steps' graphs."""
    w = Value(0.5)
    ema = Value(0.0)
    gc.collect()
    before = live()
    for step in range(200):
        loss = Value(float(step))
        for _ in range(500):
            loss = (loss * w + 1.0).tanh()
        ema = ema * 0.9 + loss.data * 0.1
        del loss
    # each step: ema * 0.9 (a node and its number's leaf), + x (the same)
    assert live() - before == 200 * 4


def test_a_graph_dropped_without_backward_is_freed_at_del():
    before = live()
    y = Value(1.0)
    for _ in range(10_000):
        y = y * 1.0001 + 0.1
    assert internals.live_nodes() - before >= 20_000
    del y
    assert internals.live_nodes() == before           # no collection needed


def test_a_graph_holding_a_cycle_is_freed_at_the_next_collection():
    before = live()
    x = Value(0.5)
    y = x
    for _ in range(100):
        out = Value(y.data * 2.0, (y,), "double")

        def _backward(out=out, y=y):
            y.grad += 2.0 * out.grad
        out._backward = _backward
        out.me = out                                    # a cycle
        y = out
    del x, y, out, _backward
    gc.collect()
    assert internals.live_nodes() == before


@pytest.mark.parametrize("holder", ["leaf", "op", "fused"])
def test_a_cycle_closed_through_untracked_op_results_is_collected(holder):
    """An op's result starts untracked by the collector; an attribute that
    refers to a Value made from the holder (a.out = (a * 2) * 3) closes a
    cycle through such results, which the collector must see whole."""
    before = live()
    refs = []
    for _ in range(3):
        a = Value(1.0)
        if holder == "op":
            a = a + 1.0
        if holder == "fused":
            out = nn.MLP(1, [3, 1])([a]) * 3
        else:
            out = (a * 2).relu() * 3
        a.out = out                     # a -> out -> ... -> a * 2 -> a
        refs += [weakref.ref(out), weakref.ref(a)]
    del a, out
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
    assert live() == before


class _StrLabel(str):
    pass


class _SelfRef(Value):
    def __init__(self, x):
        self.me = self                  # an attribute before Value.__init__ runs
        super().__init__(x)


def _leak_cases():
    def in_a_list():
        a = Value(1.0)
        b = a * 2
        a.x = [b]
        return a, b

    def in_a_dict():
        a = Value(1.0)
        b = (a + 1.0).relu()
        a.x = {"b": b}
        return a, b

    def in_a_closure():
        a = Value(1.0)
        b = (a * 2).tanh()
        a.hook = lambda: b.grad
        return a, b

    def in_a_str_subclass_label():
        v = Value(1.0) * 2
        label = _StrLabel("x")
        label.owner = v
        v.label = label
        return v, label

    def set_before_init():
        s = _SelfRef(1.0)
        return s, s * 2

    def init_run_again():
        v = Value(1.0) * 2
        v.me = v
        with pytest.raises(TypeError, match="initialised once"):
            Value.__init__(v, 2.0)
        return v, None

    return [in_a_list, in_a_dict, in_a_closure, in_a_str_subclass_label, set_before_init,
            init_run_again]


@pytest.mark.parametrize("case", _leak_cases(), ids=lambda f: f.__name__)
def test_cycles_through_containers_closures_labels_and_early_attributes_are_collected(case):
    made = case()
    refs = [weakref.ref(x) for x in made if x is not None]
    del made
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
