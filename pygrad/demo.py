"""The main job: ``python -m pygrad`` trains micrograd's moons demo and a
softmax classifier on a 3-class spiral, showing progress, loss, accuracy,
wall time and the speedup over pygrad's pure-Python reference engine
measured in the same run (and, where micrograd is installed, micrograd's
own training loop against the same loop on pygrad.Value).  With matplotlib
it writes decision-boundary and loss-curve PNGs."""
import argparse
import gc
import importlib
import importlib.util
import math
import os
import random
import sys
import tempfile
import textwrap
import time
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from . import data, losses, nn, optim

__all__ = ["main", "train_moons", "train_spiral"]


class Progress:
    """A progress bar on a terminal (tqdm's, when installed: the ``demo``
    extra brings it), plain lines every 10 steps when piped."""

    def __init__(self, title: str, total: int, stream: Any = None) -> None:
        self.title, self.total = title, total
        self.stream = stream or sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar: Any = None
        if self.tty:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self.bar = tqdm(total=total, desc=title, file=self.stream, unit="step",
                                dynamic_ncols=True)

    def update(self, step: int, loss: float, acc: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss:.4f}, accuracy {acc:.1%}", refresh=False)
            self.bar.update(1)
            if step + 1 == self.total:
                self.bar.close()
            return
        line = f"{self.title} step {step + 1:4d}/{self.total}  loss {loss:.4f}  accuracy {acc:6.1%}"
        if self.tty:
            bar = "#" * (20 * (step + 1) // self.total)
            self.stream.write(f"\r[{bar:<20}] {line}")
            if step + 1 == self.total:
                self.stream.write("\n")
        elif (step + 1) % 10 == 0 or step + 1 == self.total:
            self.stream.write(line + "\n")
        self.stream.flush()


def _loss(task: str, model: nn.MLP, X: np.ndarray, y: np.ndarray,
          value_type: Any) -> Tuple[Any, List[Any]]:
    """The task's loss over the full batch, and the model's outputs."""
    outputs = [model(x) for x in data.to_values(X, value_type)]
    if task == "moons":
        return losses.svm_hinge(outputs, y.tolist(), model.parameters(), alpha=1e-4), outputs
    return losses.softmax_cross_entropy(outputs, y.tolist()), outputs


def _accuracy(task: str, outputs: List[Any], y: np.ndarray) -> float:
    if task == "moons":
        return float(np.mean([(yi > 0) == (s.data > 0) for yi, s in zip(y, outputs)]))
    return float(np.mean([int(np.argmax([z.data for z in zs])) == yi for zs, yi in zip(outputs, y)]))


def _setup(task: str, seed: int,
           engine: str) -> Tuple[nn.MLP, np.ndarray, np.ndarray, optim.Optimizer]:
    random.seed(seed)
    if task == "moons":
        X, y = data.make_moons(100, noise=0.1, seed=seed)
        model = nn.MLP(2, [16, 16, 1], engine=engine)
        sgd = optim.SGD(model.parameters(), lr=lambda k: 1.0 - 0.9 * k / 100)
        return model, X, data.signed_labels(y), sgd
    X, y = data.make_spiral(50, 3, noise=0.2, seed=seed)
    model = nn.MLP(2, [16, 16, 3], engine=engine)
    adam = optim.Adam(model.parameters(), lr=0.05)
    return model, X, y, adam


TIERS = ("replay", "batched", "fused", "eager")


def _batched(task: str, model: nn.MLP, X: np.ndarray, y: np.ndarray) -> Tuple[Any, np.ndarray,
                                                                               np.ndarray, Any]:
    """One sample's loss graph, compiled to run over the rows (Program.map):
    the program, its rows, the grad weights (1/n on each row's loss, as the
    batch mean), and the L2 term's own program (moons) or None."""
    from .engine import Value
    from .functional import dot, logsumexp, sum as total
    from .replay import compile as compile_graph
    x = [Value(0.0), Value(0.0)]
    out = model(x)
    n = len(X)
    if task == "moons":
        yi = Value(0.0)
        outputs = [(1 + -yi * out).relu(), out]
        prog = compile_graph(outputs, inputs=x + [yi])
        rows = np.column_stack([X, y])
        ps = model.parameters()
        reg = compile_graph(1e-4 * total([p * p for p in ps]))
    else:
        hot = [Value(0.0) for _ in out]
        ce = logsumexp(out) - dot(hot, out)
        outputs = [ce] + list(out)
        prog = compile_graph(outputs, inputs=x + hot)
        rows = np.column_stack([X, np.eye(len(out))[y]])
        reg = None
    w = np.zeros((n, len(outputs)))
    w[:, 0] = 1.0 / n
    return prog, rows, w, reg


def train(task: str, steps: int, seed: int = 0, engine: str = "c", tier: str = "replay",
          progress: Optional[Progress] = None) -> dict:
    """Train one task; returns losses, accuracies, wall time and the model.

    Tiers (C engine): ``replay`` builds the graph once and re-runs it in C
    (pygrad.compile; valid here since the batch is fixed); ``batched``
    builds one sample's graph and runs it over the rows in C
    (``Program.map``: losses equal the others' to about 1e-12, as the sum
    over rows runs in another order); ``fused`` rebuilds
    it each step with fused layers; ``eager`` rebuilds it op by op."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {TIERS}, not {tier!r}")
    # The run's seconds count everything from here: the model made, the
    # graph built or compiled once, every step (SPEEDUP: the tier's time).
    t0 = time.perf_counter()
    model, X, y, opt = _setup(task, seed, engine)
    if tier == "eager":
        for layer in model.layers:
            for n in layer.neurons:
                n.fused = False
    from . import engine as c_engine, reference
    value_type = c_engine.Value if engine == "c" else reference.Value
    replay = tier == "replay" and engine == "c"
    if tier == "batched" and engine == "c":
        return _train_batched(task, steps, model, X, y, opt, progress, t0)
    hist_loss: List[float] = []
    hist_acc: List[float] = []
    if replay:
        from .replay import compile as compile_graph
        loss, outputs = _loss(task, model, X, y, value_type)
        program = compile_graph(loss)
    for k in range(steps):
        if replay:
            program.forward()
        else:
            loss, outputs = _loss(task, model, X, y, value_type)
        opt.zero_grad()
        program.backward() if replay else loss.backward()
        hist_loss.append(loss.data)
        hist_acc.append(_accuracy(task, outputs, y))
        opt.step()
        if progress is not None:
            progress.update(k, hist_loss[-1], hist_acc[-1])
    return {"task": task, "losses": hist_loss, "accuracy": hist_acc, "tier": tier,
            "seconds": time.perf_counter() - t0, "model": model, "X": X, "y": y}


def _train_batched(task: str, steps: int, model: nn.MLP, X: np.ndarray, y: np.ndarray, opt: Any,
                   progress: Optional[Progress], t0: float) -> dict:
    """The batched tier: each step is one Program.map over the rows (forward
    and backward in C, struct of arrays), plus the L2 term's replay."""
    hist_loss: List[float] = []
    hist_acc: List[float] = []
    prog, rows, w, reg = _batched(task, model, X, y)
    for k in range(steps):
        opt.zero_grad()
        out = prog.map(rows, grad=w)
        loss = float(np.sum(out[:, 0])) * (1.0 / len(rows))
        if reg is not None:
            loss = loss + reg.forward()
            reg.backward()
        if task == "moons":
            acc = float(np.mean((y > 0) == (out[:, 1] > 0)))
        else:
            acc = float(np.mean(np.argmax(out[:, 1:], axis=1) == y))
        hist_loss.append(loss)
        hist_acc.append(acc)
        opt.step()
        if progress is not None:
            progress.update(k, loss, acc)
    return {"task": task, "losses": hist_loss, "accuracy": hist_acc, "tier": "batched",
            "seconds": time.perf_counter() - t0, "model": model, "X": X, "y": y}


def train_moons(steps: int = 100, seed: int = 0, engine: str = "c", tier: str = "replay") -> dict:
    """micrograd's moons demo: MLP(2, [16, 16, 1]), SVM loss + 1e-4 L2."""
    return train("moons", steps, seed, engine, tier)


def train_spiral(steps: int = 200, seed: int = 0, engine: str = "c", tier: str = "replay") -> dict:
    """Softmax classifier, MLP(2, [16, 16, 3]), on a 3-class spiral."""
    return train("spiral", steps, seed, engine, tier)


def _plot(result: dict, out_dir: str) -> List[str]:
    """The task's decision-boundary and loss-curve PNGs in ``out_dir``."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    from .boundary import plot_decision_boundary
    os.makedirs(out_dir, exist_ok=True)
    task = result["task"]
    paths = [os.path.join(out_dir, f"{task}_boundary.png")]
    # 250 x 250 = 62,500 grid points, in one batched C call (Program.map).
    plot_decision_boundary(result["model"], result["X"], result["y"], paths[0], task)
    losses = result["losses"]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot(np.arange(1, len(losses) + 1), losses)
    # Log scale: on a linear one the curve is flat after the first tens of
    # steps, where most of the training's progress still shows.
    if min(losses) > 0:
        ax.set_yscale("log")
        ax.set_ylabel("loss (log scale)")
    else:
        ax.set_ylabel("loss")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_xlabel("step")
    ax.set_title(f"{task}: training loss, {result['tier']} tier (final {losses[-1]:.4f}, "
                 f"accuracy {result['accuracy'][-1]:.1%})", fontsize=10)
    paths.append(os.path.join(out_dir, f"{task}_loss.png"))
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


# The one definition of a speedup: the demo prints it, and so does
# benchmarks/run.py under the training table that README.md shows.
SPEEDUP = ("x faster: the slow engine's seconds per full-batch step / the tier's, which are its "
           "whole run (the model made, the graph built or compiled once, every step) / its "
           "steps; GC on")


def _timed_steps(what: str, make: Any, rows: int, budget: float, stream: Any,
                 most: int = 100) -> Tuple[List[float], float, int]:
    """Time the training steps of a slow engine within ``budget`` seconds.
    ``make(m)`` starts its training on the first ``m`` of the ``rows`` rows
    (an iterator: each next() is one step, giving its loss).  A probe step
    on a quarter of the rows comes first; full-batch steps follow while the
    last one says the next fits (at least one, at most ``most``).  When even
    one would overrun the budget (the probe times 10: a step's cost grows
    faster than its rows, the garbage collector walking the live graph), the
    probe is all there is: returns its losses, its seconds per step, and
    how many rows it had, which is then below ``rows``."""
    tty = hasattr(stream, "isatty") and stream.isatty()
    line = ""

    def timed(steps: Iterator[float], n: int) -> Tuple[float, float]:
        nonlocal line
        if tty:
            line = f"   timing {what}: a step on {n} rows ..."
            stream.write("\r" + line)
            stream.flush()
        t0 = time.perf_counter()
        loss = next(steps)
        return loss, time.perf_counter() - t0

    # The garbage of what ran before (micrograd's graphs are cycles, which
    # only a collection frees) would otherwise be charged to these steps.
    gc.collect()
    probe_rows = max(1, rows // 4)
    probe = make(probe_rows)
    loss, spent = timed(probe, probe_rows)
    probe.close()
    gc.collect()            # the probe's graph, not charged to the full steps
    losses: List[float] = []
    if probe_rows < rows and spent + spent * 10 > budget:
        losses, per_step, used = [loss], spent, probe_rows
    else:
        steps, seconds, last = make(rows), 0.0, spent * 10
        while not losses or (spent + last <= budget and len(losses) < most):
            loss, last = timed(steps, rows)
            losses.append(loss)
            spent += last
            seconds += last
        per_step, used = seconds / len(losses), rows
    if tty:
        stream.write("\r" + " " * len(line) + "\r")     # clear the progress line
    return losses, per_step, used


def _reference_steps(task: str, seed: int, rows: Optional[int] = None,
                     engine: str = "reference") -> Iterator[float]:
    """The task's training steps on pygrad's pure-Python reference engine
    (or, ``engine="c"``, the same on the C engine's fused tier), on the
    first ``rows`` rows of its data (all by default)."""
    model, X, y, opt = _setup(task, seed, engine)
    X, y = X[:rows], y[:rows]
    from . import engine as c_engine, reference
    value_type = reference.Value if engine == "reference" else c_engine.Value
    while True:
        loss, _ = _loss(task, model, X, y, value_type)
        opt.zero_grad()
        loss.backward()
        opt.step()
        yield loss.data


def _steps(n: int) -> str:
    return f"{n} step{'s' if n > 1 else ''}"


def _measured(ms: float, steps: int, used: int, rows: int) -> Tuple[str, str]:
    """How a slow engine's ms/step was found, and ``~`` or ``>= ~`` for the
    speedup: measured on full steps, or a lower bound from a probe step on
    ``used`` of the ``rows`` rows scaled by rows/used (its real cost grows
    faster than that)."""
    if used == rows:
        return f"~{ms:.0f} ms/step, the mean of {_steps(steps)}", "~"
    return (f">= ~{ms * rows / used:.0f} ms/step, a lower bound (1 step on {used} of {rows} "
            f"rows, x{rows / used:.3g})", ">= ~")


def _reference_speed(task: str, seed: int, budget: float, result: dict) -> None:
    """Time the pure-Python reference engine on the same task within
    ``budget`` seconds (_timed_steps) and print how much faster the trained
    tier is, in SPEEDUP's terms, with how the reference's time was found."""
    stream = sys.stdout
    rows = len(result["X"])
    losses, ref_step, used = _timed_steps("pygrad's pure-Python reference engine",
                                          lambda m: _reference_steps(task, seed, m), rows,
                                          budget, stream, most=len(result["losses"]))
    per_step = result["seconds"] / len(result["losses"])
    if used < rows:
        # The probe's rows on the C engine (fused: the same graph op for op).
        ours = [next(_reference_steps(task, seed, used, engine="c"))]
        same = f"the C engine's loss on those rows bit for bit: {losses == ours}"
    elif result.get("tier") == "batched":
        # Its sums over rows run in row order, not in the full graph's.
        ours = result["losses"][:len(losses)]
        agree = all(math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0) for a, b in zip(losses, ours))
        same = f"same losses to 1e-12 (batched: sums over rows in row order): {agree}"
    else:
        same = f"same losses bit for bit: {losses == result['losses'][:len(losses)]}"
    how, about = _measured(ref_step * 1e3, len(losses), used, rows)
    factor = ref_step * rows / used / per_step
    # Say what is compared: pygrad against its own slow engine, not micrograd.
    stream.write(f"   {result['tier']} tier vs pygrad's pure-Python reference engine "
                 f"(pygrad.reference, same model and loss):\n"
                 f"     {about}{factor:.0f}x faster; reference {how}\n"
                 f"     {same}\n")


def _micrograd_demo_loop(Value: Any, MLP: Any, X: Any, y: Any,
                        seed: int = 0) -> Iterator[float]:
    """micrograd's own moons training loop (its demo.ipynb: full batch, SVM
    loss + 1e-4 L2, ``lr = 1.0 - 0.9*k/100``) with ``Value`` and ``MLP``
    passed in: micrograd's (``micrograd.engine.Value``, ``micrograd.nn.MLP``)
    or pygrad's, as if only the imports had changed.  ``X``: a list of
    [x0, x1] rows; ``y``: a list of -1/+1 labels.  Yields each step's loss."""
    random.seed(seed)
    model = MLP(2, [16, 16, 1])  # 2-layer neural network

    def loss() -> Any:          # as in the notebook, without minibatches
        inputs = [list(map(Value, xrow)) for xrow in X]
        scores = list(map(model, inputs))
        losses = [(1 + -yi * scorei).relu() for yi, scorei in zip(y, scores)]
        data_loss = sum(losses) * (1.0 / len(losses))
        alpha = 1e-4
        reg_loss = alpha * sum((p * p for p in model.parameters()))
        return data_loss + reg_loss

    k = 0
    while True:
        total_loss = loss()
        model.zero_grad()
        total_loss.backward()
        learning_rate = 1.0 - 0.9 * k / 100
        for p in model.parameters():
            p.data -= learning_rate * p.grad
        yield total_loss.data
        k += 1


def _micrograd_speed(seed: int, budget: float) -> None:
    """Where micrograd is installed, time its own demo loop on micrograd's
    Value and, unchanged, on pygrad's (the drop-in claim), each within
    ``budget`` seconds, and print the ratio: pygrad runs as many steps on
    as many rows as micrograd fitted, so both are measured on the same
    work (with few steps or a quarter of the rows, labelled so); else a
    hint.  Moons only: micrograd has no exp/log for the spiral's softmax."""
    stream = sys.stdout
    try:
        # By name: micrograd ships no type information for mypy to read.
        their_engine = importlib.import_module("micrograd.engine")
        their_nn = importlib.import_module("micrograd.nn")
    except ImportError:
        stream.write("   (pip install micrograd to also time micrograd's own code against "
                     "the same code on pygrad.Value)\n")
        return
    from . import engine, nn as pygrad_nn
    X, y = data.make_moons(100, noise=0.1, seed=seed)
    rows, labels = X.tolist(), data.signed_labels(y).tolist()

    def loop(Value: Any, MLP: Any) -> Any:
        return lambda m: _micrograd_demo_loop(Value, MLP, rows[:m], labels[:m], seed)
    theirs, their_step, used = _timed_steps("micrograd's own code on micrograd.engine.Value",
                                            loop(their_engine.Value, their_nn.MLP), len(rows),
                                            budget, stream)
    # The same work on pygrad: as many steps, on as many rows.
    steps = loop(engine.Value, pygrad_nn.MLP)(used)
    gc.collect()
    t0 = time.perf_counter()
    ours = [next(steps) for _ in theirs]
    our_step = (time.perf_counter() - t0) / len(ours)
    # micrograd sums each grad in its own (set) order: equal up to rounding.
    agree = all(math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0) for a, b in zip(theirs, ours))
    on = "" if used == len(rows) else f" on {used} of the {len(rows)} rows"
    stream.write(f"   micrograd's own demo loop, on micrograd.engine.Value vs unchanged on "
                 f"pygrad.Value:\n"
                 f"     pygrad ~{their_step / our_step:.0f}x faster (micrograd "
                 f"~{their_step * 1e3:.0f} ms/step, pygrad ~{our_step * 1e3:.1f} ms/step, "
                 f"{_steps(len(ours))}{on})\n"
                 f"     same losses to 1e-12 (micrograd sums grads in another order): {agree}\n")


