"""Batched training steps: pygrad's batched tier against jitted JAX and PyTorch.

    python benchmarks/bench_batched.py            # the six-size table, 1 thread and all cores
    python benchmarks/bench_batched.py --quick    # fewer, shorter runs (CI smoke)
    python benchmarks/bench_batched.py --tasks    # the older moons / spiral comparison

The table: one training step of ``MLP(2, [H, H, 1])`` on N moons rows
(``pygrad.data.make_moons(N, noise=0.1)``), N in {100, 1000, 10000} and H in
{16, 64}, float64, micrograd's hinge loss (mean of relu(1 - y * score)) +
1e-4 * sum(p * p), plain SGD (lr 0.1; the L2 term's gradient is SGD's
weight_decay 2e-4 in pygrad and PyTorch).  The same starting weights
everywhere.

* ``pygrad``: one ``Program.train_step(rows, w, opt)`` per step (one C call:
  zero_grad, forward and backward over every row, the SGD step);
* ``jax``: ``jax.jit`` of the whole step (forward, loss, ``value_and_grad``,
  update), float64 (``jax_enable_x64``);
* ``pytorch``: float64 tensors, the idiomatic step (zero_grad, forward,
  loss, backward, step).

Two passes, each in a fresh Python so that its settings hold from the start:
``1 thread`` runs under ``taskset -c 0`` (where there is taskset) with
``XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"``,
``torch.set_num_threads(1)`` and pygrad's ``Program.threads = 1``; ``all
cores`` gives each engine every CPU (pygrad's default threads).  In each
pass the engines alternate run by run, each run timing enough steps for
about 20 ms, and the median of 11 runs is reported (one thread: the
process's CPU time, all its threads counted, which other processes on the
same core don't inflate; all cores: wall time); ratios are the other engine's
time over pygrad's (above 1: pygrad is faster).  Before timing, the first
steps' losses are checked to agree (to 1e-9 relative: the engines sum in
other orders).

JAX and PyTorch are optional (their columns are left out without them); to
install them CPU-only, next to pygrad:

    pip install jax jaxlib
    pip install torch --index-url https://download.pytorch.org/whl/cpu
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import pygrad
from pygrad import Value, data, nn, optim
from pygrad.functional import dot, logsumexp

SEED = 0
LR_MOONS, DECAY_MOONS, LR_SPIRAL = 0.1, 2e-4, 0.05


def task_data(task: str) -> Tuple[np.ndarray, np.ndarray]:
    if task == "moons":
        X, y = data.make_moons(100, noise=0.1, seed=SEED)
        return X, data.signed_labels(y)
    return data.make_spiral(50, 3, noise=0.2, seed=SEED)


def new_model(task: str) -> nn.MLP:
    random.seed(SEED)
    return nn.MLP(2, [16, 16, 1 if task == "moons" else 3])


def pygrad_step(task: str) -> Tuple[Callable[[], float], nn.MLP]:
    """One batched step of pygrad, and the model it trains."""
    X, y = task_data(task)
    model = new_model(task)
    x = [Value(0.0), Value(0.0)]
    out = model(x)
    if task == "moons":
        yi = Value(0.0)
        prog = pygrad.compile((1 + -yi * out).relu(), inputs=x + [yi])
        rows = np.column_stack([X, y])
        opt: Any = optim.SGD(model.parameters(), lr=LR_MOONS, weight_decay=DECAY_MOONS)
    else:
        hot = [Value(0.0) for _ in out]
        prog = pygrad.compile(logsumexp(out) - dot(hot, out), inputs=x + hot)
        rows = np.column_stack([X, np.eye(3)[y]])
        opt = optim.Adam(model.parameters(), lr=LR_SPIRAL)
    w = np.full(len(rows), 1.0 / len(rows))

    def step() -> float:
        loss = prog.train_step(rows, w, opt)
        return float(np.sum(loss)) / len(rows)
    return step, model


def torch_step(task: str, model: nn.MLP) -> Optional[Callable[[], float]]:
    """The same step in PyTorch (float64, one thread), from the same weights;
    None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    X, y = task_data(task)
    Xt = torch.tensor(X, dtype=torch.float64)
    layers: List[Any] = []
    for k, layer in enumerate(model.layers):
        lin = torch.nn.Linear(len(layer.neurons[0].w), len(layer.neurons), dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.tensor([[w.data for w in n.w] for n in layer.neurons],
                                            dtype=torch.float64))
            lin.bias.copy_(torch.tensor([n.b.data for n in layer.neurons], dtype=torch.float64))
        layers.append(lin)
        if k < len(model.layers) - 1:
            layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers)
    if task == "moons":
        yt = torch.tensor(y, dtype=torch.float64)
        opt: Any = torch.optim.SGD(net.parameters(), lr=LR_MOONS, weight_decay=DECAY_MOONS)

        def loss_of() -> Any:
            return torch.relu(1 - yt * net(Xt).squeeze(1)).mean()
    else:
        yt = torch.tensor(y, dtype=torch.long)
        opt = torch.optim.Adam(net.parameters(), lr=LR_SPIRAL)
        ce = torch.nn.CrossEntropyLoss()

        def loss_of() -> Any:
            return ce(net(Xt), yt)

    def step() -> float:
        opt.zero_grad()
        loss = loss_of()
        loss.backward()
        opt.step()
        return loss.item()
    return step


