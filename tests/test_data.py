"""pygrad.data: toy datasets (shapes, determinism, geometry, validation)."""
import numpy as np
import pytest

from pygrad import Value
from pygrad import reference
from pygrad.data import make_moons, make_spiral, make_xor, signed_labels, to_values

from helpers import bits

GENERATORS = [
    (make_moons, {"n_samples": 101, "noise": 0.1}, 101, 2),
    (make_spiral, {"n_per_class": 40, "n_classes": 4, "noise": 0.2}, 160, 4),
    (make_xor, {"n_samples": 40, "noise": 0.1}, 40, 2),
]


@pytest.mark.parametrize("make, kwargs, n, k", GENERATORS)
def test_shapes_and_dtypes(make, kwargs, n, k):
    X, y = make(**kwargs)
    assert X.shape == (n, 2) and X.dtype == np.float64
    assert y.shape == (n,) and y.dtype == np.int64
    assert set(np.unique(y).tolist()) == set(range(k))
    assert np.isfinite(X).all()


@pytest.mark.parametrize("make, kwargs, n, k", GENERATORS)
def test_same_seed_same_data_other_seed_other_data(make, kwargs, n, k):
    X1, y1 = make(**kwargs, seed=7)
    X2, y2 = make(**kwargs, seed=7)
    np.testing.assert_array_equal(X1, X2)
    np.testing.assert_array_equal(y1, y2)
    X3, _ = make(**kwargs, seed=8)
    assert not np.array_equal(X1, X3)


@pytest.mark.parametrize("make, kwargs, n, k", GENERATORS)
def test_generators_leave_the_global_numpy_rng_alone(make, kwargs, n, k):
    np.random.seed(123)
    expected = np.random.random()
    np.random.seed(123)
    make(**kwargs)
    assert np.random.random() == expected


def test_labels_balanced():
    assert np.bincount(make_moons(100)[1]).tolist() == [50, 50]
    assert np.bincount(make_moons(101)[1]).tolist() == [50, 51]  # as sklearn: n_in gets the odd one
    assert np.bincount(make_spiral(30, 5)[1]).tolist() == [30] * 5
    assert np.bincount(make_xor(8)[1]).tolist() == [4, 4]


def test_moons_without_noise_is_exactly_the_sklearn_formula():
    n = 51
    X, y = make_moons(n, noise=0.0, seed=3)
    n_out, n_in = n // 2, n - n // 2
    t_out, t_in = np.linspace(0, np.pi, n_out), np.linspace(0, np.pi, n_in)
    outer = np.column_stack([np.cos(t_out), np.sin(t_out)])
    inner = np.column_stack([1 - np.cos(t_in), 1 - np.sin(t_in) - 0.5])

    def rows_sorted(a):
        return a[np.lexsort(a.T[::-1])]

    np.testing.assert_array_equal(rows_sorted(X[y == 0]), rows_sorted(outer))
    np.testing.assert_array_equal(rows_sorted(X[y == 1]), rows_sorted(inner))
    assert not np.array_equal(X[:n_out], outer)  # the rows are shuffled


def test_moons_noise_is_added_to_the_same_shuffled_points():
    X0, y0 = make_moons(200, noise=0.0, seed=5)
    X1, y1 = make_moons(200, noise=0.05, seed=5)
    np.testing.assert_array_equal(y0, y1)
    d = X1 - X0
    assert 0.03 < d.std() < 0.07 and abs(d.mean()) < 0.02


def test_spiral_radius_and_classes_in_order():
    X, y = make_spiral(50, 3, noise=0.0)
    r = np.hypot(X[:, 0], X[:, 1])
    for j in range(3):
        np.testing.assert_allclose(r[y == j], np.linspace(0, 1, 50), atol=1e-12)
    assert y.tolist() == sorted(y.tolist())


def test_xor_corners():
    X, y = make_xor()
    assert X.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert y.tolist() == [0, 1, 1, 0]
    X, y = make_xor(12, noise=0.0)
    np.testing.assert_array_equal(X, np.tile(X[:4], (3, 1)))
    np.testing.assert_array_equal(y, (X[:, 0] != X[:, 1]).astype(np.int64))
    Xn, yn = make_xor(400, noise=0.1, seed=1)
    np.testing.assert_array_equal(yn, np.tile([0, 1, 1, 0], 100))
    assert np.abs(Xn - np.tile(X[:4], (100, 1))).max() < 0.6


