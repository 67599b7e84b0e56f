"""Several seeds of micrograd's moons MLP, trained in worker processes.

Each seed's model, MLP(2, [16, 16, 1]) with its initial weights drawn by
numpy's default_rng(seed), is built here and sent, pickled, to a worker of a
concurrent.futures.ProcessPoolExecutor.  The worker trains it (micrograd's
SVM loss plus L2 by SGD, the graph built once and replayed in C) and sends
back the trained model object itself, pickled again: a pygrad model pickles
at any time, its parameters arriving as new leaves with the same data and
grad.  Training is deterministic, so every seed's losses, final parameters
and grads must equal the same training done serially in this process, bit
for bit; the script checks that (exit 1 otherwise).  It writes no files.

The workers import this file to find train_in_worker: run it as a script,
or import it as a module whose folder is on sys.path.

    python examples/09_seeds_in_processes.py [--quick] [--out DIR]
"""
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

import pygrad
from pygrad import data, losses, nn, optim

from _common import check, parse_args


def build(seed: int) -> nn.MLP:
    """A fresh model whose weights come from default_rng(seed) (not from the
    global random module, which every process seeds differently)."""
    model = nn.MLP(2, [16, 16, 1])
    model.set_data(np.random.default_rng(seed).uniform(-1, 1, len(model.parameters())))
    return model


def train(model: nn.MLP, steps: int) -> List[float]:
    """Train ``model`` in place on 100 moons points; the loss of every step,
    then the loss at the final parameters."""
    X, y = data.make_moons(100, noise=0.1, seed=0)
    opt = optim.SGD(model.parameters(), lr=lambda k: 1.0 - 0.9 * k / steps)
    scores = [model(x) for x in data.to_values(X)]
    loss = losses.svm_hinge(scores, data.signed_labels(y).tolist(), model.parameters(), alpha=1e-4)
    program = pygrad.compile(loss)  # the batch is fixed: build the graph once, replay it in C
    history = []
    for _ in range(steps):
        history.append(program.forward())
        opt.zero_grad()
        program.backward()
        opt.step()
    history.append(program.forward())
    return history


def train_in_worker(seed: int, model: nn.MLP, steps: int) -> Dict[str, Any]:
    """What a worker runs: ``model`` arrives unpickled, is trained, and goes
    back (pickled by the executor) with its losses."""
    received = model.get_data()
    t0 = time.perf_counter()
    history = train(model, steps)
    return {"seed": seed, "received": received, "losses": history, "model": model,
            "seconds": time.perf_counter() - t0, "pid": os.getpid()}


def same_bits(a: Any, b: Any) -> bool:
    """Equal as IEEE 754 doubles, bit for bit (-0.0 != 0.0; a nan equals itself)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(__doc__, argv)
    seeds, steps, workers = ([0, 1, 2], 20, 2) if args.quick else \
        (list(range(8)), 100, min(4, os.cpu_count() or 1))
    if __name__ != "__main__" and sys.modules.get(__name__) is None:
        raise RuntimeError(f"the workers can't import {__name__}: run it as a script, or "
                           "import it as a module (in sys.modules, its folder on sys.path)")

    # "spawn", chosen explicitly (Linux's default is still "fork"): a spawned
    # worker is a fresh interpreter that has only what was pickled to it, so
    # the models really travel by pickle (a forked one would inherit a copy of
    # this process's memory); fork copies only the calling thread of a process
    # that may be running others (a test runner's, a BLAS pool's), which can
    # deadlock and which Python 3.12+ warns about; and spawn is the default on
    # macOS and Windows, so the example behaves the same everywhere.  The cost:
    # each worker imports numpy and pygrad when it starts, a fraction of a second.
    context = multiprocessing.get_context("spawn")
    print(f"moons, {len(seeds)} seeds x {steps} steps on {workers} spawned worker processes:")
    t0 = time.perf_counter()
    sent = {seed: build(seed) for seed in seeds}
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        # The executor pickles a task's arguments later, in a background
        # thread: leave a submitted model alone until its result is back.
        futures = {seed: pool.submit(train_in_worker, seed, sent[seed], steps) for seed in seeds}
        results = {seed: f.result() for seed, f in futures.items()}
    wall = time.perf_counter() - t0

    serial, equal = {}, {}
    for seed in seeds:
        model = build(seed)
        history = train(model, steps)
        serial[seed] = {"losses": history, "model": model}
        r = results[seed]
        equal[seed] = (same_bits(r["received"], sent[seed].get_data())
                       and same_bits(r["losses"], history)
                       and same_bits(r["model"].get_data(), model.get_data())
                       and same_bits(r["model"].get_grad(), model.get_grad()))
        print(f"  seed {seed}: loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f} in worker pid "
              f"{r['pid']} ({r['seconds']:.2f} s); serially here: "
              f"{'the same, bit for bit' if equal[seed] else 'DIFFERENT'}")
    pids = sorted({r["pid"] for r in results.values()})
    print(f"  {len(seeds)} runs in {wall:.2f} s wall (worker start-up included), "
          f"{len(pids)} worker processes")

    check(all(isinstance(r["model"], nn.MLP) for r in results.values()),
          "every worker sent back its trained model object")
    check(all(equal.values()), f"all {len(seeds)} seeds' losses, parameters and grads equal "
                               "the same training done serially, bit for bit")
    check(all(r["losses"][-1] < r["losses"][0] for r in results.values()),
          "every seed's loss fell")
    return {"seeds": seeds, "steps": steps, "workers": workers, "start_method": "spawn",
            "results": results, "serial": serial, "equal": equal, "pids": pids,
            "seconds": wall}


if __name__ == "__main__":
    main()