def micrograd_step() -> Optional[Callable[[], float]]:
    """micrograd's own moons step (its Value and nn), same data and loss."""
    try:
        from micrograd import nn as mnn
    except ImportError:
        return None
    X, y = task_data("moons")
    random.seed(SEED)
    model = mnn.MLP(2, [16, 16, 1])
    from micrograd.engine import Value as MValue

    def step() -> float:
        scores = [model([MValue(a), MValue(b)]) for a, b in X.tolist()]
        loss = sum((1 + -yi * s).relu() for yi, s in zip(y.tolist(), scores)) * (1.0 / len(scores))
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data -= LR_MOONS * (p.grad + DECAY_MOONS * p.data)
        return loss.data
    return step


def timed(step: Callable[[], float], steps: int) -> float:
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t) / steps


def run(task: str, steps: int = 200, repeats: int = 7) -> Dict[str, Any]:
    """Seconds per step for each tier (median of repeats, tiers alternating),
    and the ratios."""
    ours, model = pygrad_step(task)
    theirs = torch_step(task, model)
    if theirs is not None:          # same start, same losses (to rounding)
        a = [ours() for _ in range(5)]
        b = [theirs() for _ in range(5)]
        np.testing.assert_allclose(a, b, rtol=1e-9)
    runs: Dict[str, List[float]] = {"pygrad batched": []}
    if theirs is not None:
        runs["pytorch"] = []
    for _ in range(repeats):
        runs["pygrad batched"].append(timed(ours, steps))
        if theirs is not None:
            runs["pytorch"].append(timed(theirs, steps))
    result: Dict[str, Any] = {"task": task, "steps": steps,
                              "seconds_per_step": {k: statistics.median(v) for k, v in runs.items()},
                              "runs": runs}
    mg = micrograd_step() if task == "moons" else None
    if mg is not None:
        mg_runs = [timed(mg, 1) for _ in range(2)]
        result["seconds_per_step"]["micrograd"] = statistics.median(mg_runs)
    per = result["seconds_per_step"]
    result["ratios"] = {f"{k} / pygrad batched": v / per["pygrad batched"]
                        for k, v in per.items() if k != "pygrad batched"}
    return result


def tasks_main(steps: int, repeats: int, json_path: Optional[str]) -> Dict[str, Any]:
    out = {}
    print("| task | tier | µs/step | × slower than pygrad batched |")
    print("| --- | --- | ---: | ---: |")
    for task in ("moons", "spiral"):
        r = run(task, steps, repeats)
        out[task] = r
        for name, s in r["seconds_per_step"].items():
            ratio = r["ratios"].get(f"{name} / pygrad batched", 1.0)
            print(f"| {task} | {name} | {s * 1e6:,.1f} | {ratio:,.1f} |")
    if "pytorch" not in out["moons"]["seconds_per_step"]:
        print("(PyTorch is not installed: pip install torch to add its rows)", file=sys.stderr)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=2)
    return out


# -- the six-size table ----------------------------------------------------------

SIZES = [(100, 16), (1000, 16), (10000, 16), (100, 64), (1000, 64), (10000, 64)]
LR, L2 = 0.1, 1e-4


def moons_rows(n: int) -> Tuple[np.ndarray, np.ndarray]:
    X, y = data.make_moons(n, noise=0.1, seed=SEED)
    return X, data.signed_labels(y).astype(np.float64)


