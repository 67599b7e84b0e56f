"""pygrad's benchmark suite: one command for every workload, engine and tier.

    python benchmarks/run.py            # full run, about 18 minutes on 2 cores
    python benchmarks/run.py --quick    # under a minute

Workloads and what is compared, all side by side in one run, GC on:
- 200k-op chain and random 200k-op DAG (bench_engine.py): pygrad eager vs
  the reference engine, micrograd and PyTorch 0-dim float64 tensors (each
  when installed): forward and backward apart, free cost, memory per op;
  then the replay tier on the same graphs (bench_replay.py).
- micrograd's moons training and a 3-class spiral softmax classifier
  (pygrad.demo's tasks), per tier: reference, micrograd (moons only: its
  Value has no exp/log), pygrad eager, fused, replay and batched.  Every
  pygrad tier's losses must equal the reference engine's bit for bit
  (batched: to 1e-12, as its sums over rows run in row order).
- batched steps (bench_batched.py): pygrad's Program.map against PyTorch
  float64 tensors on one thread (when installed), moons and spiral.
It prints tables, writes JSON (--json, default benchmarks/results/latest.json)
and, with matplotlib, a bar chart of the speedups (--png).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Dict, List

import bench_batched
import bench_engine
import bench_nn
import bench_replay
import pygrad
from pygrad import demo

HERE = os.path.dirname(os.path.abspath(__file__))


MICROGRAD_ON_FLOOR = "interpreter floor: micrograd's nn code on a graph-less Value (forward only)"
MICROGRAD_ON_PYGRAD = "pygrad eager: micrograd's nn code on pygrad.Value"


def training(task: str, steps: int, repeats: int) -> Dict[str, Any]:
    """Seconds for `steps` steps per tier (median of repeats for pygrad)."""
    tiers: Dict[str, Any] = {}

    def timed(name: str, fn: Any, n: int) -> None:
        runs, losses = [], None
        for _ in range(n):
            t = time.perf_counter()
            losses = fn()
            runs.append(time.perf_counter() - t)
        tiers[name] = {"seconds": statistics.median(runs), "runs": runs, "losses": losses}

    timed("reference", lambda: demo.train(task, steps, engine="reference", tier="fused")["losses"], 1)
    own = []      # tiers running micrograd's own nn and loop code
    if task == "moons":
        try:
            import micrograd  # noqa: F401 - only to know whether it is there
            timed("micrograd", lambda: bench_nn.run_micrograd(steps), 1)
            own = [MICROGRAD_ON_FLOOR, MICROGRAD_ON_PYGRAD]
            timed(own[0], lambda: bench_nn.run_micrograd(steps, value_type=bench_engine.FloorValue),
                  repeats)
            timed(own[1], lambda: bench_nn.run_micrograd(steps, eager_on_pygrad=True), repeats)
        except ImportError:
            tiers["micrograd"] = None
    for tier in ("eager", "fused", "replay", "batched"):   # eager: pygrad.nn with fused=False
        timed(f"pygrad {tier}", lambda t=tier: demo.train(task, steps, tier=t)["losses"], repeats)
    ref = tiers["reference"]["losses"]
    for name, r in tiers.items():
        if name in own or r is None:
            continue
        if name == "pygrad batched":    # sums over rows in row order: equal to rounding
            assert max(abs(a - b) <= 1e-12 * abs(b) for a, b in zip(r["losses"], ref)), name
        elif name.startswith("pygrad"):
            assert r["losses"] == ref, f"{task}: {name} differs from the reference engine"
    if own:
        # micrograd sums over sets (not bit-reproducible): equal to rounding;
        # the floor has no backward, so only its first (forward) loss agrees
        mg, on_pygrad = tiers["micrograd"]["losses"], tiers[own[1]]["losses"]
        assert max(abs(a - b) <= 1e-9 * abs(b) for a, b in zip(on_pygrad, mg)), own[1]
        assert tiers[own[0]]["losses"][0] == on_pygrad[0], own[0]
    return tiers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "latest.json"))
    ap.add_argument("--png", default=os.path.join(HERE, "results", "speedups.png"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    results: Dict[str, Any] = {"python": sys.version.split()[0], "machine": platform.platform(),
                               "cpus": os.cpu_count(), "quick": args.quick,
                               "pygrad": pygrad.__version__}

    print("# Engines: chain and DAG\n")
    # micrograd's recursive backward needs a deep stack (see bench_engine)
    results["engine"] = bench_engine.run_in_big_stack_thread(
        lambda: bench_engine.main(["--quick"] if args.quick else []))

    print("\n# Replay tier: the same graphs, compiled and re-run in C\n")
    n_ops = 20_000 if args.quick else 200_000
    results["replay"] = {}
    print("| workload | C nodes | forward ns/node | backward ns/node | forward+backward ns/node |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for plan in (bench_engine.ChainPlan(n_ops), bench_engine.DagPlan(n_ops, 20240601)):
        bench_replay.check(plan)
        r = bench_replay.bench(plan, 3 if args.quick else 7)
        results["replay"][plan.name] = r
        print(f"| {plan.name} | {r['nodes']} | {r['forward_ns_per_node']:.1f} | "
              f"{r['backward_ns_per_node']:.1f} | {r['total_ns_per_node']:.1f} |")

    results["training"] = {}
    for task, steps in (("moons", 5 if args.quick else 100), ("spiral", 5 if args.quick else 100)):
        print(f"\n# Training: {task}, {steps} steps (GC on)\n")
        tiers = training(task, steps, 1 if args.quick else 3)
        results["training"][task] = {"steps": steps, "tiers": {
            k: (None if v is None else {"seconds": v["seconds"], "runs": v["runs"]})
            for k, v in tiers.items()}}
        ref_s = tiers["reference"]["seconds"]
        mg_s = tiers["micrograd"]["seconds"] if tiers.get("micrograd") else None
        print("| tier | seconds | ms/step | × vs micrograd | × vs reference |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for name, r in tiers.items():
            if r is None:
                print(f"| {name} | not installed | | | |")
                continue
            s = r["seconds"]
            vs_m = f"{mg_s / s:.1f}" if mg_s else "n/a"
            print(f"| {name} | {s:.3f} | {1e3 * s / steps:.2f} | {vs_m} | {ref_s / s:.1f} |")
        print("\nevery pygrad tier's losses equal the reference engine's bit for bit")
        print(f"({demo.SPEEDUP.replace('x faster', '× vs X')}; X timed over all its steps)")

    print("\n# Batched steps: pygrad Program.map vs PyTorch float64 tensors, 1 thread\n")
    print("(bench_batched.py: same data, weights, loss and optimizer; tiers alternate; "
          "median of runs)\n")
    results["batched"] = {}
    print("| task | tier | µs/step | × slower than pygrad batched |")
    print("| --- | --- | ---: | ---: |")
    for task in ("moons", "spiral"):
        r = bench_batched.run(task, 50 if args.quick else 200, 3 if args.quick else 7)
        results["batched"][task] = r
        for name, sec in r["seconds_per_step"].items():
            ratio = r["ratios"].get(f"{name} / pygrad batched", 1.0)
            print(f"| {task} | {name} | {sec * 1e6:,.1f} | {ratio:,.1f} |")
    if "pytorch" not in results["batched"]["moons"]["seconds_per_step"]:
        print("\n(PyTorch is not installed: pip install torch for its rows)")

    results["wall_seconds"] = time.perf_counter() - t0
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"\nwrote {args.json}")
    chart = plot(results, args.png)
    if chart:
        print(f"wrote {chart}")
    print(f"wall time {results['wall_seconds']:.1f} s")


def plot(results: Dict[str, Any], path: str) -> str:
    """A bar chart of speedups over the reference engine (log scale)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ""
    labels: List[str] = []
    values: List[float] = []
    for wname, w in results["engine"]["workloads"].items():
        for phase in ("fwd", "bwd"):
            r = w["ratios"].get(f"reference/pygrad {phase}")
            if r:
                labels.append(f"{wname} {phase}\n(eager)")
                values.append(r)
    for task, t in results["training"].items():
        ref = t["tiers"]["reference"]["seconds"]
        for name, r in t["tiers"].items():
            if r and name.startswith("pygrad"):
                tier = "micrograd's code" if name == MICROGRAD_ON_PYGRAD else name.split()[1]
                labels.append(f"{task}\n{tier}")
                values.append(ref / r["seconds"])
    for task, b in results.get("batched", {}).items():
        torch_s = b["seconds_per_step"].get("pytorch")
        if torch_s:
            labels.append(f"{task}\nbatched\nvs PyTorch")
            values.append(torch_s / b["seconds_per_step"]["pygrad batched"])
    n_torch = len(results.get("batched", {})) if labels and "PyTorch" in labels[-1] else 0
    colors = ["#4c72b0"] * (len(values) - n_torch) + ["#dd8452"] * n_torch
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(labels)), 4.5))
    ax.bar(range(len(values)), values, color=colors)
    ax.set_yscale("log")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("× faster than the reference engine\n(orange: than PyTorch, batched)",
                  fontsize=9)
    ax.set_title("pygrad speedups (same run)")
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.0f}×", ha="center", va="bottom", fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
