"""A hyperparameter sweep and seed ensemble on dask.distributed.

Every cell of a grid (learning rate x hidden width x seed) trains its own
moons classifier, MLP(2, [width, width, 1]) with micrograd's SVM loss + L2
by SGD on the replay tier, as one task of dask.distributed's Client.map.
The runs are independent, so they spread over worker processes; each one
stays in one process (a graph is never split).  By default a LocalCluster
of 2 worker processes, 1 thread each, runs them; --scheduler ADDRESS uses
a cluster you started (`dask scheduler`, then `dask worker ADDRESS` on each
machine, with pygrad installed there).

Each run starts from weights drawn by numpy's default_rng(seed) and is
deterministic, so its final loss and parameters must equal the same run
trained serially in this process, bit for bit: the script checks that (all
runs with --quick, every 5th otherwise).  A worker that dies mid-run is
replaced by its nanny and the run retried by the scheduler; a run that
raises comes back as a RunFailed naming its (lr, width, seed) while the
others complete.  Prints the runs sorted by held-out accuracy and, with
matplotlib, writes sweep_heatmap.png (accuracy over lr x width, averaged
over seeds).  Needs `pip install "pygrad-autograd[distributed]"`.

    python examples/10_sweep_dask.py [--quick] [--out DIR] [--scheduler ADDRESS] [--workers N]
"""
import argparse
import itertools
import os
import sys
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import pygrad
from pygrad import data, losses, nn, optim

from _common import check, make_parser

Config = Tuple[float, int, int]  # (lr, width, seed)

# The grids: --quick keeps to 8 tiny runs.
FULL = {"lrs": [0.03, 0.1, 0.3, 1.0], "widths": [4, 8, 16, 32], "seeds": [0, 1, 2, 3, 4],
        "steps": 200}
QUICK = {"lrs": [0.1, 1.0], "widths": [4, 8], "seeds": [0, 1], "steps": 30}


# -- one run: what a worker executes ---------------------------------------------
# train_run refers only to importable modules (numpy, pygrad, the standard
# library) and to functions of this file, so cloudpickle can ship it by value
# to workers that don't have this script.

def train_run(lr: float, width: int, seed: int, steps: int) -> Dict[str, Any]:
    """Train one moons classifier; its losses, accuracies, wall time and
    final parameters.  Deterministic in (lr, width, seed, steps): the data
    are fixed (make_moons seeds 0 for training and 1 for the held-out set)
    and the initial weights come from numpy's default_rng(seed), not from
    the global random module."""
    t0 = time.perf_counter()
    X, y = data.make_moons(100, noise=0.1, seed=0)
    X_test, y_test = data.make_moons(200, noise=0.1, seed=1)
    labels = data.signed_labels(y).tolist()
    model = nn.MLP(2, [width, width, 1])
    model.set_data(np.random.default_rng(seed).uniform(-1, 1, len(model.parameters())))
    opt = optim.SGD(model.parameters(), lr=lambda k: lr * (1.0 - 0.9 * k / steps))
    scores = [model(x) for x in data.to_values(X)]
    loss = losses.svm_hinge(scores, labels, model.parameters(), alpha=1e-4)
    program = pygrad.compile(loss)  # the batch is fixed: build once, replay in C
    history = []
    for _ in range(steps):
        history.append(program.forward())
        opt.zero_grad()
        program.backward()
        opt.step()
    final_loss = program.forward()  # at the final parameters; updates scores too
    train_acc = float(np.mean([(s.data > 0) == (t > 0) for s, t in zip(scores, labels)]))
    test_acc = float(np.mean([(model(x).data > 0) == bool(t)
                              for x, t in zip(data.to_values(X_test), y_test)]))
    return {"lr": lr, "width": width, "seed": seed, "steps": steps, "losses": history,
            "final_loss": final_loss, "train_accuracy": train_acc, "accuracy": test_acc,
            "params": model.get_data(), "seconds": time.perf_counter() - t0,
            "pid": os.getpid()}


# -- the sweep on a dask client ------------------------------------------------

class RunFailed(RuntimeError):
    """A run that raised (or whose workers kept dying); the message names
    its (lr, width, seed), the original exception is ``__cause__``."""

    def __init__(self, config: Config, error: BaseException) -> None:
        self.lr, self.width, self.seed = config
        super().__init__(f"run lr={self.lr} width={self.width} seed={self.seed} failed: "
                         f"{type(error).__name__}: {error}")


def grid(lrs: Sequence[float], widths: Sequence[int], seeds: Sequence[int]) -> List[Config]:
    return list(itertools.product(lrs, widths, seeds))


