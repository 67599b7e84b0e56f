"""The drop-in paths: micrograd code around the ops, pygrad beside micrograd.

    python benchmarks/bench_dropin.py            # every path, ~1 minute on 2 cores
    python benchmarks/bench_dropin.py --quick    # fewer repeats
    python benchmarks/bench_dropin.py --heap     # also: each path with 2M small objects alive

Each path is written as micrograd users write it, and run on
``pygrad.Value`` and on ``micrograd.engine.Value`` (micrograd 0.1.0, needed:
``pip install micrograd``) in this one process, alternating, each timing
the median of several repeats.  The table gives pygrad's time over
micrograd's (lower is better) and the target of issue 24 (issue 51's
for the bare ``.data`` read); for the field
paths, also the floor: a class holding a node (node memory, a cffi pg_node)
whose ``data``/``grad`` are properties around one cffi call each, the
least a Value with its numbers in C costs; for the first ``_prev`` walk,
what the first read of each node's ``_prev`` must make before any walking
(the set of its children, from the operands its Value holds, and for a
child that has no Value, a number's leaf, a new object holding its
parent and the child's address, from one cffi call); for a
custom op, the closures and their field accesses with one node allocation
and one call into C per node made, one call per closure run, and no
bookkeeping.

With ``--heap``, the table gains a column: the same pygrad paths while 2M
small Python objects are alive (as in a notebook holding a dataset), over
pygrad's own small-heap time, the two alternating path by path (median of
three rounds): nothing may grow with the heap.
"""
import argparse
import gc
import random
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Set, Tuple

import pygrad
import pygrad.nn

try:
    import micrograd.engine
    import micrograd.nn
except ImportError:           # pragma: no cover - the table needs micrograd
    sys.exit("bench_dropin.py compares with micrograd: pip install micrograd==0.1.0")

ENGINES = {"pygrad": (pygrad.Value, pygrad.nn), "micrograd": (micrograd.engine.Value, micrograd.nn)}


_ffi, _lib = pygrad._core.ffi, pygrad._core.lib
_NODE_SIZE = _ffi.sizeof("pg_node")
_new = object.__new__


def _node_memory(size: int) -> Any:
    """A node's memory, which Python owns and frees (a cffi pg_node): what
    any cffi design must allocate per node."""
    return _ffi.new("pg_node *")


def floor_node(x: float) -> Any:
    """A leaf node in memory Python owns, as pygrad's own leaves are."""
    node = _node_memory(_NODE_SIZE)
    _lib.pg_leaf(node, x)
    return node


class FloorValue:
    """What bounds the field paths: the least a Value whose numbers live in
    C can do, a property around one cffi call per ``data``/``grad`` access
    on the node it holds (``_op`` and ``label`` are properties returning a
    constant)."""

    __slots__ = ("_node",)

    def __init__(self, node: Any) -> None:
        self._node = node

    def _get_data(self, _get: Any = _lib.pg_data) -> float:
        return _get(self._node)

    def _set_data(self, v: float, _put: Any = _lib.pg_set_data) -> None:
        _put(self._node, v)

    def _get_grad(self, _get: Any = _lib.pg_grad) -> float:
        return _get(self._node)

    def _set_grad(self, v: float, _put: Any = _lib.pg_set_grad) -> None:
        _put(self._node, v)

    def _name(self) -> str:
        return ""

    data = property(_get_data, _set_data)
    grad = property(_get_grad, _set_grad)
    _op = property(_name)
    label = property(_name)


class FloorLeafValue:
    """A Value made for a node that has none (a number's leaf, met by the
    first ``_prev`` read of its parent): an object holding its parent (which
    holds the node) and the child's address."""

    __slots__ = ("_parent", "_node")


def floor_first_walk(values: List[Any]) -> Callable[[], Any]:
    """What bounds the first ``_prev`` walk, over pygrad's own Values: for
    each node, the set of its children made from the operands its Value
    holds, and for a child without a Value (a number's leaf) a new
    FloorLeafValue over it (one call: ``pg_kid_addr``).  Which child that
    is was found beforehand; no walking is counted."""
    kid, node_of = _lib.pg_kid_addr, _lib.pg_node_addr
    records = []
    for v in values:
        kids = [kid(id(v), i) for i in range(_lib.pg_nkids_v(id(v)))]
        operands = tuple({id(x): x for x in (v._pg_a, v._pg_b)
                          if isinstance(x, pygrad.Value) and node_of(id(x)) in kids}.values())
        held = {node_of(id(x)) for x in operands}
        missing = tuple(i for i, p in enumerate(kids) if p not in held)
        records.append((operands, missing, v))

    def make() -> Any:
        made = []
        for operands, missing, v in records:
            kids: Set[Any] = set(operands)
            for i in missing:
                leaf = _new(FloorLeafValue)
                leaf._parent, leaf._node = v, kid(id(v), i)
                kids.add(leaf)
            made.append(kids)
        return made
    return make


