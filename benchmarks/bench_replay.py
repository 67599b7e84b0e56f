"""Replay tier: re-run a compiled graph forward and backward in C.

    python benchmarks/bench_replay.py           # 200k-op workloads, 7 repeats
    python benchmarks/bench_replay.py --quick   # 20k ops

The same workloads as bench_engine.py (the chain and the random DAG, both
unfused: one C node per op plus number-constant leaves), built once with
pygrad, compiled with pygrad.compile, then timed: forward(), backward(), and
the two together, in ns per C node of the program; median of repeats, GC
on.  Before timing, a replayed forward + backward after changing every leaf
is checked against a freshly built graph (data and grads bit for bit).
"""
import argparse
import random
import statistics
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    n_ops = 20_000 if args.quick else 200_000
    plans = [bench_engine.ChainPlan(n_ops), bench_engine.DagPlan(n_ops, 20240601)]
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
