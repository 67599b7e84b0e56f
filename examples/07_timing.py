"""How much faster? The same training on three engines, side by side.
Without --quick this takes a few minutes (the pure-Python engine trains
five times over); --quick takes seconds.

One moons training run (MLP(2, [16, 16, 1]), SVM loss, SGD) three ways:
  - reference: pygrad's pure-Python engine, written as plainly as micrograd;
  - eager: pygrad's C engine, the graph rebuilt op by op every step;
  - replay: the graph built once, compiled, and re-run in C every step.
Each is timed several times and the median taken; the ratios are what to
read, since the machine's speed cancels out.  All three must produce the
same losses, bit for bit.  (benchmarks/run.py is the full benchmark.)

    python examples/07_timing.py [--quick] [--out DIR]
"""
import random
import statistics
import time
from typing import List, Optional, Sequence

import pygrad
from pygrad import data, losses, nn, optim

from _common import check, parse_args


def train(engine: str, X, y, steps: int) -> List[float]:
    """The losses of one run on 'reference', 'eager' or 'replay'."""
    random.seed(0)
    model = nn.MLP(2, [16, 16, 1], engine="reference" if engine == "reference" else "c",
                   fused=engine != "eager")
    opt = optim.SGD(model.parameters(), lr=0.5)
    value_type = pygrad.reference.Value if engine == "reference" else pygrad.Value

    def build():
        scores = [model(x) for x in data.to_values(X, value_type)]
        return losses.svm_hinge(scores, y, model.parameters(), alpha=1e-4)
    if engine == "replay":
        loss = build()
        program = pygrad.compile(loss)
    history = []
    for _ in range(steps):
        if engine == "replay":
            program.forward()
            opt.zero_grad()
            program.backward()
        else:
            loss = build()
            opt.zero_grad()
            loss.backward()
        history.append(loss.data)
        opt.step()
    return history


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(__doc__, argv)
    n, steps, repeats = (20, 3, 3) if args.quick else (100, 10, 5)
    X, y = data.make_moons(n, noise=0.1, seed=0)
    labels = data.signed_labels(y).tolist()
    seconds, runs = {}, {}
    for engine in ("reference", "eager", "replay"):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            runs[engine] = train(engine, X, labels, steps)
            times.append(time.perf_counter() - t0)
        seconds[engine] = statistics.median(times)
    print(f"moons, {n} points, {steps} steps, median of {repeats}:")
    for engine, s in seconds.items():
        print(f"  {engine:>9}: {s * 1e3 / steps:8.2f} ms/step   "
              f"{seconds['reference'] / s:7.1f}x the reference")
    check(runs["eager"] == runs["reference"] and runs["replay"] == runs["reference"],
          "the three engines' losses are identical, bit for bit")
    return {"seconds": seconds, "losses": runs}


if __name__ == "__main__":
    main()
