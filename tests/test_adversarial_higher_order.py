"""Adversarial review of higher-order derivatives (pygrad.grad, hvp, hessian,
jvp, gradcheck(order=2)); commits ba52c49 and d82011c.

Every assertion checks a value.  A case that shows a bug is marked
``xfail(strict=True, reason="BUG: ...")`` so that the file passes while the
bug stands and fails (XPASS) once it is fixed."""
import gc
import math
import random
import struct
import sys
import threading

import numpy as np
import pytest

import pygrad
from helpers import run_in_threads, same_double
from interrupts import Interrupter
from pygrad import Value, reference as R
from pygrad._core import lib

ENGINES = [pytest.param(Value, id="c"), pytest.param(R.Value, id="reference")]
# the reference engine's runs of the interrupt test take seconds each: slow
ENGINES_REFERENCE_SLOW = [pytest.param(Value, id="c"),
                          pytest.param(R.Value, id="reference", marks=pytest.mark.slow)]


def F(V):
    """The fused-op namespace of an engine (pygrad's or the reference's)."""
    return pygrad if V is Value else R


def neg_zero(x):
    return x == 0.0 and math.copysign(1.0, x) < 0


def dbits(x):
    return struct.pack("<d", x).hex()


def live_after_gc():
    gc.collect()
    return lib.pg_live_nodes()


def central(h, x, eps=1e-6):
    return (h(x + eps) - h(x - eps)) / (2 * eps)


def derivative(V, f, x, n):
    """d^n f / dx^n at x by create_graph n times."""
    v = V(x)
    y = f(v)
    for _ in range(n):
        (y,) = pygrad.grad(y, [v], create_graph=True)
    return y.data


def expression(V, rng, xs, ops=25, lse=False, fused=True):
    """A random graph over xs with plain and (``fused``) fused ops."""
    ns = F(V)
    pool = list(xs)
    for _ in range(ops):
        a, b, c = rng.choice(pool), rng.choice(pool), rng.choice(pool)
        k = rng.randrange(11)
        if not fused and k in (5, 6, 7):
            k = 1
        if k == 0:
            v = a + b
        elif k == 1:
            v = a * b
        elif k == 2:
            v = a - b
        elif k == 3:
            v = a / (b * b + 1.0)
        elif k == 4:
            v = (a * a + 0.5) ** rng.choice([2, 3, 0.5, -1.0, 1, 0, 2.0, -0.5])
        elif k == 5:
            v = ns.dot([a, b], [c, a], rng.choice([None, b]),
                       rng.choice([None, "tanh", "sigmoid", "relu"]))
        elif k == 6:
            v = ns.sum([a, b, c, a])
        elif k == 7:
            v = ns.logsumexp([a, b, c]) if lse else a * c
        elif k == 8:
            v = (a * a + 0.1).log() - b.abs() + c.relu()
        elif k == 9:
            v = 2.0 ** (a * 0.3) + (a * a + 1) ** (b * 0.3)
        else:
            v = getattr(a * 0.5, rng.choice(["tanh", "sin", "cos", "exp", "sigmoid", "atan",
                                             "asinh", "erf", "__neg__"]))()
        pool.append(v)
    return pool


# -- finite differences ------------------------------------------------------------

@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("k,x", [(2, 1.3), (3, -0.7), (1, 0.4), (0.5, 4.0), (-1, 2.0),
                                 (2.5, 1.7), (-0.5, 0.9), (3.0, 0.0)])
