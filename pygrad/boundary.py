"""Decision boundaries: a 2-input classifier's class over a grid of the
plane, and its plot (the demo's and the examples' one helper).

On the C engine the model is built once, over two placeholder leaves, and
run over every grid point in one call (``Program.map``): 62,500 points take
milliseconds.  Other engines (the reference engine, micrograd) evaluate the
model point by point.
"""
import os
from typing import Any, Optional, Tuple

import numpy as np

from .engine import Value
from .replay import compile as compile_graph

__all__ = ["grid", "predict_classes", "plot_decision_boundary"]


def grid(X: Any, h: float = 0.05, margin: float = 1.0) -> Tuple[np.ndarray, np.ndarray]:
    """A mesh over the data's box, widened by ``margin``, with step ``h``."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != 2 or len(X) == 0:
        raise ValueError(f"X must be an (n, 2) array of points, got shape {X.shape}")
    if not h > 0:
        raise ValueError(f"h must be > 0, not {h!r}")
    return np.meshgrid(np.arange(X[:, 0].min() - margin, X[:, 0].max() + margin, h),
                       np.arange(X[:, 1].min() - margin, X[:, 1].max() + margin, h))


def predict_classes(model: Any, points: Any) -> np.ndarray:
    """The class of each point (rows of ``points``, shape (n, 2)): for one
    output, 1 where it is > 0 else 0; for several, the index of the largest.
    ``model`` maps a list of two Values to a Value or a list of Values."""
    points = np.ascontiguousarray(points, dtype=np.float64).reshape(-1, 2)
    x0, x1 = Value(0.0), Value(0.0)
    try:
        out = model([x0, x1])
    except TypeError:                       # a model of another engine
        out = None
    outs = out if isinstance(out, (list, tuple)) else [out]
    if all(isinstance(o, Value) for o in outs):
        scores = compile_graph(list(outs), inputs=[x0, x1]).map(points)
    else:
        scores = np.array([[o.data for o in (r if isinstance(r, (list, tuple)) else [r])]
                           for r in (model(p) for p in points.tolist())]).reshape(len(points), -1)
    if scores.shape[1] == 1:
        return (scores[:, 0] > 0).astype(int)
    return np.argmax(scores, axis=1)


def plot_decision_boundary(model: Any, X: Any, y: Any, path: str, title: str = "",
                           h: float = 0.05) -> Optional[str]:
    """Colour the plane by ``model``'s class under the data points and save
    a PNG at ``path`` (folders made); returns the path, or None when
    matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    xx, yy = grid(X, h)
    Z = predict_classes(model, np.c_[xx.ravel(), yy.ravel()]).reshape(xx.shape)
    X = np.asarray(X)
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.contourf(xx, yy, Z, cmap="Spectral", alpha=0.8)
    ax.scatter(X[:, 0], X[:, 1], c=y, s=30, cmap="Spectral", edgecolors="k")
    ax.set_title(title or "decision boundary")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
