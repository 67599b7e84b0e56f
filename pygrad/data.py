"""Toy datasets for training small networks with pygrad (numpy only).

Every generator is deterministic under its ``seed``: it draws only from
``numpy.random.default_rng(seed)``.  Features are float64 arrays of shape
``(n, 2)``, labels int64 arrays of shape ``(n,)``.

>>> X, y = make_moons(100, noise=0.1, seed=0)
>>> rows = to_values(X)            # list of [Value, Value]
>>> targets = signed_labels(y)     # -1.0 / +1.0 for a max-margin loss
"""
import math
import numbers
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from . import _backend
from ._numbers import real_array

__all__ = ["make_moons", "make_spiral", "make_xor", "to_values", "signed_labels"]

Dataset = Tuple[np.ndarray, np.ndarray]


def _check_size(name: str, n: Any, minimum: int = 0) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be an int, not {type(n).__name__}")
    n = int(n)
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")
    return n


def _check_noise(noise: Any) -> float:
    if isinstance(noise, bool) or not isinstance(noise, numbers.Real):
        raise TypeError(f"noise must be a real number, not {type(noise).__name__}")
    noise = float(noise)
    if not (math.isfinite(noise) and noise >= 0.0):
        raise ValueError(f"noise must be a finite number >= 0, got {noise}")
    return noise


def make_moons(n_samples: int = 100, noise: float = 0.1, seed: int = 0) -> Dataset:
    """Two interleaving half circles, as ``sklearn.datasets.make_moons``.

    Class 0 is the upper half circle ``(cos t, sin t)`` with ``n_samples // 2``
    points, class 1 the lower one ``(1 - cos t, 0.5 - sin t)`` with the rest,
    ``t`` evenly spaced over ``[0, pi]``.  The rows are shuffled, then
    gaussian noise of standard deviation ``noise`` is added (the shuffle does
    not depend on ``noise``, so one seed gives the same point order at every
    noise level).

    Returns ``(X, y)``: X float64 of shape ``(n_samples, 2)``, y int64 in {0, 1}.
    """
    n = _check_size("n_samples", n_samples, minimum=1)
    noise = _check_noise(noise)
    rng = np.random.default_rng(seed)
    n_out = n // 2
    n_in = n - n_out
    t_out = np.linspace(0, np.pi, n_out)
    t_in = np.linspace(0, np.pi, n_in)
    X = np.empty((n, 2), dtype=np.float64)
    X[:n_out, 0] = np.cos(t_out)
    X[:n_out, 1] = np.sin(t_out)
    X[n_out:, 0] = 1 - np.cos(t_in)
    X[n_out:, 1] = 1 - np.sin(t_in) - 0.5
    y = np.concatenate([np.zeros(n_out, np.int64), np.ones(n_in, np.int64)])
    order = rng.permutation(n)
    X, y = X[order], y[order]
    if noise > 0:
        X += rng.normal(scale=noise, size=X.shape)
    return X, y


def make_spiral(n_per_class: int = 100, n_classes: int = 3, noise: float = 0.2,
                seed: int = 0) -> Dataset:
    """The CS231n k-class spiral: arm ``j`` has radius ``linspace(0, 1)`` and
    angle ``linspace(4j, 4(j+1))`` plus gaussian noise ``noise`` (in radians).

    Rows are grouped by class (arm 0 first), as in the CS231n notes.
    Returns ``(X, y)``: X float64 of shape ``(n_per_class * n_classes, 2)``,
    y int64 in ``0 .. n_classes - 1``.
    """
    n = _check_size("n_per_class", n_per_class, minimum=1)
    k = _check_size("n_classes", n_classes, minimum=2)
    noise = _check_noise(noise)
    rng = np.random.default_rng(seed)
    X = np.empty((n * k, 2), dtype=np.float64)
    y = np.repeat(np.arange(k, dtype=np.int64), n)
    r = np.linspace(0.0, 1.0, n)
    for j in range(k):
        t = np.linspace(4.0 * j, 4.0 * (j + 1), n) + rng.normal(scale=noise, size=n)
        X[j * n:(j + 1) * n, 0] = r * np.sin(t)
        X[j * n:(j + 1) * n, 1] = r * np.cos(t)
    return X, y


_XOR_X = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
_XOR_Y = np.array([0, 1, 1, 0], dtype=np.int64)


def make_xor(n_samples: int = 4, noise: float = 0.0, seed: int = 0) -> Dataset:
    """XOR on the corners of the unit square: ``y = x0 xor x1``.

    Row ``i`` is corner ``i % 4`` of ``(0,0) (0,1) (1,0) (1,1)``, plus gaussian
    noise ``noise`` (so ``n_samples > 4`` with ``noise > 0`` gives jittered
    clouds around the corners).  ``n_samples`` must be at least 4.
    Returns ``(X, y)``: X float64 of shape ``(n_samples, 2)``, y int64 in {0, 1}.
    """
    n = _check_size("n_samples", n_samples, minimum=4)
    noise = _check_noise(noise)
    rng = np.random.default_rng(seed)
    idx = np.arange(n) % 4
    X, y = _XOR_X[idx], _XOR_Y[idx]
    if noise > 0:
        X = X + rng.normal(scale=noise, size=X.shape)
    return X, y


def to_values(X: Any, value_type: Optional[Callable[[float], Any]] = None) -> List[List[Any]]:
    """Rows of a 2-D array as lists of Values: ``[[Value(x00), Value(x01)], ...]``.

    ``value_type`` defaults to ``pygrad.Value``; pass ``pygrad.reference.Value``
    (or micrograd's Value) for another engine.
    """
    arr = real_array(X, "to_values' X")
    if arr.ndim != 2:
        raise ValueError(f"to_values needs a 2-D array (rows of features), got {arr.ndim}-D "
                         f"with shape {arr.shape}")
    if value_type is None or value_type is _backend.DEFAULT.Value:
        flat = _backend.DEFAULT.leaves(arr.ravel().tolist())
        width = arr.shape[1]
        return [flat[i:i + width] for i in range(0, len(flat), width)] if width else \
            [[] for _ in range(arr.shape[0])]
    return [[value_type(x) for x in row] for row in arr.tolist()]


def signed_labels(y: Any) -> np.ndarray:
    """Map labels {0, 1} to {-1.0, +1.0} (float64), micrograd's SVM convention."""
    arr = np.asarray(y)
    if arr.size and not np.isin(arr, (0, 1)).all():
        bad = np.unique(arr[~np.isin(arr, (0, 1))])[:5]
        raise ValueError(f"signed_labels needs labels in {{0, 1}}, found {bad.tolist()}")
    return np.where(arr == 1, 1.0, -1.0).astype(np.float64)
