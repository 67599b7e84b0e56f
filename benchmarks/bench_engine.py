"""Benchmark pygrad's C engine against its pure-Python reference and micrograd.

Usage::

    python3 benchmarks/bench_engine.py               # 200k ops, 5 repeats
    python3 benchmarks/bench_engine.py --quick       # 20k ops, 3 repeats
    python3 benchmarks/bench_engine.py --json out.json --repeats 7

Two workloads, built identically by every engine (only + * ** relu and
number constants, the ops micrograd 0.1.0 has):

* ``chain``: one long dependency chain,
  ``x = ((x*w + b) ** 2).relu() ** 0.5 + 0.0005`` repeated (6 ops a round).
  The per-round gradient factor is w = 0.999, so values and gradients stay
  normal (no inf, no subnormals) all the way down.
* ``dag``: a random DAG drawn once from a seeded ``random.Random``; each
  node combines one or two earlier nodes (``a+b``, ``a*b``, ``relu(a)``,
  ``a+k``, ``a*k``), chosen mostly among the recent ones with some
  long-range picks.  Every node is reachable from the root (the last one),
  and the draw keeps data in [-2, 2] so the gradients stay finite.

The "interpreter floor" row is no engine: a ``__slots__`` object made with
``object.__new__`` per op, holding only the float result (no graph, no
gradient), built over the same workload.  It is what any Python-level
Value must at least cost per op (the method call, one object, one float
op); it is timed forward only, interleaved with the engines, and the
report gives pygrad's eager forward as a multiple of it.  The "floor + one
cffi call" row is the same objects, each op also making the call into the
C core that pygrad's op makes (same entry point, same argument count), but
with NULL for the node memory and the children: the core refuses it at
once (PG_E_ARG), and no node is made:
what any Value that makes one cffi API-mode call per op must at least cost.

For each engine and workload, every repeat builds a fresh graph (forward),
calls ``root.backward()`` and drops the graph; the three are timed apart and
reported in ns per op (one op = one ``+``, ``*``, ``**`` or ``relu`` of the
workload; a number constant is a leaf made by its op, not an op).  Python's
GC stays on as it is by default (part of the real cost); ``gc.collect()``
runs between repeats, outside the timed regions.  Engines are interleaved
within each repeat so that drift in machine speed hits them alike.

Before timing, each workload is checked once: pygrad's root data and leaf
gradients must equal the reference engine's bit for bit; micrograd's (whose
``_prev`` is a set, so its gradients may be summed in another order) must
be close.
"""
import argparse
import array
import gc
import json
import math
import os
import platform
import random
import statistics
import struct
import sys
import threading
import time
import tracemalloc
from collections import deque
from typing import Any, Callable, Dict, List, Optional, Tuple

import pygrad
from pygrad import engine as pg_engine
from pygrad import reference as pg_reference
from pygrad._core import ffi, lib

perf_ns = time.perf_counter_ns


# -- workloads ------------------------------------------------------------------

CHAIN_OPS_PER_ROUND = 6