DEFAULT_OUT = "pygrad-demo"


def _check_out(out: str, given: bool = True) -> Optional[str]:
    """Why the PNGs can't go into the folder ``out``, or None when they can
    (the folder is made, if missing, so that this is known before any
    training rather than after it).  ``given``: the user passed ``--out``;
    else the default folder is named as such."""
    what = f"--out {out!r}" if given else f"the default output folder ./{out}/"
    if os.path.exists(out) and not os.path.isdir(out):
        if not given:
            return f"{what} is a file, not a folder; pass --out DIR, or --no-plot"
        return f"--out {out!r} is a file, not a folder; give a folder for the PNGs (made if missing)"
    try:
        os.makedirs(out, exist_ok=True)
        # A write is the only sure test (permissions, read-only or special
        # file systems such as /proc); O_TMPFILE leaves no name behind.
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        if not given:
            return f"{what} is not writable ({reason}); pass --out DIR, or --no-plot"
        return (f"--out {out!r}: can't write PNGs there ({reason}); give a folder you can "
                f"write to, or --no-plot")
    return None


def _will_plot(args: argparse.Namespace) -> bool:
    """Whether this run writes PNGs: asked for, and matplotlib installed
    (looked up, not imported: that costs a second)."""
    return not args.no_plot and importlib.util.find_spec("matplotlib") is not None


