"""This tree's engine against other checkouts and micrograd, side by side in one run.

    pip install "setuptools>=77" cffi micrograd==0.1.0
    git worktree add ../base-be0 be0cf5d && (cd ../base-be0 && python setup.py build_ext --inplace)
    git worktree add ../base-c35 c35cc35 && (cd ../base-c35 && python setup.py build_ext --inplace)
    python benchmarks/bench_versus.py --baseline be0cf5d=../base-be0 \
        --baseline c35cc35=../base-c35 --micrograd [--markdown]

``--baseline`` takes NAME=PATH (or a bare PATH, named by its folder) and may
be given several times; ``--micrograd`` adds a micrograd 0.1.0 column (the
probe then imports ``from micrograd.engine import Value``).  Each repeat runs
one fresh process per tree, all trees in turn, the first tree moving one
place each repeat (b1, b2, this, mg; b2, this, mg, b1; ...), so that load on
a shared machine hits every tree alike.  Each process measures the eager
tier on the same workloads:

  dropped    ns per op whose result is dropped at once (a * b, 200,000 times)
  forward    ns per op building a kept 200,000-op chain (y * w + c, then relu)
  backward   ns per node of backward() over that chain
  free       ns per node freeing that chain (del of its root, then the
             gc.collect() it calls for)
  value      ns per Value(x) made (a leaf)
  moons      ms per step of micrograd's moons step: micrograd's own nn code
             (Neuron/Layer/MLP written against Value), 2-16-16-1, 100
             samples, hinge loss + 1e-4 * sum(p * p), eager
  moons_sub  ms per step of the same, its parameters made as instances of
             ``class Weight(Value): pass`` (weights) and
             ``class Bias(Value): pass`` (biases)
  sub/moons  moons_sub / moons, per process (the cost of the subclasses)
  moons_nogc ms per step of the moons step with the cyclic collector off
             (gc.disable()): the step less the collector's walks of its
             tracked Values
  fused      ms per step of a moons task on pygrad.nn.MLP (fused layers,
             100 samples, hinge loss, optim.SGD)                [pygrad only]
  replay     ms per step of that graph compiled and replayed     [pygrad only]
  batched    µs per step of that task as one sample's graph run over the 100
             rows (Program.map with grad, then optim.SGD with weight_decay)
                                                                 [pygrad only]

It prints the median of each figure per tree, the ratio this / each baseline
(below 1: this tree is faster) and micrograd / this (this tree's speedup
over micrograd); ``--markdown`` prints the same table again as Markdown.  A
figure that a tree cannot run (micrograd has no fused layers; an old tree may
lack an API) is n/a, with the reason below the table.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from typing import Dict, List, Tuple

PROBE = r'''
import gc, json, random, sys, time
engine, n_ops = sys.argv[1], int(sys.argv[2])
if engine == "micrograd":
    from micrograd.engine import Value
    sys.setrecursionlimit(10**7)      # its backward's topological sort recurses down the chain
    where = sys.modules["micrograd"].__file__
else:
    from pygrad import Value
    where = sys.modules["pygrad"].__file__

def chain(n):
    w, c = Value(0.999), Value(0.001)
    y = Value(1.0)
    t = time.perf_counter()
    for _ in range(n // 3):
        y = (y * w + c).relu()
    fwd = (time.perf_counter() - t) / (3 * (n // 3))
    t = time.perf_counter()
    y.backward()
    bwd = (time.perf_counter() - t) / (3 * (n // 3))
    t = time.perf_counter()
    del y
    gc.collect()
    free = (time.perf_counter() - t) / (3 * (n // 3))
    return fwd, bwd, free

def dropped(n):
    a, b = Value(1.5), Value(2.0)
    t = time.perf_counter()
    for _ in range(n):
        a * b
    return (time.perf_counter() - t) / n

def leaves(n):
    t = time.perf_counter()
    keep = [Value(0.5) for _ in range(n)]
    return (time.perf_counter() - t) / n

class Weight(Value):
    pass

class Bias(Value):
    pass

def moons_step(steps, weight=Value, bias=Value):
    """micrograd's moons step on its own nn code, parameters made by
    weight(x) and bias(0)."""
    random.seed(0)
    class Neuron:
        def __init__(self, nin, nonlin=True):
            self.w = [weight(random.uniform(-1, 1)) for _ in range(nin)]
            self.b = bias(0)
            self.nonlin = nonlin
        def __call__(self, x):
            act = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)
            return act.relu() if self.nonlin else act
        def parameters(self):
            return self.w + [self.b]
    class Layer:
        def __init__(self, nin, nout, **kw):
            self.neurons = [Neuron(nin, **kw) for _ in range(nout)]
        def __call__(self, x):
            out = [n(x) for n in self.neurons]
            return out[0] if len(out) == 1 else out
        def parameters(self):
            return [p for n in self.neurons for p in n.parameters()]
    class MLP:
        def __init__(self, nin, nouts):
            sz = [nin] + nouts
            self.layers = [Layer(sz[i], sz[i + 1], nonlin=i != len(nouts) - 1)
                           for i in range(len(nouts))]
        def __call__(self, x):
            for layer in self.layers:
                x = layer(x)
            return x
        def parameters(self):
            return [p for layer in self.layers for p in layer.parameters()]
    model = MLP(2, [16, 16, 1])
    params = model.parameters()
    X = [[random.uniform(-1, 2), random.uniform(-1, 1)] for _ in range(100)]
    Y = [1 if x[0] > 0.5 else -1 for x in X]
    t = time.perf_counter()
    for k in range(steps):
        scores = [model(list(map(Value, x))) for x in X]
        losses = [(1 + -yi * s).relu() for yi, s in zip(Y, scores)]
        data_loss = sum(losses) * (1.0 / len(losses))
        loss = data_loss + 1e-4 * sum(p * p for p in params)
        for p in params:
            p.grad = 0.0
        loss.backward()
        for p in params:
            p.data -= 0.05 * p.grad
    return (time.perf_counter() - t) / steps

def fused_and_replay(steps):
    import numpy as np
    import pygrad
    from pygrad import nn, optim
    rng = np.random.default_rng(0)
    model = nn.MLP(2, [16, 16, 1])
    model.set_data(rng.uniform(-1, 1, len(model.parameters())))
    X = rng.uniform(-1, 1, (100, 2))
    Y = np.where(X[:, 0] > 0, 1.0, -1.0)
    xs = [[Value(a), Value(b)] for a, b in X]
    opt = optim.SGD(model.parameters(), lr=0.05)
    def loss_of():
        return sum((1 + -y * model(x)).relu() for x, y in zip(xs, Y)) * (1.0 / len(Y))
    t = time.perf_counter()
    for _ in range(steps):
        loss = loss_of()
        opt.zero_grad()
        loss.backward()
        opt.step()
    fused = (time.perf_counter() - t) / steps
    prog = pygrad.compile(loss_of())
    t = time.perf_counter()
    for _ in range(steps * 20):
        prog.forward()
        opt.zero_grad()
        prog.backward()
        opt.step()
    replay = (time.perf_counter() - t) / (steps * 20)
    return fused, replay

def batched(steps):
    import numpy as np
    import pygrad
    from pygrad import nn, optim
    rng = np.random.default_rng(0)
    model = nn.MLP(2, [16, 16, 1])
    model.set_data(rng.uniform(-1, 1, len(model.parameters())))
    X = rng.uniform(-1, 1, (100, 2))
    rows = np.column_stack([X, np.where(X[:, 0] > 0, 1.0, -1.0)])
    x0, x1, yi = Value(0.0), Value(0.0), Value(0.0)
    prog = pygrad.compile((1 + -yi * model([x0, x1])).relu(), inputs=[x0, x1, yi])
    opt = optim.SGD(model.parameters(), lr=0.05, weight_decay=2e-4)
    w = np.full(len(rows), 1.0 / len(rows))
    t = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        prog.map(rows, grad=w)
        opt.step()
    return (time.perf_counter() - t) / steps

out, errors = {}, {}

def timed(names, scales, figure, *args):
    # Each figure starts from a collected heap: a full collection (its
    # registry purge, its walk of every object) lands in a short timed
    # window or not depending on what ran before, which is no property of
    # the figure measured (one did, in moons' 5 steps, for one tree only).
    # A figure this tree cannot run is left out (n/a), with its reason.
    gc.collect()
    try:
        got = figure(*args)
    except Exception as e:
        errors[",".join(names)] = f"{type(e).__name__}: {e}"[:200]
        return
    got = got if isinstance(got, tuple) else (got,)
    for name, scale, v in zip(names, scales, got):
        out[name] = v * scale

timed(("forward", "backward", "free"), (1e9, 1e9, 1e9), chain, n_ops)
if engine != "micrograd":
    timed(("fused", "replay"), (1e3, 1e3), fused_and_replay, 20)
timed(("dropped",), (1e9,), dropped, n_ops)
timed(("value",), (1e9,), leaves, 100_000)
timed(("moons",), (1e3,), moons_step, 5)
timed(("moons_sub",), (1e3,), moons_step, 5, Weight, Bias)
if "moons" in out and "moons_sub" in out:
    out["sub/moons"] = out["moons_sub"] / out["moons"]

def collector_off(steps):
    gc.disable()
    try:
        return moons_step(steps)
    finally:
        gc.enable()

timed(("moons_nogc",), (1e3,), collector_off, 5)
if engine != "micrograd":
    timed(("batched",), (1e6,), batched, 2000)
print(json.dumps({"figures": out, "errors": errors, "file": where}))
'''

FIGURES: Tuple[Tuple[str, str], ...] = (
    ("dropped", "ns/op"), ("forward", "ns/op"), ("backward", "ns/node"), ("free", "ns/node"),
    ("value", "ns/leaf"), ("moons", "ms/step"), ("moons_sub", "ms/step"), ("sub/moons", "ratio"),
    ("moons_nogc", "ms/step"),
    ("fused", "ms/step"), ("replay", "ms/step"), ("batched", "µs/step"))
NAN = float("nan")


def run(tree: str, engine: str, ops: int) -> Dict:
    """One probe process; a process that fails gives no figures (n/a) and its
    error's last line."""
    env = dict(os.environ)
    if engine == "pygrad":
        env["PYTHONPATH"] = os.path.abspath(tree)
    p = subprocess.run([sys.executable, "-c", PROBE, engine, str(ops)], env=env,
                       capture_output=True, text=True, cwd=os.path.abspath(tree))
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        return {"figures": {}, "errors": {"process": last}, "file": "?"}
    got = json.loads(p.stdout)
    if engine == "pygrad" and not os.path.abspath(got["file"]).startswith(os.path.abspath(tree) + os.sep):
        # PYTHONPATH found no pygrad package in the tree, and the installed one
        # answered: its figures would be another tree's.
        sys.exit(f"{tree}: pygrad was imported from {got['file']}, not from {tree}: is it a built checkout?")
    return got


