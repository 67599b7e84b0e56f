"""Benchmark micrograd's moons demo training (100 steps) across engines.

    python benchmarks/bench_nn.py            # 100 steps; about 4 minutes
    python benchmarks/bench_nn.py --quick    # 10 steps

The same task everywhere: MLP(2, [16, 16, 1]) on pygrad.data.make_moons(100,
noise=0.1), micrograd's SVM loss + 1e-4 L2, full batch, lr 1.0 - 0.9*k/100,
``random.seed`` fixed so every engine starts from the same weights.

Tiers:
- micrograd:        micrograd.nn + micrograd.engine (when installed);
- reference:        pygrad.nn on the pure-Python reference engine;
- interpreter floor: micrograd's own nn code on bench_engine.FloorValue, an
                    object per op holding its float and no graph (backward
                    does nothing, so it runs the same forward every step):
                    what no engine of Python objects can beat on this code;
- pygrad eager:     micrograd's own nn code running on pygrad.Value (its
                    ``Value`` swapped for pygrad's), or pygrad.nn with
                    fused=False when micrograd is absent;
- pygrad fused:     pygrad.nn (one C call per layer) + pygrad.optim.SGD;
- pygrad replay:    the fused graph built once, then pygrad.compile'd and
                    re-run in C each step (forward, zero_grad, backward, step).

Python's GC stays on.  Each tier is timed end to end (input conversion,
forward, loss, backward, update); the fast tiers take the median of
--repeats runs, the slow ones (micrograd, reference) run once.  Losses are
checked: every pygrad tier must equal the reference bit for bit.
"""
import argparse
import gc
import json
import random
import statistics
import time
from typing import Any, Callable, Dict, List

from pygrad import data, losses, nn, optim
from pygrad import engine as c_engine
from pygrad import reference

SEED = 0


def moons():
    X, y = data.make_moons(100, noise=0.1, seed=SEED)
    return X.tolist(), data.signed_labels(y).tolist()


def loop(model: Any, Value: type, steps: int, update: Callable[[int], None]) -> List[float]:
    """micrograd's demo loop, written out: loss, zero_grad, backward, update."""
    X, y = moons()
    history = []
    for k in range(steps):
        inputs = [list(map(Value, row)) for row in X]
        scores = list(map(model, inputs))
        data_loss = sum((1 + -yi * s).relu() for yi, s in zip(y, scores)) * (1.0 / len(scores))
        loss = data_loss + 1e-4 * sum((p * p for p in model.parameters()))
        model.zero_grad()
        loss.backward()
        update(k)
        history.append(loss.data)
    return history


def sgd_in_python(model: Any) -> Callable[[int], None]:
    def update(k: int) -> None:
        lr = 1.0 - 0.9 * k / 100
        for p in model.parameters():
            p.data -= lr * p.grad
    return update


def run_micrograd(steps: int, eager_on_pygrad: bool = False, value_type: Any = None) -> List[float]:
    import micrograd.nn as mnn
    from micrograd.engine import Value as MValue
    Value = value_type or (c_engine.Value if eager_on_pygrad else MValue)
    saved = mnn.Value
    mnn.Value = Value          # micrograd's nn code, on another Value class
    try:
        random.seed(SEED)
        model = mnn.MLP(2, [16, 16, 1])
        return loop(model, Value, steps, sgd_in_python(model))
    finally:
        mnn.Value = saved


def run_reference(steps: int) -> List[float]:
    random.seed(SEED)
    model = nn.MLP(2, [16, 16, 1], engine="reference")
    return loop(model, reference.Value, steps, sgd_in_python(model))


def run_pygrad_eager(steps: int) -> List[float]:
    random.seed(SEED)
    model = nn.MLP(2, [16, 16, 1], fused=False)
    return loop(model, c_engine.Value, steps, sgd_in_python(model))


