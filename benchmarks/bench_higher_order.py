"""Higher-order derivatives: cost, against PyTorch and JAX, and agreement with JAX.

    pip install jax jaxlib torch        # optional: each column runs if installed
    python benchmarks/bench_higher_order.py [--repeats 5]

Four parts, each printed as a table; the last line is one JSON object.

1. **HVP vs one gradient** on micrograd's moons MLP (2-16-16-1 ReLU, 100
   samples of make_moons, hinge loss + 1e-4 * sum(p * p), 337 parameters),
   written with pygrad.dot (pygrad.nn's fused neurons) and with plain ops
   (micrograd's nn code).  One gradient is the forward pass and
   backward() from new leaves; an HVP is ``pygrad.hvp`` (the forward pass,
   then forward-over-reverse in one C call), and beside it the same
   product as grad-of-grad (``grad(create_graph=True)``, then ``grad`` of
   its dot with v).  Medians of the repeats, alternating, in one process;
   the ratios are over one gradient.
2. **The full 337 x 337 Hessian** of that loss: ``pygrad.hessian`` against
   ``torch.func.hessian`` and ``jax.jit(jax.hessian)`` (float64, one
   thread each, the same parameters and data; jit's compile time is left
   out and printed apart), with the largest difference of their matrices.
3. **Agreement with JAX**: the 2nd and 3rd derivatives of every unary op
   and the Hessian (mixed partials) of every binary op at fixed points,
   against ``jax.grad`` in float64; the goal is 1e-9 relative (or absolute
   under 1).
4. **Memory**: 20,000 rounds of ``grad(create_graph=True)`` then ``grad``,
   each dropped: the resident set and the live node count, before and
   after.
"""
import argparse
import json
import math
import os
import random
import statistics
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import pygrad  # noqa: E402
from pygrad import Value  # noqa: E402
from pygrad.data import make_moons  # noqa: E402

SIZES = (2, 16, 16, 1)
ALPHA = 1e-4


def moons():
    X, y = make_moons(n_samples=100, noise=0.1)
    return [list(map(float, x)) for x in X], [float(t) * 2 - 1 for t in y]


def n_params() -> int:
    return sum((a + 1) * b for a, b in zip(SIZES, SIZES[1:]))


def loss_fn(X, Y, fused: bool):
    """f(*params): the moons loss, parameters neuron by neuron (w..., b)."""
    def f(*params):
        layers, k = [], 0
        for nin, nout in zip(SIZES, SIZES[1:]):
            neurons = []
            for _ in range(nout):
                neurons.append((params[k:k + nin], params[k + nin]))
                k += nin + 1
            layers.append(neurons)
        losses = []
        for x, target in zip(X, Y):
            h = x
            for li, layer in enumerate(layers):
                last = li == len(layers) - 1
                if fused:
                    h = [pygrad.dot(w, h, b, act=None if last else "relu") for w, b in layer]
                else:
                    out = []
                    for w, b in layer:
                        s = sum((wi * hi for wi, hi in zip(w, h)), b)
                        out.append(s if last else s.relu())
                    h = out
            losses.append((1 + -target * h[0]).relu())
        data_loss = sum(losses) * (1.0 / len(losses))
        reg = ALPHA * sum(p * p for p in params)
        return data_loss + reg
    return f


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def part_hvp(X, Y, theta, v, repeats):
    rows = {}
    for fused in (True, False):
        f = loss_fn(X, Y, fused)

        def gradient():
            leaves = [Value(t) for t in theta]
            f(*leaves).backward()
            return [p.grad for p in leaves]

        def hvp():
            return pygrad.hvp(f, theta, v)

        def grad_of_grad():
            leaves = [Value(t) for t in theta]
            first = pygrad.grad(f(*leaves), leaves, create_graph=True)
            return [d.data for d in pygrad.grad(first, leaves, grad_outputs=v)]
        t_grad, t_hvp, t_gg = [], [], []
        for _ in range(repeats):
            t_grad.append(timed(gradient, 1))
            t_hvp.append(timed(hvp, 1))
            t_gg.append(timed(grad_of_grad, 1))
        name = "fused (pygrad.dot)" if fused else "plain ops"
        rows[name] = tuple(statistics.median(t) for t in (t_grad, t_hvp, t_gg))
    print("\n1. HVP vs one gradient, moons MLP 2-16-16-1, 100 samples (ms, medians)")
    print(f"   {'graph':<20} {'gradient':>10} {'hvp':>10} {'hvp/grad':>9} {'grad-of-grad':>13} {'ratio':>7}")
    for name, (g, h, gg) in rows.items():
        print(f"   {name:<20} {g * 1e3:10.2f} {h * 1e3:10.2f} {h / g:9.2f} {gg * 1e3:13.2f} {gg / g:7.2f}")
    return {name: {"gradient_ms": g * 1e3, "hvp_ms": h * 1e3, "ratio": h / g,
                   "grad_of_grad_ms": gg * 1e3, "grad_of_grad_ratio": gg / g}
            for name, (g, h, gg) in rows.items()}


