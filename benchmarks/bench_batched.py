"""Batched training steps: pygrad's Program.map against PyTorch tensors.

    python benchmarks/bench_batched.py            # 200 steps per run, 7 runs
    python benchmarks/bench_batched.py --quick    # 50 steps, 3 runs

Two tasks, the same everywhere (data, architecture, starting weights, loss,
optimizer; full batch):

* moons:  MLP(2, [16, 16, 1]) on pygrad.data.make_moons(100, noise=0.1),
  micrograd's hinge loss (mean of relu(1 - y * score)), L2 through SGD's
  weight_decay (2e-4, the gradient of micrograd's 1e-4 * sum(p * p)), lr 0.1.
* spiral: MLP(2, [16, 16, 3]) on a 3-class spiral (50 points a class),
  softmax cross-entropy (mean), Adam(lr 0.05).

Tiers: ``pygrad batched`` builds one sample's graph, compiles it with the
per-row inputs and runs each step as one ``Program.map(rows, grad=1/n)``
plus the optimizer's step in C; ``pytorch`` is float64 tensors on one
thread (``torch.set_num_threads(1)``), the idiomatic batched step
(zero_grad, forward, loss, backward, step); ``micrograd`` (moons only, when
installed) is its own demo loop, timed over a few steps.

Each run times ``steps`` steps; the tiers alternate run by run and the
median is reported, so drift in machine speed hits them alike.  Before
timing, both tiers' losses over the first steps are checked to agree (to
1e-9 relative: PyTorch sums in other orders).
"""
import argparse
import json
import random
import statistics
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
        opt.zero_grad()
        loss = prog.map(rows, grad=w)
        opt.step()
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


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="50 steps per run, 3 runs")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    steps, repeats = (50, 3) if args.quick else (200, 7)
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
