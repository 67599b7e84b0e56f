"""Memory: a 10M-node graph, long training, and kept Values beside micrograd.

    python benchmarks/bench_memory.py                     # all three parts, ~4 minutes on 2 cores
    python benchmarks/bench_memory.py --quick             # all three, smaller: ~1 minute
    python benchmarks/bench_memory.py --part scenarios    # one part: graph, training or scenarios

--quick: 1,000,000 nodes in part 1, 500 steps in part 2, and part 3's
scenarios at 20 / 60 / 20 / 5 steps.

Part 1 builds y <- y * w + c (two C nodes a round) until the graph has
10,000,000 nodes, backpropagates, and drops it: wall time of each phase,
the nodes built (counted by construction), RSS per node (node, keep and
Value), and resident memory (RSS) before, built, at the peak, after the
drop, and after glibc's malloc_trim(0) (what malloc keeps for reuse after
the free is no live node).  The peak is the process's high-water mark
(getrusage), read in a fresh process where this graph is the only big
thing.

Part 2 trains micrograd's moons MLP for 2,000 SGD steps on minibatches of
10 (tests/training.py, eager and replay tiers) and prints RSS at steps 200
and 2,000, which should be within a few percent of each other.

Part 3, kept Values: four scenarios written as a micrograd user writes them
(only + * ** relu, and custom ops as ``Value(data, (children,), op)`` with a
``_backward`` closure), each run on pygrad (``pygrad.Value``; for S4 also
its fused MLP), the reference engine (``pygrad.reference.Value``) and
micrograd (when importable), with the same data and seeds:

  S1  100 steps, each a 20,000-node chain y <- y * w + c, keeping
      ``Value(y.data)`` made before ``y.backward()``;
  S2  300 graphs of 3,000 nodes, keeping the node after round 100 of each;
  S3  100 rounds of a chain of 2,000 custom tanh ops, tanh(y * w + c),
      backpropagated and dropped, keeping nothing;
  S4  micrograd's moons demo: MLP 2-16-16-1 (each engine's own nn), 100
      points, SVM hinge loss + L2, SGD, keeping ``Value(loss.data)`` per step
      (40 steps; micrograd takes ~1 s a step).

Each (scenario, engine) runs in a fresh process (this file with --worker):
one warm-up step, then gc.collect() and the baseline; then the scenario,
timed; then gc.collect() again.  It reports RSS growth (/proc/self/statm)
and the wall time, in one markdown table with the nodes reachable from the
kept Values (counted on the reference engine) and pygrad's RSS growth over
micrograd's.

No figure counts live C nodes: C keeps no record of them (Python owns every
node, pygrad/_lifetime.py), and counting them from Python's side means
wrapping the node allocator (tests/internals.py), which would add to the
times and the RSS measured here; RSS shows what the nodes cost.
"""
import argparse
import gc
import importlib.util
import json
import math
import os
import random
import resource
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from pygrad import Value
from pygrad._core import lib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


