"""The forward-over-reverse sweep of pygrad.hvp, hessian and jvp
(csrc/second_order.c; pygrad/_second_order.py over floats).

The C sweep against the sweep over floats (the reference engine) bit for
bit, on graphs with every op; against grad-of-grad (create_graph) and
finite differences within rounding; what it hands back to Python (a
Function, a closure that does nothing, a custom op); and that it writes no
number of any node, under threads, a Ctrl-C at every line, and failed
allocations (tests/test_alloc_failure.py)."""
import math
import random

import numpy as np
import pytest

import pygrad
from helpers import assert_same_doubles, interrupt_at_every_line, run_in_threads
from pygrad import Value, reference as R
from test_higher_order import BINARY, UNARY_POINTS, Cube, random_expression

ENGINES = [pytest.param(Value, id="c"), pytest.param(R.Value, id="reference")]


def engine_of(V):
    return pygrad if V is Value else R


def grad_of_grad_hessian(f, xs, V):
    leaves = [V(x) for x in xs]
    first = pygrad.grad(f(*leaves), leaves, create_graph=True)
    return np.array([[d.data for d in pygrad.grad(g, leaves)] for g in first])


def every_op(V, xs, rng):
    """A graph with every plain op, a fused neuron of each activation (with
    and without a bias), sum and logsumexp."""
    E = engine_of(V)
    y = random_expression(V, rng, xs, ops=30)
    terms = [y]
    for method, points in sorted(UNARY_POINTS.items()):
        x = xs[len(terms) % len(xs)]
        terms.append(getattr(x * 0.0 + points[0], method)() * x * x)
    for f in BINARY.values():
        terms.append(f(xs[0] * 0.25 + 1.2, xs[1] * 0.125 + 0.9))
    for act in (None, "relu", "tanh", "sigmoid"):
        terms.append(E.dot(xs[:2], xs[2:], xs[0] * 0.5, act) * xs[1])
        terms.append(E.dot(xs, list(reversed(xs)), None, act))
    terms.append(E.logsumexp([xs[0], xs[1] * 2.0, xs[2] * xs[3]]) * xs[0])
    terms.append(E.sum([x * x for x in xs]) * xs[2])
    return E.sum(terms)


@pytest.mark.parametrize("seed", range(5))
def test_c_and_the_sweep_over_floats_agree_bit_for_bit(seed):
    results = []
    for V in (Value, R.Value):
        rng = random.Random(seed)
        xs0 = [rng.uniform(-1.0, 1.0) for _ in range(4)]
        v = [rng.uniform(-1.0, 1.0) for _ in range(4)]

        def f(*xs):
            return every_op(V, list(xs), random.Random(seed + 100))
        h = pygrad.hessian(f, [V(x) for x in xs0])
        hv = pygrad.hvp(f, [V(x) for x in xs0], v)
        value, tangent = pygrad.jvp(f, [V(x) for x in xs0], v)
        results.append([*h.ravel().tolist(), *hv.tolist(), value, tangent])
    assert_same_doubles(results[0], results[1], "hessian, hvp, jvp: C vs reference")


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("seed", range(4))
def test_the_sweep_agrees_with_grad_of_grad_and_finite_differences(V, seed):
    rng = random.Random(seed)
    xs0 = [rng.uniform(-1.0, 1.0) for _ in range(4)]

    def f(*xs):
        return every_op(V, list(xs), random.Random(seed + 100))
    h = pygrad.hessian(f, [V(x) for x in xs0])
    g2 = grad_of_grad_hessian(f, xs0, V)
    assert h == pytest.approx(g2 * 0.5 + g2.T * 0.5, rel=1e-11, abs=1e-11)
    eps = 1e-6
    for j in range(4):
        up, down = list(xs0), list(xs0)
        up[j] += eps
        down[j] -= eps
        column = [(a - b) / (2 * eps) for a, b in zip(gradient(f, up, V), gradient(f, down, V))]
        assert h[:, j] == pytest.approx(column, rel=1e-5, abs=1e-5)
    v = [rng.uniform(-1.0, 1.0) for _ in range(4)]
    assert pygrad.hvp(f, [V(x) for x in xs0], v) == pytest.approx(h @ np.array(v), rel=1e-11,
                                                                   abs=1e-11)


def gradient(f, xs, V):
    leaves = [V(x) for x in xs]
    return [d.data for d in pygrad.grad(f(*leaves), leaves)]


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("method", sorted(UNARY_POINTS))
def test_every_unary_ops_hvp_matches_finite_differences(V, method):
    for x in UNARY_POINTS[method]:
        def f(v):
            return getattr(v, method)() * v
        (second,) = pygrad.hvp(f, [x], [1.0])
        eps = 1e-6
        numeric = (gradient(f, [x + eps], V)[0] - gradient(f, [x - eps], V)[0]) / (2 * eps)
        assert second == pytest.approx(numeric, rel=1e-5, abs=1e-6), (method, x)
        assert second == pytest.approx(grad_of_grad_hessian(f, [x], V)[0, 0], rel=1e-13,
                                       abs=1e-14)


@pytest.mark.parametrize("V", ENGINES)
def test_a_constant_s_inf_or_nan_adds_no_tangent(V):
    """Nothing that doesn't depend on the inputs has a tangent: a constant
    log(0) = -inf times a tangent of 0 would otherwise make nan."""
    def f(x):
        c = V(0.0).log()                    # -inf, a constant
        return (x * x + c).exp() + x * x * x
    assert pygrad.hvp(f, [V(0.5)], [1.0]).tolist() == [3.0]
    assert pygrad.hessian(f, [V(0.5)]).tolist() == [[3.0]]
    assert pygrad.jvp(f, [V(0.5)], [2.0]) == (0.125, 1.5)