def _plan(tasks: List[str], args: argparse.Namespace, plot: bool) -> str:
    """The run's first lines: what it does and about how long it takes.
    Training takes well under a second a task; each slow engine's timing
    stops within ``--reference-seconds`` (micrograd's, and pygrad on the
    same work, within twice that); a task's PNGs take about a second."""
    budget = args.reference_seconds
    timings = 0.0
    if budget > 0:
        micrograd = "moons" in tasks and importlib.util.find_spec("micrograd") is not None
        timings = budget * (len(tasks) + (2 if micrograd else 0))
    seconds = 0.5 * len(tasks) + timings + (1.0 if plot else 0.0) * len(tasks)
    timed = (f"; then times the slow engines (--reference-seconds {budget:g} each) for the "
             f"speedups" if budget > 0 else "")
    lines = [f"pygrad demo: {' and '.join(tasks)} on the {args.tier} tier{timed}; "
             f"about {max(1, round(seconds))} s in all"]
    if budget > 0:
        lines += textwrap.wrap(SPEEDUP, 96, initial_indent="  (", subsequent_indent="   ")
        lines[-1] += ")"
    return "\n".join(textwrap.fill(line, 100, subsequent_indent="  ") if i == 0 else line
                     for i, line in enumerate(lines))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m pygrad`` and the ``pygrad`` command: the
    exit status, 0; 2 for bad arguments (and an ``--out`` it can't write
    to); 1 when a PNG can't be written after training; 130 after Ctrl-C,
    which prints one line, not a traceback; 141, silently, when the output's
    reader has gone (``pygrad | head``)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        if getattr(sys.stdout, "isatty", lambda: False)():
            sys.stdout.write("\n")           # end a progress line cut short
        sys.stdout.flush()
        sys.stderr.write("interrupted\n")
        return 130                             # 128 + SIGINT, as shells report it
    except BrokenPipeError:
        # The reader went away (``pygrad | head``): stop quietly, as other
        # command-line tools do.  Python's own flush of stdout at exit would
        # fail again and print an error, so stdout goes to devnull first.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):       # no file descriptor (a test's)
            pass
        return 141                             # 128 + SIGPIPE


