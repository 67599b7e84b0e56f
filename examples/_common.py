"""Small helpers shared by the examples: argument parsing, a result check
that fails the run, and a decision-boundary plot."""
import argparse
import os
from typing import Any, Callable, List, Optional, Sequence

import numpy as np


def parse_args(doc: str, argv: Optional[Sequence[str]], plots: bool = False) -> argparse.Namespace:
    """``--quick`` (and ``--out DIR`` for examples that plot)."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smaller run, a few seconds")
    if plots:
        p.add_argument("--out", default=".", help="folder for the PNGs (needs matplotlib)")
    return p.parse_args(argv)


def check(ok: bool, what: str) -> None:
    """Print the outcome of a check; a failed check ends the run with exit 1."""
    print(f"  [{'ok' if ok else 'FAILED'}] {what}")
    if not ok:
        raise SystemExit(1)


def plot_decision_boundary(predict: Callable[[List[float]], int], X: np.ndarray, y: np.ndarray,
                           path: str, title: str) -> Optional[str]:
    """Colour the plane by ``predict([x0, x1])`` under the data points; the
    PNG's path, or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  (matplotlib is not installed: no plot; pip install matplotlib)")
        return None
    h = 0.1
    xx, yy = np.meshgrid(np.arange(X[:, 0].min() - 0.5, X[:, 0].max() + 0.5, h),
                         np.arange(X[:, 1].min() - 0.5, X[:, 1].max() + 0.5, h))
    Z = np.array([predict(p) for p in np.c_[xx.ravel(), yy.ravel()].tolist()]).reshape(xx.shape)
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.contourf(xx, yy, Z, cmap="Spectral", alpha=0.6)
    ax.scatter(X[:, 0], X[:, 1], c=y, s=20, cmap="Spectral", edgecolors="k")
    ax.set_title(title)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"  wrote {path}")
    return path


def accuracy(predicted: Any, y: Any) -> float:
    return float(np.mean(np.asarray(predicted) == np.asarray(y)))
