"""Lifetime: what a kept Value costs, and walks over ``_prev``, beside micrograd.

    python benchmarks/bench_lifetime.py               # default cases, pygrad and micrograd
    python benchmarks/bench_lifetime.py --quick       # smaller rounds
    python benchmarks/bench_lifetime.py --case held_1m --case ema
    python benchmarks/bench_lifetime.py --big         # the default cases and big (several GB)
    python benchmarks/bench_lifetime.py --case big --engines pygrad

Each (case, engine) runs in a fresh process.  Memory is read from
/proc/self/statm (Linux): RSS (and VSZ) growth, after ``gc.collect()`` unless
said otherwise; peak RSS is the kernel's high-water mark (VmHWM in
/proc/self/status).  micrograd's backward sorts recursively, so its worker
raises the recursion limit where a case backpropagates a long chain.

  held_1m     a held 1,000,000-node chain (``x = x * c + d``, c and d leaves):
              bytes of RSS per node while it is held.
  kept_leaf   2,000 rounds: a leaf ``Value(r)`` kept, then 4,096 ops over it
              (y <- y * w + 1) dropped.  KB of RSS and of VSZ per kept leaf.
  ema         2,000 training steps of a small graph (a 2-4-1 MLP written
              against Value, 4 samples, hinge loss, backward, SGD), each
              step's loss fresh, with ``ema = ema * 0.9 + loss.data * 0.1``
              kept across steps (ema a Value): KiB of RSS per step.
  rlimit      20,000 training steps under a 1 GiB RLIMIT_AS (pygrad.nn MLP
              2-16-16-1 on 10 rows, hinge loss, SGD), keeping ``inputs[0][0]``
              each step: the steps done (a MemoryError stops it early).
  custom      100 rounds of a chain of 300 micrograd-style custom ops, each a
              binary ``Value(a.data * b.data, (a, b), 'mul')`` then a unary
              ``Value(t, (x,), 'tanh')``, each with a ``_backward`` closure,
              backpropagated and dropped: MB of RSS after, against before.
  free_2m     a 2,000,000-node chain built, backpropagated and dropped: MB of
              RSS right after the ``del``, with no later call (mb_del),
              against before it was built; after a ``gc.collect()`` (mb_after:
              micrograd's nodes are in cycles through their ``_backward``
              closures, so only a collection frees them); and after the next
              leaf (mb_next: under issue 38's design an owner table gave its
              room back only when pygrad next ran Python; now a node's memory
              goes with its last keep, so mb_next should match mb_after).
  prev_walk   the first topological walk over ``_prev`` of a 20,000-node
              graph (micrograd's build_topo, iterative): µs per node.
  lecture     micrograd's lecture-style manual backward over that graph
              (topological order, then ``node._backward()`` in reverse): µs
              per node.
  big         (only with --big or --case big) a 10**7-node chain built,
              backpropagated and freed (del, then gc.collect()): seconds of
              each and in all, peak RSS in GB, MB of RSS left after the free.
              Several GB for pygrad; micrograd needs about 10 GB and minutes.
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
    sys.setrecursionlimit(10**8)   # its backward's topological sort recurses down a chain

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

def held_chain(n):
    c, d = Value(0.999999), Value(1e-6)
    x = Value(1.0)
    for _ in range(n // 2):
        x = x * c + d
    return x

def peak_rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return float("nan")

def custom_mul(a, b):
    out = Value(a.data * b.data, (a, b), "mul")
    def _backward():
        a.grad += b.data * out.grad
        b.grad += a.data * out.grad
    out._backward = _backward
    return out

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
        for _ in range(300):
            y = custom_tanh(custom_mul(y, w) + 0.2)
        y.backward()
    round_(); gc.collect(); rss0, _ = statm()
    for _ in range(rounds):
        round_()
    gc.collect(); rss1, _ = statm()
    out = {"mb_after": (rss1 - rss0) / 2**20}
elif case == "free_2m":
    gc.collect(); rss0, _ = statm()
    y = held_chain(2_000_000)
    y.backward()
    del y
    rss_del, _ = statm()
    gc.collect(); rss1, _ = statm()
    Value(0.0)        # pygrad runs Python again (issue 38's owner table freed only then)
    rss2, _ = statm()
    out = {"mb_del": (rss_del - rss0) / 2**20, "mb_after": (rss1 - rss0) / 2**20,
           "mb_next": (rss2 - rss0) / 2**20}
elif case == "held_1m":
    n = 1_000_000
    gc.collect(); rss0, _ = statm()
    x = held_chain(n)
    gc.collect(); rss1, _ = statm()
    out = {"bytes_per_node": (rss1 - rss0) / n}
elif case == "ema":
    steps = 200 if quick else 2000
    random.seed(2)
    w1 = [[Value(random.uniform(-1, 1)) for _ in range(2)] for _ in range(4)]
    b1 = [Value(0.0) for _ in range(4)]
    w2 = [Value(random.uniform(-1, 1)) for _ in range(4)]
    b2 = Value(0.0)
    params = [p for row in w1 for p in row] + b1 + w2 + [b2]
    X = [[random.uniform(-1, 1), random.uniform(-1, 1)] for _ in range(4)]
    Y = [1.0 if a > b else -1.0 for a, b in X]
    ema = Value(0.0)
    def step(ema):
        losses = []
        for (a, b), y in zip(X, Y):
            h = [(wa * a + wb * b + bb).relu() for (wa, wb), bb in zip(w1, b1)]
            s = sum((v * hi for v, hi in zip(w2, h)), b2)
            losses.append((1 + -y * s).relu())
        loss = sum(losses) * 0.25
        for p in params:
            p.grad = 0.0
        loss.backward()
        for p in params:
            p.data -= 0.05 * p.grad
        return ema * 0.9 + loss.data * 0.1
    for _ in range(100):
        ema = step(ema)
    gc.collect(); rss0, _ = statm()
    for _ in range(steps):
        ema = step(ema)
    gc.collect(); rss1, _ = statm()
    out = {"kib_per_step": (rss1 - rss0) / steps / 1024, "ema": ema.data}
elif case == "big":
    n = 10**7
    gc.collect(); rss0, _ = statm()
    t0 = time.perf_counter()
    y = held_chain(n)
    t1 = time.perf_counter()
    y.backward()
    t2 = time.perf_counter()
    del y
    gc.collect()
    t3 = time.perf_counter()
    rss1, _ = statm()
    out = {"build_s": t1 - t0, "backward_s": t2 - t1, "free_s": t3 - t2, "total_s": t3 - t0,
           "peak_gb": peak_rss() / 2**30, "mb_left": (rss1 - rss0) / 2**20}
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

CASES = ("held_1m", "kept_leaf", "ema", "rlimit", "custom", "free_2m", "prev_walk", "lecture")
OPTIONAL = ("big",)


def run(case: str, engine: str, quick: bool) -> Dict[str, Any]:
    p = subprocess.run([sys.executable, "-c", WORKER, case, engine, "1" if quick else "0"],
                       capture_output=True, text=True,
                       cwd=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]}
    return json.loads(p.stdout)


def cell(got: Dict[str, Any]) -> str:
    """One table cell: each figure as name=value, 3 significant digits."""
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in got.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--case", choices=CASES + OPTIONAL, action="append",
                    help="run only this case (may be given several times)")
    ap.add_argument("--big", action="store_true",
                    help="add the 10**7-node chain (several GB of RAM; micrograd's takes minutes)")
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
    cases = list(args.case or CASES) + (["big"] if args.big and "big" not in (args.case or ()) else [])
    for case in cases:
        cells = [cell(run(case, e, args.quick)) for e in engines]
        print(f"| {case} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
