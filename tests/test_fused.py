"""The fused n-ary ops (pygrad.dot, pygrad.sum, pygrad.logsumexp) against the
same expressions written with plain ops.

pygrad.reference has the plain-op versions under the same names; each fused
op must give the same double for the value and for every gradient after one
backward() (bytes compared; any nan equals any nan), including when one
Value appears several times among the operands, so gradients accumulate.
The fused ops are also checked against finite differences on both engines,
and against closed forms where overflow is the point (logsumexp).
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pygrad
from pygrad import Value as C
from pygrad import gradcheck, reference
from pygrad.reference import Value as R

from helpers import assert_same_doubles, same_double, show

inf, nan = math.inf, math.nan

# (Value type, module with dot/sum/logsumexp) for each engine's fused ops
ENGINES = [pytest.param(C, pygrad, id="C"), pytest.param(R, reference, id="ref")]
ACTS = [None, "linear", "relu", "tanh", "sigmoid"]

# ---------------------------------------------------------------------------
# plain-op versions written against any Value type (the reference module's
# versions only take reference Values), to also compare fused C with
# op-by-op C


def plain_dot(V, w, x, b=None, act=None):
    val = lambda v: v if isinstance(v, V) else V(v)  # noqa: E731
    terms = (val(wi) * val(xi) for wi, xi in zip(w, x))
    out = next(terms) if b is None else val(b)
    for t in terms:
        out = out + t
    return out if act in (None, "linear") else getattr(out, act)()


def plain_sum(V, values, start=None):
    vs = ([] if start is None else [start]) + list(values)
    vs = [v if isinstance(v, V) else V(v) for v in vs]
    out = vs[0]
    for v in vs[1:]:
        out = out + v
    return out


def plain_logsumexp(V, values):
    vs = [v if isinstance(v, V) else V(v) for v in values]
    m = vs[0].data
    for v in vs[1:]:
        if v.data > m:
            m = v.data
    if math.isinf(m):
        m = 0.0
    return plain_sum(V, [(v - m).exp() for v in vs]).log() + m


# ---------------------------------------------------------------------------
# cases: a pool of leaf data; operands refer to a pool leaf ("v", i) -- so
# the same Value can appear several times -- or are numbers ("k", x)

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
special = st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 1e200, -1e200, 1e-300, inf, -inf, nan])
numbers = st.one_of(finite, finite, finite, special, st.integers(-5, 5))


def operand(pool_size):
    leaf = st.tuples(st.just("v"), st.integers(0, pool_size - 1))
    const = st.tuples(st.just("k"), numbers)
    return st.one_of(leaf, leaf, leaf, const)


@st.composite
def dot_cases(draw):
    pool = draw(st.lists(numbers.map(float), min_size=1, max_size=5))
    n = draw(st.integers(0, 6))
    op = operand(len(pool))
    w = draw(st.lists(op, min_size=n, max_size=n))
    x = draw(st.lists(op, min_size=n, max_size=n))
    b = draw(op) if n == 0 or draw(st.booleans()) else None
    act = draw(st.sampled_from(ACTS))
    return pool, w, x, b, act


@st.composite
def sum_cases(draw):
    pool = draw(st.lists(numbers.map(float), min_size=1, max_size=5))
    op = operand(len(pool))
    start = draw(st.one_of(st.none(), op))
    values = draw(st.lists(op, min_size=1 if start is None else 0, max_size=8))
    return pool, values, start


lse_numbers = st.one_of(st.floats(min_value=-60, max_value=60), finite,
                        st.sampled_from([1000.0, -1000.0, 710.0, 1e300, -1e300, 0.0, -0.0,
                                         inf, -inf]))


@st.composite
def lse_cases(draw):
    pool = draw(st.lists(lse_numbers, min_size=1, max_size=5))
    leaf = st.tuples(st.just("v"), st.integers(0, len(pool) - 1))
    op = st.one_of(leaf, leaf, leaf, st.tuples(st.just("k"), lse_numbers))
    values = draw(st.lists(op, min_size=1, max_size=7))
    return pool, values


def realize(spec, leaves):
    if spec is None:
        return None
    kind, x = spec
    return leaves[x] if kind == "v" else x


def run(V, pool, build):
    """Make the pool's leaves, build the expression, backward once; the
    root's data and the leaves' grads."""
    leaves = [V(x) for x in pool]
    out = build(leaves)
    out.backward()
    return [out.data] + [v.grad for v in leaves]


def check_same(results, names):
    ref = results[0]
    for got, name in zip(results[1:], names[1:]):
        assert_same_doubles(got, ref, f"{name} vs {names[0]} (data, then leaf grads)")


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------
# bit identity with the plain-op versions


@SETTINGS
@given(dot_cases())
def test_dot_is_bit_identical_to_the_reference_plain_ops(case):
    pool, w, x, b, act = case

    def build(dot, leaves):
        return dot([realize(s, leaves) for s in w], [realize(s, leaves) for s in x],
                   realize(b, leaves), act)

    check_same([
        run(R, pool, lambda lv: build(reference.dot, lv)),
        run(C, pool, lambda lv: build(pygrad.dot, lv)),
        run(C, pool, lambda lv: build(lambda *a: plain_dot(C, *a), lv)),
    ], ["reference.dot", "pygrad.dot", "plain ops on C"])


@SETTINGS
@given(sum_cases())
def test_sum_is_bit_identical_to_the_reference_plain_ops(case):
    pool, values, start = case

    def build(fsum, leaves):
        vs = [realize(s, leaves) for s in values]
        st_ = realize(start, leaves)
        return fsum(vs) if start is None else fsum(vs, start=st_)

    check_same([
        run(R, pool, lambda lv: build(reference.sum, lv)),
        run(C, pool, lambda lv: build(pygrad.sum, lv)),
        run(C, pool, lambda lv: build(lambda vs, start=None: plain_sum(C, vs, start), lv)),
    ], ["reference.sum", "pygrad.sum", "plain ops on C"])


@SETTINGS
@given(lse_cases())
def test_logsumexp_is_bit_identical_to_the_reference_plain_ops(case):
    pool, values = case

    def build(lse, leaves):
        return lse([realize(s, leaves) for s in values])

    check_same([
        run(R, pool, lambda lv: build(reference.logsumexp, lv)),
        run(C, pool, lambda lv: build(pygrad.logsumexp, lv)),
        run(C, pool, lambda lv: build(lambda vs: plain_logsumexp(C, vs), lv)),
    ], ["reference.logsumexp", "pygrad.logsumexp", "plain ops on C"])


@pytest.mark.parametrize("act", ACTS)
def test_dot_with_every_operand_the_same_value(act):
    # w*w + w*w + ... with b = w too: every gradient lands on one leaf
    got = []
    for V, dot in ((R, reference.dot), (C, pygrad.dot)):
        a = V(0.37)
        out = dot([a, a, a], [a, a, a], a, act)
        out.backward()
        got.append([out.data, a.grad])
    assert_same_doubles(got[1], got[0], "fused vs reference")
    if act in (None, "linear"):
        assert got[1][0] == 0.37 + 0.37 * 0.37 + 0.37 * 0.37 + 0.37 * 0.37
        assert got[1][1] == pytest.approx(1 + 6 * 0.37)


def test_fused_ops_take_numpy_and_int_numbers():
    a = C(2.0)
    out = pygrad.dot([a, np.float64(3.0)], [np.int64(4), a], np.float32(0.5), "linear")
    assert out.data == 0.5 + 2.0 * 4.0 + 3.0 * 2.0
    out.backward()
    assert a.grad == 4.0 + 3.0
    assert pygrad.sum([1, a, np.float64(2.5)], start=True).data == 1 + 1 + 2.0 + 2.5
    assert pygrad.logsumexp([0, np.float64(0.0)]).data == math.log(2.0)


def test_fused_ops_accept_any_iterable():
    a, b = C(1.5), C(-2.0)
    assert pygrad.dot(iter([a, b]), (v for v in [b, a])).data == 1.5 * -2.0 + -2.0 * 1.5
    assert pygrad.sum(v for v in [a, b]).data == -0.5
    assert pygrad.logsumexp(iter([a, a])).data == 1.5 + math.log(2.0)


def test_long_fused_ops_are_bit_identical_to_the_reference():
    # thousands of operands: one node with a long child list
    rng = np.random.default_rng(0)
    n = 5000
    xs = rng.uniform(-1, 1, 2 * n + 1).tolist()
    got = []
    for V, ops in ((C, pygrad), (R, reference)):
        vs = [V(x) for x in xs]
        outs = [ops.dot(vs[:n], vs[n:2 * n], vs[-1], "tanh"), ops.sum(vs),
                ops.logsumexp([v * 30 for v in vs[:n]])]
        for out in outs:
            out.backward()
        got.append([out.data for out in outs] + [v.grad for v in vs])
    assert_same_doubles(got[0], got[1], "C vs reference (data, then grads)")


# ---------------------------------------------------------------------------
# values against closed forms


@pytest.mark.parametrize("V, ops", ENGINES)
def test_dot_values_against_floats(V, ops):
    w, x, b = [0.5, -1.25, 2.0], [1.5, 0.25, -0.75], 0.125
    z = b + w[0] * x[0] + w[1] * x[1] + w[2] * x[2]
    for act, f in [(None, lambda t: t), ("relu", lambda t: max(t, 0.0)), ("tanh", math.tanh),
                   ("sigmoid", lambda t: 1 / (1 + math.exp(-t)))]:
        out = ops.dot([V(t) for t in w], [V(t) for t in x], V(b), act)
        assert out.data == pytest.approx(f(z), rel=1e-15, abs=1e-300)
    out = ops.dot([V(t) for t in w], [V(t) for t in x])
    assert out.data == w[0] * x[0] + w[1] * x[1] + w[2] * x[2]


@pytest.mark.parametrize("V, ops", ENGINES)
def test_relu_dot_of_a_negative_sum_is_zero_with_zero_grads(V, ops):
    w, x, b = [V(1.0), V(2.0)], [V(-3.0), V(0.5)], V(0.25)
    out = ops.dot(w, x, b, "relu")
    assert out.data == 0.0
    out.backward()
    assert [v.grad for v in w + x + [b]] == [0.0] * 5


@pytest.mark.parametrize("V, ops", ENGINES)
def test_sum_values_and_grads(V, ops):
    a, b = V(1.5), V(-4.0)
    out = ops.sum([a, b, a, 2], start=b)
    assert out.data == -4.0 + 1.5 - 4.0 + 1.5 + 2
    out.backward()
    assert (a.grad, b.grad) == (2.0, 2.0)


@pytest.mark.parametrize("V, ops", ENGINES)
@pytest.mark.parametrize("xs", [[1000.0, 1000.0], [1000.0, 0.0], [-1000.0, -1000.0, -999.0],
                                [710.0, 709.0, 1.0], [0.3, -1.2, 2.0], [5.0]])
def test_logsumexp_of_large_values_does_not_overflow(V, ops, xs):
    m = max(xs)
    expected = m + math.log(math.fsum(math.exp(x - m) for x in xs))
    vs = [V(x) for x in xs]
    out = ops.logsumexp(vs)
    assert math.isfinite(out.data)
    assert out.data == pytest.approx(expected, rel=1e-15)
    out.backward()
    softmax = [math.exp(x - expected) for x in xs]
    assert [v.grad for v in vs] == pytest.approx(softmax, rel=1e-12, abs=1e-300)
    assert math.fsum(v.grad for v in vs) == pytest.approx(1.0, rel=1e-14)


@pytest.mark.parametrize("V, ops", ENGINES)
@pytest.mark.parametrize("xs, data, grads", [
    ([-inf, 0.0], 0.0, [0.0, 1.0]),
    ([-inf, 2.0, 2.0], 2.0 + math.log(2.0), [0.0, 0.5, 0.5]),
    ([-inf, -inf], -inf, [nan, nan]),
    ([inf, 0.0], inf, [nan, 0.0]),
    ([inf, -inf], inf, [nan, 0.0]),
])
def test_logsumexp_with_infinite_entries(V, ops, xs, data, grads):
    vs = [V(x) for x in xs]
    out = ops.logsumexp(vs)
    assert same_double(out.data, data), show(out.data)
    out.backward()
    assert_same_doubles([v.grad for v in vs], grads, "grads")


# ---------------------------------------------------------------------------
# finite differences, on both engines


@pytest.mark.parametrize("V, ops", ENGINES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("bias", [True, False])
def test_dot_gradcheck(V, ops, act, bias):
    xs = [0.7, -0.4, 1.1, 0.9, -0.3, 0.8, 0.45]   # pre-activation far from relu's kink

    def f(*v):
        return ops.dot(v[0:3], v[3:6], v[6] if bias else None, act)

    res = gradcheck(f, xs, value_type=V)
    assert res, str(res)
    assert any(g != 0.0 for g in res.analytic)


@pytest.mark.parametrize("V, ops", ENGINES)
def test_dot_gradcheck_with_repeated_inputs(V, ops):
    # w = [a, b, a], x = [b, a, a], bias b: the duplicates' partials add up
    res = gradcheck(lambda a, b: ops.dot([a, b, a], [b, a, a], b, "tanh"), [0.3, -0.6],
                    value_type=V)
    assert res, str(res)


@pytest.mark.parametrize("V, ops", ENGINES)
def test_sum_gradcheck(V, ops):
    res = gradcheck(lambda a, b, c: ops.sum([a * a, b, a * c, c.tanh()], start=b * b),
                    [0.3, -1.7, 0.8], value_type=V)
    assert res, str(res)
    assert res.analytic == pytest.approx([2 * 0.3 + 0.8, 1 + 2 * -1.7,
                                          0.3 + 1 - math.tanh(0.8) ** 2])


@pytest.mark.parametrize("V, ops", ENGINES)
@pytest.mark.parametrize("xs", [[0.3, -1.2, 2.0], [1000.0, 999.0, 998.5], [-3.0, -3.0]])
def test_logsumexp_gradcheck(V, ops, xs):
    res = gradcheck(lambda *v: ops.logsumexp(list(v)), xs, value_type=V)
    assert res, str(res)


@pytest.mark.parametrize("V, ops", ENGINES)
def test_fused_ops_gradcheck_when_composed(V, ops):
    def f(a, b, c, d):
        h1 = ops.dot([a, b], [c, d], 0.1, "tanh")
        h2 = ops.dot([c, a], [b, d], None, "sigmoid")
        return ops.logsumexp([h1, h2, ops.sum([h1, h2, a], start=d)])

    res = gradcheck(f, [0.5, -0.3, 0.8, 1.2], value_type=V)
    assert res, str(res)


# ---------------------------------------------------------------------------
# the fused node itself


@pytest.mark.parametrize("act", [None, "linear"])
def test_dot_without_activation_is_a_linear_node(act):
    a, b, c = C(1.0), C(2.0), C(3.0)
    out = pygrad.dot([a, b], [c, a], c, act)
    assert out._op == "linear"
    assert out._prev == {a, b, c}
    assert pygrad.dot([a], [b])._op == "linear"


@pytest.mark.parametrize("act, name", [("relu", "linear+ReLU"), ("tanh", "linear+tanh"),
                                       ("sigmoid", "linear+sigmoid")])
def test_dot_with_activation_is_one_linear_node(act, name):
    a, b, c = C(1.0), C(2.0), C(3.0)
    out = pygrad.dot([a, b], [c, a], c, act)
    assert out._op == name
    assert out._prev == {a, b, c}     # one node, no separate activation node
    assert pygrad.dot([a], [b], None, act)._op == name


def test_sum_and_logsumexp_op_names():
    a, b = C(1.0), C(2.0)
    assert pygrad.sum([a, b])._op == "sum"
    assert pygrad.sum([a], start=b)._op == "sum"
    assert pygrad.sum([a, b])._prev == {a, b}
    assert pygrad.logsumexp([a, b])._op == "logsumexp"
    assert pygrad.logsumexp([a, b, a])._prev == {a, b}


def test_fused_nodes_are_new_nodes_even_for_one_operand():
    a = C(2.0)
    for out in (pygrad.sum([a]), pygrad.dot([], [], a), pygrad.logsumexp([a])):
        assert out is not a
        out.backward()
    assert a.grad == 3.0


# ---------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("V, ops", ENGINES)
def test_dot_with_mismatched_lengths_raises(V, ops):
    a, b = V(1.0), V(2.0)
    with pytest.raises(ValueError, match="as many"):
        ops.dot([a, b], [a])
    with pytest.raises(ValueError, match="as many"):
        ops.dot([a], [a, b], b, "relu")
    with pytest.raises(ValueError, match="as many"):
        ops.dot([], [a], b)


@pytest.mark.parametrize("V, ops", ENGINES)
@pytest.mark.parametrize("act", ["ReLU", "gelu", "", "Tanh", 1, 0])
def test_dot_with_an_unknown_activation_raises(V, ops, act):
    a, b = V(1.0), V(2.0)
    with pytest.raises(ValueError, match="act must be"):
        ops.dot([a], [b], None, act)


def test_fused_empty_inputs_raise_value_error():
    with pytest.raises(ValueError, match="dot of nothing"):
        pygrad.dot([], [])
    with pytest.raises(ValueError, match="sum of nothing"):
        pygrad.sum([])
    with pytest.raises(ValueError, match="logsumexp of nothing"):
        pygrad.logsumexp([])
    # but a bias or a start alone is fine
    assert pygrad.dot([], [], 2.0).data == 2.0
    assert pygrad.sum([], start=3.0).data == 3.0


@pytest.mark.parametrize("call", ["dot([], [])", "sum([])", "logsumexp([])"])
def test_reference_empty_inputs_raise_value_error(call):
    with pytest.raises(ValueError):
        eval(call, vars(reference))


@pytest.mark.parametrize("V, ops", ENGINES)
@pytest.mark.parametrize("bad", ["x", None, [1.0], 1j, object()])
def test_fused_ops_reject_non_numbers(V, ops, bad):
    a = V(1.0)
    calls = [lambda: ops.dot([a], [bad]), lambda: ops.dot([bad], [a]),
             lambda: ops.sum([a, bad]), lambda: ops.logsumexp([a, bad]),
             lambda: ops.logsumexp([bad])]
    if bad is not None:     # None as bias or start means none
        calls += [lambda: ops.dot([a], [a], bad), lambda: ops.sum([a], start=bad)]
    for call in calls:
        with pytest.raises(TypeError):
            call()


@pytest.mark.parametrize("call", [
    lambda c, r: pygrad.dot([c], [r]),
    lambda c, r: pygrad.dot([c], [c], r),
    lambda c, r: pygrad.sum([c, r]),
    lambda c, r: pygrad.sum([c], start=r),
    lambda c, r: pygrad.logsumexp([r, c]),
])
def test_fused_c_ops_reject_reference_values(call):
    with pytest.raises(TypeError):
        call(C(1.0), R(1.0))