def weights_of(model: nn.MLP) -> List[Tuple[np.ndarray, np.ndarray]]:
    return [(np.array([[w.data for w in n.w] for n in layer.neurons]),
             np.array([n.b.data for n in layer.neurons])) for layer in model.layers]


def size_pygrad(n: int, h: int, threads: Optional[int]) -> Tuple[Callable[[], float], nn.MLP]:
    X, y = moons_rows(n)
    random.seed(SEED)
    model = nn.MLP(2, [h, h, 1])
    x = [Value(0.0), Value(0.0)]
    yi = Value(0.0)
    prog = pygrad.compile((1 + -yi * model(x)).relu(), inputs=x + [yi])
    prog.threads = threads
    rows = np.column_stack([X, y])
    w = np.full(n, 1.0 / n)
    opt = optim.SGD(model.parameters(), lr=LR, weight_decay=2 * L2)
    params = model.parameters()

    def step() -> float:
        losses = prog.train_step(rows, w, opt)
        # the loss as the others report it: mean hinge + L2 (before the step)
        return 0.0 if losses is None else float(np.mean(losses))
    step.l2 = lambda: L2 * float(np.sum(np.square([p.data for p in params])))  # type: ignore
    return step, model


def size_jax(n: int, model: nn.MLP) -> Optional[Callable[[], float]]:
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
    except ImportError:
        return None
    X, y = moons_rows(n)
    Xj, yj = jnp.asarray(X), jnp.asarray(y)
    params = [(jnp.asarray(W), jnp.asarray(b)) for W, b in weights_of(model)]

    def loss_fn(ps: Any) -> Any:
        a = Xj
        for k, (W, b) in enumerate(ps):
            a = a @ W.T + b
            if k < len(ps) - 1:
                a = jax.nn.relu(a)
        data_loss = jnp.mean(jax.nn.relu(1 - yj * a[:, 0]))
        return data_loss + L2 * sum(jnp.sum(W * W) + jnp.sum(b * b) for W, b in ps)

    @jax.jit
    def jstep(ps: Any) -> Any:
        loss, g = jax.value_and_grad(loss_fn)(ps)
        return [(W - LR * gW, b - LR * gb) for (W, b), (gW, gb) in zip(ps, g)], loss

    state = {"p": params}

    def step() -> float:
        state["p"], loss = jstep(state["p"])
        return loss

    def last() -> None:
        jax.block_until_ready(state["p"])
    step.sync = last  # type: ignore
    return step


def size_torch(n: int, model: nn.MLP, threads: int) -> Optional[Callable[[], float]]:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    X, y = moons_rows(n)
    Xt, yt = torch.tensor(X), torch.tensor(y)
    layers: List[Any] = []
    for k, (W, b) in enumerate(weights_of(model)):
        lin = torch.nn.Linear(W.shape[1], W.shape[0], dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.tensor(W))
            lin.bias.copy_(torch.tensor(b))
        layers.append(lin)
        if k < len(model.layers) - 1:
            layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(net.parameters(), lr=LR, weight_decay=2 * L2)

    def step() -> float:
        opt.zero_grad()
        loss = torch.relu(1 - yt * net(Xt).squeeze(1)).mean()
        loss.backward()
        opt.step()
        return loss.detach()
    step.sync = lambda: None  # type: ignore
    return step


def time_run(step: Callable[[], Any], steps: int, clock: Callable[[], float] = time.perf_counter) -> float:
    t = clock()
    for _ in range(steps):
        step()
    sync = getattr(step, "sync", None)
    if sync is not None:
        sync()
    return (clock() - t) / steps


