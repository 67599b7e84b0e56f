"""Adversarial review of the forward-over-reverse sweep behind pygrad.hvp,
hessian and jvp (csrc/second_order.c, pygrad/_second_order.py).

Written by an independent review; the bugs it found are fixed (each test
says what it found).  The one strict xfail is a last-bit difference that
predates the sweep: a fused node reached through several children (as in
backward(): docs/higher-order.md)."""
import math
import random
import struct
import threading

import numpy as np
import pytest

import pygrad
from helpers import interrupt_at_every_line
from pygrad import Value, reference as R

ENGINES = [pytest.param(Value, id="c"), pytest.param(R.Value, id="reference")]
INF, NAN = float("inf"), float("nan")


def M(V):
    return pygrad if V is Value else R


def bits(xs):
    return [b"nan" if math.isnan(x) else struct.pack("<d", x) for x in np.ravel(xs)]


def gog_hessian(f, xs, V):
    leaves = [V(x) for x in xs]
    first = pygrad.grad(f(*leaves), leaves, create_graph=True)
    h = np.array([[d.data for d in pygrad.grad(g, leaves)] for g in first])
    return h * 0.5 + h.T * 0.5


# -- bugs -----------------------------------------------------------------------------


def test_detached_max_of_a_singular_node_poisons_the_c_hessian():
    def f_of(V):
        return lambda x: M(V).detached_max([x.sqrt(), V(1.0)]) + x * x
    c = pygrad.hessian(f_of(Value), [Value(0.0)]).tolist()
    r = pygrad.hessian(f_of(R.Value), [R.Value(0.0)]).tolist()
    assert r == [[2.0]]
    assert c == r            # was [[nan]] (review)


@pytest.mark.parametrize("V", ENGINES)
def test_a_node_cut_off_by_a_guard_makes_nan(V):
    def f(x):
        return x.sqrt() ** 0.0 + x * x
    assert gog_hessian(f, [0.0], V).tolist() == [[2.0]]
    assert pygrad.hessian(f, [V(0.0)]).tolist() == [[2.0]]     # was [[nan]] (review)


@pytest.mark.parametrize("V", ENGINES)
def test_a_guarded_off_infinite_branch_makes_nan(V):
    def f(x):
        return (x * INF).exp() ** 0.0 + x * x
    assert gog_hessian(f, [1.0], V).tolist() == [[2.0]]
    assert pygrad.hessian(f, [V(1.0)]).tolist() == [[2.0]]


@pytest.mark.parametrize("V", ENGINES)
def test_a_noop_closure_over_a_singular_node_makes_nan(V):
    def f(x):
        s = x.sqrt()
        return V(s.data, (s,), "cut") + x * x
    assert pygrad.hessian(f, [V(0.0)]).tolist() == [[2.0]]


@pytest.mark.parametrize("V", ENGINES)
def test_mixed_partial_next_to_an_infinite_one(V):
    def f(x, y):
        return x.sqrt() + x * y
    g = gog_hessian(f, [0.0, 1.0], V)
    assert g[0, 1] == 1.0 and g[1, 0] == 1.0
    h = pygrad.hessian(f, [V(0.0), V(1.0)])
    assert h[0, 1] == 1.0                      # was nan (review)
    assert h[0, 0] == -INF and h[1, 1] == 0.0


@pytest.mark.xfail(strict=True, reason="C sweeps a fused sum/dot as one node while the reference "
                   "engine sweeps the plain graph, so a child shared between them accumulates in "
                   "another order: the last bit differs (backward() differs too: pre-existing)")
