"""Instructions per unit of work, by callgrind: the same on every run of a
tree, where this shared machine's timings are not.  Between two trees, a
difference under about 2% can come from layout alone (dict probe lengths,
addresses): the same loop run directly measured +2.3% here and -0.2% there.

    python benchmarks/bench_instructions.py                    # this tree
    python benchmarks/bench_instructions.py --baseline NAME=DIR  # and worktrees built in place
    python benchmarks/bench_instructions.py --micrograd        # and micrograd 0.1.0
    python benchmarks/bench_instructions.py --only chain custom

Each path runs in a fresh ``python`` under ``valgrind --tool=callgrind``
twice, at n units and at none (same imports and setup); the difference
over n is the instructions one unit costs, interpreter and C core alike.
Needs valgrind.  A run of every path takes a few minutes.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

# A custom op the micrograd way: a Value over its input, and a closure.
CUSTOM_TANH = (
    "import math\n"
    "def tanh(x):\n"
    "    t = math.tanh(x.data)\n"
    "    out = V(t, (x,), 'tanh')\n"
    "    def _backward():\n"
    "        x.grad += (1 - t ** 2) * out.grad\n"
    "    out._backward = _backward\n"
    "    return out")

# micrograd's moons step on its own nn code (Neuron, Layer, MLP written
# against V), 2-16-16-1, 100 samples, hinge loss + 1e-4 L2, eager: issue 44's
# fifth row, the same step as benchmarks/bench_versus.py's.
MOONS_SETUP = (
    "import random\n"
    "random.seed(0)\n"
    "class Neuron:\n"
    "    def __init__(self, nin, nonlin=True):\n"
    "        self.w = [V(random.uniform(-1, 1)) for _ in range(nin)]\n"
    "        self.b = V(0)\n"
    "        self.nonlin = nonlin\n"
    "    def __call__(self, x):\n"
    "        act = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)\n"
    "        return act.relu() if self.nonlin else act\n"
    "layers = [[Neuron(a, nonlin=i != 2) for _ in range(b)]\n"
    "          for i, (a, b) in enumerate([(2, 16), (16, 16), (16, 1)])]\n"
    "params = [p for l in layers for n in l for p in n.w + [n.b]]\n"
    "X = [[random.uniform(-1, 2), random.uniform(-1, 1)] for _ in range(100)]\n"
    "Y = [1 if x[0] > 0.5 else -1 for x in X]\n"
    "def forward(x):\n"
    "    v = list(map(V, x))\n"
    "    for l in layers:\n"
    "        v = [n(v) for n in l]\n"
    "    return v[0]")
MOONS_STEP = (
    "scores = [forward(x) for x in X]\n"
    "losses = [(1 + -yi * s).relu() for yi, s in zip(Y, scores)]\n"
    "loss = sum(losses) * (1.0 / len(losses)) + 1e-4 * sum(p * p for p in params)\n"
    "for p in params:\n"
    "    p.grad = 0.0\n"
    "loss.backward()\n"
    "for p in params:\n"
    "    p.data -= 0.05 * p.grad\n"
    "del scores, losses, loss")

# name -> (unit, units per round, setup, one round); the code sees V (the
# Value class), nn (the engine's), R (the rounds of the measured run, for a
# setup that must not depend on whether it runs) and N (rounds to run: R or 0).
PATHS: Dict[str, Tuple[str, int, str, str]] = {
    "dropped": ("op", 1, "a, b = V(1.5), V(2.0)", "a * b"),
    "moons step": ("step", 1, MOONS_SETUP, MOONS_STEP),
    "chain": ("op", 3, "w, c, y = V(0.999), V(0.001), V(1.0)",
              "y = (y * w + c).relu()"),
    "leaf": ("kept Value(x)", 1, "kept = []", "kept.append(V(1.5))"),
    "update": ("parameter", 337, "model = nn.MLP(2, [16, 16, 1]); ps = model.parameters()",
               "for p in ps:\n    p.data += -0.01 * p.grad\n    p.grad = 0"),
    "first walk": ("node", 12002, (
        "def graph(n):\n"
        "    a, b = V(0.5), V(-1.5)\n"
        "    x = a\n"
        "    for i in range(n):\n"
        "        x = (x * b + a).relu() + (x if i % 3 else a) * 0.5\n"
        "    return x\n"
        "def walk(root):\n"
        "    seen, out, stack = set(), [], [root]\n"
        "    while stack:\n"
        "        v = stack.pop()\n"
        "        if id(v) in seen:\n"
        "            continue\n"
        "        seen.add(id(v)); out.append(v); stack.extend(v._prev)\n"
        "    return out\n"
        "roots = [graph(2000) for _ in range(R)]\n"
        "import gc; gc.collect()\n"
        "it = iter(roots)"), "walk(next(it))"),
    "custom": ("op", 100, CUSTOM_TANH,
               "y = V(0.3)\nfor _ in range(100):\n    y = tanh(y)\ny.backward()"),
    "above custom": ("op", 200, CUSTOM_TANH,
                     "y = tanh(V(0.3))\nfor _ in range(200):\n    y = y * 1.01"),
    "fused step": ("step", 1, (
        "import random\n"
        "random.seed(0)\n"
        "model = nn.MLP(2, [16, 16, 1])\n"
        "xs = [[V(random.uniform(-1, 1)), V(random.uniform(-1, 1))] for _ in range(100)]\n"
        "ys = [1.0 if x[0].data > 0 else -1.0 for x in xs]\n"
        "ps = model.parameters()"),
        "loss = sum((1 + -y * model(x)).relu() for x, y in zip(xs, ys)) * (1.0 / len(ys))\n"
        "model.zero_grad()\nloss.backward()\n"
        "for p in ps:\n    p.data -= 0.05 * p.grad"),
}

CHILD = """
import sys
sys.path.insert(0, {root!r})
{imports}
R = {rounds}
N = {n}
{setup}
for _ in range(N):
{body}
"""

ENGINE_IMPORTS = {
    "pygrad": "from pygrad import Value as V\nimport pygrad.nn as nn",
    "micrograd": "from micrograd.engine import Value as V\nimport micrograd.nn as nn",
}


def instructions(code: str) -> int:
    """Instructions callgrind counts for ``python -c code``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0")
        run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                              sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, check=False)
        found = re.search(r"Collected : (\d+)", run.stderr)
        if run.returncode != 0 or found is None:
            raise RuntimeError(f"the child failed:\n{run.stderr[-2000:]}")
        return int(found.group(1))