class FloorCustomValue(FloorValue):
    """What bounds a custom op: FloorValue's fields, a slot for the closure
    and the operands, no bookkeeping."""

    __slots__ = ("_backward", "_hold")
    _backward: Callable[[], None]
    _hold: tuple


def floor_custom() -> Callable[[], Any]:
    """The custom-op path with only what any cffi design must do: the new
    node's memory (a cffi pg_node) and one call into C that fills it, and one
    call (a node pointer, as resuming the sweep takes) at each closure; the
    closures run in Python, reading and writing through FloorValue's
    properties.  The nodes are leaves: C links no children."""
    import math
    alloc, leaf, resume = _node_memory, _lib.pg_leaf, _lib.pg_flags

    def tanh(x: Any) -> Any:
        t = math.tanh(x.data)
        node = alloc(_NODE_SIZE)
        leaf(node, t)
        out = FloorCustomValue(node)
        out._hold = (x,)

        def _backward() -> None:
            x.grad += (1 - t ** 2) * out.grad
        out._backward = _backward
        return out

    def custom() -> None:
        made = [FloorCustomValue(floor_node(0.3))]
        for _ in range(100):
            made.append(tanh(made[-1]))
        made[-1].grad = 1.0
        for v in reversed(made[1:]):
            resume(v._node)
            v._backward()
    return custom


_keep: List[Any] = []


def floor_paths() -> Dict[str, Tuple[Callable[[], Any], int]]:
    """The field paths on FloorValue, over pygrad's own nodes."""
    values = [FloorValue(floor_node(random.random())) for _ in range(2000)]
    params = values[:337]

    def reads() -> float:
        s = 0.0
        for v in values:
            s += v.data
            s += v.grad
            v._op
            v.label
        return s

    def bare_reads() -> None:
        for v in values:
            v.data

    def update() -> None:
        for p in params:
            p.data += -0.01 * p.grad
            p.grad = 0
    kept = graph(pygrad.Value, 500)
    nodes = walk(kept)                # the first walk's own Values, before it
    _keep.append(kept)
    return {"first _prev walk (per node)": (floor_first_walk(nodes), len(nodes)),
            "custom op, build + backward (per op)": (floor_custom(), 100),
            "v.data / v.grad / v._op / v.label reads (per Value)": (reads, len(values)),
            "a bare v.data read (per Value)": (bare_reads, len(values)),
            "update loop p.data += -lr*p.grad; p.grad = 0 (per parameter)": (update,
                                                                              len(params))}


def graph(V: Any, n: int) -> Any:
    """A DAG of about 4n nodes, as a model's loss would be."""
    a, b = V(0.5), V(-1.5)
    x = a
    for i in range(n):
        x = (x * b + a).relu() + (x if i % 3 else a) * 0.5
    return x


def walk(root: Any) -> List[Any]:
    """A graph walk by identity, as drawing helpers do (draw_dot's trace)."""
    seen, out, stack = set(), [], [root]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        out.append(v)
        stack.extend(v._prev)
    return out


def lecture_backward(root: Any) -> None:
    """The lecture's backward by hand: topological order, then _backward()."""
    topo, visited = [], set()
    stack = [(root, False)]
    while stack:
        v, done = stack.pop()
        if done:
            topo.append(v)
        elif v not in visited:
            visited.add(v)
            stack.append((v, True))
            stack.extend((c, False) for c in v._prev)
    root.grad = 1.0
    for v in reversed(topo):
        v._backward()


def custom_tanh(V: Any, x: Any) -> Any:
    """A custom op the micrograd way: a Value with children and a closure."""
    import math
    t = math.tanh(x.data)
    out = V(t, (x,), "tanh")

    def _backward() -> None:
        x.grad += (1 - t ** 2) * out.grad
    out._backward = _backward
    return out