def test_empty_datasets_are_refused():
    with pytest.raises(ValueError, match="n_samples must be >= 1, got 0"):
        make_moons(0)
    with pytest.raises(ValueError, match="n_per_class must be >= 1, got 0"):
        make_spiral(0)
    assert make_moons(1)[0].shape == (1, 2)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: make_moons(10.0), TypeError, "n_samples must be an int"),
    (lambda: make_moons("10"), TypeError, "n_samples must be an int"),
    (lambda: make_moons(True), TypeError, "n_samples must be an int"),
    (lambda: make_moons(-1), ValueError, "n_samples must be >= 1"),
    (lambda: make_moons(10, noise=-0.1), ValueError, "noise must be a finite number >= 0"),
    (lambda: make_moons(10, noise=float("nan")), ValueError, "noise must be"),
    (lambda: make_moons(10, noise="0.1"), TypeError, "noise must be a real number"),
    (lambda: make_spiral(-5), ValueError, "n_per_class must be >= 1"),
    (lambda: make_spiral(5, 1), ValueError, "n_classes must be >= 2"),
    (lambda: make_spiral(5, 2.5), TypeError, "n_classes must be an int"),
    (lambda: make_spiral(5, 3, noise=-1), ValueError, "noise"),
    (lambda: make_xor(3), ValueError, "n_samples must be >= 4"),
    (lambda: make_xor(None), TypeError, "n_samples must be an int"),
    (lambda: to_values([1.0, 2.0]), ValueError, "2-D array"),
    (lambda: to_values(np.zeros((2, 2, 2))), ValueError, "2-D array"),
    (lambda: signed_labels([0, 1, 2]), ValueError, r"labels in \{0, 1\}, found \[2\]"),
])
def test_validation(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_numpy_integer_sizes_are_accepted():
    X, _ = make_moons(np.int64(10))
    assert X.shape == (10, 2)


@pytest.mark.parametrize("V", [Value, reference.Value])
def test_to_values(V):
    X = np.array([[1.5, -2.0], [0.25, 3.0]])
    rows = to_values(X, V) if V is not Value else to_values(X)
    assert [[type(v) for v in row] for row in rows] == [[V, V], [V, V]]
    assert [[v.data for v in row] for row in rows] == X.tolist()
    loss = sum(w * x for w, x in zip(rows[0], rows[1]))
    assert loss.data == 1.5 * 0.25 + -2.0 * 3.0


def test_to_values_accepts_lists_and_empty():
    assert [[v.data for v in row] for row in to_values([[1, 2]])] == [[1.0, 2.0]]
    assert to_values(np.zeros((0, 2))) == []


def test_signed_labels():
    s = signed_labels(np.array([0, 1, 1, 0]))
    assert s.dtype == np.float64 and s.tolist() == [-1.0, 1.0, 1.0, -1.0]
    _, y = make_moons(20)
    np.testing.assert_array_equal(signed_labels(y), 2.0 * y - 1.0)
    assert signed_labels([]).shape == (0,)


def test_to_values_leaves_behave_as_leaves():
    import pickle

    from pygrad import engine
    X = np.array([[0.5, -1.5], [2.0, 0.25], [-0.0, float("inf")]])
    rows = to_values(X)
    a, b = rows[0]
    assert (a._op, a._prev, repr(a)) == ("", set(), repr(Value(0.5)))
    assert bits(rows[2][0].data) == bits(-0.0) and rows[2][1].data == float("inf")
    y = a * b + a
    assert y._prev >= {a} and any(p is a for p in y._prev)      # the user's own objects
    y.backward()
    assert (a.grad, b.grad) == (-1.5 + 1.0, 0.5)
    a.data, a.label, a.note = 3.0, "a", "mine"
    assert (a.data, a.label, a.note) == (3.0, "a", "mine")
    copy = pickle.loads(pickle.dumps(a))
    assert (copy.data, copy.grad, copy.note) == (3.0, a.grad, "mine")
    # kept across many graphs and settling, they keep their numbers
    for _ in range(50):
        t = Value(1.0)
        for _ in range(400):
            t = t * 1.001 + 0.5
    engine.settle()
    assert (a.data, b.data, a.grad, a.note) == (3.0, -1.5, -0.5, "mine")


def test_to_values_larger_than_a_segment():
    X = np.arange(2 * 5000, dtype=np.float64).reshape(5000, 2) / 7.0
    rows = to_values(X)
    assert [[v.data for v in row] for row in rows] == X.tolist()
    s = rows[0][0] + rows[-1][1]
    s.backward()
    assert (rows[0][0].grad, rows[-1][1].grad, s.data) == (1.0, 1.0, X[0, 0] + X[-1, 1])


def test_to_values_of_rows_without_columns():
    assert to_values(np.zeros((3, 0))) == [[], [], []]
