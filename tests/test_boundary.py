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
    with pytest.raises(ValueError, match="n must be >= 2"):
        boundary.grid(np.zeros((3, 2)), n=1)
    with pytest.raises(TypeError, match="n must be an int"):
        boundary.grid(np.zeros((3, 2)), n=2.5)
    xx, yy = boundary.grid(np.array([[0.0, 0.0], [2.0, 1.0]]), h=0.5, margin=1.0)
    assert xx.shape == yy.shape and xx.min() == -1.0 and yy.max() < 2.0 + 1e-9


def test_the_default_grid_is_250_by_250_points_over_the_widened_box():
    """62,500 points, as the docs say, whatever the data's spread (a step h
    gave 5,900 to 8,100 on the demo's data)."""
    assert boundary.GRID_SIDE == 250
    for X in (np.array([[0.0, 0.0], [1.0, 1.0]]), np.random.default_rng(2).normal(size=(100, 2)) * 3):
        xx, yy = boundary.grid(X)
        assert xx.shape == yy.shape == (250, 250) and xx.size == 62_500
        assert (xx.min(), xx.max()) == (X[:, 0].min() - 1.0, X[:, 0].max() + 1.0)
        assert (yy.min(), yy.max()) == (X[:, 1].min() - 1.0, X[:, 1].max() + 1.0)
    xx, _ = boundary.grid(np.zeros((1, 2)), n=7, margin=0.5)
    assert xx.shape == (7, 7) and xx[0].tolist() == np.linspace(-0.5, 0.5, 7).tolist()


def test_the_h_step_grid_is_kept_for_those_who_ask_for_it():
    xx, yy = boundary.grid(np.array([[0.0, 0.0], [1.0, 1.0]]), h=0.5)
    assert xx.shape == (6, 6)


@pytest.mark.parametrize("nouts", [[8, 1], [8, 3]])
def test_margins_are_positive_exactly_where_the_class_is_predicted(nouts):
    """The plot contours these continuous margins at 0 (a smooth boundary,
    between grid points) instead of the class labels (steps along cells)."""
    random.seed(7)
    model = nn.MLP(2, nouts)
    points = np.random.default_rng(3).normal(size=(500, 2)) * 2
    margins = boundary._margins(boundary._scores(model, points))
    classes = boundary.predict_classes(model, points)
    assert margins.shape == (max(2, nouts[-1]), 500)
    assert np.array_equal(np.argmax(margins, axis=0), classes)
    assert np.array_equal(margins[classes, np.arange(500)] > 0, np.ones(500, bool))
    assert np.all((margins > 0).sum(axis=0) == 1)


def _drawn(monkeypatch):
    """The figures a plot closes, kept open for the test to read."""
    plt = pytest.importorskip("matplotlib.pyplot")
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    return figures


@pytest.mark.parametrize("task", ["moons", "spiral"])
def test_the_plot_shares_colours_and_has_a_legend_labels_and_a_telling_title(task, tmp_path,
                                                                            monkeypatch):
    figures = _drawn(monkeypatch)
    import matplotlib
    from matplotlib.contour import ContourSet
    from matplotlib.collections import PathCollection
    from pygrad import demo
    result = demo.train(task, 100 if task == "moons" else 200)
    path = boundary.plot_decision_boundary(result["model"], result["X"], result["y"],
                                           str(tmp_path / "b.png"), task)
    assert path == str(tmp_path / "b.png") and (tmp_path / "b.png").stat().st_size > 0
    (ax,) = figures[-1].axes
    k, arch = (2, "MLP(2, [16, 16, 1])") if task == "moons" else (3, "MLP(2, [16, 16, 3])")
    assert ax.get_title() == (f"{task}: {arch}, accuracy {result['accuracy'][-1]:.1%} "
                              f"on the points shown")
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("x[0]", "x[1]")
    names = ["class -1", "class +1"] if task == "moons" else ["class 0", "class 1", "class 2"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == names
    points = {c.get_label(): tuple(c.get_facecolor()[0][:3]) for c in ax.collections
              if isinstance(c, PathCollection) and c.get_label().startswith("class")}
    assert list(points) == names and len(set(points.values())) == k
    if tuple(int(x) for x in matplotlib.__version__.split(".")[:2]) >= (3, 8):
        regions = [tuple(c.get_facecolor()[0][:3]) for c in ax.collections
                   if isinstance(c, ContourSet) and c.filled]
        assert regions == list(points.values())        # region c in point class c's colour


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


def test_a_model_of_plain_numbers_gets_its_classes():
    # (a model that returns floats, not Values: each point's own call)
    def model(x):
        a, b = (v.data if hasattr(v, "data") else v for v in x)
        return [a - b, b - a]
    got = boundary.predict_classes(model, [[1.0, 0.0], [0.0, 1.0], [2.0, 3.0]])
    assert got.tolist() == [0, 1, 1]
