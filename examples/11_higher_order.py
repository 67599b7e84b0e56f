"""Higher-order derivatives: Newton's method, and tanh's first six derivatives.

pygrad.grad(y, xs, create_graph=True) returns the gradient as Values of a
new graph, which pygrad.grad differentiates again, to any order.  Here
Newton's method minimizes a 2-D function with pygrad.grad and
pygrad.hessian, and tanh's first six derivatives are taken by nesting
grad, checked against their closed forms and against pygrad.reference bit
for bit, and plotted as HIPS autograd's README plots them.

    python examples/11_higher_order.py [--quick] [--out DIR]
"""
import math
import os
from typing import List, Optional, Sequence

import pygrad
from pygrad import Value, reference

from _common import check, make_parser


def f(x, y):
    """A bowl with a curved valley: its minimum is at (1, 0.5)."""
    return (x - 1.0) ** 4 + (x - 2.0 * y) ** 2 + 0.5 * (y - 0.5) ** 2


def newton(start: Sequence[float], steps: int) -> List[List[float]]:
    """x <- x - H^-1 g, with g from pygrad.grad and H from pygrad.hessian."""
    import numpy as np
    path = [list(start)]
    x = np.array(start, dtype=float)
    for _ in range(steps):
        leaves = [Value(v) for v in x]
        g = np.array([d.data for d in pygrad.grad(f(*leaves), leaves)])
        h = pygrad.hessian(f, list(x))
        x = x - np.linalg.solve(h, g)
        path.append(list(x))
    return path


def tanh_derivatives(V: type, x: float, orders: int) -> List[float]:
    """tanh and its first `orders` derivatives at x, by nesting grad."""
    v = V(x)
    y = v.tanh()
    out = [y.data]
    for _ in range(orders):
        (y,) = pygrad.grad(y, [v], create_graph=True)
        out.append(y.data)
    return out


def closed_form(x: float) -> List[float]:
    """tanh, tanh', tanh'', tanh''' from t = tanh(x)."""
    t = math.tanh(x)
    s = 1.0 - t * t
    return [t, s, -2.0 * t * s, -2.0 * s * (1.0 - 3.0 * t * t)]


def plot(xs: List[float], curves: List[List[float]], path: str) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  (matplotlib is not installed: no plot; pip install matplotlib)")
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for order, ys in enumerate(curves):
        ax.plot(xs, ys, label="tanh" if order == 0 else f"d^{order}")
    ax.set_title("tanh and its first six derivatives (pygrad.grad, create_graph=True)")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"  wrote {path}")
    return path


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = make_parser(__doc__, writes="tanh_derivatives.png").parse_args(argv)
    path = newton([-1.0, 2.0], 12 if args.quick else 20)
    for i, (x, y) in enumerate(path[:4] + path[-1:]):
        print(f"  newton step {i if i < 4 else len(path) - 1:2d}: x={x:.12f} y={y:.12f}")
    end = path[-1]
    check(abs(end[0] - 1.0) < 1e-3 and abs(end[1] - 0.5) < 1e-3, "Newton reaches the minimum (1, 0.5)")

    n = 61 if args.quick else 401
    xs = [-4.0 + 8.0 * i / (n - 1) for i in range(n)]
    rows = [tanh_derivatives(Value, x, 6) for x in xs]
    same = all(tanh_derivatives(reference.Value, x, 6) == row for x, row in zip(xs, rows))
    check(same, "the C engine and the reference engine agree bit for bit, to the 6th order")
    worst = max(abs(a - b) for x, row in zip(xs, rows) for a, b in zip(row, closed_form(x)))
    check(worst < 1e-12, f"orders 0-3 match the closed forms (worst {worst:.1e})")
    curves = [[row[k] for row in rows] for k in range(7)]
    os.makedirs(args.out, exist_ok=True)
    written = plot(xs, curves, os.path.join(args.out, "tanh_derivatives.png"))
    return {"newton": path, "derivatives": rows, "xs": xs, "plot": written}


if __name__ == "__main__":
    main()
