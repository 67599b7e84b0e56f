"""Decision boundaries: a 2-input classifier's class over a grid of the
plane, and its plot (the demo's and the examples' one helper).

The default grid is 250 x 250 = 62,500 points (``GRID_SIDE`` per side)
over the data's box widened by 1 on each side.  On the C engine the model
is built once, over two placeholder leaves, and run over every grid point
in one call (``Program.map``): 62,500 points take milliseconds.  Other
engines (the reference engine, micrograd) evaluate the model point by
point, which for 62,500 points takes seconds to minutes: pass a smaller
``n``.
"""
import os
from typing import Any, List, Optional, Tuple

import numpy as np

from ._numbers import to_setting, to_size
from .engine import Value
from .replay import compile as compile_graph

__all__ = ["grid", "predict_classes", "plot_decision_boundary"]

#: Points per side of the default grid: 250 x 250 = 62,500 points, fine
#: enough that the boundary drawn between them is smooth at the PNG's size.
GRID_SIDE = 250


def grid(X: Any, h: Optional[float] = None, margin: float = 1.0,
         n: int = GRID_SIDE) -> Tuple[np.ndarray, np.ndarray]:
    """``numpy.meshgrid`` arrays over the box of the points ``X`` (shape
    ``(n_points, 2)``), widened by ``margin`` on each side: ``n`` x ``n``
    points, edges included (default 250 x 250 = 62,500), or, with a step
    ``h``, the points ``np.arange(low, high, h)`` on each axis (their number
    then depends on the data's spread)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != 2 or len(X) == 0:
        raise ValueError(f"X must be an (n, 2) array of points, got shape {X.shape}")
    margin = to_setting(margin, "margin")
    low, high = X.min(axis=0) - margin, X.max(axis=0) + margin
    if h is not None:
        if not to_setting(h, "h") > 0:
            raise ValueError(f"h must be > 0, not {h!r}")
        return np.meshgrid(np.arange(low[0], high[0], h), np.arange(low[1], high[1], h))
    n = to_size(n, "n", minimum=2)
    return np.meshgrid(np.linspace(low[0], high[0], n), np.linspace(low[1], high[1], n))


def predict_classes(model: Any, points: Any) -> np.ndarray:
    """The class of each point (rows of ``points``, shape (n, 2)): for one
    output, 1 where it is > 0 else 0; for several, the index of the largest.
    ``model`` maps a list of two Values to a Value or a list of Values."""
    scores = _scores(model, points)
    if scores.shape[1] == 1:
        return (scores[:, 0] > 0).astype(int)
    return np.argmax(scores, axis=1)


def _scores(model: Any, points: Any) -> np.ndarray:
    """The model's outputs at each point, shape (n, outputs)."""
    points = np.ascontiguousarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 2:
        raise ValueError(f"points must be an (n, 2) array of points, got shape {points.shape}")
    x0, x1 = Value(0.0), Value(0.0)
    try:
        out = model([x0, x1])
    except TypeError:                       # a model of another engine
        out = model([0.0, 0.0])
    outs = out if isinstance(out, (list, tuple)) else [out]
    if all(isinstance(o, Value) for o in outs):
        return compile_graph(list(outs), inputs=[x0, x1]).map(points).reshape(len(points),
                                                                              len(outs))
    # (a model of another engine gives its Values; one of plain numbers, numbers)
    return np.array([[o.data if hasattr(o, "data") else o
                      for o in (r if isinstance(r, (list, tuple)) else [r])]
                     for r in (model(p) for p in points.tolist())],
                    dtype=np.float64).reshape(len(points), len(outs))


def _margins(scores: np.ndarray) -> np.ndarray:
    """Per class, how far its score is above the best other one (> 0 exactly
    where ``predict_classes`` picks it), shape (classes, n).  Contouring
    these continuous numbers at 0 draws the boundary between grid points
    (linear interpolation), not along the grid's cells as class labels do."""
    if scores.shape[1] == 1:
        return np.stack([-scores[:, 0], scores[:, 0]])
    top2 = np.sort(scores, axis=1)[:, -2:]
    best_other = np.where(scores == top2[:, 1:], top2[:, :1], top2[:, 1:])
    return (scores - best_other).T


def _class_indices(y: np.ndarray) -> Tuple[np.ndarray, List[str]]:
    """``y`` as the class indices ``predict_classes`` gives, and each
    index's name for the legend.  Labels -1/+1 (micrograd's, for a model
    with one output) become 0/1: index 1 is the side where it is > 0."""
    if y.size and np.all(np.isin(y, (-1, 1))) and np.any(y < 0):
        return (y > 0).astype(int), ["-1", "+1"]
    idx = y.astype(int)
    return idx, [str(c) for c in range(int(idx.max()) + 1 if idx.size else 0)]


def _model_name(model: Any) -> str:
    """``MLP(2, [16, 16, 1])`` for pygrad's MLP (its constructor call, short
    enough for a title), else the class's name."""
    structure = getattr(model, "_structure", None)
    if type(model).__name__ == "MLP" and callable(structure):
        sizes = structure()
        return f"MLP({sizes[0]}, {sizes[1:]})"
    return type(model).__name__


def plot_decision_boundary(model: Any, X: Any, y: Any, path: str, title: str = "",
                           h: Optional[float] = None, n: int = GRID_SIDE) -> Optional[str]:
    """Colour the plane by ``model``'s class (``predict_classes`` over
    ``grid(X, h, n=n)``: 62,500 points by default) under the data points
    ``X`` coloured by their labels ``y`` in the same colours, with a legend,
    labelled axes and a title naming ``title``, the model and its accuracy
    on ``(X, y)``; save a PNG at ``path`` (folders made).  ``y`` holds class
    indices, or -1/+1 (or 0/1) for a model with one output.  Returns the
    path, or None when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    X = np.asarray(X, dtype=np.float64)
    xx, yy = grid(X, h, n=n)
    margins = _margins(_scores(model, np.c_[xx.ravel(), yy.ravel()]))
    predicted = predict_classes(model, X)
    labels, names = _class_indices(np.asarray(y))
    k = max(len(names), len(margins))
    names += [str(i) for i in range(len(names), k)]
    accuracy = float(np.mean(predicted == labels))
    # One colour per class, for both the regions (light) and the points
    # (full, edged): a point on its own class's region reads as right.
    colours = [plt.get_cmap("tab10")(c % 10) for c in range(k)]
    fig, ax = plt.subplots(figsize=(6, 5.4))
    for c, m in enumerate(margins):
        m = m.reshape(xx.shape)
        if m.max() > 0:
            ax.contourf(xx, yy, m, levels=[0.0, float(m.max()) + 1.0], colors=[colours[c]],
                        alpha=0.3)
            if m.min() < 0:
                ax.contour(xx, yy, m, levels=[0.0], colors="0.25", linewidths=0.8)
    for c in range(k):
        ax.scatter(X[labels == c, 0], X[labels == c, 1], color=colours[c], s=28,
                   edgecolors="k", linewidths=0.6, label=f"class {names[c]}")
    ax.legend(title="data (shading: model's class)", loc="best", fontsize=8,
              title_fontsize=8, framealpha=0.9)
    ax.set_xlabel("x[0]")
    ax.set_ylabel("x[1]")
    ax.set_xlim(xx.min(), xx.max())
    ax.set_ylim(yy.min(), yy.max())
    head = f"{title}: " if title else "decision boundary: "
    ax.set_title(f"{head}{_model_name(model)}, accuracy {accuracy:.1%} on the points shown",
                 fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