@pytest.mark.parametrize("V", ENGINES)
def test_the_sweep_writes_no_number(V):
    xs = [V(0.3), V(-0.7)]
    y = (xs[0] * xs[1]).tanh() * xs[0] - xs[1] / (xs[0] + 2.0)
    y.backward()
    before = [(v.data, v.grad) for v in (*xs, y)]
    h = pygrad.hessian(lambda a, b: (a * b).tanh() * a - b / (a + 2.0), xs)
    assert [(v.data, v.grad) for v in (*xs, y)] == before
    assert h.shape == (2, 2)


@pytest.mark.parametrize("V", ENGINES)
def test_inputs_not_below_the_output_and_repeated_ones(V):
    h = pygrad.hessian(lambda a, b, c: a * a * c, [V(1.0), V(2.0), V(3.0)])
    assert h.tolist() == [[6.0, 0.0, 2.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]]
    assert pygrad.hvp(lambda a: V(3.0), [V(1.0)], [1.0]).tolist() == [0.0]
    assert pygrad.jvp(lambda a: V(3.0), [V(1.0)], [1.0]) == (3.0, 0.0)


def test_a_function_below_goes_to_grad_of_grad_with_the_same_numbers():
    def f(x, y):
        return Cube.apply(x * y) + x.tanh() * y
    for V in (Value, R.Value):
        xs = [0.4, -0.3]
        assert (pygrad.hessian(f, [V(x) for x in xs]) == grad_of_grad_hessian(f, xs, V) * 0.5
                + grad_of_grad_hessian(f, xs, V).T * 0.5).all()
    h_c = pygrad.hessian(f, [Value(0.4), Value(-0.3)])
    h_r = pygrad.hessian(f, [R.Value(0.4), R.Value(-0.3)])
    assert (h_c == h_r).all()
    # jvp reads a Function's partials forward, in C's engine and the reference alike
    assert pygrad.jvp(f, [0.4, -0.3], [1.0, 2.0]) == pygrad.jvp(f, [R.Value(0.4), R.Value(-0.3)],
                                                                  [1.0, 2.0])


def test_a_closure_that_does_nothing_runs_the_sweep_over_floats():
    def made_with(V):
        def f(x, y):
            inner = x * y
            node = V(inner.data, (inner,), "custom")
            node._backward = lambda: None           # micrograd's default: adds nothing
            return node * x + (x * y).sin() * y
        return f
    hc = pygrad.hessian(made_with(Value), [Value(0.4), Value(-0.3)])
    hr = pygrad.hessian(made_with(R.Value), [R.Value(0.4), R.Value(-0.3)])
    assert_same_doubles(hc.ravel().tolist(), hr.ravel().tolist())
    g2 = grad_of_grad_hessian(made_with(Value), [0.4, -0.3], Value)
    assert hc == pytest.approx(g2, rel=1e-13)


@pytest.mark.parametrize("V", ENGINES)
def test_a_custom_ops_closure_is_refused_clearly(V):
    def f(x):
        out = V(x.data ** 2, (x,), "sq")

        def _backward():
            x.grad += 2 * x.data * out.grad
        out._backward = _backward
        return out * x
    for call in (lambda: pygrad.hvp(f, [V(0.5)], [1.0]), lambda: pygrad.hessian(f, [V(0.5)]),
                 lambda: pygrad.jvp(f, [V(0.5)], [1.0])):
        with pytest.raises(TypeError, match="custom op 'sq' has a Python _backward"):
            call()


def test_threads_sweeping_one_graph_and_backward_get_the_serial_results():
    rng = random.Random(5)
    xs = [Value(rng.uniform(-1, 1)) for _ in range(4)]
    y = every_op(Value, xs, rng)
    from pygrad.higher_order import _second_order, _view_of
    view = _view_of([y] + xs, "test")
    rows = np.eye(4)
    expected = _second_order(view, y, xs, rows, True)[1].tolist()
    results = []

    def work():
        for _ in range(10):
            results.append(_second_order(view, y, xs, rows, True)[1].tolist())
            y.backward()                # and backward()s between, on the same graph
    assert run_in_threads(work) == []
    assert len(results) == 30 and all(r == expected for r in results)


def test_a_ctrl_c_at_any_line_of_hvp_changes_nothing():
    def f(a, b):
        return (a * b).tanh() * pygrad.logsumexp([a, b]) + pygrad.dot([a, b], [b, a], 0.5, "relu")
    modules = ("pygrad/higher_order.py", "pygrad/_graph_views.py", "pygrad/_second_order.py")
    lines = interrupt_at_every_line(lambda: pygrad.hvp(f, [0.3, 0.6], [1.0, -1.0]).tolist(),
                                    modules)
    assert lines > 10


def test_a_traced_graph_and_an_uninitialised_value_are_refused():
    class Bare(Value):
        def __init__(self):
            pass
    with pytest.raises(TypeError, match="__init__ never ran"):
        pygrad.hvp(lambda a: a * Bare(), [1.0], [1.0])


def test_sweeps_leave_no_node_behind():
    import gc
    from pygrad._core import lib

    def f(a, b):
        return pygrad.dot([a, b], [b, a], 0.5, "tanh") * pygrad.logsumexp([a, b])
    pygrad.hessian(f, [0.3, 0.6])
    gc.collect()
    before = lib.pg_live_nodes()
    for _ in range(200):
        pygrad.hessian(f, [0.3, 0.6])
        pygrad.hvp(f, [0.3, 0.6], [1.0, 2.0])
        pygrad.jvp(f, [0.3, 0.6], [1.0, 2.0])
    gc.collect()
    assert lib.pg_live_nodes() == before
