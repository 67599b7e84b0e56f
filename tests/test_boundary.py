"""pygrad.boundary: the decision-boundary helper of the demo and examples."""
import random

import numpy as np
import pytest

from pygrad import Value, boundary, nn


def eager_classes(model, points):
    out = []
    for p in points.tolist():
        o = model([Value(x) for x in p])
        out.append(int(o.data > 0) if isinstance(o, Value) else int(np.argmax([v.data for v in o])))
    return np.array(out)


@pytest.mark.parametrize("nouts", [[8, 1], [8, 3]])
def test_grid_classes_equal_the_model_point_by_point(nouts):
    random.seed(4)
    model = nn.MLP(2, nouts)
    xx, yy = boundary.grid(np.array([[0.0, 0.0], [1.0, 1.0]]), h=0.1)
    points = np.c_[xx.ravel(), yy.ravel()]
    got = boundary.predict_classes(model, points)
    assert got.shape == (len(points),)
    assert np.array_equal(got, eager_classes(model, points))
    assert len(set(got.tolist())) > 1


def test_models_of_other_engines_go_point_by_point():
    random.seed(5)
    ref = nn.MLP(2, [4, 3], engine="reference")
    twin = nn.MLP(2, [4, 3])
    twin.set_data(ref.get_data())
    points = np.random.default_rng(0).normal(size=(50, 2))
    assert np.array_equal(boundary.predict_classes(ref, points),
                          boundary.predict_classes(twin, points))


def test_grid_checks_its_input():
    with pytest.raises(ValueError, match=r"\(n, 2\)"):
        boundary.grid(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="h must be"):
        boundary.grid(np.zeros((3, 2)), h=0.0)
    xx, yy = boundary.grid(np.array([[0.0, 0.0], [2.0, 1.0]]), h=0.5, margin=1.0)
    assert xx.shape == yy.shape and xx.min() == -1.0 and yy.max() < 2.0 + 1e-9


def test_plot_writes_a_png_or_says_none(tmp_path):
    random.seed(6)
    model = nn.MLP(2, [4, 1])
    X = np.random.default_rng(1).normal(size=(10, 2))
    path = boundary.plot_decision_boundary(model, X, np.arange(10) % 2, str(tmp_path / "b.png"))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert path is None
    else:
        assert path is not None and (tmp_path / "b.png").stat().st_size > 0