def test_powk_second_derivative_matches_finite_differences(V, k, x):
    d2 = derivative(V, lambda v: v ** k, x, 2)
    expected = k * (k - 1) * x ** (k - 2) if x != 0.0 else 0.0
    assert d2 == pytest.approx(expected, rel=1e-12, abs=1e-12)
    d1 = lambda p: derivative(V, lambda v: v ** k, p, 1)
    if x != 0.0:
        assert d2 == pytest.approx(central(d1, x), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("V", ENGINES)
def test_x_cubed_third_and_fourth_derivatives(V):
    assert derivative(V, lambda v: v ** 3, 0.0, 3) == 6.0
    assert derivative(V, lambda v: v ** 3, -2.0, 3) == 6.0
    assert derivative(V, lambda v: v ** 3, 1.5, 4) == 0.0
    assert derivative(V, lambda v: v ** 2, 3.0, 1) == 6.0
    assert derivative(V, lambda v: v ** 2, 3.0, 2) == 2.0


@pytest.mark.parametrize("V", ENGINES)
def test_x_pow_zero_adds_nothing_even_at_zero(V):
    for x in (0.0, -0.0, 2.0, math.inf):
        assert derivative(V, lambda v: v ** 0, x, 1) == 0.0
        assert derivative(V, lambda v: v ** 0 * v, x, 2) == 0.0
        (g,) = pygrad.grad(V(x) ** 0.0, [V(x)])
        assert g.data == 0.0


@pytest.mark.parametrize("V", ENGINES)
def test_zero_pow_value_follows_pytorch(V):
    # d/da a**b = b a**(b-1); d/db taken as 0 where a == 0 and b >= 0
    expect = {2.0: (0.0, 0.0), 0.5: (math.inf, 0.0), 0.0: (0.0, 0.0),
              -1.0: (-math.inf, -math.inf), 1.0: (1.0, 0.0)}
    for e, (ga, gb) in expect.items():
        a, b = V(0.0), V(e)
        cg = pygrad.grad(a ** b, [a, b], create_graph=True)
        num = pygrad.grad(a ** b, [a, b])
        assert [v.data for v in cg] == [ga, gb] == [v.data for v in num]
    h = pygrad.hessian(lambda p, q: p ** q, [V(0.0), V(2.0)])
    assert h.tolist() == [[2.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("V", ENGINES)
def test_rpow_number_base_second_derivative(V):
    x0 = 0.7
    d2 = derivative(V, lambda v: 2.0 ** v, x0, 2)
    assert d2 == pytest.approx(2.0 ** x0 * math.log(2) ** 2, rel=1e-14)


@pytest.mark.parametrize("V", ENGINES)
def test_mixed_hessian_of_a_composite_matches_finite_differences(V):
    f = lambda a, b, c: (a * b).sin() * c.exp() / (a * a + 1.0) + (b - c) ** 3 + a.tanh() * c
    x = [0.3, -0.8, 0.5]
    h = pygrad.hessian(f, [V(v) for v in x])
    for i in range(3):
        def grad_at(t, i=i):
            xs = list(x)
            xs[i] = t
            vs = [V(v) for v in xs]
            return [g.data for g in pygrad.grad(f(*vs), vs)]
        up, down = grad_at(x[i] + 1e-6), grad_at(x[i] - 1e-6)
        for j in range(3):
            assert h[j][i] == pytest.approx((up[j] - down[j]) / 2e-6, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("V", ENGINES)
def test_hvp_is_hessian_times_v_and_jvp_is_gradient_dot_tangent(V):
    f = lambda a, b: (a * b).tanh() + a ** 3 * b - (b / (a + 2.0)).log1p()
    xs, v = [0.4, 1.1], [0.3, -2.0]
    h = pygrad.hessian(f, [V(x) for x in xs])
    assert pygrad.hvp(f, [V(x) for x in xs], v) == pytest.approx(h @ np.array(v), rel=1e-13)
    vs = [V(x) for x in xs]
    g = [q.data for q in pygrad.grad(f(*vs), vs)]
    y, t = pygrad.jvp(f, [V(x) for x in xs], v)
    assert y == f(*[V(x) for x in xs]).data
    assert t == pytest.approx(g[0] * v[0] + g[1] * v[1], rel=1e-13)
    fd = (f(V(xs[0] + 1e-6 * v[0]), V(xs[1] + 1e-6 * v[1])).data
          - f(V(xs[0] - 1e-6 * v[0]), V(xs[1] - 1e-6 * v[1])).data) / 2e-6
    assert t == pytest.approx(fd, rel=1e-6)


UNARY = {"exp": 0.3, "log": 1.7, "tanh": 0.4, "sin": 0.9, "cos": 0.9, "tan": 0.3, "asin": 0.3,
         "acos": 0.3, "atan": 0.7, "sinh": 0.5, "cosh": 0.5, "asinh": 0.5, "acosh": 1.5,
         "atanh": 0.3, "sqrt": 2.0, "log2": 1.5, "log10": 1.5, "log1p": 0.5, "expm1": 0.5,
         "erf": 0.5, "erfc": 0.5, "abs": -0.5, "relu": 0.5, "sigmoid": 0.3, "__neg__": 0.2}


@pytest.mark.parametrize("name", list(UNARY))
def test_every_unary_op_jvp_grad_and_third_order_agree_across_engines(name):
    x0 = UNARY[name]
    res = []
    for V in (Value, R.Value):
        x = V(x0)
        y = getattr(x * 1.25, name)() * x
        d1, = pygrad.grad(y, [x], create_graph=True)
        d2, = pygrad.grad(d1, [x], create_graph=True)
        d3, = pygrad.grad(d2, [x])
        n1, = pygrad.grad(y, [x])
        j = pygrad.jvp(lambda q: getattr(q * 1.25, name)() * q, [V(x0)], [1.0])
        assert d1.data == n1.data and j[0] == y.data
        assert j[1] == pytest.approx(d1.data, rel=1e-15)
        res.append((d1.data, d2.data, d3.data, j))
    assert res[0] == res[1]
    h = 1e-5
    fd = lambda p: derivative(Value, lambda q: getattr(q * 1.25, name)() * q, p, 1)
    assert res[0][1] == pytest.approx((fd(x0 + h) - fd(x0 - h)) / (2 * h), rel=1e-5, abs=1e-6)


# -- relu / abs at 0 -------------------------------------------------------------------

@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("x", [0.0, -0.0])
def test_relu_and_abs_at_zero_have_derivative_zero(V, x):
    for m in ("relu", "abs"):
        v = V(x)
        (d,) = pygrad.grad(getattr(v, m)(), [v], create_graph=True)
        assert d.data == 0.0
        (d2,) = pygrad.grad(d, [v])
        assert d2.data == 0.0
        assert pygrad.jvp(lambda q: getattr(q, m)(), [V(x)], [1.0])[1] == 0.0
    assert neg_zero(V(-0.0).relu().data)          # micrograd's relu(-0.0) is -0.0
    assert pygrad.hessian(lambda q: q.relu() * q.abs(), [V(x)]).tolist() == [[0.0]]


@pytest.mark.parametrize("V", ENGINES)
def test_relu_and_abs_second_derivative_is_zero_away_from_the_kink(V):
    for x in (-1.5, 0.7):
        assert derivative(V, lambda q: q.relu() * 3.0, x, 2) == 0.0
        assert derivative(V, lambda q: q.abs() * 3.0, x, 2) == 0.0
        assert derivative(V, lambda q: q.abs() * q, x, 2) == (2.0 if x > 0 else -2.0)


# -- bit for bit -------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(8))
def test_engines_and_paths_agree_bit_for_bit_multi_output(seed):
    """Several outputs with seeds, intermediate nodes as inputs, plain ops:
    the gradient graph's numbers, grad()'s numbers and a second order, on
    both engines, bit for bit (data chosen away from -0.0)."""
    results = []
    for V in (Value, R.Value):
        rng = random.Random(seed)
        xs = [V(rng.choice([rng.uniform(-2, 2), 1.0, 0.5])) for _ in range(3)]
        pool = expression(V, rng, xs, fused=False)
        outs = [rng.choice(pool) for _ in range(3)]
        ins = xs + [rng.choice(pool) for _ in range(2)]
        seeds = [rng.choice([1.0, -0.5, 2.0, 3.0]) for _ in outs]
        g = pygrad.grad(outs, ins, grad_outputs=seeds, create_graph=True)
        n = pygrad.grad(outs, ins, grad_outputs=seeds)
        s = g[0] + g[1] * 2.0 + g[2] * 3.0
        h = pygrad.grad(s, xs)
        gd, nd = [v.data for v in g], [v.data for v in n]
        assert all(same_double(a, b) or a == b == 0.0 for a, b in zip(gd, nd))
        results.append([abs(v) if v == 0.0 else v for v in gd + nd + [v.data for v in h]])
    assert all(same_double(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("V", ENGINES)
def test_create_graph_equals_backward_bit_for_bit_on_every_plain_op(V):
    names = ["exp", "tanh", "sin", "cos", "atan", "sinh", "asinh", "sigmoid", "relu", "erf",
             "erfc", "expm1", "abs", "cosh", "tan"]

    def f(x, y):
        z = x * y + x / y - y ** 3 + x ** V(2.0) + 2 ** x
        for n in names:
            z = z + getattr(z * 0.01, n)()
        return z + (x * x).log2() + (y * y + 1).sqrt() + x ** 0.5 + x ** -1 + (x ** 2).log10()

    x, y = V(1.3), V(0.4)
    out = f(x, y)
    g = pygrad.grad(out, [x, y], create_graph=True)
    n = pygrad.grad(out, [x, y])
    out.backward()
    assert [d.data for d in g] == [d.data for d in n] == [x.grad, y.grad]


@pytest.mark.parametrize("V", ENGINES)
def test_create_graph_negative_zero_matches_backward(V):
    x, z = V(0.0), V(-0.0)
    y = x * z
    (g,) = pygrad.grad(y, [x], create_graph=True)
    (n,) = pygrad.grad(y, [x])
    y.backward()
    assert dbits(g.data) == dbits(n.data) == dbits(x.grad)


@pytest.mark.parametrize("V", ENGINES)
def test_create_graph_negative_zero_seed_on_an_output_that_is_an_input(V):
    x = V(3.0)
    (g,) = pygrad.grad(x, [x], grad_outputs=[-0.0], create_graph=True)
    (n,) = pygrad.grad(x, [x], grad_outputs=[-0.0])
    assert dbits(g.data) == dbits(n.data)


@pytest.mark.xfail(strict=True, reason="BUG (minor): 2nd derivatives through logsumexp differ "
                   "between engines in the last bits: the C engine differentiates its fused "
                   "node's rebuilt graph, reference.logsumexp is the plain graph, and the "
                   "second sweep adds in another order; docs promise engines agree bit for bit")
def test_logsumexp_second_derivative_engines_bit_for_bit():
    rng = random.Random(0)
    mismatches = 0
    for _ in range(40):
        pts = [rng.uniform(-2, 2) for _ in range(3)]
        res = []
        for V in (Value, R.Value):
            xs = [V(p) for p in pts]
            y = F(V).logsumexp([xs[0], xs[1], xs[2] * xs[0]])
            g = pygrad.grad(y, xs, create_graph=True)
            res.append([v.data for v in pygrad.grad(g[0] + g[1] * 2.0 + g[2] * 3.0, xs)])
        mismatches += res[0] != res[1]
    assert mismatches == 0


@pytest.mark.xfail(strict=True, reason="BUG (pre-existing, fused ops): when one Value reaches a "
                   "fused node (pygrad.sum/dot/logsumexp) through several children, the fused "
                   "rule adds every child's part before the children's subgraphs run, the plain "
                   "graph interleaves them: backward(), grad() and create_graph differ from the "
                   "plain graph / reference engine in the last bit (csrc/ops.c fused rules; "
                   "docs: 'fused and op-by-op models agree bit for bit')")
@pytest.mark.parametrize("kind", ["sum", "dot", "logsumexp"])
def test_fused_op_over_shared_subgraphs_equals_plain_graph_bit_for_bit(kind):
    make = {"sum": lambda ns, x, w: ns.sum([x, x.exp(), x.sin(), x]),
            "dot": lambda ns, x, w: ns.dot([w, w * 1.5, w], [x, x.sin(), x.exp()]),
            "logsumexp": lambda ns, x, w: ns.logsumexp([x, x.sin(), x * w, x])}[kind]
    r = []
    for V in (Value, R.Value):
        x, w = V(1.0550984759064561), V(-0.9797238970423132)
        y = make(F(V), x, w)
        y.backward()
        r.append((x.grad, w.grad))
    assert r[0] == r[1]


@pytest.mark.parametrize("V", ENGINES)
def test_function_create_graph_equals_backward_bit_for_bit(V):
    class GradFirst(pygrad.Function):
        differentiable = True

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_values
            return (grad * x * x * 3.0,)

    x = V(0.7808582937711817)
    y = GradFirst.apply(x) * 2.181296237217373
    (d,) = pygrad.grad(y, [x], create_graph=True)
    (n,) = pygrad.grad(y, [x])
    y.backward()
    assert d.data == n.data == x.grad


# -- hessian -----------------------------------------------------------------------------

@pytest.mark.parametrize("V", ENGINES)
def test_hessian_is_exactly_symmetric(V):
    rng = random.Random(5)
    f = lambda *v: expression(V, random.Random(5), list(v), ops=30)[-1]
    h = pygrad.hessian(f, [V(rng.uniform(-1, 1)) for _ in range(4)])
    assert all(dbits(h[i][j]) == dbits(h[j][i]) for i in range(4) for j in range(4))
    assert h.dtype == np.float64 and h.shape == (4, 4)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("V", ENGINES)
def test_hessian_of_large_but_finite_entries_does_not_overflow(V):
    h = pygrad.hessian(lambda x, y: x * y * 1e308, [V(1.0), V(1.0)])
    assert h.tolist() == [[0.0, 1e308], [1e308, 0.0]]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_hessian_large_diagonal_does_not_overflow():
    h = pygrad.hessian(lambda x: x * x * 0.5e308, [1.0])
    assert h.tolist() == [[1e308]]


def test_hessian_of_an_identity_a_constant_and_an_unused_input():
    assert pygrad.hessian(lambda a, b: a, [1.0, 2.0]).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert pygrad.hessian(lambda a: Value(3.0), [1.0]).tolist() == [[0.0]]
    assert pygrad.hessian(lambda a, b: a * a * a, [2.0, 5.0]).tolist() == [[12.0, 0.0], [0.0, 0.0]]
    assert pygrad.hessian(lambda a: a * a * a, 2.0).tolist() == [[12.0]]


@pytest.mark.parametrize("V", ENGINES)
def test_hessian_with_nan_and_inf_data_is_symmetric_and_matches_per_entry_sweeps(V):
    for pts in ([math.nan, 1.0], [math.inf, 2.0], [-math.inf, -0.5]):
        f = lambda a, b: a * b * b + (a * 0.0 + b).tanh()
        h = pygrad.hessian(f, [V(p) for p in pts])
        assert same_double(h[0][1], h[1][0])
        xs = [V(p) for p in pts]
        g = pygrad.grad(f(*xs), xs, create_graph=True)
        row1 = [v.data for v in pygrad.grad(g[1], xs)]
        assert same_double(h[1][1], row1[1])


# -- fused ops ----------------------------------------------------------------------------

@pytest.mark.parametrize("act", [None, "linear", "relu", "tanh", "sigmoid"])
@pytest.mark.parametrize("bias", [None, 0.3])
def test_dot_hessian_equals_the_plain_graph_bit_for_bit(act, bias):
    vals = [0.5, -0.2, 0.9, 0.1, 0.4, -0.3]
    act_r = None if act == "linear" else act
    hc = pygrad.hessian(lambda *v: pygrad.dot(v[:3], v[3:], bias, act) * v[0] + v[4],
                        [Value(v) for v in vals])
    hr = pygrad.hessian(lambda *v: R.dot(v[:3], v[3:], bias, act_r) * v[0] + v[4],
                        [R.Value(v) for v in vals])
    assert np.array_equal(hc, hr)


@pytest.mark.parametrize("V", ENGINES)
def test_fused_ops_with_repeated_children(V):
    ns = F(V)
    for f in (lambda x, y: ns.dot([x, x, y], [x, y, x]) * y,
              lambda x, y: ns.sum([x, x, y, x]) * y,
              lambda x, y: ns.dot([], [], x, "tanh") * y,
              lambda x, y: ns.logsumexp([x, x, y]) * y,
              lambda x, y: ns.sum([x * y])):
        x, y = V(0.3), V(-0.8)
        z = f(x, y)
        g = pygrad.grad(z, [x, y], create_graph=True)
        n = pygrad.grad(z, [x, y])
        z.backward()
        assert [v.data for v in g] == [v.data for v in n] == [x.grad, y.grad]
        h = pygrad.hessian(f, [V(0.3), V(-0.8)])

        def grads(p, q):
            vs = [V(p), V(q)]
            return [v.data for v in pygrad.grad(f(*vs), vs)]
        up, down = grads(0.3 + 1e-6, -0.8), grads(0.3 - 1e-6, -0.8)
        assert h[0] == pytest.approx([(u - d) / 2e-6 for u, d in zip(up, down)],
                                     rel=1e-6, abs=1e-6)


def test_fused_dot_duplicate_children_hessian_values():
    # d(x*x + x*y + y*x)*y: f = x^2 y + 2 x y^2
    h = pygrad.hessian(lambda x, y: pygrad.dot([x, x, y], [x, y, x]) * y, [0.3, -0.8])
    x, y = 0.3, -0.8
    assert np.allclose(h, [[2 * y, 2 * x + 4 * y], [2 * x + 4 * y, 4 * x]], rtol=1e-14, atol=0)


@pytest.mark.parametrize("V", ENGINES)
def test_logsumexp_second_derivative_matches_finite_differences(V):
    ns = F(V)
    xs0 = [0.3, -1.2, 2.0]
    f = lambda *v: ns.logsumexp(list(v))
    h = pygrad.hessian(f, [V(x) for x in xs0])
    p = np.exp(np.array(xs0) - np.log(np.sum(np.exp(xs0))))
    assert h == pytest.approx(np.diag(p) - np.outer(p, p), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("pts", [(-math.inf, 1.0), (math.inf, 1.0), (800.0, -900.0),
                                 (-math.inf, -math.inf), (1e3, 2.0)])
def test_logsumexp_with_extreme_inputs_matches_backward(V, pts):
    x, y = V(pts[0]), V(pts[1])
    z = F(V).logsumexp([x, y, x * y])
    g = pygrad.grad(z, [x, y], create_graph=True)
    n = pygrad.grad(z, [x, y])
    z.backward()
    for a, b, c in zip([v.data for v in g], [v.data for v in n], [x.grad, y.grad]):
        assert same_double(a, b) and same_double(b, c)


def test_fused_mlp_hessian_equals_unfused_and_reference():
    state = random.getstate()
    random.seed(0)
    m_f = pygrad.nn.MLP(3, [4, 4, 1])
    m_u = pygrad.nn.MLP(3, [4, 4, 1], fused=False)
    m_r = pygrad.nn.MLP(3, [4, 4, 1], engine="reference")
    random.setstate(state)
    m_u.set_data(m_f.get_data())
    m_r.set_data(m_f.get_data())
    xs = [0.3, -0.7, 1.1]
    f_of = lambda m: (lambda a, b, c: m([a, b, c]) ** 2 + m([a * a, b, c]).tanh())
    hf = pygrad.hessian(f_of(m_f), [Value(x) for x in xs])
    hu = pygrad.hessian(f_of(m_u), [Value(x) for x in xs])
    hr = pygrad.hessian(f_of(m_r), [R.Value(x) for x in xs])
    assert np.array_equal(hu, hr)
    assert np.allclose(hf, hu, rtol=1e-12, atol=1e-15)
    assert np.any(hf != 0.0)


def test_fused_mlp_parameter_gradient_graph_equals_backward():
    state = random.getstate()
    random.seed(1)
    m = pygrad.nn.MLP(2, [3, 1])
    random.setstate(state)
    x = [Value(0.4), Value(-0.9)]
    y = m(x) * m(x)
    params = m.parameters()
    g = pygrad.grad(y, params, create_graph=True)
    n = pygrad.grad(y, params)
    m.zero_grad()
    y.backward()
    assert [v.data for v in g] == [v.data for v in n] == [p.grad for p in params]
    # the gradient graph differentiates once more: d/dp sum(g) against FD
    s = pygrad.sum(g)
    h = [v.data for v in pygrad.grad(s, params)]
    p0 = params[0].data

    def total(t):
        params[0].data = t
        yy = m(x) * m(x)
        out = sum(v.data for v in pygrad.grad(yy, params))
        params[0].data = p0
        return out
    assert h[0] == pytest.approx(central(total, p0), rel=1e-5, abs=1e-8)


# -- grad() leaves every grad -----------------------------------------------------------

@pytest.mark.parametrize("V", ENGINES)
def test_grad_leaves_grad_bits_including_nan_payload_and_negative_zero(V):
    payload = struct.unpack("<d", struct.pack("<Q", 0x7ff8000000000abc))[0]
    a, b = V(1.0), V(2.0)
    y = (a - b) / b
    a.grad, b.grad, y.grad = -0.0, payload, -math.inf
    pygrad.grad(y, [a, b])
    pygrad.grad(y, [a, b], create_graph=True)
    pygrad.hessian(lambda p, q: (p - q) / q, [a, b])
    assert dbits(a.grad) == dbits(-0.0)
    assert dbits(b.grad) == dbits(payload)
    assert y.grad == -math.inf


@pytest.mark.parametrize("V", ENGINES)
def test_grad_between_backwards_keeps_micrograds_hidden_grads(V):
    def run(mid):
        a, b = V(1.5), V(0.7)
        y = (a - b) * (a / b) + (b - a) / (a - b * 0.5)
        y.backward()
        if mid:
            pygrad.grad(y, [a, b])
            pygrad.grad([y, y * 2.0], [b], create_graph=True)
            pygrad.hvp(lambda p, q: p / q - q, [a, b], [1.0, 1.0])
        y.backward()
        y.backward()
        return a.grad, b.grad
    assert run(True) == run(False)


@pytest.mark.parametrize("V", ENGINES)
def test_grad_inside_a_custom_ops_backward_does_not_disturb_the_sweep(V):
    def build(inner):
        a, b = V(1.5), V(0.6)
        s = a - b
        d = s / b
        c = V(d.data * 2, (d,), "dbl")

        def bw():
            if inner:
                pygrad.grad([d, s], [a, b])
                pygrad.grad(d, [a, b], create_graph=True)
            d.grad += 2 * c.grad
        c._backward = bw
        out = c * s + d
        return a, b, out
    res = []
    for inner in (False, True):
        a, b, out = build(inner)
        out.backward()
        out.backward()
        res.append((a.grad, b.grad))
    assert res[0] == res[1]


# -- duplicate / odd inputs and outputs --------------------------------------------------

@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("cg", [False, True])
def test_duplicates_outputs_that_are_inputs_and_unrelated_inputs(V, cg):
    x, w = V(1.5), V(4.0)
    y = x * x
    z = y * 3.0
    r = lambda *a, **k: [v.data for v in pygrad.grad(*a, create_graph=cg, **k)]
    assert r(y, [x, x]) == [3.0, 3.0]
    assert r([y, y], [x], grad_outputs=[1.0, 2.0]) == [9.0]
    assert r([y, x], [x]) == [4.0]
    assert r(x, [x]) == [1.0]
    assert r(y, [w, x]) == [0.0, 3.0]
    assert r(z, [y, x]) == [3.0, 9.0]             # an intermediate node as input
    assert r(y, [z]) == [0.0]                     # an input above the output
    assert r([y, z], [x], grad_outputs=[V(2.0), -1.0]) == [-3.0]
    assert r(y, []) == []


@pytest.mark.parametrize("V", ENGINES)
def test_grad_outputs_value_is_differentiated_too(V):
    x, s = V(2.0), V(3.0)
    (g,) = pygrad.grad(x * x, [x], grad_outputs=[s * s], create_graph=True)
    assert g.data == 36.0
    assert [v.data for v in pygrad.grad(g, [x, s])] == [18.0, 24.0]


@pytest.mark.parametrize("V", ENGINES)
def test_numeric_results_are_new_leaves_and_create_graph_unused_is_zero(V):
    x, w = V(2.0), V(5.0)
    n = pygrad.grad(x * x, [x, w])
    assert [v.data for v in n] == [4.0, 0.0]
    assert all(not v._children and v.grad == 0.0 for v in n)
    (u,) = pygrad.grad(x * x, [w], create_graph=True)
    assert u.data == 0.0 and pygrad.grad(u, [w])[0].data == 0.0


@pytest.mark.parametrize("V", ENGINES)
def test_nan_and_inf_data_match_backward(V):
    for pts in ([math.nan, 1.0], [math.inf, 0.5], [-math.inf, 2.0], [-0.0, 3.0], [0.0, -0.0]):
        a, b = V(pts[0]), V(pts[1])
        y = (a * b).tanh() + (a - b) * (b + 1.0) + a.relu() * b.abs()
        g = pygrad.grad(y, [a, b], create_graph=True)
        n = pygrad.grad(y, [a, b])
        y.backward()
        for p, q, r in zip([v.data for v in g], [v.data for v in n], [a.grad, b.grad]):
            assert (same_double(p, q) or p == q == 0.0) and same_double(q, r)


@pytest.mark.parametrize("V", ENGINES)
def test_inputs_given_as_any_iterable(V):
    x = V(2.0)
    y = x * x
    assert [v.data for v in pygrad.grad(y, (v for v in [x]))] == [4.0]
    assert [v.data for v in pygrad.grad(y, x)] == [4.0]
    assert [v.data for v in pygrad.grad(y, np.array([x], dtype=object))] == [4.0]
    assert [v.data for v in pygrad.grad([y], [x], grad_outputs=3.0)] == [12.0]


# -- custom ops, Functions, local grads ---------------------------------------------------

@pytest.mark.parametrize("V", ENGINES)
def test_custom_python_backward_is_refused_by_every_call(V):
    x = V(0.3)
    a = x.tanh()
    c = V(a.data * 2, (a,), "dbl")

    def bw():
        a.grad += 2 * c.grad
    c._backward = bw
    y = (c * x).exp()
    for call in (lambda: pygrad.grad(y, [x]), lambda: pygrad.grad(y, [x], create_graph=True),
                 lambda: pygrad.grad([x * 2.0, y], [x]),
                 lambda: pygrad.hessian(lambda q: y * q, [V(1.0)]),
                 lambda: pygrad.hvp(lambda q: y * q, [V(1.0)], [1.0])):
        with pytest.raises(TypeError, match="dbl"):
            call()

    def jvp_f(q):
        out = V(q.data * 2, (q,), "twice")
        out._backward = bw
        return out
    with pytest.raises(TypeError, match="twice"):
        pygrad.jvp(jvp_f, [V(1.0)], [1.0])
    y.backward()                                  # backward() still runs it
    assert x.grad == pytest.approx(math.exp(c.data * x.data) * (c.data + x.data * 2
                                   * (1 - math.tanh(0.3) ** 2)))


def test_reference_op_with_replaced_backward_is_refused():
    a, b = R.Value(2.0), R.Value(3.0)
    out = a * b

    def bw():
        a.grad += 100.0 * out.grad
    out._backward = bw
    with pytest.raises(TypeError, match="custom op"):
        pygrad.grad(out, [a, b])


def test_c_op_with_replaced_backward_is_refused():
    a, b = Value(2.0), Value(3.0)
    out = a * b

    def bw():
        a.grad += 100.0 * out.grad
    out._backward = bw
    with pytest.raises(TypeError, match="custom op"):
        pygrad.grad(out, [a, b])
    out.backward()
    assert (a.grad, b.grad) == (100.0, 0.0)


def test_reference_leaf_with_python_backward_is_refused():
    a, b = R.Value(2.0), R.Value(3.0)
    out = a * b

    def bw():
        b.grad += 7.0 * a.grad
    a._backward = bw
    out.backward()
    assert b.grad == 23.0                         # backward() runs the leaf's closure
    with pytest.raises(TypeError):
        pygrad.grad(out, [a, b])


def test_custom_node_without_backward_gives_zero_like_the_reference():
    r = []
    for V in (Value, R.Value):
        x = V(2.0)
        out = V(3.0, (x,), "foo")
        r.append([v.data for v in pygrad.grad(out * x, [x])])
    assert r == [[3.0], [3.0]]


@pytest.mark.parametrize("V", ENGINES)
def test_non_differentiable_function_and_local_grads_refuse_create_graph_only(V):
    class Twice(pygrad.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, grad):
            return (2.0 * grad,)
    x = V(0.5)
    y = Twice.apply(x * x)
    with pytest.raises(TypeError, match="differentiable = True"):
        pygrad.grad(y, [x], create_graph=True)
    assert pygrad.grad(y, [x])[0].data == 2.0
    assert pygrad.jvp(lambda q: Twice.apply(q * q), [V(0.5)], [1.0]) == (0.5, 2.0)
    z = V(1.0, (x,), [4.0])                       # microgpt's Value(data, children, grads)
    with pytest.raises(TypeError, match="local"):
        pygrad.grad(z * x, [x], create_graph=True)
    assert pygrad.grad(z * x, [x])[0].data == 4.0 * 0.5 + 1.0
    with pytest.raises(TypeError):
        pygrad.hessian(lambda q: Twice.apply(q * q), [V(0.5)])


@pytest.mark.parametrize("V", ENGINES)
def test_differentiable_function_third_derivative_and_gradcheck(V):
    from test_higher_order import Cube       # x ** 3, differentiable = True
    assert derivative(V, lambda v: Cube.apply(v), 2.0, 2) == 12.0
    assert derivative(V, lambda v: Cube.apply(v), 2.0, 3) == 6.0
    assert pygrad.jvp(lambda v: Cube.apply(v), [V(2.0)], [0.5]) == (8.0, 6.0)
    assert pygrad.gradcheck(lambda a, b: Cube.apply(a * b), [0.7, 1.3], order=2,
                            value_type=V).ok


@pytest.mark.parametrize("V", ENGINES)
def test_gradcheck_order_two_catches_a_detached_function(V):
    class Detached(pygrad.Function):
        differentiable = True

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_values
            xd = x.data if hasattr(x, "data") else x
            return (3 * xd * xd * g,)
    r = pygrad.gradcheck(lambda a: Detached.apply(a), [1.5], order=2, value_type=V)
    assert not r.ok and r.analytic == [0.0] and r.numeric[0] == pytest.approx(9.0)


def test_gradcheck_order_argument():
    for bad in (3, "2", None, 0):
        with pytest.raises(ValueError, match="order must be 1 or 2"):
            pygrad.gradcheck(lambda a: a * a, [1.0], order=bad)
    r = pygrad.gradcheck(lambda a, b: (a * b).sin(), [1.0, 0.5], order=2)
    assert r.ok and len(r.analytic) == 4 and r.analytic[1] == r.analytic[2]


# -- values that are not plain ------------------------------------------------------------

def test_uninitialised_input_is_refused_with_create_graph():
    x = Value(1.0)
    u = Value.__new__(Value)
    with pytest.raises(TypeError):
        pygrad.grad(x * 2, [u])
    with pytest.raises(TypeError):
        pygrad.grad(x * 2, [u], create_graph=True)


@pytest.mark.parametrize("cg", [False, True])
def test_uninitialised_reference_output_is_a_type_error(cg):
    u = R.Value.__new__(R.Value)
    with pytest.raises(TypeError):
        pygrad.grad(u, [R.Value(1.0)], create_graph=cg)


def test_uninitialised_c_output_is_a_type_error():
    u = Value.__new__(Value)
    for cg in (False, True):
        with pytest.raises(TypeError, match="__init__ never ran|no node"):
            pygrad.grad(u, [Value(1.0)], create_graph=cg)
        with pytest.raises(TypeError, match="__init__ never ran|no node"):
            pygrad.grad([Value(1.0) * 2, u], [Value(1.0)], create_graph=cg)


@pytest.mark.parametrize("V", ENGINES)
def test_subclasses_own_init_slots_getattr(V):
    class GA(V):
        def __getattr__(self, name):
            raise KeyboardInterrupt(name)

    class SL(V):
        __slots__ = ("extra",)

    class OI(V):
        def __init__(self, d, tag="t"):
            super().__init__(d)
            self.tag = tag
    expected = None
    for C in (GA, SL, OI, V):
        a, b = C(0.5), C(1.5)
        y = (a * b).tanh() + a ** 3 - b / a
        g = pygrad.grad(y, [a, b], create_graph=True)
        gg = pygrad.grad(g[0], [a, b])
        n = pygrad.grad(y, [a, b])
        got = ([v.data for v in g], [v.data for v in gg], [v.data for v in n], a.grad, b.grad)
        expected = expected or got
        assert got == expected and got[0] == got[2]


def test_subclass_with_data_equality_create_graph():
    class DV(Value):
        def __eq__(self, o):
            return isinstance(o, Value) and self.data == o.data

        def __hash__(self):
            return hash(self.data)
    a, b = DV(2.0), DV(2.0)
    y = a * b + a
    assert [v.data for v in pygrad.grad(y, [a, b])] == [3.0, 2.0]
    assert [v.data for v in pygrad.grad(y, [a, b], create_graph=True)] == [3.0, 2.0]


def test_unhashable_subclass_create_graph():
    class EV(Value):
        def __eq__(self, o):
            return self.data == getattr(o, "data", o)
    a, b = EV(2.0), EV(3.0)
    y = a * b
    assert [v.data for v in pygrad.grad(y, [a, b])] == [3.0, 2.0]
    assert [v.data for v in pygrad.grad(y, [a, b], create_graph=True)] == [3.0, 2.0]


def test_unhashable_reference_subclass_create_graph_works():
    class EV(R.Value):
        def __eq__(self, o):
            return self.data == getattr(o, "data", o)
    a, b = EV(2.0), EV(3.0)
    assert [v.data for v in pygrad.grad(a * b, [a, b], create_graph=True)] == [3.0, 2.0]


def _traced_loss():
    W = [[Value(0.1 * i + 0.05 * j) for j in range(3)] for i in range(4)]
    params = [w for row in W for w in row]
    kept = {}

    def loss_fn(tokens):
        x = pygrad.embed(W, tokens[0])
        loss = x[0] * x[1] + x[2].tanh()
        kept["loss"] = loss
        try:
            pygrad.grad(loss, params, create_graph=True)
        except ValueError as e:
            kept["inside"] = str(e)
        return loss
    pl = pygrad.per_length(loss_fn, 4)
    value = pl.loss([2])
    return kept, params, value


def test_create_graph_on_a_per_length_trace_is_a_value_error():
    kept, params, value = _traced_loss()
    assert value == pytest.approx(0.2 * 0.25 + math.tanh(0.3))
    assert "traces" in kept["inside"]
    with pytest.raises(ValueError):
        pygrad.grad(kept["loss"], params, create_graph=True)
    with pytest.raises(ValueError):
        pygrad.jvp(lambda a: a * kept["loss"], [1.0], [1.0])


def test_numeric_grad_of_a_traced_value_is_a_value_error():
    kept, params, _ = _traced_loss()
    with pytest.raises(ValueError):
        pygrad.grad(kept["loss"], params)


def test_numeric_grad_inside_a_per_length_trace_is_refused_or_right():
    W = [[Value(0.1 * i + 0.05 * j) for j in range(3)] for i in range(4)]

    def loss_fn(tokens):
        x = pygrad.embed(W, tokens[0])
        loss = x[0] * x[1]
        (g,) = pygrad.grad(loss, [x[0]])          # = x[1]
        return loss + g
    pl = pygrad.per_length(loss_fn, 4)
    try:
        got = [pl.loss([t]) for t in range(4)]
    except ValueError:
        return                                     # refused: the documented behaviour
    assert got == pytest.approx([W[t][0].data * W[t][1].data + W[t][1].data for t in range(4)])


# -- bad input ------------------------------------------------------------------------------

_x = Value(2.0)
_y = _x * _x
_rx = R.Value(2.0)

BAD = {
    "output float": (lambda: pygrad.grad(3.0, [_x]), TypeError),
    "output None": (lambda: pygrad.grad(None, [_x]), TypeError),
    "inputs str": (lambda: pygrad.grad(_y, "ab"), TypeError),
    "input None": (lambda: pygrad.grad(_y, [_x, None]), TypeError),
    "no outputs": (lambda: pygrad.grad([], [_x]), ValueError),
    "mixed engines": (lambda: pygrad.grad(_y, [_rx]), TypeError),
    "mixed seed": (lambda: pygrad.grad(_y, [_x], grad_outputs=[_rx], create_graph=True), TypeError),
    "seed complex": (lambda: pygrad.grad(_y, [_x], grad_outputs=[1j]), TypeError),
    "seed str": (lambda: pygrad.grad(_y, [_x], grad_outputs="1"), TypeError),
    "seed None": (lambda: pygrad.grad(_y, [_x], grad_outputs=[None]), TypeError),
    "seed count": (lambda: pygrad.grad(_y, [_x], grad_outputs=[1, 2]), ValueError),
    "seed huge int": (lambda: pygrad.grad(_y, [_x], grad_outputs=[10 ** 400]), ValueError),
    "hvp f": (lambda: pygrad.hvp(None, [1.0], [1.0]), TypeError),
    "hvp xs str": (lambda: pygrad.hvp(lambda a: a * a, ["1"], [1.0]), TypeError),
    "hvp vs count": (lambda: pygrad.hvp(lambda a, b: a * b, [1.0, 2.0], [1.0]), ValueError),
    "hessian empty": (lambda: pygrad.hessian(lambda: Value(1.0), []), ValueError),
    "hessian returns list": (lambda: pygrad.hessian(lambda a: [a], [1.0]), TypeError),
    "hessian returns float": (lambda: pygrad.hessian(lambda a: 1.0, [1.0]), TypeError),
    "hessian nested xs": (lambda: pygrad.hessian(lambda a, b: a * b, [[1.0, 2.0]]), TypeError),
    "hessian mixed xs": (lambda: pygrad.hessian(lambda a, b: a * b, [Value(1.0), _rx]), TypeError),
    "jvp wrong count": (lambda: pygrad.jvp(lambda a, b: a * b, [1.0, 2.0], [1.0]), ValueError),
    "jvp other engine": (lambda: pygrad.jvp(lambda a: _rx * 2, [1.0], [1.0]), TypeError),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_a_clear_error(name):
    call, exc = BAD[name]
    with pytest.raises(exc):
        call()


@pytest.mark.parametrize("bad", [None, [None], "2", b"1"], ids=["None", "[None]", "str", "bytes"])
def test_hvp_and_jvp_refuse_non_numbers(bad):
    with pytest.raises(TypeError):
        pygrad.hvp(lambda a: a * a * a, [1.0], bad)
    with pytest.raises(TypeError):
        pygrad.jvp(lambda a: a * a * a, [1.0], bad)


# -- threads, interrupts, memory, depth -------------------------------------------------------

def test_threads_numeric_grad_create_graph_and_backward_on_one_graph():
    def graph():
        a, b = Value(1.5), Value(0.6)
        return a, b, ((a - b) / b).tanh() * pygrad.logsumexp([a, b * a])
    a, b, y = graph()
    expected = [v.data for v in pygrad.grad(y, [a, b])]
    bad, count, lock = [], [0], threading.Lock()

    def work():
        for i in range(60):
            if i % 3:
                if [v.data for v in pygrad.grad(y, [a, b])] != expected:
                    bad.append(1)
                if [v.data for v in pygrad.grad(y, [a, b], create_graph=True)] != expected:
                    bad.append(2)
            else:
                y.backward()
                with lock:
                    count[0] += 1
    assert run_in_threads(work, 4) == []
    assert bad == []
    ra, rb, ry = graph()
    for _ in range(count[0]):
        ry.backward()
    assert count[0] == 80 and (a.grad, b.grad) == (ra.grad, rb.grad)


@pytest.mark.parametrize("V", ENGINES_REFERENCE_SLOW)
@pytest.mark.parametrize("which", ["create_graph", "numeric", "hessian", "jvp"])
def test_interrupt_at_chosen_events_leaves_state_unchanged(V, which):
    """A KeyboardInterrupt raised at every 61st traced event of pygrad's code
    (no timing): grads, hidden grads and the live node count are as before."""
    def graph():
        a, b = V(0.7), V(-0.4)
        y = (a - b) / (a * b + 2.0)
        return a, b, F(V).logsumexp([y, a])
    ra, rb, rz = graph()
    rz.backward()
    rz.backward()
    f = lambda p, q: (p - q) / (p * q + 2.0)
    n, fired_any = 1, 0
    while True:
        a, b, z = graph()
        z.backward()
        before = (a.grad, b.grad)
        base = live_after_gc()
        it = Interrupter(n)
        sys.settrace(it)
        try:
            if which == "create_graph":
                pygrad.grad(z, [a, b], create_graph=True)
            elif which == "numeric":
                pygrad.grad(z, [a, b])
            elif which == "hessian":
                pygrad.hessian(f, [a, b])
            else:
                pygrad.jvp(f, [a, b], [1.0, 2.0])
        except KeyboardInterrupt:
            fired_any += 1
        finally:
            sys.settrace(None)
        assert (a.grad, b.grad) == before
        if V is Value:
            assert live_after_gc() == base
        z.backward()
        assert (a.grad, b.grad) == (ra.grad, rb.grad)
        if it.fired is None:
            break
        n += 61
    assert fired_any >= 2


@pytest.mark.parametrize("V", ENGINES)
def test_interrupt_from_a_functions_backward_during_hessian_rows(V):
    calls = []

    class Stop(pygrad.Function):
        differentiable = True

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_values
            calls.append(1)
            if len(calls) == stop_at[0]:
                raise KeyboardInterrupt
            return (2.0 * x * grad,)
    stop_at = [0]
    f = lambda p, q: Stop.apply(p * q) * (p - q)
    h_ok = pygrad.hessian(f, [V(0.5), V(1.5)])
    total = len(calls)
    assert total >= 2
    for k in range(2, total + 1):
        calls.clear()
        stop_at[0] = k
        x = V(0.5)
        x.grad = 7.0
        base = live_after_gc()
        with pytest.raises(KeyboardInterrupt):
            pygrad.hessian(f, [x, V(1.5)])
        assert x.grad == 7.0
        if V is Value:
            assert live_after_gc() == base
    stop_at[0] = 0
    assert np.array_equal(pygrad.hessian(f, [V(0.5), V(1.5)]), h_ok)


def test_interrupt_from_getattr_of_a_grad_outputs_value_changes_nothing():
    class Trap(Value):
        def __getattr__(self, name):
            raise KeyboardInterrupt(name)
    x = Value(0.5)
    y = (x - 1.0) / x
    y.backward()
    before = x.grad
    base = live_after_gc()
    with pytest.raises(KeyboardInterrupt):
        pygrad.grad(y, [x], grad_outputs=Trap(2.0), create_graph=True)
    assert x.grad == before and live_after_gc() == base
    y.backward()
    ref = Value(0.5)
    ry = (ref - 1.0) / ref
    ry.backward()
    ry.backward()
    assert x.grad == ref.grad


def test_no_node_leaks_across_successes_and_errors():
    class ND(pygrad.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return (2 * g,)

    def rounds():
        x = Value(0.3)
        a = x.tanh()
        c = Value(a.data * 2, (a,), "dbl")

        def bw():
            a.grad += 2 * c.grad
        c._backward = bw
        y = (c * x).exp()
        for cg in (True, False):
            with pytest.raises(TypeError):
                pygrad.grad(y, [x], create_graph=cg)
        with pytest.raises(TypeError):
            pygrad.hessian(lambda q: ND.apply(q) * q, [1.0])
        for _ in range(20):
            y = (x.sin() * x - x / (x + 1)) ** 3
            (d,) = pygrad.grad(y, [x], create_graph=True)
            (dd,) = pygrad.grad(d, [x], create_graph=True)
            pygrad.grad([dd, d], [x])
            pygrad.hessian(lambda a, b: (a * b).tanh() * pygrad.logsumexp([a, b]), [0.1, 0.2])
            pygrad.hvp(lambda a, b: pygrad.dot([a, b], [b, a], 0.5, "tanh"), [0.1, 0.2], [1, 2])
            pygrad.jvp(lambda a, b: pygrad.sum([a, b, a * b]), [0.1, 0.2], [1, 2])
    rounds()
    base = live_after_gc()
    rounds()
    assert live_after_gc() == base


def test_deep_chain_of_100k_nodes():
    base = live_after_gc()
    x = Value(0.5)
    y = x
    for _ in range(100_000):
        y = y + x
    (d,) = pygrad.grad(y * y, [x], create_graph=True)       # a 100k-deep gradient graph
    (dd,) = pygrad.grad(d, [x])
    assert d.data == 2 * 100_001 * 100_001 * 0.5 and dd.data == 2 * 100_001 ** 2
    (n,) = pygrad.grad(y, [x])
    assert n.data == 100_001.0
    del x, y, d, dd, n
    assert live_after_gc() == base


def test_deep_reference_chain():
    x = R.Value(0.5)
    y = x
    for _ in range(10_000):
        y = y * 1.0 + x
    (d,) = pygrad.grad(y, [x], create_graph=True)
    assert d.data == 10_001.0 and pygrad.grad(d, [x])[0].data == 0.0


def test_huge_fan_in_and_fan_out():
    xs = [Value(i * 1e-3) for i in range(5000)]
    y = pygrad.sum([v * v for v in xs])
    g = pygrad.grad(y, xs, create_graph=True)
    h = pygrad.grad(pygrad.sum(g), xs)
    assert all(v.data == 2.0 for v in h)
    assert [v.data for v in g[:3]] == [0.0, 2e-3, 4e-3]
    x = Value(0.5)
    z = pygrad.sum([x * (i * 1e-3) for i in range(5000)]) * x
    (d,) = pygrad.grad(z, [x], create_graph=True)
    (dd,) = pygrad.grad(d, [x])
    c = sum(i * 1e-3 for i in range(5000))
    assert d.data == pytest.approx(2 * c * 0.5, rel=1e-12)
    assert dd.data == pytest.approx(2 * c, rel=1e-12)