class ChainPlan:
    """x0, w, b are the leaves; the root is x after `rounds` rounds."""

    name = "chain"

    def __init__(self, n_ops: int) -> None:
        self.rounds = max(1, n_ops // CHAIN_OPS_PER_ROUND)
        self.n_ops = self.rounds * CHAIN_OPS_PER_ROUND
        self.leaf_data = (0.5, 0.999, 0.0005)

    def describe(self) -> str:
        return (f"{self.n_ops} ops: {self.rounds} rounds of "
                "x = ((x*w + b)**2).relu()**0.5 + 0.0005")

    def build(self, V: Callable[[float], Any]) -> Tuple[Any, tuple]:
        x0, w, b = (V(d) for d in self.leaf_data)
        x = x0
        for _ in range(self.rounds):
            x = x * w
            x = x + b
            x = x ** 2
            x = x.relu()
            x = x ** 0.5
            x = x + 0.0005
        return x, (x0, w, b)


OP_ADD, OP_MUL, OP_RELU, OP_ADDK, OP_MULK = range(5)


class DagPlan:
    """The random DAG as flat lists (op, a, b, k per node), drawn once.

    Node indices: 0 .. n_leaves-1 are leaves, node n_leaves + j is op j.
    Operand picks: the oldest node nothing uses yet when more than `window`
    such nodes wait (so every node ends up used), else a recent node
    (geometric distance, mean `mean_back`) or, with probability `p_long`,
    any earlier node.  The last ops fold the still-unused nodes into the
    root with ``+``.  Data is simulated with floats while drawing, only to
    keep it bounded: an op whose result would leave [-lim, lim] or come
    near 0 is replaced by ``a*k`` or ``a+k``.
    """

    name = "dag"

    def __init__(self, n_ops: int, seed: int, n_leaves: int = 64, window: int = 32,
                 p_long: float = 0.1, mean_back: float = 8.0, lim: float = 2.0) -> None:
        rng = random.Random(seed)
        self.seed = seed
        self.n_ops = n_ops
        self.leaf_data = [rng.uniform(-1.0, 1.0) for _ in range(n_leaves)]
        vals = list(self.leaf_data)
        ops: List[int] = []
        A: List[int] = []
        B: List[int] = []
        K: List[float] = []
        total = n_leaves + n_ops
        used = bytearray(total)
        unused = deque(range(n_leaves))      # lazy: may hold used entries
        n_unused = n_leaves

        def oldest_unused() -> int:
            while used[unused[0]]:
                unused.popleft()
            return unused.popleft()

        def recent(i: int) -> int:
            if rng.random() < p_long:
                return rng.randrange(i)
            j = i - 1 - int(rng.expovariate(1.0 / mean_back))
            return j if j >= 0 else rng.randrange(i)

        for i in range(n_leaves, total):
            if n_unused - 1 >= total - i:
                # Fold: join the two oldest unused nodes, so that the root
                # (the last node) ends up the only unused one.
                op, a, b, k = OP_ADD, oldest_unused(), -1, 0.0
                used[a] = 1
                b = oldest_unused()
                used[b] = 1
                n_unused -= 2
                v = vals[a] + vals[b]
            else:
                a = oldest_unused() if n_unused > window else recent(i)
                va = vals[a]
                b, k = -1, 0.0
                r = rng.random()
                if r < 0.30:
                    op = OP_ADD
                elif r < 0.55:
                    op = OP_MUL
                elif r < 0.65:
                    op = OP_RELU
                elif r < 0.80:
                    op = OP_ADDK
                else:
                    op = OP_MULK
                if op == OP_ADD or op == OP_MUL:
                    b = recent(i)
                    if b == a:
                        b = i - 1 if a != i - 1 else i - 2
                    v = va + vals[b] if op == OP_ADD else va * vals[b]
                elif op == OP_RELU:
                    v = 0.0 if va < 0.0 else va
                elif op == OP_ADDK:
                    k = rng.uniform(-1.0, 1.0)
                    v = va + k
                else:
                    k = rng.uniform(0.25, 1.0) * rng.choice((1.0, -1.0))
                    v = va * k
                if abs(v) > lim and va != 0.0:
                    op, b, k = OP_MULK, -1, rng.uniform(0.25, 0.5) * lim / abs(va)
                    v = va * k
                elif abs(v) > lim or (v != 0.0 and abs(v) < 1e-3):
                    op, b, k = OP_ADDK, -1, rng.uniform(-1.0, 1.0)
                    v = va + k
                for j in (a, b):
                    if j >= 0 and not used[j]:
                        used[j] = 1
                        n_unused -= 1
            ops.append(op)
            A.append(a)
            B.append(b)
            K.append(k)
            vals.append(v)
            unused.append(i)
            n_unused += 1
        assert n_unused == 1 and not used[total - 1], "DAG: a node is not reachable from the root"
        # Stored untracked by the GC (bytes, arrays), so that the collections
        # the timed builds trigger do not also traverse the plan.
        self.ops = bytes(ops)
        self.A = array.array("i", A)
        self.B = array.array("i", B)
        self.K = array.array("d", K)
        self.leaf_data = array.array("d", self.leaf_data)
        self.op_counts = {name: self.ops.count(code) for code, name in
                          enumerate(("a+b", "a*b", "relu", "a+k", "a*k"))}
        long_range = sum(1 for j, a in enumerate(self.A) if n_leaves + j - a > 1000)
        self.long_range_operands = long_range

    def describe(self) -> str:
        c = self.op_counts
        return (f"{self.n_ops} ops on {len(self.leaf_data)} leaves, seed {self.seed}: "
                + ", ".join(f"{k} {v}" for k, v in c.items()))

    def build(self, V: Callable[[float], Any]) -> Tuple[Any, list]:
        nodes = [V(d) for d in self.leaf_data]
        leaves = nodes[:]
        app = nodes.append
        for op, a, b, k in zip(self.ops, self.A, self.B, self.K):
            if op == OP_ADD:
                app(nodes[a] + nodes[b])
            elif op == OP_MUL:
                app(nodes[a] * nodes[b])
            elif op == OP_RELU:
                app(nodes[a].relu())
            elif op == OP_ADDK:
                app(nodes[a] + k)
            else:
                app(nodes[a] * k)
        # The list holds every node, as a training loop's graph would be
        # held through its parameters and intermediate lists.
        return nodes[-1], (leaves, nodes)


# -- engines --------------------------------------------------------------------

_new = object.__new__


class FloorValue:
    """The interpreter floor: per op, one object from ``object.__new__``
    holding the float result; no graph.  Only what the workloads use."""

    __slots__ = ("data", "grad")

    def __init__(self, data: float, _children: Any = (), _op: str = "") -> None:
        self.data = data
        self.grad = 0.0      # for micrograd's zero_grad and update (bench_nn.py)

    def __neg__(self) -> "FloorValue":
        return self * -1

    def backward(self) -> None:
        """No graph, so nothing to do: the floor is forward only."""

    def __add__(self, o: Any) -> "FloorValue":
        out = _new(FloorValue)
        out.data = self.data + (o.data if type(o) is FloorValue else o)
        return out

    __radd__ = __add__

    def __mul__(self, o: Any) -> "FloorValue":
        out = _new(FloorValue)
        out.data = self.data * (o.data if type(o) is FloorValue else o)
        return out

    __rmul__ = __mul__

    def __pow__(self, k: Any) -> "FloorValue":
        out = _new(FloorValue)
        out.data = self.data ** k
        return out

    def relu(self) -> "FloorValue":
        out = _new(FloorValue)
        d = self.data
        out.data = 0.0 if d < 0.0 else d
        return out


_NULL = ffi.NULL


class CffiFloorValue(FloorValue):
    """The interpreter floor plus one refused call into the C core per op:
    the entry point and argument count of pygrad's own op, with no node
    memory and no children (NULL), so the core returns at once and no node
    is made."""

    __slots__ = ()

    def __add__(self, o: Any, _vv: Any = lib.pg_binary_ADD,
                _vk: Any = lib.pg_binary_k_ADD) -> "CffiFloorValue":
        if type(o) is CffiFloorValue:
            _vv(_NULL, _NULL, _NULL)
            d = o.data
        else:
            _vk(_NULL, _NULL, o)
            d = o
        out = _new(CffiFloorValue)
        out.data = self.data + d
        return out

    __radd__ = __add__

    def __mul__(self, o: Any, _vv: Any = lib.pg_binary_MUL,
                _vk: Any = lib.pg_binary_k_MUL) -> "CffiFloorValue":
        if type(o) is CffiFloorValue:
            _vv(_NULL, _NULL, _NULL)
            d = o.data
        else:
            _vk(_NULL, _NULL, o)
            d = o
        out = _new(CffiFloorValue)
        out.data = self.data * d
        return out

    __rmul__ = __mul__

    def __pow__(self, k: Any, _powk: Any = lib.pg_powk_float) -> "CffiFloorValue":
        _powk(_NULL, _NULL, k)
        out = _new(CffiFloorValue)
        out.data = self.data ** k
        return out

    def relu(self, _relu: Any = lib.pg_unary_RELU) -> "CffiFloorValue":
        _relu(_NULL, _NULL)
        out = _new(CffiFloorValue)
        d = self.data
        out.data = 0.0 if d < 0.0 else d
        return out


FLOOR = "floor"
CFFI_FLOOR = "floor+cffi"


class Engine:
    def __init__(self, name: str, V: Any, version: str, note: str = "",
                 forward_only: bool = False) -> None:
        self.name = name
        self.V = V
        self.version = version
        self.note = note
        self.forward_only = forward_only


def load_engines(wanted: List[str]) -> Tuple[List[Engine], Dict[str, str]]:
    engines = []
    skipped = {}
    for name in wanted:
        if name == "pygrad":
            engines.append(Engine("pygrad", pg_engine.Value, pygrad.__version__))
        elif name == "reference":
            engines.append(Engine("reference", pg_reference.Value, pygrad.__version__))
        elif name == FLOOR:
            engines.append(Engine(FLOOR, FloorValue, platform.python_version(),
                                  "interpreter floor: forward only, no graph",
                                  forward_only=True))
        elif name == CFFI_FLOOR:
            engines.append(Engine(CFFI_FLOOR, CffiFloorValue, pygrad.__version__,
                                  "interpreter floor + one refused cffi call per op",
                                  forward_only=True))
        elif name == "micrograd":
            try:
                from micrograd import engine as mg_engine
            except ImportError as e:
                skipped["micrograd"] = f"not importable ({e}); pip install micrograd==0.1.0"
                continue
            try:
                from importlib.metadata import version
                mg_version = version("micrograd")
            except Exception:
                mg_version = "?"
            engines.append(Engine("micrograd", mg_engine.Value, mg_version))
        elif name == "torch":
            try:
                import torch
            except ImportError as e:
                skipped["torch"] = f"not importable ({e}); pip install torch"
                continue
            torch.set_num_threads(1)

            def tensor(x: float, _t: Any = torch) -> Any:
                return _t.tensor(x, dtype=_t.float64, requires_grad=True)
            engines.append(Engine("torch", tensor, torch.__version__,
                                  "0-dim float64 tensors, requires_grad"))
        else:
            raise SystemExit(f"unknown engine {name!r}")
    return engines, skipped


# -- checks ---------------------------------------------------------------------

def bits(x: float) -> bytes:
    return struct.pack("<d", float(x))


def verify(plan: Any, engines: List[Engine]) -> Dict[str, Any]:
    """Build and backward once per engine, untimed; compare with reference."""
    results: Dict[str, Any] = {}
    floor_data = None
    for e in engines:
        if e.forward_only:
            data = float(plan.build(e.V)[0].data)
            assert floor_data is None or bits(data) == bits(floor_data), (e.name, data, floor_data)
            floor_data = data
            continue
        root, extra = plan.build(e.V)
        leaves = extra[0] if isinstance(extra[0], list) else list(extra)
        try:
            root.backward()
            grads = [float(v.grad) for v in leaves]
            err = None
        except (RecursionError, MemoryError) as ex:
            grads, err = None, f"{type(ex).__name__}: {ex}"
        results[e.name] = (float(root.data), grads, err)
        del root, extra, leaves
        gc.collect()
    out: Dict[str, Any] = {"leaves_compared": None}
    ref = results.get("reference")
    pg = results.get("pygrad")
    if ref is not None and pg is not None:
        assert ref[2] is None and pg[2] is None, (ref[2], pg[2])
        assert bits(pg[0]) == bits(ref[0]), f"{plan.name}: root data {pg[0]!r} != {ref[0]!r}"
        for i, (g1, g2) in enumerate(zip(pg[1], ref[1])):
            assert bits(g1) == bits(g2), f"{plan.name}: leaf {i} grad {g1!r} != reference {g2!r}"
        assert all(math.isfinite(g) for g in pg[1])
        out["pygrad_equals_reference_bitwise"] = True
        out["leaves_compared"] = len(pg[1])
        out["root_data"] = pg[0]
        out["leaf_grads_head"] = pg[1][:4]
        out["nonzero_leaf_grads"] = sum(1 for g in pg[1] if g != 0.0)
    base = ref or pg
    if floor_data is not None and base is not None:
        # Same float ops in the same order; ** may round differently
        # (Python's float ** against the core's x * x for ** 2).
        assert math.isclose(floor_data, base[0], rel_tol=1e-9), (floor_data, base[0])
        out["floor_root_data_bitwise_equal"] = bits(floor_data) == bits(base[0])
    for other in ("micrograd", "torch"):
        mg = results.get(other)
        if mg is None or base is None:
            continue
        if mg[2] is not None:
            out[other] = f"backward failed: {mg[2]}"
            continue
        scale = max(1.0, max(abs(g) for g in base[1]))
        worst = max([abs(mg[0] - base[0]) / max(abs(base[0]), 1e-300)]
                    + [abs(g1 - g2) / scale for g1, g2 in zip(mg[1], base[1])])
        assert math.isclose(mg[0], base[0], rel_tol=1e-9), (other, mg[0], base[0])
        assert worst < 1e-6, f"{plan.name}: {other} differs from reference by {worst:.3g}"
        out[f"{other}_max_rel_diff"] = worst
        out[f"{other}_bitwise_equal"] = (bits(mg[0]) == bits(base[0]) and all(
            bits(g1) == bits(g2) for g1, g2 in zip(mg[1], base[1])))
    return out


def python_heap_per_op(plan: Any, e: Engine) -> float:
    """Python heap bytes held per op by a built graph (tracemalloc, untimed).
    For pygrad this counts the C nodes too: their memory is Python's."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        g = plan.build(e.V)
        held = tracemalloc.get_traced_memory()[0] - base
        del g
    finally:
        tracemalloc.stop()
    gc.collect()
    return held / plan.n_ops


# -- timing ---------------------------------------------------------------------

def run_once(plan: Any, e: Engine) -> Dict[str, Any]:
    """One repeat: build, backward, drop.  Returns raw ns and node counts."""
    gc.collect()
    if e.forward_only:
        t0 = perf_ns()
        g = plan.build(e.V)
        t1 = perf_ns()
        del g
        gc.collect()
        return {"fwd": t1 - t0}
    t0 = perf_ns()
    g = plan.build(e.V)
    t1 = perf_ns()
    err = None
    try:
        g[0].backward()
    except (RecursionError, MemoryError) as ex:
        err = f"{type(ex).__name__} in backward: {ex}"
    t2 = perf_ns()
    if err is not None:
        del g
        gc.collect()
        return {"error": err, "fwd": t1 - t0}
    t3 = perf_ns()
    del g                              # the only reference to the graph
    t4 = perf_ns()
    gc.collect()
    t5 = perf_ns()
    gc.collect()                       # the cost of a collection with no graph
    t6 = perf_ns()
    r = {"fwd": t1 - t0, "bwd": t2 - t1, "del": t4 - t3, "collect": t5 - t4,
         "collect_baseline": t6 - t5, "collect_extra": max(0, (t5 - t4) - (t6 - t5))}
    return r


def summary(xs: List[float]) -> Dict[str, Any]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
            "all": [round(x, 2) for x in xs]}


def bench_workload(plan: Any, engines: List[Engine], repeats: int,
                   log: Callable[[str], None]) -> Dict[str, Any]:
    n = plan.n_ops
    raw: Dict[str, List[Dict[str, Any]]] = {e.name: [] for e in engines}
    failed: Dict[str, str] = {}
    for rep in range(repeats):
        for e in engines:
            if e.name in failed:
                continue
            r = run_once(plan, e)
            if "error" in r:
                failed[e.name] = r["error"]
                log(f"  {plan.name} {e.name}: {r['error']}")
            raw[e.name].append(r)
        log(f"  {plan.name}: repeat {rep + 1}/{repeats} done")
    out: Dict[str, Any] = {"n_ops": n, "engines": {}}
    for e in engines:
        fwd_only = raw[e.name]
        runs = [r for r in fwd_only if "error" not in r]
        if e.forward_only:
            out["engines"][e.name] = {"fwd_ns_per_op": summary([r["fwd"] / n for r in runs]),
                                      "forward_only": True}
            continue
        if not runs:
            # backward failed (micrograd's recursion): forward times only
            out["engines"][e.name] = {"error": failed.get(e.name, "no runs"),
                                      "fwd_ns_per_op": summary([r["fwd"] / n for r in fwd_only])}
            continue
        d: Dict[str, Any] = {
            "fwd_ns_per_op": summary([r["fwd"] / n for r in runs]),
            "bwd_ns_per_op": summary([r["bwd"] / n for r in runs]),
            "total_ns_per_op": summary([(r["fwd"] + r["bwd"]) / n for r in runs]),
            "free_ns_per_op": summary([(r["del"] + r["collect_extra"]) / n for r in runs]),
            "collect_baseline_ms": summary([r["collect_baseline"] / 1e6 for r in runs]),
        }
        if e.name in failed:
            d["error"] = failed[e.name]
        if e.name == "pygrad":
            d["collect_after_del_ms"] = summary([r["collect"] / 1e6 for r in runs])
        out["engines"][e.name] = d
    pg = out["engines"].get("pygrad", {})
    ratios: Dict[str, Any] = {}
    if "fwd_ns_per_op" in pg:
        for other in ("micrograd", "reference", "torch"):
            o = out["engines"].get(other, {})
            for phase in ("fwd", "bwd", "total"):
                key = f"{phase}_ns_per_op"
                # a backward failure (micrograd's recursion) leaves fwd only
                if key in o and (phase == "fwd" or "error" not in o):
                    ratios[f"{other}/pygrad {phase}"] = o[key]["median"] / pg[key]["median"]
    floor = out["engines"].get(FLOOR, {})
    if "fwd_ns_per_op" in pg and "fwd_ns_per_op" in floor:
        ratios["pygrad/floor fwd"] = pg["fwd_ns_per_op"]["median"] / floor["fwd_ns_per_op"]["median"]
        # paired within each repeat (the two builds ran back to back)
        out["pygrad_over_floor_fwd_per_repeat"] = summary(
            [p["fwd"] / f["fwd"] for p, f in zip(raw["pygrad"], raw[FLOOR]) if "error" not in p])
    cffi_floor = out["engines"].get(CFFI_FLOOR, {})
    if "fwd_ns_per_op" in cffi_floor and "fwd_ns_per_op" in floor:
        ratios["floor+cffi/floor fwd"] = (cffi_floor["fwd_ns_per_op"]["median"]
                                          / floor["fwd_ns_per_op"]["median"])
    out["ratios"] = ratios
    return out


# -- report ---------------------------------------------------------------------

def fmt(x: Optional[float], nd: int = 0) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.{nd}f}"


def fmt_load(meta: Dict[str, Any]) -> str:
    la = meta.get("loadavg_at_start")
    return "n/a" if la is None else "/".join(f"{x:.2f}" for x in la)


def fmt_range(xs: List[int]) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:,}" if lo == hi else f"{lo:,}..{hi:,}"


def markdown(results: Dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "# pygrad engine benchmark",
        "",
        f"- Python {meta['python']} ({meta['implementation']}), {meta['platform']}, "
        f"{meta['cpu_count']} CPUs (load average at start {fmt_load(meta)}); "
        f"GC on, thresholds {meta['gc_threshold']}",
        f"- repeats {meta['repeats']} (median shown), seed {meta['seed']}; engines: "
        + ", ".join(f"{k} {v}" for k, v in meta["engines"].items()),
    ]
    for name, why in meta["skipped"].items():
        lines.append(f"- skipped {name}: {why}")
    for wname, w in results["workloads"].items():
        lines += ["", f"## {wname}: {w['description']}", "",
                  "| engine | fwd ns/op | bwd ns/op | fwd+bwd ns/op | free ns/op | "
                  "Python heap B/op | fwd x pygrad | bwd x pygrad |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        pg = w["engines"].get("pygrad", {})
        for ename, d in w["engines"].items():
            bad = "error" in d or d.get("forward_only", False)

            def med(key: str, dd: Dict[str, Any] = d) -> Optional[float]:
                return None if (bad and key != "fwd_ns_per_op") or key not in dd \
                    else dd[key]["median"]

            def ratio(key: str) -> str:
                a, p = med(key), med(key, pg)
                return "n/a" if a is None or p is None else f"{a / p:,.1f}x"

            heap = w.get("python_heap_bytes_per_op", {}).get(ename)
            label = {FLOOR: "interpreter floor (fwd only)",
                     CFFI_FLOOR: "floor + one cffi call (fwd only)"}.get(ename, ename)
            lines.append(
                f"| {label} | {fmt(med('fwd_ns_per_op'))} | {fmt(med('bwd_ns_per_op'))} "
                f"| {fmt(med('total_ns_per_op'))} | {fmt(med('free_ns_per_op'))} | {fmt(heap)} "
                f"| {ratio('fwd_ns_per_op')} | {ratio('bwd_ns_per_op')} |")
            if "error" in d:
                lines.append(f"|  ({ename}: {d['error']}) | | | | | | | |")
        if "pygrad/floor fwd" in w["ratios"]:
            pr = w["pygrad_over_floor_fwd_per_repeat"]
            lines += ["", f"pygrad eager forward / interpreter floor: "
                          f"{w['ratios']['pygrad/floor fwd']:.2f}x (medians; per repeat, paired: "
                          f"median {pr['median']:.2f}x, range {pr['min']:.2f}..{pr['max']:.2f}x)."]
        if "floor+cffi/floor fwd" in w["ratios"]:
            lines += ["", f"floor + one cffi call per op / interpreter floor: "
                          f"{w['ratios']['floor+cffi/floor fwd']:.2f}x (medians): the least a "
                          f"Value making one cffi API-mode call per op can cost."]
        ver = w["verification"]
        if ver.get("pygrad_equals_reference_bitwise"):
            v = (f"check: pygrad == reference bit for bit (root data and "
                 f"{ver['leaves_compared']} leaf grads, {ver['nonzero_leaf_grads']} nonzero)")
            if "micrograd_max_rel_diff" in ver:
                v += (f"; micrograd max rel diff {ver['micrograd_max_rel_diff']:.2g}"
                      f" (bitwise equal: {ver['micrograd_bitwise_equal']})")
            elif "micrograd" in ver:
                v += f"; micrograd: {ver['micrograd']}"
            lines += ["", v + "."]
    lines += ["", "## ratios (same run, medians)", "",
              "| workload | " + " | ".join(RATIO_KEYS) + " |",
              "|---|" + "---:|" * len(RATIO_KEYS)]
    for wname, w in results["workloads"].items():
        cells = [fmt(w["ratios"].get(k), 2 if "floor" in k else 1) + ("x" if k in w["ratios"] else "")
                 for k in RATIO_KEYS]
        lines.append(f"| {wname} | " + " | ".join(cells) + " |")
    lines += ["",
              "ns/op: wall time / ops of the workload (a number constant's leaf is "
              "part of its op).  free: `del` of the graph + the time the next "
              "`gc.collect()` takes beyond an empty one (the reference and micrograd "
              "graphs are cyclic through their `_backward` closures, so only the "
              "collector frees them).  Python heap: "
              "tracemalloc, separate untimed build; pygrad's C nodes are not in it."]
    return "\n".join(lines)


RATIO_KEYS = ["pygrad/floor fwd", "floor+cffi/floor fwd", "micrograd/pygrad fwd", "micrograd/pygrad bwd",
              "reference/pygrad fwd", "reference/pygrad bwd",
              "torch/pygrad fwd", "torch/pygrad bwd"]


# -- main -----------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20k ops, 3 repeats")
    ap.add_argument("--repeats", type=int, default=None, help="repeats per engine (default 5)")
    ap.add_argument("--ops", type=int, default=None, help="ops per workload (default 200000)")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--engines", default="pygrad,floor,floor+cffi,reference,micrograd,torch",
                    help="'floor' is the interpreter floor, 'floor+cffi' the floor plus one "
                         "cffi call per op (both forward only)")
    ap.add_argument("--workloads", default="chain,dag")
    ap.add_argument("--no-heap", action="store_true", help="skip the tracemalloc pass")
    ap.add_argument("--json", metavar="PATH", default=None, help="write results as JSON")
    args = ap.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 5)
    n_ops = args.ops or (20_000 if args.quick else 200_000)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    assert gc.isenabled(), "the benchmark measures with Python's GC on"
    engines, skipped = load_engines([s for s in args.engines.split(",") if s])
    for name, why in skipped.items():
        log(f"skipping {name}: {why}")

    plans: List[Any] = []
    for w in args.workloads.split(","):
        if w == "chain":
            plans.append(ChainPlan(n_ops))
        elif w == "dag":
            plans.append(DagPlan(n_ops, args.seed))
        elif w:
            raise SystemExit(f"unknown workload {w!r}")

    results: Dict[str, Any] = {
        "meta": {
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "gc_threshold": gc.get_threshold(),
            "repeats": repeats,
            "ops": n_ops,
            "seed": args.seed,
            "quick": args.quick,
            "engines": {e.name: e.version for e in engines},
            "skipped": skipped,
            "pygrad_node_bytes": lib.pg_node_size(),
            "recursion_limit": sys.getrecursionlimit(),
        },
        "workloads": {},
    }
    for plan in plans:
        log(f"{plan.name}: {plan.describe()}")
        ver = verify(plan, engines)
        log(f"{plan.name}: verified {ver}")
        w = bench_workload(plan, engines, repeats, log)
        # After the timing: a tracemalloc pass just before it slowed the
        # next timed build 2-3x (the allocator's state after tracemalloc).
        heap = {}
        if not args.no_heap:
            for e in engines:
                if not e.forward_only:
                    heap[e.name] = python_heap_per_op(plan, e)
        w["description"] = plan.describe()
        w["verification"] = ver
        w["python_heap_bytes_per_op"] = heap
        if isinstance(plan, DagPlan):
            w["op_counts"] = plan.op_counts
            w["operands_more_than_1000_back"] = plan.long_range_operands
        results["workloads"][plan.name] = w
    results["meta"]["wall_s"] = round(time.perf_counter() - t_start, 2)
    print(markdown(results))
    print(f"\nwall time: {results['meta']['wall_s']:.1f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
        log(f"wrote {args.json}")
    return results


def run_in_big_stack_thread(fn: Callable[[], Any]) -> Any:
    """micrograd's backward recurses once per graph level: run everything
    with a high recursion limit on a thread with a 512 MiB stack, so a 200k
    deep chain neither raises RecursionError nor overflows the C stack."""
    sys.setrecursionlimit(10 ** 6)
    box: Dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as ex:  # re-raised in the main thread
            box["error"] = ex

    try:
        threading.stack_size(512 * 1024 * 1024)
    except (ValueError, RuntimeError):
        pass
    t = threading.Thread(target=target, name="bench")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")


if __name__ == "__main__":
    try:
        run_in_big_stack_thread(main)
    except SystemExit as ex:
        raise SystemExit(ex.code)