def parse_baseline(spec: str) -> Tuple[str, str]:
    name, sep, path = spec.partition("=")
    if not sep:
        path = spec
        name = os.path.basename(os.path.normpath(spec))
    return name, path


def fmt(v: float) -> str:
    if math.isnan(v):
        return "n/a"
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def fmt_ratio(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.1f}" if v >= 10 else f"{v:.3f}"


def main(argv: "List[str] | None" = None) -> Dict[str, Dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", action="append", default=[], metavar="NAME=PATH",
                    help="another checkout, built in place (may be given several times)")
    ap.add_argument("--micrograd", action="store_true", help="add a micrograd 0.1.0 column")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown too")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ops", type=int, default=200_000)
    args = ap.parse_args(argv)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    # (column name, tree, engine); "this" is always there, for the ratios.
    trees: List[Tuple[str, str, str]] = [(n, p, "pygrad") for n, p in map(parse_baseline, args.baseline)]
    trees.append(("this", here, "pygrad"))
    if args.micrograd:
        trees.append(("micrograd", here, "micrograd"))
    names = [t[0] for t in trees]
    if len(set(names)) != len(names):
        ap.error(f"column names must differ: {names}")
    samples: Dict[str, List[Dict[str, float]]] = {n: [] for n in names}
    errors: Dict[str, Dict[str, str]] = {n: {} for n in names}
    files: Dict[str, str] = {}
    for r in range(args.repeats):
        for i in range(len(trees)):
            name, tree, engine = trees[(r + i) % len(trees)]
            got = run(tree, engine, args.ops)
            samples[name].append(got["figures"])
            errors[name].update(got["errors"])
            files[name] = got["file"]
            print(f"  repeat {r + 1}/{args.repeats}: {name} done", file=sys.stderr, flush=True)
    med = {n: {k: statistics.median([s.get(k, NAN) for s in runs]) if all(k in s for s in runs) else NAN
               for k, _ in FIGURES}
           for n, runs in samples.items()}

    bases = names[:len(args.baseline)]
    header = ["figure", "unit"] + names + [f"this/{b}" for b in bases]
    if args.micrograd:
        header.append("micrograd/this")
    rows = []
    for k, unit in FIGURES:
        t = med["this"][k]
        row = [k, unit] + [fmt(med[n][k]) if unit != "ratio" else fmt_ratio(med[n][k]) for n in names]
        ratio_cells = [] if unit == "ratio" else [fmt_ratio(t / med[b][k]) for b in bases]
        if args.micrograd and unit != "ratio":
            ratio_cells.append(fmt_ratio(med["micrograd"][k] / t))
        rows.append(row + (ratio_cells or [""] * (len(header) - len(row))))

    print(f"median of {args.repeats} alternating processes per tree, {args.ops} ops per chain")
    for n, f in files.items():
        print(f"  {n:<12} {f}")
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    for n in names:
        for what, why in errors[n].items():
            print(f"  n/a: {n} {what}: {why}")
    if args.markdown:
        print()
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    return med


if __name__ == "__main__":
    main()