def paths(V: Any, nn: Any) -> Dict[str, Tuple[Callable[[], Any], int]]:
    """name -> (a callable doing the path, how many units it does)."""
    n = 500
    prepared: Dict[str, Any] = {}

    def first_walk() -> None:
        walk(prepared["fresh"])

    def setup_first() -> None:
        prepared["fresh"] = graph(V, n)

    kept = graph(V, n)
    walk(kept)
    units = len(walk(kept))
    values = [V(random.random()) for _ in range(2000)]
    for v in values:
        v.label = "p"
    model = nn.MLP(2, [16, 16, 1])
    params = model.parameters()

    def reads() -> float:
        s = 0.0
        for v in values:
            s += v.data
            s += v.grad
            v._op
            v.label
        return s

    def bare_reads() -> None:
        for v in values:
            v.data

    def update() -> None:
        for p in params:
            p.data += -0.01 * p.grad
            p.grad = 0

    def custom() -> None:
        x = V(0.3)
        y = x
        for _ in range(100):
            y = custom_tanh(V, y)
        y.backward()

    def above_custom() -> None:
        x = custom_tanh(V, V(0.3))
        y = x
        for _ in range(200):
            y = y * 1.01

    def elsewhere() -> None:
        y = V(0.3)
        for _ in range(200):
            y = y * 1.01
    return {
        "repeat _prev walk (per node)": (lambda: walk(kept), units),
        "first _prev walk (per node)": (first_walk, units, setup_first),  # type: ignore[dict-item]
        "lecture-style manual backward (per node)": (lambda: lecture_backward(graph(V, n)), units),
        "v.data / v.grad / v._op / v.label reads (per Value)": (reads, len(values)),
        "a bare v.data read (per Value)": (bare_reads, len(values)),
        "update loop p.data += -lr*p.grad; p.grad = 0 (per parameter)": (update, len(params)),
        "custom op, build + backward (per op)": (custom, 100),
        "an op above a custom op (per op)": (above_custom, 200),
        "the same op elsewhere (per op)": (elsewhere, 200),
        "Value(x) (per Value)": (lambda: [V(1.5) for _ in range(2000)], 2000),
        "model.zero_grad() (per call)": (model.zero_grad, 1),
    }


TARGETS = {
    "repeat _prev walk (per node)": 2.0,
    "first _prev walk (per node)": 4.0,
    "lecture-style manual backward (per node)": 3.0,
    "v.data / v.grad / v._op / v.label reads (per Value)": 5.0,
    "a bare v.data read (per Value)": 2.5,
    "update loop p.data += -lr*p.grad; p.grad = 0 (per parameter)": 5.0,
    "custom op, build + backward (per op)": 1.5,
    "an op above a custom op (per op)": None,
    "the same op elsewhere (per op)": None,
    "Value(x) (per Value)": 1.5,
    "model.zero_grad() (per call)": 1.0,
}


def time_path(entry: Any, repeats: int) -> float:
    """Median seconds per unit over repeats (each at least ~20 ms)."""
    fn, units = entry[0], entry[1]
    setup = entry[2] if len(entry) > 2 else None
    times = []
    for _ in range(repeats):
        loops, total = 0, 0.0
        while total < 0.02:
            if setup is not None:
                setup()
            t = time.perf_counter()
            fn()
            total += time.perf_counter() - t
            loops += 1
        times.append(total / loops / units)
    return statistics.median(times)


def measure(repeats: int) -> Dict[str, Dict[str, float]]:
    random.seed(0)
    built = {name: paths(*ENGINES[name]) for name in ENGINES}
    built["floor"] = floor_paths()
    out: Dict[str, Dict[str, float]] = {name: {} for name in built}
    for path in TARGETS:
        for _ in range(2):          # alternate, so drift hits every engine alike
            for name in built:
                if path in built[name]:
                    t = time_path(built[name][path], max(1, repeats // 2))
                    out[name][path] = min(out[name].get(path, t), t)
    return out


def heap_ratios(repeats: int) -> Dict[str, float]:
    """pygrad's time per path with 2M small objects alive over without,
    the two alternating path by path (so that drift in the machine's speed
    hits both alike); median of the per-round ratios."""
    random.seed(0)
    built = paths(*ENGINES["pygrad"])
    ratios: Dict[str, List[float]] = {path: [] for path in TARGETS}
    for _ in range(3):
        for path in TARGETS:
            small = time_path(built[path], max(1, repeats // 2))
            junk = [[i] for i in range(2_000_000)]
            gc.collect()
            big = time_path(built[path], max(1, repeats // 2))
            del junk
            gc.collect()
            ratios[path].append(big / small)
    return {path: statistics.median(r) for path, r in ratios.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--heap", action="store_true", help="also with 2M small objects alive")
    args = ap.parse_args()
    repeats = 3 if args.quick else 7
    small = measure(repeats)
    big = heap_ratios(repeats) if args.heap else None
    head = "| path | pygrad | micrograd | pygrad / micrograd | target | floor / micrograd |"
    if big:
        head += " pygrad, 2M objects alive / small heap |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for path, target in TARGETS.items():
        p, m = small["pygrad"][path], small["micrograd"][path]
        f = small["floor"].get(path)
        row = (f"| {path} | {p * 1e9:,.0f} ns | {m * 1e9:,.0f} ns | {p / m:.2f}x | "
               f"{'at most %.1fx' % target if target else 'as elsewhere'} | "
               f"{'%.2fx' % (f / m) if f else ''} |")
        if big:
            row += f" {big[path]:.2f}x |"
        print(row)
    print(f"\npython {sys.version.split()[0]}, pygrad {pygrad.__version__}, "
          f"median of {repeats} repeats per engine, alternating")


if __name__ == "__main__":
    main()
