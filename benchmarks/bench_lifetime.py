"""Lifetime: what a kept Value costs, and walks over ``_prev``, beside micrograd.

    python benchmarks/bench_lifetime.py            # every case, pygrad and micrograd
    python benchmarks/bench_lifetime.py --quick    # smaller rounds

Each (case, engine) runs in a fresh process.  Memory is read from
/proc/self/statm (Linux): RSS and VSZ growth after ``gc.collect()``.

  kept_leaf   2,000 rounds: a leaf ``Value(r)`` kept, then 4,096 ops over it
              (y <- y * w + 1) dropped.  KB of RSS and of VSZ per kept leaf.
  rlimit      20,000 training steps under a 1 GiB RLIMIT_AS (pygrad.nn MLP
              2-16-16-1 on 10 rows, hinge loss, SGD), keeping ``inputs[0][0]``
              each step: the steps done (a MemoryError stops it early).
  custom      100 rounds of a chain of 300 micrograd-style custom tanh ops
              (``Value(t, (x,), 'tanh')`` with a ``_backward`` closure),
              backpropagated and dropped: MB of RSS after, against before.
  free_2m     a 2,000,000-node chain built, backpropagated and dropped: MB of
              RSS after, against before (mb_after); and after the next leaf
              (mb_next: pygrad's owner table gives its room back when pygrad
              next runs Python, a leaf or a backward()).
  prev_walk   the first topological walk over ``_prev`` of a 20,000-node
              graph (micrograd's build_topo, iterative): µs per node.
  lecture     micrograd's lecture-style manual backward over that graph
              (topological order, then ``node._backward()`` in reverse): µs
              per node.
"""
import argparse
import json
import os
import subprocess
import sys
from typing import Any, Dict

WORKER = r'''
import gc, json, math, os, random, resource, sys, time
case, engine, quick = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if engine == "pygrad":
    from pygrad import Value
else:
    from micrograd.engine import Value

def statm():
    with open("/proc/self/statm") as f:
        vsz, rss = f.read().split()[:2]
    page = os.sysconf("SC_PAGE_SIZE")
    return int(rss) * page, int(vsz) * page

def chain(x, n, w):
    y = x
    for _ in range(n // 2):
        y = y * w + 1.0
    return y

def custom_tanh(x):
    t = math.tanh(x.data)
    out = Value(t, (x,), "tanh")
    def _backward():
        x.grad += (1 - t * t) * out.grad
    out._backward = _backward
    return out

def graph(n):
    random.seed(0)
    xs = [Value(random.uniform(-1, 1)) for _ in range(32)]
    y = xs[0]
    for i in range(n // 2):
        y = (y * xs[i % 32] + xs[(i * 7) % 32]) if i % 3 else (y * 0.5).relu()
    return y

def topo(root):
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        v, done = stack.pop()
        if done:
            order.append(v)
            continue
        if v in seen:
            continue
        seen.add(v)
        stack.append((v, True))
        for c in v._prev:
            if c not in seen:
                stack.append((c, False))
    return order

out = {}
if case == "kept_leaf":
    rounds = 200 if quick else 2000
    w = Value(0.999)
    kept = []
    for r in range(20):
        kept.append(Value(float(r))); chain(kept[-1], 4096, w)
    gc.collect(); rss0, vsz0 = statm()
    for r in range(rounds):
        x = Value(float(r)); kept.append(x)
        y = chain(x, 4096, w); del y
    gc.collect(); rss1, vsz1 = statm()
    out = {"rss_kb_per_leaf": (rss1 - rss0) / rounds / 1024, "vsz_kb_per_leaf": (vsz1 - vsz0) / rounds / 1024}
elif case == "rlimit":
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    steps = 2000 if quick else 20000
    if engine == "pygrad":
        from pygrad import nn
    else:
        from micrograd import nn
    random.seed(1)
    model = nn.MLP(2, [16, 16, 1])
    X = [[random.uniform(-1, 1), random.uniform(-1, 1)] for _ in range(10)]
    Y = [1.0 if a * b > 0 else -1.0 for a, b in X]
    keep, done = [], 0
    try:
        for step in range(steps):
            inputs = [[Value(a), Value(b)] for a, b in X]
            loss = sum((1 + -y * model(x)).relu() for x, y in zip(inputs, Y)) * 0.1
            for p in model.parameters():
                p.grad = 0.0
            loss.backward()
            for p in model.parameters():
                p.data -= 0.01 * p.grad
            keep.append(inputs[0][0])
            done = step + 1
    except MemoryError:
        pass
    out = {"steps": done}
elif case == "custom":
    rounds = 20 if quick else 100
    w = Value(0.7)
    def round_():
        y = Value(0.1)
        for _ in range(300):     # micrograd's recursive backward stops near 330
            y = custom_tanh(y * w + 0.2)
        y.backward()
    round_(); gc.collect(); rss0, _ = statm()
    for _ in range(rounds):
        round_()
    gc.collect(); rss1, _ = statm()
    out = {"mb_after": (rss1 - rss0) / 2**20}
elif case == "free_2m":
    gc.collect(); rss0, _ = statm()
    y = chain(Value(1.0), 2_000_000, Value(0.999999))
    if engine == "pygrad":
        y.backward()
    del y
    gc.collect(); rss1, _ = statm()
    Value(0.0)        # pygrad runs Python again: its owner table gives its room back
    rss2, _ = statm()
    out = {"mb_after": (rss1 - rss0) / 2**20, "mb_next": (rss2 - rss0) / 2**20}
elif case in ("prev_walk", "lecture"):
    n = 20000
    y = graph(n)
    gc.collect()
    t = time.perf_counter()
    order = topo(y)
    walk = time.perf_counter() - t
    if case == "prev_walk":
        out = {"us_per_node": walk / len(order) * 1e6}
    else:
        y.grad = 1.0
        t = time.perf_counter()
        for v in reversed(order):
            v._backward()
        out = {"us_per_node": (walk + time.perf_counter() - t) / len(order) * 1e6}
print(json.dumps(out))
'''

CASES = ("kept_leaf", "rlimit", "custom", "free_2m", "prev_walk", "lecture")


def run(case: str, engine: str, quick: bool) -> Dict[str, Any]:
    p = subprocess.run([sys.executable, "-c", WORKER, case, engine, "1" if quick else "0"],
                       capture_output=True, text=True,
                       cwd=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--case", choices=CASES, action="append")
    ap.add_argument("--engines", default="pygrad,micrograd",
                    help="comma-separated (micrograd's rlimit case takes about 30 minutes)")
    args = ap.parse_args()
    engines = args.engines.split(",")
    try:
        import micrograd  # noqa: F401
    except ImportError:
        engines = [e for e in engines if e != "micrograd"]
    print("| case | " + " | ".join(engines) + " |")
    print("|---|" + "---|" * len(engines))
    for case in args.case or CASES:
        cells = [json.dumps(run(case, e, args.quick)) for e in engines]
        print(f"| {case} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