def _ship_by_value() -> None:
    """Workers can't import this script: have cloudpickle send its functions
    by value.  It does so by itself for __main__ and for a module loaded by
    path; an import under another name needs registering."""
    if __name__ != "__main__" and __name__ in sys.modules:
        import cloudpickle
        cloudpickle.register_pickle_by_value(sys.modules[__name__])


def run_sweep(client: Any, configs: Sequence[Config], steps: int,
              run: Callable[..., Dict[str, Any]] = train_run,
              log: Optional[Callable[[str], None]] = print) -> Tuple[List[dict], List[RunFailed]]:
    """Run ``run(lr, width, seed, steps)`` for every config on the client's
    workers (Client.map), one task per run.  Results are collected as they
    complete, with a counter line per run; a run that raises becomes a
    RunFailed and the others go on.  Returns (results, failures), each in
    ``configs`` order."""
    from distributed import as_completed
    configs = [tuple(c) for c in configs]
    if len(set(configs)) != len(configs):
        raise ValueError("configs must be distinct (lr, width, seed) triples")
    if not configs:
        return [], []
    _ship_by_value()
    token = uuid.uuid4().hex[:8]  # fresh keys: never reuse an earlier sweep's results
    keys = [f"pygrad-run-lr={lr}-width={w}-seed={s}-{token}" for lr, w, s in configs]
    futures = client.map(run, *zip(*configs), steps=steps, key=keys)
    config_of = {f.key: c for f, c in zip(futures, configs)}
    done: Dict[Config, Any] = {}
    for i, future in enumerate(as_completed(futures), 1):
        config = config_of[future.key]
        try:
            r = done[config] = future.result()  # re-raises the run's exception here
        except Exception as exc:
            failure = done[config] = RunFailed(config, exc)
            failure.__cause__ = exc
            line = str(failure)
        else:
            line = _describe(config, r)
        if log is not None:
            log(f"  [{i:{len(str(len(configs)))}d}/{len(configs)}] {line}")
    del futures
    ordered = [done[c] for c in configs]
    return ([r for r in ordered if not isinstance(r, RunFailed)],
            [r for r in ordered if isinstance(r, RunFailed)])


def _describe(config: Config, r: Any) -> str:
    """A progress line for a finished run (the keys train_run returns, where
    a custom run function returns them)."""
    lr, width, seed = config
    line = f"lr {lr:<5g} width {width:3d} seed {seed}: "
    if isinstance(r, dict) and {"accuracy", "seconds", "pid"} <= set(r):
        return line + f"accuracy {r['accuracy']:6.1%}, {r['seconds']:.2f} s (worker pid {r['pid']})"
    return line + "done"


def same_bits(a: Any, b: Any) -> bool:
    """Equal as IEEE 754 doubles, bit for bit (so -0.0 != 0.0, and a nan
    equals the same nan)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def matches_serial(result: Dict[str, Any]) -> bool:
    """Train the same run here, in this process, and compare every loss and
    parameter bit for bit."""
    here = train_run(result["lr"], result["width"], result["seed"], result["steps"])
    return all(same_bits(here[k], result[k]) for k in ("losses", "final_loss", "params"))


# -- reporting -----------------------------------------------------------------

def print_table(results: List[dict]) -> None:
    ranked = sorted(results, key=lambda r: (-r["accuracy"], r["final_loss"]))
    print(f"  {'rank':>4} {'lr':>6} {'width':>5} {'seed':>4} {'final loss':>10} "
          f"{'train acc':>9} {'test acc':>8} {'seconds':>7}")
    for rank, r in enumerate(ranked, 1):
        print(f"  {rank:4d} {r['lr']:6g} {r['width']:5d} {r['seed']:4d} {r['final_loss']:10.4f} "
              f"{r['train_accuracy']:9.1%} {r['accuracy']:8.1%} {r['seconds']:7.2f}")


def mean_accuracy(results: List[dict]) -> Tuple[List[float], List[int], np.ndarray]:
    """Held-out accuracy averaged over seeds: (lrs, widths, [width][lr])."""
    lrs = sorted({r["lr"] for r in results})
    widths = sorted({r["width"] for r in results})
    table = np.full((len(widths), len(lrs)), np.nan)
    for i, w in enumerate(widths):
        for j, lr in enumerate(lrs):
            accs = [r["accuracy"] for r in results if r["width"] == w and r["lr"] == lr]
            if accs:
                table[i, j] = np.mean(accs)
    return lrs, widths, table


def plot_heatmap(results: List[dict], path: str) -> Optional[str]:
    """Mean held-out accuracy over lr x width as a PNG; its path, or None
    without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  (matplotlib is not installed: no heat map; pip install matplotlib)")
        return None
    lrs, widths, table = mean_accuracy(results)
    fig, ax = plt.subplots(figsize=(1.2 * len(lrs) + 2, 0.8 * len(widths) + 1.5))
    im = ax.imshow(table, cmap="viridis", vmin=0.5, vmax=1.0, origin="lower")
    ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
    ax.set_yticks(range(len(widths)), [str(w) for w in widths])
    ax.set_xlabel("learning rate")
    ax.set_ylabel("hidden width")
    seeds = len({r["seed"] for r in results})
    ax.set_title(f"moons: held-out accuracy, mean of {seeds} seeds")
    for i in range(len(widths)):
        for j in range(len(lrs)):
            if not np.isnan(table[i, j]):
                ax.text(j, i, f"{table[i, j]:.0%}", ha="center", va="center",
                        color="black" if table[i, j] > 0.8 else "white")
    fig.colorbar(im, ax=ax, label="accuracy")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"  wrote {path}")
    return path