def run_pygrad_fused(steps: int) -> List[float]:
    random.seed(SEED)
    model = nn.MLP(2, [16, 16, 1])
    opt = optim.SGD(model.parameters(), lr=lambda k: 1.0 - 0.9 * k / 100)
    X, y = moons()
    history = []
    for _ in range(steps):
        inputs = data.to_values(X)
        scores = [model(x) for x in inputs]
        loss = losses.svm_hinge(scores, y, model.parameters(), alpha=1e-4)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.data)
    return history


def run_pygrad_replay(steps: int) -> List[float]:
    import pygrad
    random.seed(SEED)
    model = nn.MLP(2, [16, 16, 1])
    opt = optim.SGD(model.parameters(), lr=lambda k: 1.0 - 0.9 * k / 100)
    X, y = moons()
    scores = [model(x) for x in data.to_values(X)]
    loss = losses.svm_hinge(scores, y, model.parameters(), alpha=1e-4)
    program = pygrad.compile(loss)
    history = []
    for _ in range(steps):
        history.append(program.forward())
        opt.zero_grad()
        program.backward()
        opt.step()
    return history


FLOOR = "interpreter floor (micrograd.nn on a graph-less Value, forward only)"


def timed(fn: Callable[[int], List[float]], steps: int, repeats: int) -> Dict[str, Any]:
    times, result = [], None
    for _ in range(repeats):
        gc.collect()
        t = time.perf_counter()
        result = fn(steps)
        times.append(time.perf_counter() - t)
    return {"seconds": statistics.median(times), "runs": times, "losses": result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="10 steps")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each fast tier (median)")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    steps = 10 if args.quick else args.steps
    try:
        import micrograd
        has_micrograd = micrograd is not None
    except ImportError:
        has_micrograd = False

    tiers: Dict[str, Any] = {}
    if has_micrograd:
        tiers["micrograd"] = timed(run_micrograd, steps, 1)
    tiers["reference"] = timed(run_reference, steps, 1)
    if has_micrograd:
        from bench_engine import FloorValue
        tiers[FLOOR] = timed(lambda s: run_micrograd(s, value_type=FloorValue), steps,
                             args.repeats)
        tiers["pygrad eager (micrograd.nn on pygrad.Value)"] = timed(
            lambda s: run_micrograd(s, eager_on_pygrad=True), steps, args.repeats)
    else:
        tiers["pygrad eager (nn, fused=False)"] = timed(run_pygrad_eager, steps, args.repeats)
    tiers["pygrad fused (nn + optim.SGD)"] = timed(run_pygrad_fused, steps, args.repeats)
    tiers["pygrad replay (compiled once, re-run in C)"] = timed(run_pygrad_replay, steps,
                                                                args.repeats)

    ref_losses = tiers["reference"]["losses"]
    for name, r in tiers.items():
        if name.startswith("pygrad"):
            assert r["losses"] == ref_losses, f"{name} differs from the reference engine"
    if FLOOR in tiers:      # the same forward: its first loss is everyone's
        assert tiers[FLOOR]["losses"][0] == ref_losses[0], "the floor computes another loss"
    print(f"# moons training, {steps} steps, MLP(2, [16, 16, 1]), GC on\n")
    print("| tier | seconds | ms/step | × faster than micrograd | × faster than reference |")
    print("| --- | ---: | ---: | ---: | ---: |")
    base_m = tiers.get("micrograd", {}).get("seconds")
    base_r = tiers["reference"]["seconds"]
    for name, r in tiers.items():
        s = r["seconds"]
        vs_m = f"{base_m / s:.1f}" if base_m else "n/a"
        print(f"| {name} | {s:.3f} | {1e3 * s / steps:.2f} | {vs_m} | {base_r / s:.1f} |")
    print(f"\nfinal loss {ref_losses[-1]:.6f}; every pygrad tier equals the reference bit for bit"
          + ("" if not has_micrograd else
             f"; micrograd's final loss {tiers['micrograd']['losses'][-1]:.6f}"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": steps, "tiers": {k: {"seconds": v["seconds"], "runs": v["runs"]}
                                                 for k, v in tiers.items()}}, f, indent=2)


if __name__ == "__main__":
    main()