def test_fused_nodes_sharing_a_child_c_vs_reference_bits():
    def f_of(V):
        E = M(V)

        def f(x0, x1, x2):
            n4 = x2 * x1
            n5 = E.dot([x1, n4], [n4, x1], 0.5, None)
            n6 = E.sum([n4, x2, n4, n5])
            return (x0 - n6) / n6
        return f
    xs = [1.0, 0.0, 1.0]
    vv = [0.42322133376582083, 0.08439163813883921, 0.5170884504516626]
    c = pygrad.hvp(f_of(Value), [Value(x) for x in xs], vv)
    r = pygrad.hvp(f_of(R.Value), [R.Value(x) for x in xs], vv)
    assert bits(c) == bits(r)


def test_fused_relu_neuron_zero_sign_c_vs_reference():
    # Found in review: C's fused relu neuron passed the activation's grad
    # (relu_slope(y) * g = -0.0) straight to the products, where the plain
    # graph sums it into the pre-activation's adjoint from 0.0 (+0.0).  The
    # sign of a zero may differ from grad-of-grad's (other orders of
    # addition); the two engines must agree bit for bit.
    def f_of(E):
        return lambda x0, x2: -(E.dot([-2.0 / x0], [x2], 0.5, "relu")).exp()
    r = pygrad.hessian(f_of(R), [R.Value(1.0), R.Value(1.0)])
    c = pygrad.hessian(f_of(pygrad), [Value(1.0), Value(1.0)])
    assert bits(c) == bits(r)
    assert (c == gog_hessian(f_of(pygrad), [1.0, 1.0], Value)).all()


@pytest.mark.parametrize("seed", range(20))
def test_fused_ops_c_vs_reference_on_smooth_points(seed):
    rng = random.Random(seed)
    xs0 = [rng.uniform(-1, 1) for _ in range(4)]
    vv = [rng.uniform(-1, 1) for _ in range(4)]
    acts = [None, "relu", "tanh", "sigmoid"]
    out = []
    for V in (Value, R.Value):
        E = M(V)

        def f(a, b, c, d):
            t = E.dot([a, b], [c, d], a * 0.5, acts[seed % 4]) * E.logsumexp([a, b * c, d])
            return t + E.sum([a * b, c.exp(), d]) * E.dot([c], [d], None, acts[(seed + 1) % 4])
        out.append(bits(pygrad.hessian(f, [V(x) for x in xs0])) +
                   bits(pygrad.hvp(f, [V(x) for x in xs0], vv)) +
                   bits(pygrad.jvp(f, [V(x) for x in xs0], vv)))
    assert out[0] == out[1]


def test_a_0d_array_as_xs():
    assert pygrad.hessian(lambda x: x ** 3, np.array(2.0)).tolist() == [[12.0]]


# -- what held --------------------------------------------------------------------------

UNARY = ["exp", "log", "tanh", "sigmoid", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
         "cosh", "asinh", "acosh", "atanh", "sqrt", "log2", "log10", "log1p", "expm1", "erf",
         "erfc", "abs", "relu", "__neg__"]


def random_graph(V, xs, seed, special):
    rng = random.Random(seed)
    E = M(V)
    pool = list(xs)
    for _ in range(25):
        a, b = rng.choice(pool), rng.choice(pool)
        k = rng.randrange(15)
        if k == 0:
            v = a + b
        elif k == 1:
            v = a * b
        elif k == 2:
            v = a - b
        elif k == 3:
            v = a / b
        elif k == 4:
            v = a ** rng.choice([0, 1, 2, 3, 0.5, -1.0, -2, 1.5, 0.0, 1.0, 2.0])
        elif k == 5:
            v = a ** b
        elif k == 6:
            v = rng.choice([2.0, 0.5, -1.5, 0.0]) ** a
        elif k == 7:
            v = rng.choice([1.5, -2.0, 0.0]) - a
        elif k == 8:
            v = rng.choice([1.5, -2.0, 0.0]) / a
        elif k in (9, 10):  # (fused nodes: see the xfails above, and the test below)
            v = (a * b).tanh()
        elif k == 11:
            v = a * a
        elif k == 12:
            v = a * special
        else:
            v = getattr(a, rng.choice(UNARY))()
        pool.append(v)
    return pool[-1] + pool[-2] * pool[-3]