def big_graph(nodes: int) -> None:
    w, c = Value(0.5), Value(1.0)
    Value(0.0).backward()
    gc.collect()
    base_rss = rss_mib()
    t0 = time.perf_counter()
    y = Value(0.0)
    for _ in range(nodes // 2):
        y = y * w + c
    t1 = time.perf_counter()
    y.backward()
    t2 = time.perf_counter()
    built, built_rss = 1 + 2 * (nodes // 2), rss_mib()   # the first y, then * and + a round
    del y
    gc.collect()
    t3 = time.perf_counter()
    print(f"graph of {built:,} C nodes ({lib.pg_node_size()} B each = "
          f"{built * lib.pg_node_size() / 2**20:,.0f} MiB of node memory; "
          f"{(built_rss - base_rss) * 2**20 / built:,.0f} B of RSS per node with its keep "
          f"and Value)")
    print(f"  build    {t1 - t0:7.2f} s  ({(t1 - t0) / built * 1e9:5.0f} ns/node, Python loop)")
    print(f"  backward {t2 - t1:7.3f} s  ({(t2 - t1) / built * 1e9:5.1f} ns/node)")
    print(f"  free     {t3 - t2:7.3f} s  ({(t3 - t2) / built * 1e9:5.1f} ns/node)")
    print(f"  RSS: {base_rss:,.0f} MiB before, {built_rss:,.0f} MiB built, "
          f"peak {peak_rss_mib():,.0f} MiB, {rss_mib():,.0f} MiB after the drop"
          f"{trimmed_rss()}")


def trimmed_rss() -> str:
    """RSS once glibc gives its free heap back (malloc_trim): the nodes'
    memory is malloc's (ffi.new), and what malloc keeps after a free is no
    live node.  Empty where there is no glibc."""
    try:
        import ctypes
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return ""
    trim(0)
    return f", {rss_mib():,.0f} MiB after malloc_trim(0)"


def training(steps: int) -> None:
    from training import moons_model, train_moons
    for tier in ("eager", "replay"):
        samples = {}

        def sample(k: int) -> None:
            if k in (steps // 10, steps):
                gc.collect()
                samples[k] = rss_mib()
        train_moons(moons_model(0, tier), 0, tier, steps=steps, batch=10, after_step=sample)
        r0, r1 = samples[steps // 10], samples[steps]
        print(f"{tier:>6}: step {steps // 10}: {r0:6.1f} MiB RSS; "
              f"step {steps}: {r1:6.1f} MiB ({(r1 - r0) / r0:+.2%})")


# -- part 3: kept Values, side by side with micrograd -----------------------------

# name -> (row label with {n} for the size, full size, --quick size); the
# size is S1's steps, S2's graphs, S3's rounds, S4's SGD steps.
SCENARIOS: Dict[str, Tuple[str, int, int]] = {
    "S1": ("{n} steps of a 20k-node chain, keep Value(y.data) made before backward()", 100, 20),
    "S2": ("{n} graphs of 3k nodes, keep the node after round 100 of each", 300, 60),
    "S3": ("{n} rounds of 2,000 custom tanh ops feeding one another, keep nothing", 100, 20),
    "S4": ("moons MLP 2-16-16-1, 100 points, hinge + L2, {n} SGD steps, "
           "keep Value(loss.data)", 40, 5),
}
ENGINES = ("pygrad", "pygrad fused", "reference", "micrograd")
S1_ROUNDS = 10_000                   # y <- y * w + c: 2 nodes a round
S2_ROUNDS, S2_KEEP_AT = 1_500, 99    # keep y after round 100 (201 nodes below it)
S3_OPS = 2_000                       # y <- tanh(y * w + c): 3 nodes a round
MOONS_POINTS = 100


def load_engine(name: str) -> Tuple[Any, Callable[[], Any]]:
    """An engine's Value class and a maker of its moons MLP (which draws
    micrograd's weights from the global ``random``)."""
    if name == "micrograd":
        from micrograd import nn as micrograd_nn
        from micrograd.engine import Value as MicrogradValue
        return MicrogradValue, lambda: micrograd_nn.MLP(2, [16, 16, 1])
    from pygrad import nn
    if name == "reference":
        from pygrad.reference import Value as ReferenceValue
        return ReferenceValue, lambda: nn.MLP(2, [16, 16, 1], engine="reference")
    return Value, lambda: nn.MLP(2, [16, 16, 1], fused=name == "pygrad fused")


def custom_tanh(V: Any) -> Callable[[Any], Any]:
    """tanh as a micrograd user adds it (micrograd 0.1.0 has none): the
    closure refers to its own ``out`` and to its input."""
    def tanh(x: Any) -> Any:
        t = math.tanh(x.data)
        out = V(t, (x,), "tanh")

        def _backward() -> None:
            x.grad += (1 - t ** 2) * out.grad
        out._backward = _backward
        return out
    return tanh


def scenario(name: str, V: Any,
             make_mlp: Callable[[], Any]) -> Tuple[Callable[[Optional[list]], None], List[Any]]:
    """(step, setup) of a scenario on Value class V.  step(kept) does one
    step and appends what it keeps to ``kept``; step(None) is the warm-up:
    the same work, nothing kept, and (S4) no update of the parameters.
    ``setup``: the Values made before the baseline (leaves, parameters)."""
    rng = random.Random(0)
    w, c = V(rng.uniform(0.9, 0.999)), V(rng.uniform(0.0, 0.1))

    def chain(kept: Optional[list]) -> None:
        y = V(1.0)
        for i in range(S1_ROUNDS if name == "S1" else S2_ROUNDS):
            y = y * w + c
            if name == "S2" and i == S2_KEEP_AT and kept is not None:
                kept.append(y)
        if name == "S1" and kept is not None:
            kept.append(V(y.data))
        y.backward()

    def tanh_chain(kept: Optional[list]) -> None:
        y = V(0.1)
        for _ in range(S3_OPS):
            y = tanh(y * w + c)
        y.backward()

    if name in ("S1", "S2"):
        return chain, [w, c]
    if name == "S3":
        tanh = custom_tanh(V)
        return tanh_chain, [w, c]

    from pygrad.data import make_moons       # numpy only, seeded: the same points everywhere
    X, y = make_moons(MOONS_POINTS, noise=0.1, seed=0)
    points, labels = X.tolist(), [2.0 * t - 1.0 for t in y.tolist()]
    random.seed(1337)
    model = make_mlp()
    params = model.parameters()
    steps = [0]

    def sgd_step(kept: Optional[list]) -> None:
        # micrograd's demo notebook: max-margin loss + L2, full batch, SGD
        inputs = [[V(a), V(b)] for a, b in points]
        scores = [model(x) for x in inputs]
        losses = [(1 + -yi * si).relu() for yi, si in zip(labels, scores)]
        data_loss = sum(losses) * (1.0 / len(losses))
        reg_loss = 1e-4 * sum(p * p for p in params)
        total_loss = data_loss + reg_loss
        model.zero_grad()
        total_loss.backward()
        if kept is None:
            return
        learning_rate = 1.0 - 0.9 * steps[0] / 100
        for p in params:
            p.data -= learning_rate * p.grad
        steps[0] += 1
        kept.append(V(total_loss.data))
    return sgd_step, params


def reachable(kept: List[Any], setup: List[Any]) -> int:
    """The distinct nodes reachable from ``kept`` through ``_prev``, less
    those of ``setup`` (made before the baseline)."""
    seen = set(map(id, setup))
    todo = list(kept)
    while todo:
        v = todo.pop()
        if id(v) not in seen:
            seen.add(id(v))
            todo.extend(v._prev)
    return len(seen) - len(setup)


def scenario_worker(name: str, engine_name: str, quick: bool) -> None:
    """Run one (scenario, engine) in this fresh process; print one JSON line."""
    sys.setrecursionlimit(100_000)           # micrograd's backward recurses graph-deep
    V, make_mlp = load_engine(engine_name)
    on_c = engine_name.startswith("pygrad")
    step, setup = scenario(name, V, make_mlp)
    step(None)                               # warm-up
    gc.collect()
    rss0 = rss_mib()
    kept: List[Any] = []
    t0 = time.perf_counter()
    _, full, small = SCENARIOS[name]
    for _ in range(small if quick else full):
        step(kept)
    seconds = time.perf_counter() - t0
    gc.collect()
    result: Dict[str, Any] = {"rss": rss_mib() - rss0, "seconds": seconds, "kept": len(kept),
                              "last": kept[-1].data if kept else None}
    if not on_c:
        result.update(reachable=reachable(kept, setup))
    print("RESULT " + json.dumps(result))


def run_worker(name: str, engine_name: str, quick: bool) -> Dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, engine_name]
    proc = subprocess.run(cmd + ["--quick"] * quick, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit status {proc.returncode}: {last}"}


def kept_values(quick: bool) -> None:
    engines = list(ENGINES)
    if importlib.util.find_spec("micrograd") is None:
        print("micrograd is not importable (pip install micrograd==0.1.0): its column is skipped")
        engines.remove("micrograd")
    print("kept Values: each scenario on each engine in a fresh process", flush=True)
    results: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for name in SCENARIOS:
        for e in engines:
            if e == "pygrad fused" and name != "S4":
                continue                      # only an MLP has a fused form
            r = results[name, e] = run_worker(name, e, quick)
            done = r["error"] if "error" in r else f"{r['rss']:+.1f} MiB, {r['seconds']:.1f} s"
            print(f"{name} on {e}: {done}", flush=True)

    def cell(name: str, e: str, key: str, fmt: str) -> str:
        r = results.get((name, e))
        if r is None:
            return "n/a" if e == "micrograd" and e not in engines else "—"
        return "error" if "error" in r else format(r[key], fmt)

    def ratio(name: str) -> str:
        p, m = results.get((name, "pygrad"), {}), results.get((name, "micrograd"), {})
        if "rss" not in p or "rss" not in m:
            return "n/a"
        if m["rss"] < 1.0:                   # a ratio to ~0 says nothing
            return f"— (micrograd {m['rss']:+.1f})"
        return f"{p['rss'] / m['rss']:.2f}"

    print("\nRSS growth (MiB) after gc.collect(), each run in a fresh process after a warm-up "
          "step; kept = nodes reachable from the kept Values (reference engine); seconds: "
          "pygrad / pygrad fused / reference / micrograd.\n")
    print("| scenario | kept | pygrad MiB | pygrad fused MiB "
          "| reference MiB | micrograd MiB | pygrad / micrograd RSS | seconds |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for name, (label, full, small) in SCENARIOS.items():
        fused = cell(name, "pygrad fused", "rss", "+.1f")
        seconds = " / ".join(cell(name, e, "seconds", ".1f") for e in ENGINES)
        print(f"| {name}: {label.format(n=small if quick else full)} "
              f"| {cell(name, 'reference', 'reachable', ',')} | {cell(name, 'pygrad', 'rss', '+.1f')} "
              f"| {fused} "
              f"| {cell(name, 'reference', 'rss', '+.1f')} | {cell(name, 'micrograd', 'rss', '+.1f')} "
              f"| {ratio(name)} | {seconds} |")
    # The same work on every engine: the last kept number agrees.
    for name in SCENARIOS:
        last = {e: r["last"] for (n, e), r in results.items() if n == name and r.get("last") is not None}
        if last and max(last.values()) - min(last.values()) > 1e-9 * max(map(abs, last.values())):
            print(f"\nnote: {name}'s last kept value differs across engines: {last}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--part", choices=("all", "graph", "training", "scenarios"), default="all")
    parser.add_argument("--worker", nargs=2, metavar=("SCENARIO", "ENGINE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, engine_name = args.worker
        scenario_worker(name, engine_name, quick=args.quick)
        return
    if args.part in ("all", "graph"):
        big_graph(1_000_000 if args.quick else 10_000_000)
    if args.part in ("all", "training"):
        training(500 if args.quick else 2_000)
    if args.part in ("all", "scenarios"):
        kept_values(args.quick)


if __name__ == "__main__":
    main()