def _main(argv: Optional[Sequence[str]]) -> int:
    from ._version import __version__
    p = argparse.ArgumentParser(
        prog="pygrad",
        description="Train micrograd's moons demo and a softmax classifier on a 3-class "
                    "spiral with pygrad's C engine, showing loss, accuracy, wall time, how "
                    "much faster it is than pygrad's own pure-Python reference engine and, "
                    "where micrograd is installed, micrograd's own code against the same code "
                    "on pygrad.Value; with matplotlib, write decision-boundary and loss-curve "
                    "PNGs. Ctrl-C stops it (exit status 130).")
    p.add_argument("--version", action="version", version=f"pygrad {__version__}")
    p.add_argument("--dataset", choices=["moons", "spiral", "both"], default="both",
                   help="what to train (default: both)")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (default: 100 for moons, 200 for spiral)")
    p.add_argument("--seed", type=int, default=0, help="seed for data and weights (default 0)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="folder for the PNGs, made if missing and checked before training "
                        "(default: ./pygrad-demo)")
    p.add_argument("--no-plot", action="store_true", help="don't write PNGs")
    p.add_argument("--tier", choices=TIERS, default="replay",
                   help="replay: build once, re-run in C (default); batched: one sample's "
                        "graph run over the rows in C (Program.map); fused: rebuild each step "
                        "with fused layers; eager: rebuild op by op")
    p.add_argument("--reference-seconds", type=float, default=1.0,
                   help="time budget for each slow engine timed for the speedup lines: "
                        "pygrad's pure-Python reference engine, per task, and, when installed, "
                        "micrograd on moons (default 1.0; 0 skips them)")
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        p.error("--steps must be at least 1")
    if args.reference_seconds < 0:
        p.error("--reference-seconds must be >= 0")
    plot = _will_plot(args)
    given = args.out is not None
    args.out = args.out if given else DEFAULT_OUT
    problem = _check_out(args.out, given) if plot else None
    if problem is not None:
        sys.stderr.write(f"pygrad: error: {problem}\n")
        return 2
    tasks = ["moons", "spiral"] if args.dataset == "both" else [args.dataset]
    print(_plan(tasks, args, plot))
    for task in tasks:
        steps = args.steps or (100 if task == "moons" else 200)
        print(f"== {task}: {steps} steps on pygrad, C engine, tier: {args.tier}")
        result = train(task, steps, args.seed, "c", args.tier, Progress(task, steps))
        per_step = result["seconds"] / steps
        print(f"   final loss {result['losses'][-1]:.4f}, accuracy {result['accuracy'][-1]:.1%}, "
              f"{result['seconds']:.2f} s ({per_step * 1e3:.1f} ms/step)")
        if args.reference_seconds > 0:
            _reference_speed(task, args.seed, args.reference_seconds, result)
            if task == "moons":
                _micrograd_speed(args.seed, args.reference_seconds)
        if plot:
            try:
                paths = _plot(result, args.out)
            except OSError as e:        # the folder was writable at the start: a full disk, ...
                sys.stderr.write(f"pygrad: error: can't write the PNGs into {args.out!r}: "
                                 f"{e.strerror or e}\n")
                return 1
            for path in paths:
                print(f"   wrote {path}")
        elif not args.no_plot:
            print("   (install matplotlib, pip install 'pygrad-autograd[plot]', for PNGs)")
    return 0