# -- the script ------------------------------------------------------------------

def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = make_parser(__doc__, writes="sweep_heatmap.png if matplotlib is installed",
                    out_default="pygrad-sweep")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="an existing dask scheduler, e.g. tcp://10.0.0.5:8786 "
                        "(default: start a LocalCluster)")
    p.add_argument("--connect-timeout", metavar="SECONDS", type=float, default=10.0,
                   help="how long to try reaching --scheduler (default: 10)")
    p.add_argument("--workers", metavar="N", type=int, default=2,
                   help="worker processes of the LocalCluster (default: 2, 1 thread each)")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if not args.connect_timeout > 0:
        p.error("--connect-timeout must be positive")
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        print("dask.distributed is not installed: nothing to run "
              "(pip install \"pygrad-autograd[distributed]\")")
        return {"skipped": "dask.distributed is not installed"}
    spec = QUICK if args.quick else FULL
    configs = grid(spec["lrs"], spec["widths"], spec["seeds"])
    steps = spec["steps"]
    print(f"sweep: {len(spec['lrs'])} learning rates x {len(spec['widths'])} widths x "
          f"{len(spec['seeds'])} seeds = {len(configs)} moons runs of {steps} steps")
    t0 = time.perf_counter()
    if args.scheduler:
        try:
            client = Client(args.scheduler, timeout=args.connect_timeout)
        except (OSError, TimeoutError) as e:
            # dask's own error is a traceback ending in "Timed out trying to connect"
            raise SystemExit(f"no dask scheduler answered at {args.scheduler} within "
                             f"{args.connect_timeout:g} s ({type(e).__name__}): start one with "
                             f"`dask scheduler`, or check the address") from None
        with client:
            print(f"  on the cluster at {args.scheduler} "
                  f"({len(client.scheduler_info()['workers'])} workers)")
            results, failures = run_sweep(client, configs, steps)
    else:
        with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                          dashboard_address=":0") as cluster, Client(cluster) as client:
            print(f"  on a LocalCluster of {args.workers} worker processes, 1 thread each")
            results, failures = run_sweep(client, configs, steps)
    seconds = time.perf_counter() - t0
    print(f"  {len(results)} runs in {seconds:.1f} s wall "
          f"({sum(r['seconds'] for r in results):.1f} s of training), sorted by held-out accuracy:")
    print_table(results)
    lrs, widths, table = mean_accuracy(results)
    best = max(results, key=lambda r: (r["accuracy"], -r["final_loss"]), default=None)
    plot = plot_heatmap(results, os.path.join(args.out, "sweep_heatmap.png")) if results else None

    to_check = results if args.quick else results[::5]
    mismatches = [(r["lr"], r["width"], r["seed"]) for r in to_check if not matches_serial(r)]
    for m in mismatches:
        print(f"    lr {m[0]:g} width {m[1]} seed {m[2]}: differs from the serial run")
    for f in failures:
        print(f"    {f}")
    check(not failures, f"all {len(configs)} runs completed")
    check(not mismatches, f"{len(to_check)} runs equal the same run trained serially, bit for bit")
    check(best is not None and best["accuracy"] >= 0.85,
          "the best run gets at least 85% of the held-out points right")
    return {"results": results, "failures": failures, "checked": len(to_check),
            "mismatches": mismatches, "best": best, "lrs": lrs, "widths": widths,
            "mean_accuracy": table, "plot": plot, "seconds": seconds}


if __name__ == "__main__":
    main()
