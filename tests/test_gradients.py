"""Every op's gradient against central finite differences, on both engines;
IEEE special values and gradient conventions at singular points; and, if
PyTorch is installed, gradients against PyTorch float64.
"""
import math
import struct

import pytest

from pygrad import Value as C
from pygrad._ops import METHOD_OPS
from pygrad.reference import Value as R

ENGINES = [pytest.param(C, id="C"), pytest.param(R, id="ref")]

inf, nan = math.inf, math.nan


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def same_double(x: float, y: float) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return bits(x) == bits(y)


def sigmoid_f(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


# ---------------------------------------------------------------------------
# cases: (name, function of Values, the same function on floats, points)
#
# OP_CASES has one entry per op of the op table (csrc/ops.def) that a Value
# method makes, keyed by the op's key; test_every_table_op_has_a_gradient_case
# fails when an op is missing.  The Value function is only built from Value
# operators/methods, so it also runs on torch tensors
# (test_gradients_match_pytorch_float64).  Points stay away from kinks and
# singularities.


def unary(method, f, xs):
    """The case of a unary method: ``v.method()`` against ``f``, at xs."""
    return [(method, lambda a: getattr(a, method)(), f, [(x,) for x in xs])]


OP_CASES = {
    # add / sub / mul / div, Value-Value and with constants on either side
    "add": [
        ("add", lambda a, b: a + b, lambda a, b: a + b, [(1.5, -2.0), (0.0, 3.0), (-0.7, 0.2)]),
        ("add_const", lambda a: a + 3, lambda a: a + 3, [(1.5,), (-2.25,)]),
        ("radd_const", lambda a: 2.5 + a, lambda a: 2.5 + a, [(1.5,), (-2.25,)]),
        ("add_self", lambda a: a + a, lambda a: a + a, [(1.5,), (-0.3,)]),
    ],
    "sub": [
        ("sub", lambda a, b: a - b, lambda a, b: a - b, [(1.5, -2.0), (0.0, 3.0), (-0.7, 0.2)]),
        ("sub_const", lambda a: a - 3, lambda a: a - 3, [(1.5,), (-2.25,)]),
        ("rsub_const", lambda a: 2.5 - a, lambda a: 2.5 - a, [(1.5,), (-2.25,)]),
        ("sub_self", lambda a: a - a, lambda a: a - a, [(1.5,)]),
    ],
    "mul": [
        ("mul", lambda a, b: a * b, lambda a, b: a * b, [(1.5, -2.0), (0.0, 3.0), (-0.7, 0.2)]),
        ("mul_const", lambda a: a * -3, lambda a: a * -3, [(1.5,), (-2.25,)]),
        ("rmul_const", lambda a: 0.5 * a, lambda a: 0.5 * a, [(1.5,), (-2.25,)]),
        ("mul_self", lambda a: a * a, lambda a: a * a, [(1.5,), (-0.3,)]),
    ],
    "div": [
        ("div", lambda a, b: a / b, lambda a, b: a / b, [(1.5, -2.0), (0.0, 3.0), (-0.7, 0.2)]),
        ("div_const", lambda a: a / 4, lambda a: a / 4, [(1.5,), (-2.25,)]),
        ("rdiv_const", lambda a: 4 / a, lambda a: 4 / a, [(1.5,), (-2.25,), (0.1,)]),
        ("div_self", lambda a: a / a, lambda a: a / a, [(1.5,), (-0.3,)]),
    ],
    "neg": [("neg", lambda a: -a, lambda a: -a, [(1.5,), (-2.25,), (0.0,)])],
    # x ** constant
    "powk": [
        ("pow_int2", lambda a: a ** 2, lambda a: a ** 2, [(1.5,), (-2.25,), (0.0,)]),
        ("pow_int3", lambda a: a ** 3, lambda a: a ** 3, [(1.5,), (-2.25,)]),
        ("pow_int_neg1", lambda a: a ** -1, lambda a: a ** -1, [(1.5,), (-2.25,)]),
        ("pow_int_neg2", lambda a: a ** -2, lambda a: a ** -2, [(1.5,), (-2.25,)]),
        ("pow_int0", lambda a: a ** 0, lambda a: a ** 0, [(1.5,), (-2.25,)]),
        ("pow_int1", lambda a: a ** 1, lambda a: a ** 1, [(1.5,), (-2.25,)]),
        ("pow_float_half", lambda a: a ** 0.5, lambda a: a ** 0.5, [(1.5,), (0.01,), (9.0,)]),
        ("pow_float_1_5", lambda a: a ** 1.5, lambda a: a ** 1.5, [(1.5,), (0.3,)]),
        ("pow_float_neg_half", lambda a: a ** -0.5, lambda a: a ** -0.5, [(1.5,), (0.3,)]),
        ("pow_float_2", lambda a: a ** 2.0, lambda a: a ** 2.0, [(1.5,), (-2.25,)]),
        ("pow_float_neg_2_5", lambda a: a ** -2.5, lambda a: a ** -2.5, [(1.5,), (0.7,)]),
    ],
    # x ** y, both Values (positive base), and number ** Value
    "pow": [
        ("pow_value", lambda a, b: a ** b, lambda a, b: a ** b,
         [(1.5, 2.0), (0.5, -1.5), (3.0, 0.25), (2.0, 0.0), (1.0, 3.0)]),
        ("pow_value_self", lambda a: a ** a, lambda a: a ** a, [(1.5,), (0.3,)]),
        ("rpow_2", lambda a: 2 ** a, lambda a: 2 ** a, [(1.5,), (-2.25,), (0.0,)]),
        ("rpow_half", lambda a: 0.5 ** a, lambda a: 0.5 ** a, [(1.5,), (-2.25,)]),
        ("rpow_e", lambda a: math.e ** a, lambda a: math.e ** a, [(1.5,), (-2.25,)]),
    ],
    # unary functions
    "exp": unary("exp", math.exp, [1.5, -2.25, 0.0, 10.0]),
    "log": unary("log", math.log, [1.5, 0.01, 100.0]),
    "tanh": unary("tanh", math.tanh, [0.3, -1.2, 0.0, 3.0]),
    "relu": unary("relu", lambda a: max(0.0, a), [1.5, -2.25, 0.01, -0.01]),
    "sigmoid": unary("sigmoid", sigmoid_f, [0.0, 0.7, -0.7, 5.0, -5.0, 30.0, -30.0]),
    "sin": unary("sin", math.sin, [0.3, -1.2, 0.0, 4.0, 100.0]),
    "cos": unary("cos", math.cos, [0.3, -1.2, 0.0, 4.0, 100.0]),
    "tan": unary("tan", math.tan, [0.3, -1.2, 0.0, 1.5]),
    "asin": unary("asin", math.asin, [0.3, -0.9, 0.0, 0.99]),
    "acos": unary("acos", math.acos, [0.3, -0.9, 0.0, 0.99]),
    "atan": unary("atan", math.atan, [0.3, -1.2, 0.0, 50.0]),
    "sinh": unary("sinh", math.sinh, [0.3, -1.2, 0.0, 10.0]),
    "cosh": unary("cosh", math.cosh, [0.3, -1.2, 0.0, 10.0]),
    "asinh": unary("asinh", math.asinh, [0.3, -1.2, 0.0, 1e3]),
    "acosh": unary("acosh", math.acosh, [1.3, 2.0, 1e3]),
    "atanh": unary("atanh", math.atanh, [0.3, -0.9, 0.0, 0.99]),
    "sqrt": unary("sqrt", math.sqrt, [1.5, 0.01, 100.0]),
    "log2": unary("log2", math.log2, [1.5, 0.01, 100.0]),
    "log10": unary("log10", math.log10, [1.5, 0.01, 100.0]),
    "log1p": unary("log1p", math.log1p, [1.5, 1e-8, -0.5, 0.0, 100.0]),
    "expm1": unary("expm1", math.expm1, [1.5, 1e-8, -2.25, 0.0, 10.0]),
    "erf": unary("erf", math.erf, [0.3, -1.2, 0.0, 3.0]),
    "erfc": unary("erfc", math.erfc, [0.3, -1.2, 0.0, 3.0]),
    "abs": unary("abs", math.fabs, [1.5, -2.25, 0.01, -0.01])
    + [("abs_builtin", lambda a: abs(a), math.fabs, [(1.5,), (-2.25,)])],
}

COMPOSITES = [
    ("neuron", lambda w1, x1, w2, x2, b: (w1 * x1 + w2 * x2 + b).tanh(),
     lambda w1, x1, w2, x2, b: math.tanh(w1 * x1 + w2 * x2 + b),
     [(-3.0, 2.0, 1.0, 0.0, 6.8813735870195432), (0.5, -0.4, 0.3, 1.1, -0.2)]),
    ("poly_over_exp", lambda a, b, c: (a * b + c) ** 2 / (a - c).exp(),
     lambda a, b, c: (a * b + c) ** 2 / math.exp(a - c),
     [(1.5, -2.0, 0.5), (0.3, 0.7, -1.1)]),
    ("mlp_ish", lambda a, b: ((a * b).sigmoid() + (a - b).relu() * (b ** 2 + 1).log()) / (1 + a ** 2),
     lambda a, b: (sigmoid_f(a * b) + max(0.0, a - b) * math.log(b ** 2 + 1)) / (1 + a ** 2),
     [(1.5, -0.5), (-0.3, 0.9)]),
    ("shared_subexpr", lambda a: ((a * a).exp() * (a * a)).tanh() + (a * a) ** 0.5,
     lambda a: math.tanh(math.exp(a * a) * (a * a)) + (a * a) ** 0.5,
     [(0.4,), (-0.9,)]),
    ("elementary_mix", lambda a, b: (a.sin() * b.cos() + (a * b).abs().sqrt()).log1p()
     + (a / 4).asin().erf() - b.atan().sinh().expm1(),
     lambda a, b: math.log1p(math.sin(a) * math.cos(b) + math.sqrt(abs(a * b)))
     + math.erf(math.asin(a / 4)) - math.expm1(math.sinh(math.atan(b))),
     [(0.7, -1.3), (-2.1, 0.4)]),
]

CASES = [case for cases in OP_CASES.values() for case in cases] + COMPOSITES


def test_every_table_op_has_a_gradient_case():
    assert sorted(OP_CASES) == sorted(op.key for op in METHOD_OPS)


def finite_difference(f, xs, i):
    h = 1e-6 * max(1.0, abs(xs[i]))
    up = list(xs)
    dn = list(xs)
    up[i] += h
    dn[i] -= h
    return (f(*up) - f(*dn)) / (up[i] - dn[i])


def case_params():
    for name, fv, ff, points in CASES:
        for p in points:
            yield pytest.param(fv, ff, p, id=f"{name}-{','.join(map(repr, p))}")


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("fv, ff, point", list(case_params()))
def test_forward_matches_math_and_gradient_matches_finite_difference(V, fv, ff, point):
    leaves = [V(x) for x in point]
    out = fv(*leaves)
    out.backward()
    assert out.data == pytest.approx(ff(*point), rel=1e-12, abs=1e-12)
    assert out.grad == 1.0
    for i, leaf in enumerate(leaves):
        # finite difference of the engine's own forward...
        fd = finite_difference(lambda *xs: fv(*map(V, xs)).data, point, i)
        assert leaf.grad == pytest.approx(fd, rel=1e-5, abs=1e-6), f"input {i}"
        # ...and of the plain-float function
        fd_math = finite_difference(ff, point, i)
        assert leaf.grad == pytest.approx(fd_math, rel=1e-5, abs=1e-6), f"input {i}"


@pytest.mark.parametrize("fv, ff, point", list(case_params()))
def test_gradient_identical_between_engines_on_each_case(fv, ff, point):
    results = []
    for V in (C, R):
        leaves = [V(x) for x in point]
        out = fv(*leaves)
        out.backward()
        results.append((out.data, [leaf.grad for leaf in leaves]))
    (cd, cg), (rd, rg) = results
    assert same_double(cd, rd)
    assert all(same_double(x, y) for x, y in zip(cg, rg)), (cg, rg)


@pytest.mark.parametrize("V", ENGINES)
def test_known_micrograd_values_more_ops(V):
    # micrograd's test_more_ops, whose expected numbers come from PyTorch.
    a = V(-4.0)
    b = V(2.0)
    c = a + b
    d = a * b + b ** 3
    c += c + 1
    c += 1 + c + (-a)
    d += d * 2 + (b + a).relu()
    d += 3 * d + (b - a).relu()
    e = c - d
    f = e ** 2
    g = f / 2.0
    g += 10.0 / f
    g.backward()
    assert abs(g.data - 24.70408163265306) < 1e-6
    assert abs(a.grad - 138.83381924198252) < 1e-6
    assert abs(b.grad - 645.5772594752186) < 1e-6


@pytest.mark.parametrize("V", ENGINES)
def test_known_micrograd_values_sanity_check(V):
    # micrograd's test_sanity_check: y = h + q + q*x at x = -4
    # z = 2x + 2 + x = -10, q = relu(z) + z*x = 40, h = relu(z*z) = 100
    # y = 100 + 40 - 160 = -20;  dy/dx = 2z*3 + (1 + x)(z + 3x) + q
    #       = -60 + (-3)(-22) + 40 = 46
    x = V(-4.0)
    z = 2 * x + 2 + x
    q = z.relu() + z * x
    h = (z * z).relu()
    y = h + q + q * x
    y.backward()
    assert y.data == -20.0
    assert x.grad == 46.0


# ---------------------------------------------------------------------------
# sigmoid at large |x|: no overflow


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("x, expected", [(800.0, 1.0), (-800.0, 0.0), (1e308, 1.0),
                                         (-1e308, 0.0), (inf, 1.0), (-inf, 0.0)])
def test_sigmoid_saturates_exactly_without_overflow(V, x, expected):
    a = V(x)
    s = a.sigmoid()
    s.backward()
    assert s.data == expected
    assert math.isfinite(a.grad)
    assert a.grad == 0.0


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("x", [30.0, -30.0, 40.0, -40.0, 700.0, -700.0, -745.0])
def test_sigmoid_large_inputs_finite_and_correct(V, x):
    a = V(x)
    s = a.sigmoid()
    s.backward()
    assert s.data == pytest.approx(sigmoid_f(x), rel=1e-15, abs=0)
    assert math.isfinite(a.grad) and a.grad >= 0.0
    sv = sigmoid_f(x)
    assert a.grad == pytest.approx(sv * (1 - sv), rel=1e-12, abs=1e-300)


# ---------------------------------------------------------------------------
# IEEE special values (C semantics, not Python's exceptions), on both engines

# Keyed by op (every op of the table: test_every_table_op_has_ieee_and_nan_cases).
IEEE_OP_CASES = {
    "log": [("log(0) = -inf", lambda V: V(0.0).log(), -inf),
            ("log(-0.0) = -inf", lambda V: V(-0.0).log(), -inf),
            ("log(-1) = nan", lambda V: V(-1.0).log(), nan)],
    "div": [("1/0 = inf", lambda V: V(1.0) / 0.0, inf),
            ("-1/0 = -inf", lambda V: V(-1.0) / 0.0, -inf),
            ("0/0 = nan", lambda V: V(0.0) / 0.0, nan),
            ("1/Value(-0.0) = -inf", lambda V: V(1.0) / V(-0.0), -inf),
            ("1/int 0 = inf", lambda V: V(1.0) / 0, inf),
            ("rdiv 1/Value(0) = inf", lambda V: 1 / V(0.0), inf)],
    "exp": [("exp(1000) = inf", lambda V: V(1000.0).exp(), inf),
            ("exp(-1000) = 0", lambda V: V(-1000.0).exp(), 0.0)],
    "powk": [("0**-1 = inf", lambda V: V(0.0) ** -1, inf),
             ("-0.0**-1 = -inf", lambda V: V(-0.0) ** -1, -inf),
             ("0**-0.5 = inf", lambda V: V(0.0) ** -0.5, inf),
             ("(-8)**0.5 = nan", lambda V: V(-8.0) ** 0.5, nan),
             ("10**400 = inf", lambda V: V(10.0) ** 400, inf),
             ("(-10)**401 = -inf", lambda V: V(-10.0) ** 401, -inf),
             ("0**0 = 1", lambda V: V(0.0) ** 0, 1.0),
             ("nan**0 = 1 (C99 pow)", lambda V: V(nan) ** 0, 1.0)],
    "pow": [("Value(-8)**Value(1/3) = nan", lambda V: V(-8.0) ** V(1.0 / 3.0), nan),
            ("1**Value(nan) = 1 (C99 pow)", lambda V: 1 ** V(nan), 1.0)],
    "tanh": [("tanh(inf) = 1", lambda V: V(inf).tanh(), 1.0)],
    "sub": [("inf - inf = nan", lambda V: V(inf) - V(inf), nan)],
    "add": [("inf + -inf = nan", lambda V: V(inf) + V(-inf), nan)],
    "mul": [("0 * inf = nan", lambda V: V(0.0) * inf, nan)],
    "neg": [("-(0.0) = -0.0", lambda V: -V(0.0), -0.0)],
    "sigmoid": [("sigmoid(-inf) = 0", lambda V: V(-inf).sigmoid(), 0.0)],
    "relu": [("relu(-0.0) = -0.0", lambda V: V(-0.0).relu(), -0.0),
             ("relu(-inf) = 0", lambda V: V(-inf).relu(), 0.0),
             ("relu(nan) = nan", lambda V: V(nan).relu(), nan)],
    "sin": [("sin(inf) = nan", lambda V: V(inf).sin(), nan),
            ("sin(-0.0) = -0.0", lambda V: V(-0.0).sin(), -0.0)],
    "cos": [("cos(-inf) = nan", lambda V: V(-inf).cos(), nan)],
    "tan": [("tan(inf) = nan", lambda V: V(inf).tan(), nan)],
    "asin": [("asin(1.5) = nan", lambda V: V(1.5).asin(), nan),
             ("asin(-inf) = nan", lambda V: V(-inf).asin(), nan)],
    "acos": [("acos(-1.5) = nan", lambda V: V(-1.5).acos(), nan),
             ("acos(1) = 0", lambda V: V(1.0).acos(), 0.0)],
    "atan": [("atan(inf) = pi/2", lambda V: V(inf).atan(), math.pi / 2)],
    "sinh": [("sinh(1000) = inf", lambda V: V(1000.0).sinh(), inf),
             ("sinh(-1000) = -inf", lambda V: V(-1000.0).sinh(), -inf)],
    "cosh": [("cosh(-1000) = inf", lambda V: V(-1000.0).cosh(), inf)],
    "asinh": [("asinh(-inf) = -inf", lambda V: V(-inf).asinh(), -inf)],
    "acosh": [("acosh(0.5) = nan", lambda V: V(0.5).acosh(), nan),
              ("acosh(1) = 0", lambda V: V(1.0).acosh(), 0.0)],
    "atanh": [("atanh(1) = inf", lambda V: V(1.0).atanh(), inf),
              ("atanh(-1) = -inf", lambda V: V(-1.0).atanh(), -inf),
              ("atanh(2) = nan", lambda V: V(2.0).atanh(), nan)],
    "sqrt": [("sqrt(-1) = nan", lambda V: V(-1.0).sqrt(), nan),
             ("sqrt(-0.0) = -0.0", lambda V: V(-0.0).sqrt(), -0.0),
             ("sqrt(inf) = inf", lambda V: V(inf).sqrt(), inf)],
    "log2": [("log2(0) = -inf", lambda V: V(0.0).log2(), -inf),
             ("log2(-1) = nan", lambda V: V(-1.0).log2(), nan)],
    "log10": [("log10(-0.0) = -inf", lambda V: V(-0.0).log10(), -inf),
              ("log10(-2) = nan", lambda V: V(-2.0).log10(), nan)],
    "log1p": [("log1p(-1) = -inf", lambda V: V(-1.0).log1p(), -inf),
              ("log1p(-2) = nan", lambda V: V(-2.0).log1p(), nan)],
    "expm1": [("expm1(1000) = inf", lambda V: V(1000.0).expm1(), inf),
              ("expm1(-inf) = -1", lambda V: V(-inf).expm1(), -1.0)],
    "erf": [("erf(-inf) = -1", lambda V: V(-inf).erf(), -1.0)],
    "erfc": [("erfc(inf) = 0", lambda V: V(inf).erfc(), 0.0),
             ("erfc(-inf) = 2", lambda V: V(-inf).erfc(), 2.0)],
    "abs": [("abs(-0.0) = 0.0", lambda V: abs(V(-0.0)), 0.0),
            ("abs(-inf) = inf", lambda V: V(-inf).abs(), inf)],
}
IEEE_CASES = [case for cases in IEEE_OP_CASES.values() for case in cases]


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("make, expected", [pytest.param(m, e, id=n) for n, m, e in IEEE_CASES])
def test_ieee_special_value(V, make, expected):
    out = make(V)
    assert same_double(out.data, expected), f"{out.data!r} != {expected!r}"


@pytest.mark.parametrize("make, expected", [pytest.param(m, e, id=n) for n, m, e in IEEE_CASES])
def test_ieee_special_value_and_its_gradients_identical_between_engines(make, expected):
    outs = []
    for V in (C, R):
        out = make(V)
        out.backward()
        outs.append([out.data] + [v.grad for v in _walk(out)])
    assert len(outs[0]) == len(outs[1])
    assert all(same_double(x, y) for x, y in zip(*outs)), outs


def _walk(root):
    """All nodes below root, breadth first, siblings sorted by (data, grad)
    bits, so the two engines' graphs can be compared without relying on the
    iteration order of the ``_prev`` set."""
    def key(v):
        return tuple(b"nan" if math.isnan(x) else bits(x) for x in (v.data, v.grad))
    out, frontier = [], [root]
    while frontier:
        kids = [k for v in frontier for k in sorted(v._prev, key=key)]
        out.extend(kids)
        frontier = kids
    return out


NAN_OP_CASES = {
    "add": [("add", lambda x: x + 1.0), ("radd", lambda x: 1.0 + x),
            ("add_value", lambda x: x + x)],
    "sub": [("sub", lambda x: x - 1.0), ("rsub", lambda x: 1.0 - x)],
    "mul": [("mul", lambda x: x * 2.0), ("rmul", lambda x: 2.0 * x),
            ("mul_zero", lambda x: x * 0.0)],
    "div": [("div", lambda x: x / 2.0), ("rdiv", lambda x: 2.0 / x),
            ("div_zero", lambda x: x / 0.0)],
    "neg": [("neg", lambda x: -x)],
    "powk": [("pow_int", lambda x: x ** 2), ("pow_float", lambda x: x ** 0.5),
             ("pow_neg", lambda x: x ** -1)],
    "pow": [("pow_value_base", lambda x: x ** (x * 0.0 + 2.0)), ("rpow", lambda x: 2.0 ** x)],
    **{key: [(key, lambda x, m=key: getattr(x, m)())] for key in (
        "exp", "log", "tanh", "relu", "sigmoid", "sin", "cos", "tan", "asin", "acos", "atan",
        "sinh", "cosh", "asinh", "acosh", "atanh", "sqrt", "log2", "log10", "log1p", "expm1",
        "erf", "erfc", "abs")},
}
NAN_OPS = [case for cases in NAN_OP_CASES.values() for case in cases]


def test_every_table_op_has_ieee_and_nan_cases():
    keys = sorted(op.key for op in METHOD_OPS)
    assert sorted(IEEE_OP_CASES) == keys
    assert sorted(NAN_OP_CASES) == keys


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("op", [pytest.param(f, id=n) for n, f in NAN_OPS])
def test_nan_propagates_through_op(V, op):
    x = V(nan)
    y = op(x)
    assert math.isnan(y.data)
    y.backward()  # must not raise


@pytest.mark.parametrize("op", [pytest.param(f, id=n) for n, f in NAN_OPS])
def test_nan_input_gradients_identical_between_engines(op):
    grads = []
    for V in (C, R):
        x = V(nan)
        y = op(x)
        y.backward()
        grads.append(x.grad)
    assert same_double(*grads), grads


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("op, expected", [
    (lambda x: x.exp(), nan), (lambda x: x.log(), nan), (lambda x: x.tanh(), nan),
    (lambda x: x.sigmoid(), nan), (lambda x: x ** 2, nan), (lambda x: 2.0 / x, nan),
    (lambda x: x * 3.0, 3.0),   # d(3x)/dx does not read x
    (lambda x: x + 1.0, 1.0),
    (lambda x: -x, -1.0),
    (lambda x: x.relu(), 0.0),  # mask (out > 0) is False for nan, as in micrograd
], ids=["exp", "log", "tanh", "sigmoid", "pow2", "rdiv", "mul", "add", "neg", "relu"])
def test_gradient_at_nan_input(V, op, expected):
    x = V(nan)
    op(x).backward()
    assert same_double(x.grad, expected)


# ---------------------------------------------------------------------------
# gradient conventions at singular points (PyTorch's)


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("x", [0.0, -0.0, 2.0, -3.0, inf, nan])
def test_grad_of_x_pow_constant_zero_is_zero_even_at_zero(V, x):
    a = V(x)
    out = a ** 0
    out.backward()
    assert out.data == 1.0
    assert same_double(a.grad, 0.0)
    b = V(x)
    out = b ** 0.0
    out.backward()
    assert same_double(b.grad, 0.0)


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("y", [0.0, 0.5, 1.0, 2.0, 3.5])
def test_grad_wrt_exponent_of_zero_pow_nonnegative_y_is_zero(V, y):
    x = V(0.0)
    e = V(y)
    out = x ** e
    out.backward()
    assert e.grad == 0.0  # not 0 * log(0) = nan
    # d/dx: y * 0**(y-1); 0 for y == 0 (convention), 1 for y == 1, 0 for y > 1
    expected_dx = {0.0: 0.0, 0.5: inf, 1.0: 1.0, 2.0: 0.0, 3.5: 0.0}[y]
    assert x.grad == expected_dx


@pytest.mark.parametrize("V", ENGINES)
def test_grad_wrt_base_of_value_pow_zero_exponent_is_zero(V):
    x, y = V(0.0), V(0.0)
    out = x ** y
    out.backward()
    assert out.data == 1.0
    assert x.grad == 0.0 and y.grad == 0.0


@pytest.mark.parametrize("V", ENGINES)
def test_grad_wrt_exponent_of_zero_pow_negative_y_is_not_masked(V):
    # The convention only covers y >= 0: for y < 0 it is inf * log(0) = -inf.
    x, y = V(0.0), V(-1.0)
    out = x ** y
    out.backward()
    assert out.data == inf
    assert y.grad == -inf


@pytest.mark.parametrize("V", ENGINES)
def test_relu_negative_zero_keeps_sign_and_zero_grad(V):
    a = V(-0.0)
    r = a.relu()
    r.backward()
    assert math.copysign(1.0, r.data) == -1.0
    assert a.grad == 0.0
    b = V(0.0)
    r = b.relu()
    r.backward()
    assert math.copysign(1.0, r.data) == 1.0
    assert b.grad == 0.0


@pytest.mark.parametrize("V", ENGINES)
def test_log_gradient_at_zero_is_inf(V):
    a = V(0.0)
    out = a.log()
    out.backward()
    assert a.grad == inf
    b = V(-0.0)
    out = b.log()
    out.backward()
    assert b.grad == -inf


@pytest.mark.parametrize("V", ENGINES)
def test_div_gradients_at_zero_denominator(V):
    a, b = V(1.0), V(0.0)
    out = a / b
    out.backward()
    assert a.grad == inf          # g / b
    assert b.grad == -inf         # -g * a / (b * b)


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("method, x, expected", [
    ("abs", 0.0, 0.0), ("abs", -0.0, 0.0), ("abs", nan, nan), ("abs", -2.0, -1.0),
    ("abs", -inf, -1.0),
    ("sqrt", 0.0, inf), ("sqrt", -0.0, -inf), ("sqrt", -1.0, nan),
    ("asin", 1.0, inf), ("asin", -1.0, inf), ("asin", 2.0, nan),
    ("acos", 1.0, -inf), ("acos", -1.0, -inf),
    ("atanh", 1.0, inf), ("atanh", -1.0, inf), ("acosh", 1.0, inf), ("acosh", 0.5, nan),
    ("log2", 0.0, inf), ("log10", 0.0, inf), ("log1p", -1.0, inf),
    ("sin", inf, nan), ("expm1", -inf, 0.0), ("erf", inf, 0.0), ("erfc", -inf, -0.0),
], ids=lambda p: repr(p))
def test_gradient_convention_at_kinks_and_boundaries(V, method, x, expected):
    # PyTorch's formulas in IEEE arithmetic (docs/api.md, IEEE results: the
    # gradient conventions).
    a = V(x)
    getattr(a, method)().backward()
    if expected == 0.0:
        assert a.grad == 0.0       # either sign: grad starts at +0.0
    else:
        assert same_double(a.grad, expected), a.grad


# ---------------------------------------------------------------------------
# PyTorch float64, if installed


def test_gradients_match_pytorch_float64():
    torch = pytest.importorskip("torch")
    for name, fv, _, points in CASES:
        for point in points:
            ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in point]
            tout = fv(*ts)
            tout.backward()
            for V in (C, R):
                leaves = [V(x) for x in point]
                out = fv(*leaves)
                out.backward()
                assert out.data == pytest.approx(tout.item(), rel=1e-12, abs=1e-300), name
                for leaf, t in zip(leaves, ts):
                    tg = t.grad.item() if t.grad is not None else 0.0
                    assert leaf.grad == pytest.approx(tg, rel=1e-12, abs=1e-300), (name, point)


def test_what_bit_for_bit_means_for_nan_as_the_docs_say():
    """docs/api.md (Two engines) and docs/internals.md (The three parts):
    NaNs agree as NaNs, not by sign or payload; everything else by its 64
    bits. The tests' comparison is exactly that."""
    import struct
    from pygrad import Value as CValue
    from pygrad.reference import Value as RValue
    c, r = (CValue(0.0) / 0.0).data, (RValue(0.0) / 0.0).data
    assert math.isnan(c) and math.isnan(r) and same_double(c, r)
    assert not same_double(0.0, -0.0)
    c, r = CValue(math.inf).sin().data, RValue(math.inf).sin().data
    assert math.isnan(c) and math.isnan(r)
    pos, neg = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000))[0], \
        struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000000))[0]
    assert same_double(pos, neg)