def torch_loss(X, Y):
    import torch

    def f(theta):
        k, h = 0, torch.tensor(X, dtype=torch.float64)
        for li, (nin, nout) in enumerate(zip(SIZES, SIZES[1:])):
            block = theta[k:k + (nin + 1) * nout].reshape(nout, nin + 1)
            k += (nin + 1) * nout
            h = h @ block[:, :nin].T + block[:, nin]
            if li < len(SIZES) - 2:
                h = torch.relu(h)
        y = torch.tensor(Y, dtype=torch.float64)
        return torch.relu(1 - y * h[:, 0]).mean() + ALPHA * (theta * theta).sum()
    return f


def jax_loss(X, Y):
    import jax.numpy as jnp

    def f(theta):
        k, h = 0, jnp.asarray(X)
        for li, (nin, nout) in enumerate(zip(SIZES, SIZES[1:])):
            block = theta[k:k + (nin + 1) * nout].reshape(nout, nin + 1)
            k += (nin + 1) * nout
            h = h @ block[:, :nin].T + block[:, nin]
            if li < len(SIZES) - 2:
                h = jnp.maximum(h, 0.0)
        return jnp.maximum(1 - jnp.asarray(Y) * h[:, 0], 0.0).mean() + ALPHA * (theta * theta).sum()
    return f


def part_hessian(X, Y, theta, repeats):
    f = loss_fn(X, Y, True)
    runs = {"pygrad.hessian": lambda: pygrad.hessian(f, theta)}
    matrices = {"pygrad.hessian": runs["pygrad.hessian"]()}
    compile_s = None
    try:
        import torch
        torch.set_num_threads(1)
        from torch.func import hessian as torch_hessian
        tf, tt = torch_loss(X, Y), torch.tensor(theta, dtype=torch.float64)
        runs["torch.func.hessian"] = lambda: torch_hessian(tf)(tt)
        matrices["torch.func.hessian"] = runs["torch.func.hessian"]().numpy()
    except ImportError:
        print("   (torch is not installed: no torch column)")
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
        jf = jax.jit(jax.hessian(jax_loss(X, Y)))
        jt = jax.numpy.asarray(theta)
        t = time.perf_counter()
        jf(jt).block_until_ready()
        compile_s = time.perf_counter() - t
        runs["jax.jit(jax.hessian)"] = lambda: jf(jt).block_until_ready()
        matrices["jax.jit(jax.hessian)"] = np.asarray(jf(jt))
    except ImportError:
        print("   (jax is not installed: no jax column)")
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(timed(run, 1))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    ours = med["pygrad.hessian"]
    n = len(theta)
    print(f"\n2. The full {n} x {n} Hessian of the moons loss (ms, medians; float64, one thread)")
    print(f"   {'':<22} {'ms':>10} {'/ pygrad':>9} {'max |diff| vs pygrad':>21}")
    for name, t in med.items():
        diff = float(np.max(np.abs(matrices[name] - matrices["pygrad.hessian"])))
        print(f"   {name:<22} {t * 1e3:10.1f} {t / ours:9.2f} {diff:21.2e}")
    if compile_s is not None:
        print(f"   (jax.jit's first call, compile included: {compile_s * 1e3:.0f} ms)")
    symmetric = bool((matrices["pygrad.hessian"] == matrices["pygrad.hessian"].T).all())
    print(f"   pygrad's Hessian symmetric to the last bit: {symmetric}")
    return {"ms": {k: v * 1e3 for k, v in med.items()}, "jax_compile_ms":
            None if compile_s is None else compile_s * 1e3, "symmetric": symmetric}


UNARY = {
    "exp": ([-1.3, 0.4, 2.0], "exp"), "log": ([0.3, 1.7, 5.0], "log"),
    "tanh": ([-1.2, 0.3, 0.9], "tanh"), "sigmoid": ([-2.0, 0.1, 1.5], "sigmoid"),
    "sin": ([-2.0, 0.5, 3.0], "sin"), "cos": ([-2.0, 0.5, 3.0], "cos"),
    "tan": ([-1.0, 0.2, 1.1], "tan"), "asin": ([-0.7, 0.1, 0.6], "arcsin"),
    "acos": ([-0.7, 0.1, 0.6], "arccos"), "atan": ([-2.0, 0.3, 1.5], "arctan"),
    "sinh": ([-1.5, 0.2, 1.1], "sinh"), "cosh": ([-1.5, 0.2, 1.1], "cosh"),
    "asinh": ([-2.0, 0.3, 1.5], "arcsinh"), "acosh": ([1.3, 2.0, 4.0], "arccosh"),
    "atanh": ([-0.6, 0.1, 0.5], "arctanh"), "sqrt": ([0.3, 1.0, 4.0], "sqrt"),
    "log2": ([0.3, 1.7, 5.0], "log2"), "log10": ([0.3, 1.7, 5.0], "log10"),
    "log1p": ([-0.5, 0.3, 3.0], "log1p"), "expm1": ([-1.3, 0.4, 2.0], "expm1"),
    "erf": ([-1.2, 0.3, 1.0], "erf"), "erfc": ([-1.2, 0.3, 1.0], "erfc"),
    "abs": ([-1.5, 0.7], "abs"), "relu": ([-1.5, 0.7], "relu"), "__neg__": ([-0.4, 1.2], "negative"),
    "x ** 3": ([-1.1, 0.6], None), "x ** 0.5": ([0.4, 2.0], None), "x ** -1.5": ([0.4, 2.0], None),
}
BINARY = {
    "a + b": lambda a, b: a + b, "a * b": lambda a, b: a * b, "a - b": lambda a, b: a - b,
    "a / b": lambda a, b: a / b, "a ** b": lambda a, b: a ** b,
}


