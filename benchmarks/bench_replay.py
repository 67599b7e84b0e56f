"""Replay tier: re-run a compiled graph forward and backward in C.

    python benchmarks/bench_replay.py           # 200k-op workloads, 7 repeats
    python benchmarks/bench_replay.py --quick   # 20k ops
    python benchmarks/bench_replay.py --baseline ../base   # against another checkout

The same workloads as bench_engine.py (the chain and the random DAG, both
unfused: one C node per op plus number-constant leaves), built once with
pygrad, compiled with pygrad.compile, then timed: forward(), backward(), and
the two together, in ns per C node of the program; median of repeats, GC
on.  Before timing, a replayed forward + backward after changing every leaf
is checked against a freshly built graph (data and grads bit for bit).

With --baseline (another checkout, built in place), both engines run in one
process, their sweeps alternating, which on a shared machine is steadier
than separate runs.  Which engine is loaded and built first sways the
result by up to ~10% (memory placement), so it runs twice, once in each
order, and reports the geometric mean of the two ratios.
"""
import argparse
import importlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import bench_engine
import pygrad
from pygrad import Value


def leaves_of(plan, keep) -> list:
    return list(keep) if plan.name == "chain" else keep[0]


def check(plan) -> None:
    root, keep = plan.build(Value)
    leaves = leaves_of(plan, keep)
    program = pygrad.compile(root)
    rng = random.Random(1)
    new = [d * (1 + 1e-4 * rng.random()) for d in plan.leaf_data]
    for v, d in zip(leaves, new):
        v.data = d
        v.grad = 0.0
    program.forward()
    program.backward()
    saved = plan.leaf_data
    plan.leaf_data = new
    fresh, fresh_keep = plan.build(Value)
    fresh_leaves = leaves_of(plan, fresh_keep)
    plan.leaf_data = saved
    fresh.backward()
    assert root.data == fresh.data, "replayed forward differs from a fresh build"
    assert [v.grad for v in leaves] == [v.grad for v in fresh_leaves], "replayed grads differ"


def bench(plan, repeats: int) -> dict:
    root, keep = plan.build(Value)
    program = pygrad.compile(root)
    n = len(program)
    fwd, bwd = [], []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        program.forward()
        t1 = time.perf_counter_ns()
        program.backward()
        t2 = time.perf_counter_ns()
        fwd.append((t1 - t0) / n)
        bwd.append((t2 - t1) / n)
    f, b = statistics.median(fwd), statistics.median(bwd)
    return {"nodes": n, "forward_ns_per_node": f, "backward_ns_per_node": b,
            "total_ns_per_node": statistics.median(x + y for x, y in zip(fwd, bwd))}


def plans_of(n_ops: int) -> list:
    return [bench_engine.ChainPlan(n_ops), bench_engine.DagPlan(n_ops, 20240601)]


def pair(trees: "list[str]", n_ops: int, rounds: int) -> dict:
    """One process, two engines (loaded, and their graphs built, in the
    order of ``trees``): forward + backward sweeps alternating, ns/node."""
    tmp = tempfile.mkdtemp(prefix="pygrad-ab-")
    try:
        sys.path.insert(0, tmp)
        mods = []
        for i, tree in enumerate(trees):
            # The package under a name of its own: its imports are relative.
            shutil.copytree(os.path.join(tree, "pygrad"), os.path.join(tmp, f"pygrad_ab{i}"))
            mods.append(importlib.import_module(f"pygrad_ab{i}"))
        out = {}
        for plan in plans_of(n_ops):
            roots = [plan.build(m.Value)[0] for m in mods]
            programs = [m.compile(root) for m, root in zip(mods, roots)]
            # an interior Value (a child of the root), read after each run in
            # the "+ read" rows: what a loop that looks inside the graph pays
            inner = [next(v for v in sorted(root._prev, key=lambda v: v.data) if v._prev)
                     for root in roots]
            for read in (False, True):
                times: "list[list[float]]" = [[] for _ in mods]
                for r in range(rounds):
                    for i in (range(len(mods)) if r % 2 == 0 else reversed(range(len(mods)))):
                        p = programs[i]
                        t0 = time.perf_counter_ns()
                        p.forward()
                        p.backward()
                        if read:
                            inner[i].data
                        times[i].append((time.perf_counter_ns() - t0) / len(p))
                out[plan.name + (" + read" if read else "")] = times
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def versus(baseline: str, n_ops: int, rounds: int) -> None:
    this = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ratios: "dict[str, list[float]]" = {}
    medians: "dict[str, dict[str, list[float]]]" = {}
    for order in ([this, baseline], [baseline, this]):
        cmd = [sys.executable, os.path.abspath(__file__), "--_pair", json.dumps(order),
               "--ops", str(n_ops), "--rounds", str(rounds)]
        res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        for name, times in res.items():
            t_this, t_base = (times[0], times[1]) if order[0] == this else (times[1], times[0])
            ratios.setdefault(name, []).append(
                statistics.median(a / b for a, b in zip(t_this, t_base)))
            m = medians.setdefault(name, {"this": [], "base": []})
            m["this"].append(statistics.median(t_this))
            m["base"].append(statistics.median(t_base))
    print(f"this: {this}\nbase: {os.path.abspath(baseline)}\n")
    print("| workload | this ns/node | base ns/node | this/base, this loaded first | "
          "base first | geometric mean |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, (r1, r2) in ratios.items():
        m = medians[name]
        print(f"| {name} | {statistics.mean(m['this']):.1f} | {statistics.mean(m['base']):.1f} | "
              f"{r1:.3f} | {r2:.3f} | **{math.sqrt(r1 * r2):.3f}** |")
    print(f"\nforward + backward per node (+ read: then one interior node's .data), {rounds} "
          "rounds alternating in each of the two processes; ratios are medians of the "
          "per-round ratios")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--baseline", help="another checkout, built in place: compare side by side")
    ap.add_argument("--rounds", type=int, default=30, help="alternating rounds (--baseline)")
    ap.add_argument("--ops", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_pair", help=argparse.SUPPRESS)
    args = ap.parse_args()
    n_ops = args.ops or (20_000 if args.quick else 200_000)
    if args._pair:
        print(json.dumps(pair(json.loads(args._pair), n_ops, args.rounds)))
        return
    if args.baseline:
        versus(args.baseline, n_ops, args.rounds)
        return
    plans = plans_of(n_ops)
    print("| workload | C nodes | forward ns/node | backward ns/node | forward+backward ns/node |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for plan in plans:
        check(plan)
        r = bench(plan, args.repeats)
        print(f"| {plan.name} | {r['nodes']} | {r['forward_ns_per_node']:.1f} | "
              f"{r['backward_ns_per_node']:.1f} | {r['total_ns_per_node']:.1f} |")
    print("\nreplayed data and grads equal a fresh build's bit for bit")


if __name__ == "__main__":
    main()