@pytest.mark.parametrize("seed", range(60))
def test_c_and_reference_agree_bit_for_bit_with_special_values(seed):
    rng = random.Random(seed * 7)
    xs0 = [rng.choice([rng.uniform(-2, 2), 0.0, -0.0, 1.0, 0.5]) for _ in range(3)]
    special = rng.choice([1.0, INF, NAN, -0.0, 0.0, 1e308])
    vv = [rng.uniform(-1, 1) for _ in range(3)]
    out = []
    for V in (Value, R.Value):
        def f(*xs):
            return random_graph(V, list(xs), seed, V(special))
        with np.errstate(all="ignore"):
            h = pygrad.hessian(f, [V(x) for x in xs0])
            hv = pygrad.hvp(f, [V(x) for x in xs0], vv)
            j = pygrad.jvp(f, [V(x) for x in xs0], vv)
        out.append(bits(h) + bits(hv) + bits(j))
    assert out[0] == out[1]


@pytest.mark.parametrize("seed", range(6))
def test_matches_torch_float64_on_smooth_points(seed):
    torch = pytest.importorskip("torch")
    rng = random.Random(seed)
    xs0 = [rng.uniform(0.2, 0.9) for _ in range(3)]
    ops = ["exp", "tanh", "sin", "cos", "atan", "asinh", "erf", "sigmoid", "log1p", "sqrt"]

    def build(x, y, z, lib):
        out = x * 0.0
        for i, m in enumerate(ops):
            a = [x, y, z][i % 3] * [y, z, x][(i + 1) % 3] + 0.5
            out = out + (getattr(a, m)() if lib is None else getattr(lib, m)(a)) * z
        out = out + x ** 3 * y - 1.5 / (z + 1.0) + 2.0 ** (x * y) + (x + 1.0) ** (y * z)
        return out

    h = pygrad.hessian(lambda x, y, z: build(x, y, z, None), xs0)
    t = torch.tensor(xs0, dtype=torch.float64)
    th = torch.autograd.functional.hessian(lambda v: build(v[0], v[1], v[2], torch), t).numpy()
    assert h == pytest.approx(th, rel=1e-12, abs=1e-12)
    v = [rng.uniform(-1, 1) for _ in range(3)]
    value, tangent = pygrad.jvp(lambda x, y, z: build(x, y, z, None), xs0, v)
    _, tt = torch.autograd.functional.jvp(lambda w: build(w[0], w[1], w[2], torch), t,
                                          torch.tensor(v, dtype=torch.float64))
    assert tangent == pytest.approx(float(tt), rel=1e-12, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("V", ENGINES)
def test_a_deep_chain_has_no_recursion_limit(V):
    n = 200_000 if V is Value else 20_000

    def f(x):
        y = x
        for _ in range(n):
            y = (y * 0.999999).sin() + y * 1e-6
        return y
    h = pygrad.hessian(f, [V(0.3)])
    assert math.isfinite(h[0, 0]) and h[0, 0] < 0.0
    value, tangent = pygrad.jvp(f, [V(0.3)], [1.0])
    assert 0.0 < tangent < 1.0


@pytest.mark.parametrize("V", ENGINES)
def test_one_node_through_2_to_the_60_paths(V):
    def f(x):
        s = x
        for _ in range(60):
            s = s + s * 1e-3
        return s * s
    c = 1.001 ** 60
    assert pygrad.hessian(f, [V(0.5)])[0, 0] == pytest.approx(2 * c * c, rel=1e-13)


BAD = {
    "vs short": (lambda: pygrad.hvp(lambda x, y: x * y, [1.0, 2.0], [1.0]), ValueError),
    "vs long": (lambda: pygrad.hvp(lambda x, y: x * y, [1.0, 2.0], [1, 2, 3]), ValueError),
    "vs None": (lambda: pygrad.hvp(lambda x, y: x * y, [1.0, 2.0], None), ValueError),
    "vs str one input": (lambda: pygrad.hvp(lambda x: x * x, [1.0], "a"), TypeError),
    "vs 2d": (lambda: pygrad.hvp(lambda x, y: x * y, [1.0, 2.0], np.eye(2)), TypeError),
    "vs complex": (lambda: pygrad.hvp(lambda x: x * x, [1.0], [1j]), TypeError),
    "xs empty": (lambda: pygrad.hessian(lambda: Value(1.0), []), ValueError),
    "xs None": (lambda: pygrad.hessian(lambda x: x, [None]), TypeError),
    "xs mixed engines": (lambda: pygrad.hessian(lambda x, y: x * y, [Value(1.0), R.Value(2.0)]),
                         TypeError),
    "xs huge int": (lambda: pygrad.hessian(lambda x: x, [10 ** 400]), ValueError),
    "f returns float": (lambda: pygrad.hessian(lambda x: 3.0, [1.0]), TypeError),
    "f returns other engine": (lambda: pygrad.hessian(lambda x: R.Value(3.0), [1.0]), TypeError),
    "f returns list": (lambda: pygrad.jvp(lambda x: [x], [1.0], [1.0]), TypeError),
    "f not callable": (lambda: pygrad.hvp(3, [1.0], [1.0]), TypeError),
    "jvp tangents short": (lambda: pygrad.jvp(lambda x, y: x * y, [1.0, 2.0], [1.0]), ValueError),
    "uninit Value in f": (lambda: pygrad.hessian(lambda x: x * Value.__new__(Value), [1.0]),
                          TypeError),
    "uninit Value returned": (lambda: pygrad.hessian(lambda x: Value.__new__(Value), [1.0]),
                              TypeError),
    "uninit ref Value returned": (
        lambda: pygrad.hessian(lambda x: R.Value.__new__(R.Value), [R.Value(1.0)]), TypeError),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_arguments_are_clear_errors(name):
    call, error = BAD[name]
    with pytest.raises(error):
        call()


def test_odd_subclasses_and_outer_values():
    class Loud(Value):
        def __eq__(self, o):
            raise RuntimeError("eq")

        def __hash__(self):
            raise RuntimeError("hash")

        def __getattr__(self, n):
            raise RuntimeError("getattr " + n)

    class Agreeable(R.Value):
        def __eq__(self, o):
            return True
        __hash__ = None

    assert pygrad.hessian(lambda x: x * x * x, [Loud(2.0)]).tolist() == [[12.0]]
    assert pygrad.hessian(lambda x: x * Loud(2.0) * x, [1.0]).tolist() == [[4.0]]
    assert pygrad.hessian(lambda x, y: x * y * x, [Agreeable(1.0), Agreeable(2.0)]).tolist() \
        == [[4.0, 2.0], [2.0, 0.0]]
    w = Value(3.0) * Value(2.0)
    assert pygrad.hessian(lambda x: w, [1.0]).tolist() == [[0.0]]
    assert pygrad.hessian(lambda x, y: x, [1.0, 2.0]).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert pygrad.jvp(lambda x, y: y, [1.0, 2.0], [3.0, 4.0]) == (2.0, 4.0)


def test_inside_a_per_length_trace():
    W = [[Value(0.1 * i + 0.05 * j) for j in range(3)] for i in range(4)]
    out = {}

    def loss_fn(tokens):
        x = pygrad.embed(W, tokens[0])
        out["pure"] = pygrad.hessian(lambda a: a * a * a, [2.0]).tolist()
        for name, call in [("traced", lambda: pygrad.hessian(lambda a: a * x[0] * a, [2.0])),
                           ("traced xs", lambda: pygrad.hvp(lambda a: a * a, [x[0]], [1.0]))]:
            with pytest.raises(ValueError):
                call()
            out[name] = True
        return x[0] * x[1]
    pygrad.per_length(loss_fn, 4).loss([1])
    assert out == {"pure": [[12.0]], "traced": True, "traced xs": True}


def _outer_graph():
    w, u = Value(1.5), Value(-0.5)
    z = (w - u) / (w * u) + (u - w) / (u + 2.0)
    return w, u, z


def test_writes_no_number_of_an_outer_graph_sub_div_hidden_grads_included():
    w, u, z = _outer_graph()
    w2, u2, z2 = _outer_graph()          # the same, never swept
    z.backward()
    z2.backward()
    before = [(v.data, v.grad) for v in (w, u, z)]
    for _ in range(3):
        pygrad.hessian(lambda x: x * z * x + (x - z) / (z + x), [0.7])
        pygrad.jvp(lambda x: x * z - w / x, [0.7], [1.0])
    assert [(v.data, v.grad) for v in (w, u, z)] == before
    z.backward()                 # a hidden SUB/DIV grad left changed would show here
    z2.backward()
    assert [v.grad for v in (w, u, z)] == [v.grad for v in (w2, u2, z2)]


def _shared_graph():
    rng = random.Random(3)
    ws = [Value(rng.uniform(-1, 1)) for _ in range(6)]
    shared = pygrad.dot(ws[:3], ws[3:], 0.25, "tanh") * pygrad.logsumexp(ws)
    other = Value(0.5)                   # written by the backward thread only
    loss = shared * other + shared.exp()
    return ws, shared, other, loss


def _backwards(ws, other, loss, out, n=30):
    for i in range(n):
        for w in ws:
            w.grad = 0.0
        other.data = 0.5 + i
        loss.backward()
        out.append([w.grad for w in ws])


def test_threads_hessian_while_others_backward_and_write_data_on_a_shared_graph():
    ws, shared, other, loss = _shared_graph()

    def f(a, b):
        return (a * shared).sin() * b + pygrad.logsumexp([a, b, shared]) * a

    expected = pygrad.hessian(f, [0.3, -0.4]).tolist()
    serial = []
    ws2, _, other2, loss2 = _shared_graph()
    _backwards(ws2, other2, loss2, serial)
    barrier = threading.Barrier(4)
    results, grads = [], []

    def hess():
        barrier.wait()
        for _ in range(30):
            results.append(pygrad.hessian(f, [0.3, -0.4]).tolist())

    def back():
        barrier.wait()
        _backwards(ws, other, loss, grads)

    threads = [threading.Thread(target=t) for t in (hess, hess, back, hess)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 90 and all(r == expected for r in results)
    assert grads == serial


MODULES = ("pygrad/higher_order.py", "pygrad/_graph_views.py", "pygrad/_second_order.py",
           "pygrad/_backend.py", "pygrad/_numbers.py")


@pytest.mark.slow
@pytest.mark.parametrize("path", ["reference", "noop-closure", "function"])
def test_a_ctrl_c_at_any_line_of_the_other_paths_changes_nothing(path):
    from helpers import square_function
    outer = Value(0.8)
    outer_y = outer * outer
    outer_y.backward()
    if path == "reference":
        def f(a, b):
            return (a * b).tanh() * R.logsumexp([a, b]) + R.dot([a], [b], 0.5, "relu")
        xs = [R.Value(0.3), R.Value(0.6)]
    elif path == "noop-closure":
        def f(a, b):
            c = Value(a.data, (a,), "cut")        # a closure that does nothing
            return (a * b).tanh() * c + pygrad.dot([a], [b], 0.5, "tanh") * outer_y
        xs = [0.3, 0.6]
    else:
        Square = square_function()
        Square.differentiable = True

        def f(a, b):
            return Square.apply(a * b) * outer_y + a.exp()
        xs = [0.3, 0.6]
    assert interrupt_at_every_line(lambda: pygrad.hessian(f, xs).ravel().tolist(), MODULES) > 10
    assert (outer.grad, outer_y.grad) == (1.6, 1.0)