def rel_error(ours, theirs):
    return abs(ours - theirs) / max(1.0, abs(theirs))


def part_jax():
    try:
        import jax
        import jax.numpy as jnp
        import jax.scipy.special as jsp
        jax.config.update("jax_enable_x64", True)
    except ImportError:
        print("\n3. (jax is not installed: no agreement check)")
        return None

    def jax_fn(method, name):
        if method.startswith("x **"):
            k = float(method.split("**")[1])
            return lambda x: x ** k
        if name in ("erf", "erfc"):
            return getattr(jsp, name)
        if name == "sigmoid":
            return jax.nn.sigmoid
        if name == "relu":
            return jax.nn.relu
        return getattr(jnp, name)

    def ours(method):
        if method.startswith("x **"):
            k = float(method.split("**")[1])
            return lambda v: v ** k
        return lambda v: getattr(v, method)()

    def nth(f, x, n):
        v = Value(x)
        y = f(v)
        for _ in range(n):
            (y,) = pygrad.grad(y, [v], create_graph=True)
        return y.data
    worst, rows = 0.0, []
    for method, (points, name) in UNARY.items():
        jf = jax_fn(method, name)
        d2, d3 = jax.grad(jax.grad(jf)), jax.grad(jax.grad(jax.grad(jf)))
        e = max(max(rel_error(nth(ours(method), x, 2), float(d2(x))),
                    rel_error(nth(ours(method), x, 3), float(d3(x)))) for x in points)
        rows.append((method, e))
        worst = max(worst, e)
    for name, f in BINARY.items():
        point = [1.3, 0.7]
        h = pygrad.hessian(f, point)
        hj = np.asarray(jax.hessian(lambda p: f(p[0], p[1]))(jnp.asarray(point)))
        e = float(np.max(np.abs(h - hj) / np.maximum(1.0, np.abs(hj))))
        rows.append((name + " (Hessian)", e))
        worst = max(worst, e)
    print("\n3. Agreement with JAX float64: 2nd and 3rd derivatives, binary Hessians "
          "(worst relative error, or absolute under 1)")
    for name, e in rows:
        print(f"   {name:<18} {e:.1e}")
    print(f"   worst {worst:.1e}: {'within' if worst <= 1e-9 else 'OVER'} 1e-9")
    return {"worst": worst, "within_1e-9": worst <= 1e-9}


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def part_memory(rounds: int):
    """``rounds`` of grad(create_graph=True) then grad again, each dropped:
    the live node count and the resident set before and after."""
    from pygrad._core import lib

    def once():
        x, w = Value(0.3), Value(-1.1)
        y = ((x * w).tanh() + (x / w).exp()) ** 2
        gs = pygrad.grad(y, [x, w], create_graph=True)
        pygrad.grad(gs[0] + gs[1], [x, w])
    for _ in range(1000):
        once()
    import gc
    gc.collect()
    before, nodes = rss_kib(), lib.pg_live_nodes()
    for _ in range(rounds):
        once()
    gc.collect()
    after, nodes_after = rss_kib(), lib.pg_live_nodes()
    print(f"\n4. {rounds:,} rounds of grad(create_graph=True) then grad, each dropped: "
          f"RSS {before:,} -> {after:,} KiB, live nodes {nodes} -> {nodes_after}")
    return {"rounds": rounds, "rss_kib": [before, after], "live_nodes": [nodes, nodes_after]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=20000, help="memory rounds (part 4)")
    args = ap.parse_args()
    X, Y = moons()
    rng = random.Random(1)
    theta = [rng.uniform(-1, 1) * (1 / math.sqrt(2)) for _ in range(n_params())]
    v = [rng.uniform(-1, 1) for _ in theta]
    out = {"hvp": part_hvp(X, Y, theta, v, args.repeats),
           "hessian": part_hessian(X, Y, theta, args.repeats),
           "jax_agreement": part_jax(), "memory": part_memory(args.rounds)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