def size_row(n: int, h: int, pass_threads: Optional[int], repeats: int, budget: float) -> Dict[str, Any]:
    """One size: seconds per step of each engine (median of repeats,
    alternating) and the others' ratios to pygrad."""
    ours, model = size_pygrad(n, h, pass_threads)
    torch_threads = pass_threads or len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (pass_threads or os.cpu_count() or 1)
    engines: Dict[str, Callable[[], Any]] = {"pygrad": ours}
    jx = size_jax(n, model)
    if jx is not None:
        engines["jax"] = jx
    tt = size_torch(n, model, torch_threads)
    if tt is not None:
        engines["pytorch"] = tt
    # Same start, same losses: the first step's (mean hinge) loss.
    l2 = ours.l2()  # type: ignore[attr-defined]
    first = {"pygrad": ours() + l2}
    if jx is not None:
        first["jax"] = float(jx())
    if tt is not None:
        first["pytorch"] = float(tt()) + l2
    for name, v in first.items():
        assert abs(v - first["pygrad"]) <= 1e-9 * abs(first["pygrad"]), (n, h, first)
    # Warm up, and how many steps make a run of about `budget` seconds.
    counts = {}
    for name, st in engines.items():
        t = time_run(st, 3)
        counts[name] = max(1, min(2000, int(budget / max(t, 1e-7))))
    # One thread: the process's CPU time, which other processes sharing the
    # core don't inflate (every engine's threads count); all cores: wall time.
    clock = time.process_time if pass_threads == 1 else time.perf_counter
    runs: Dict[str, List[float]] = {k: [] for k in engines}
    for _ in range(repeats):
        for name, st in engines.items():
            runs[name].append(time_run(st, counts[name], clock))
    per = {k: statistics.median(v) for k, v in runs.items()}
    return {"n": n, "h": h, "seconds_per_step": per, "runs": runs, "first_loss": first,
            "clock": clock.__name__,
            "ratios": {k: v / per["pygrad"] for k, v in per.items() if k != "pygrad"}}


def table_pass(label: str, quick: bool) -> Dict[str, Any]:
    """The six sizes in this process, as it was started (worker)."""
    threads = 1 if label == "1 thread" else None
    repeats, budget = (3, 0.01) if quick else (11, 0.02)
    return {"label": label, "rows": [size_row(n, h, threads, repeats, budget) for n, h in SIZES]}


def print_table(result: Dict[str, Any]) -> None:
    rows = result["rows"]
    others = [k for k in ("jax", "pytorch") if k in rows[0]["seconds_per_step"]]
    clock = "CPU time" if result["label"] == "1 thread" else "wall time"
    print(f"\n{result['label']} ({result.get('how', '')}; {clock}):\n")
    head = "| N rows | H | pygrad ms |" + "".join(f" {k} ms | {k} ÷ pygrad |" for k in others)
    print(head)
    print("|---:|---:|---:|" + "---:|---:|" * len(others))
    for r in rows:
        per = r["seconds_per_step"]
        line = f"| {r['n']:,} | {r['h']} | {per['pygrad'] * 1e3:.4f} |"
        line += "".join(f" {per[k] * 1e3:.4f} | {r['ratios'][k]:.2f} |" for k in others)
        print(line)
    if not others:
        print("(JAX and PyTorch are not installed: see this script's doc to add them)")


def run_pass(label: str, quick: bool) -> Dict[str, Any]:
    """A pass in a fresh Python, pinned and configured as its label says."""
    env = dict(os.environ)
    # Threads that spin after their work (OpenMP's default wait policy in
    # PyTorch's builds) would take the CPU from the engine timed next: they
    # sleep at once instead.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("KMP_BLOCKTIME", "0")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", label]
    if quick:
        cmd.append("--quick")
    how = "every CPU of this process"
    if label == "1 thread":
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                            "intra_op_parallelism_threads=1").strip()
        env["OMP_NUM_THREADS"] = "1"
        how = "XLA one thread, torch.set_num_threads(1), Program.threads = 1"
        if shutil.which("taskset"):
            cmd = ["taskset", "-c", "0"] + cmd
            how = "taskset -c 0, " + how
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=True, text=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["how"] = how
    return result


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    ap.add_argument("--tasks", action="store_true", help="the older moons / spiral comparison")
    ap.add_argument("--passes", default="1 thread,all cores",
                    help="which passes, comma-separated ('1 thread', 'all cores')")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.tasks:
        steps, repeats = (50, 3) if args.quick else (200, 7)
        return tasks_main(steps, repeats, args.json)
    if args.worker:
        result = table_pass(args.worker, args.quick)
        print(json.dumps(result))
        return result
    out = {"passes": []}
    print(f"pygrad {pygrad.__version__}, {os.cpu_count()} CPUs; float64; "
          "MLP(2, [H, H, 1]) moons step, hinge + L2, SGD")
    for label in [p.strip() for p in args.passes.split(",") if p.strip()]:
        result = run_pass(label, args.quick)
        out["passes"].append(result)
        print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