def per_unit(path: str, engine: str, root: str, rounds: int) -> float:
    unit, per_round, setup, body = PATHS[path]
    if engine == "pygrad" and root:
        imports = ENGINE_IMPORTS[engine]
    else:
        imports, root = ENGINE_IMPORTS[engine], ""
    indented = "\n".join("    " + line for line in body.splitlines())
    counts = [instructions(CHILD.format(root=root, imports=imports, rounds=rounds, n=n,
                                        setup=setup, body=indented)) for n in (rounds, 0)]
    return (counts[0] - counts[1]) / (rounds * per_round)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", action="append", default=[], metavar="[NAME=]DIR",
                        help="another tree, built in place, to compare with (repeatable)")
    parser.add_argument("--micrograd", action="store_true", help="also micrograd 0.1.0")
    parser.add_argument("--only", nargs="*", choices=sorted(PATHS), help="these paths only")
    parser.add_argument("--rounds", type=int, default=0, help="rounds per path (default: its own)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        sys.exit("bench_instructions.py needs valgrind (apt install valgrind)")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    columns = [("this tree", "pygrad", here)]
    for spec in args.baseline:
        name, _, path = spec.rpartition("=")
        columns.append((name or "baseline", "pygrad", os.path.abspath(path)))
    if args.micrograd:
        columns.append(("micrograd", "micrograd", ""))
    default_rounds = {"dropped": 50000, "moons step": 1, "chain": 20000, "leaf": 100000,
                      "update": 50, "first walk": 2, "custom": 50, "above custom": 100,
                      "fused step": 20}
    ratios = [f"this / {c[0]}" for c in columns[1:]]
    print("| path | unit | " + " | ".join(c[0] for c in columns + [(r,) for r in ratios]) + " |")
    print("|---|---|" + "---:|" * (len(columns) + len(ratios)))
    for path in args.only or list(PATHS):
        rounds = args.rounds or default_rounds[path]
        figures = [per_unit(path, engine, root, rounds) for _, engine, root in columns]
        row = f"| {path} | {PATHS[path][0]} | " + " | ".join(f"{f:,.0f}" for f in figures)
        row += "".join(f" | {figures[0] / f:.3f}" for f in figures[1:])
        print(row + " |", flush=True)


if __name__ == "__main__":
    main()
