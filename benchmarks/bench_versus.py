"""This tree's engine against another checkout's, side by side in one run.

    git worktree add ../base main && pip install "setuptools>=77" cffi \
        && (cd ../base && python setup.py build_ext --inplace)
    python benchmarks/bench_versus.py --baseline ../base

Each repeat runs one fresh process per tree, alternating (base, this, base,
this, ...), so that load on a shared machine hits both alike.  Each process
measures the eager tier on the same workloads:

  dropped   ns per op whose result is dropped at once (a * b, 200,000 times)
  forward   ns per op building a 200,000-op chain (y * w + c, then relu)
  backward  ns per node of backward() over that chain
  free      ns per node freeing that chain (del of its root)
  value     ns per Value(x) made (a leaf)
  moons     ms per step of micrograd's moons loop (its own nn code, written
            against Value, 30 samples, eager)
  fused     ms per step of the same task on pygrad.nn.MLP (fused layers,
            100 samples, hinge loss, optim.SGD)
  replay    ms per step of that graph compiled and replayed
  batched   µs per step of that task as one sample's graph run over the 100
            rows (Program.map with grad, then optim.SGD with weight_decay)

It prints the median of each figure per tree and the ratio this / base.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List

PROBE = r'''
import gc, json, random, sys, time
from pygrad import Value

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

def moons_step(steps):
    random.seed(0)
    class Neuron:
        def __init__(self, nin, nonlin=True):
            self.w = [Value(random.uniform(-1, 1)) for _ in range(nin)]
            self.b = Value(0)
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
    sizes = [2, 16, 16, 1]
    layers = [Layer(sizes[i], sizes[i + 1], nonlin=i != 2) for i in range(3)]
    params = [p for l in layers for p in l.parameters()]
    X = [[random.uniform(-1, 2), random.uniform(-1, 1)] for _ in range(30)]
    Y = [1 if x[0] > 0.5 else -1 for x in X]
    t = time.perf_counter()
    for k in range(steps):
        scores = []
        for x in X:
            v = list(map(Value, x))
            for l in layers:
                v = l(v)
            scores.append(v)
        losses = [(1 + -yi * s).relu() for yi, s in zip(Y, scores)]
        loss = sum(losses) * (1.0 / len(losses)) + 1e-4 * sum(p * p for p in params)
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

def timed(figure, *args):
    # Each figure starts from a collected heap: a full collection (its
    # registry purge, its walk of every object) lands in a short timed
    # window or not depending on what ran before, which is no property of
    # the figure measured (one did, in moons' 5 steps, for one tree only).
    gc.collect()
    return figure(*args)

fwd, bwd, free = timed(chain, int(sys.argv[1]))
fused, replay = timed(fused_and_replay, 20)
out = {"dropped": timed(dropped, int(sys.argv[1])) * 1e9,
       "forward": fwd * 1e9, "backward": bwd * 1e9, "free": free * 1e9,
       "value": timed(leaves, 100_000) * 1e9,
       "moons": timed(moons_step, 5) * 1e3, "fused": fused * 1e3, "replay": replay * 1e3,
       "batched": timed(batched, 2000) * 1e6}
print(json.dumps(out))
'''


def run(tree: str, ops: int) -> Dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run([sys.executable, "-c", PROBE, str(ops)], env=env, capture_output=True,
                         text=True, cwd=os.path.abspath(tree), check=True)
    return json.loads(out.stdout)


def main(argv: "List[str] | None" = None) -> Dict[str, Dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="another checkout, built in place")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ops", type=int, default=200_000)
    args = ap.parse_args(argv)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    samples: Dict[str, List[Dict[str, float]]] = {"base": [], "this": []}
    for _ in range(args.repeats):
        samples["base"].append(run(args.baseline, args.ops))
        samples["this"].append(run(here, args.ops))
    med = {tree: {k: statistics.median(s.get(k, float("nan")) for s in runs) for k in samples["this"][0]}
           for tree, runs in samples.items()}
    print(f"{'figure':<10} {'base':>10} {'this':>10} {'this/base':>10}   "
          f"(median of {args.repeats}, alternating processes)")
    for k, unit in (("dropped", "ns/op"), ("forward", "ns/op"), ("backward", "ns/node"),
                    ("free", "ns/node"), ("value", "ns/leaf"),
                    ("moons", "ms/step"), ("fused", "ms/step"), ("replay", "ms/step"),
                    ("batched", "µs/step")):
        b, t = med["base"][k], med["this"][k]
        print(f"{k:<10} {b:>10.1f} {t:>10.1f} {t / b:>10.3f}   {unit}")
    return med


if __name__ == "__main__":
    main()
