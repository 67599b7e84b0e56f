"""pygrad.grad (create_graph), hvp, hessian, jvp and gradcheck(order=2).

Second and third derivatives are checked against central finite
differences of the analytic derivative one order down; the C engine
against the reference engine bit for bit; the numbers of a gradient
graph against backward()'s bit for bit."""
import gc
import math
import random

import pytest

import pygrad
import test_function
from helpers import run_in_threads, same_double
from pygrad import Value, reference as R
from pygrad._core import lib

ENGINES = [pytest.param(Value, id="c"), pytest.param(R.Value, id="reference")]

# Each unary method, with points inside its domain (away from kinks).
UNARY_POINTS = {
    "exp": [-1.3, 0.4, 2.0], "log": [0.3, 1.7, 5.0], "tanh": [-1.2, 0.3, 0.9],
    "sigmoid": [-2.0, 0.1, 1.5], "sin": [-2.0, 0.5, 3.0], "cos": [-2.0, 0.5, 3.0],
    "tan": [-1.0, 0.2, 1.1], "asin": [-0.7, 0.1, 0.6], "acos": [-0.7, 0.1, 0.6],
    "atan": [-2.0, 0.3, 1.5], "sinh": [-1.5, 0.2, 1.1], "cosh": [-1.5, 0.2, 1.1],
    "asinh": [-2.0, 0.3, 1.5], "acosh": [1.3, 2.0, 4.0], "atanh": [-0.6, 0.1, 0.5],
    "sqrt": [0.3, 1.0, 4.0], "log2": [0.3, 1.7, 5.0], "log10": [0.3, 1.7, 5.0],
    "log1p": [-0.5, 0.3, 3.0], "expm1": [-1.3, 0.4, 2.0], "erf": [-1.2, 0.3, 1.0],
    "erfc": [-1.2, 0.3, 1.0], "abs": [-1.5, 0.7], "relu": [-1.5, 0.7], "__neg__": [-0.4, 1.2],
}
ELEMENTARY = [m for m in UNARY_POINTS if m not in ("abs", "relu", "__neg__")]


def nth_derivative(V, f, x, n):
    """d^n f / dx^n at x, by pygrad.grad with create_graph, n times."""
    v = V(x)
    y = f(v)
    for _ in range(n):
        (y,) = pygrad.grad(y, [v], create_graph=True)
    return y.data


def central(h, x, eps):
    return (h(x + eps) - h(x - eps)) / (2 * eps)


def test_every_unary_method_is_checked():
    from pygrad import _ops
    methods = {m.name for op in _ops.OPS if op.arity == 1 and op.methods for m in op.methods}
    assert methods - {"__abs__", "__pow__"} <= set(UNARY_POINTS)


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("method", sorted(UNARY_POINTS))
def test_second_derivative_of_every_unary_op_matches_finite_differences(V, method):
    def f(v):
        return getattr(v, method)()
    for x in UNARY_POINTS[method]:
        second = nth_derivative(V, f, x, 2)
        numeric = central(lambda t: nth_derivative(V, f, t, 1), x, 1e-5)
        assert second == pytest.approx(numeric, rel=1e-6, abs=1e-7), (method, x)


@pytest.mark.parametrize("method", ELEMENTARY)
def test_third_derivative_of_the_elementary_functions(method):
    def f(v):
        return getattr(v, method)()
    for x in UNARY_POINTS[method]:
        third = nth_derivative(Value, f, x, 3)
        numeric = central(lambda t: nth_derivative(Value, f, t, 2), x, 1e-5)
        assert third == pytest.approx(numeric, rel=1e-5, abs=1e-6), (method, x)
        assert third == nth_derivative(R.Value, f, x, 3)      # bit for bit


BINARY = {
    "add": lambda a, b: a + b, "mul": lambda a, b: a * b, "sub": lambda a, b: a - b,
    "div": lambda a, b: a / b, "pow": lambda a, b: a ** b,
    "rsub": lambda a, b: 2.5 - a * b, "rdiv": lambda a, b: 1.5 / (a + b),
    "powk": lambda a, b: a ** 3 * b ** 2 + a ** 0.5 + b ** -1.5,
    "rpow": lambda a, b: 2.0 ** (a * b),
}


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_hessian_of_binary_ops_matches_finite_differences(V, name):
    f = BINARY[name]
    point = [1.3, 0.7]
    h = pygrad.hessian(f, [V(x) for x in point])

    def gradient(p):
        vs = [V(x) for x in p]
        return [g.data for g in pygrad.grad(f(*vs), vs)]
    for i in range(2):
        up, down = list(point), list(point)
        up[i] += 1e-6
        down[i] -= 1e-6
        col = [(u - d) / 2e-6 for u, d in zip(gradient(up), gradient(down))]
        for j in range(2):
            assert h[j][i] == pytest.approx(col[j], rel=1e-6, abs=1e-6), (name, i, j)


def random_expression(V, rng, xs, ops=40):
    """A random graph over xs with every kind of plain op."""
    pool = list(xs)
    unary = ["tanh", "sin", "cos", "exp", "sigmoid", "atan", "asinh", "erf", "__neg__"]
    for _ in range(ops):
        a, b = rng.choice(pool), rng.choice(pool)
        k = rng.randrange(8)
        if k == 0:
            v = a + b
        elif k == 1:
            v = a * b
        elif k == 2:
            v = a - b
        elif k == 3:
            v = a / (b * b + 1.0)
        elif k == 4:
            v = (a * a + 0.5) ** rng.choice([2, 3, 0.5, -1.0])
        elif k == 5:
            v = (a * a + 0.5) ** b.tanh()
        else:
            v = getattr(a * 0.5, rng.choice(unary))()
        pool.append(v)
    return pool[-1] + pool[-2] * pool[-3]


@pytest.mark.parametrize("seed", range(6))
def test_the_engines_agree_bit_for_bit_to_the_third_order(seed):
    results = []
    for V in (Value, R.Value):
        rng = random.Random(seed)
        xs = [V(rng.uniform(-1.5, 1.5)) for _ in range(4)]
        y = random_expression(V, rng, xs)
        g1 = pygrad.grad(y, xs, create_graph=True)
        g2 = pygrad.grad(g1[0] * 0.5 + g1[1], xs, create_graph=True)
        g3 = pygrad.grad(g2[2], xs)
        results.append([v.data for v in g1 + g2 + g3])
    assert all(same_double(a, b) for a, b in zip(*results)), results


@pytest.mark.parametrize("V", ENGINES)
def test_a_gradient_graph_holds_backwards_numbers_and_touches_no_grad(V):
    rng = random.Random(7)
    xs = [V(rng.uniform(-1, 1)) for _ in range(5)]
    y = random_expression(V, rng, xs, ops=60)
    for x in xs:
        x.grad = 0.25                     # the user's: grad() must leave them
    graph = pygrad.grad(y, xs, create_graph=True)
    numbers = pygrad.grad(y, xs)
    assert [x.grad for x in xs] == [0.25] * 5
    for x in xs:
        x.grad = 0.0
    y.backward()
    assert [g.data for g in graph] == [x.grad for x in xs]
    assert [g.data for g in numbers] == [x.grad for x in xs]
    assert all(not g._children for g in numbers)      # new leaves


@pytest.mark.parametrize("V", ENGINES)
def test_grad_keeps_micrograds_second_backward(V):
    # a - b and a / b keep a hidden grad that a second backward() adds to
    # (micrograd's hidden b * -1 node); grad() in between changes none of it.
    def run(call_grad):
        a, b = V(1.5), V(-0.7)
        y = (a - b) * (a / b)
        y.backward()
        if call_grad:
            pygrad.grad(y, [a, b])
            pygrad.grad(y, [a, b], create_graph=True)
        y.backward()
        return a.grad, b.grad
    assert run(True) == run(False)


@pytest.mark.parametrize("V", ENGINES)
def test_seeds_outputs_and_unused_inputs(V):
    x, y, unused = V(0.5), V(2.0), V(3.0)
    outs = [x * y, (x + y).exp(), x * x]
    got = pygrad.grad(outs, [x, y, unused, outs[0]], grad_outputs=[1.5, -2.0, V(0.5)])
    e = math.exp(2.5)
    assert got[0].data == pytest.approx(1.5 * 2.0 - 2.0 * e + 0.5 * 2 * 0.5)
    assert got[1].data == pytest.approx(1.5 * 0.5 - 2.0 * e)
    assert got[2].data == 0.0 and got[3].data == 1.5
    graph = pygrad.grad(outs[0], [unused], create_graph=True)
    assert graph[0].data == 0.0


def test_relu_and_abs_at_zero_follow_pytorch():
    for method in ("relu", "abs"):
        first = pygrad.grad(getattr(Value(0.0), method)(), [Value(0.0)])
        x = Value(0.0)
        (d1,) = pygrad.grad(getattr(x, method)(), [x], create_graph=True)
        (d2,) = pygrad.grad(d1, [x])
        assert d1.data == 0.0 and d2.data == 0.0 and first[0].data == 0.0
    x = Value(-0.0)
    (d,) = pygrad.grad(x.relu() * 3.0, [x])
    assert d.data == 0.0


def mlp_loss(params, points, fused):
    """A 2-3-1 tanh MLP's squared error, fused (pygrad.dot) or plain."""
    w1, b1, w2, b2 = params[:6], params[6:9], params[9:12], params[12]
    total = None
    for x0, x1, target in points:
        if fused:
            hidden = [pygrad.dot(w1[2 * j:2 * j + 2], [x0, x1], b1[j], act="tanh") for j in range(3)]
            out = pygrad.dot(w2, hidden, b2)
        else:
            hidden = [(b1[j] + w1[2 * j] * x0 + w1[2 * j + 1] * x1).tanh() for j in range(3)]
            out = b2 + w2[0] * hidden[0] + w2[1] * hidden[1] + w2[2] * hidden[2]
        term = (out - target) ** 2
        total = term if total is None else total + term
    return total


def test_fused_neurons_differentiate_twice_as_their_plain_graph():
    rng = random.Random(3)
    start = [rng.uniform(-1, 1) for _ in range(13)]
    points = [(rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(-1, 1)) for _ in range(4)]
    fused = pygrad.hessian(lambda *p: mlp_loss(p, points, True), start)
    plain = pygrad.hessian(lambda *p: mlp_loss(p, points, False), start)
    ref = pygrad.hessian(lambda *p: mlp_loss(p, points, False), [R.Value(x) for x in start])
    assert (fused == fused.T).all()
    assert fused == pytest.approx(plain, rel=1e-12, abs=1e-13)
    assert (plain == ref).all()
    # the first order: fused and plain agree bit for bit
    vs = [Value(x) for x in start]
    a = [g.data for g in pygrad.grad(mlp_loss(vs, points, True), vs, create_graph=True)]
    b = [g.data for g in pygrad.grad(mlp_loss(vs, points, False), vs)]
    assert a == b


def test_sum_and_logsumexp_differentiate_twice():
    def f(fused):
        def run(a, b, c):
            if fused:
                return pygrad.logsumexp([a, b * 2.0, c]) * pygrad.sum([a * a, b, c])
            m = max(a.data, 2.0 * b.data, c.data)
            s = (a - m).exp() + (b * 2.0 - m).exp() + (c - m).exp()
            return (s.log() + m) * (a * a + b + c)
        return run
    point = [0.3, -0.4, 1.1]
    fused, plain = pygrad.hessian(f(True), point), pygrad.hessian(f(False), point)
    assert fused == pytest.approx(plain, rel=1e-12, abs=1e-14)


class Cube(test_function.Cube):
    differentiable = True          # x ** 3 and 3 * x * x * grad work on Values too


class NumbersOnly(pygrad.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return math.sin(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_values
        return (math.cos(x) * grad,)


@pytest.mark.parametrize("V", ENGINES)
def test_differentiable_functions_and_the_error_for_the_others(V):
    x = V(1.3)
    (d1,) = pygrad.grad(Cube.apply(x) * 2.0, [x], create_graph=True)
    (d2,) = pygrad.grad(d1, [x], create_graph=True)
    (d3,) = pygrad.grad(d2, [x])
    assert (d1.data, d2.data, d3.data) == pytest.approx((6 * 1.3 ** 2, 12 * 1.3, 12.0))
    y = NumbersOnly.apply(x)
    assert pygrad.grad(y, [x])[0].data == pytest.approx(math.cos(1.3))
    with pytest.raises(TypeError, match="differentiable = True"):
        pygrad.grad(y, [x], create_graph=True)
    z = V(2.0, (x,), [0.5])           # microgpt's way: the local gradient a number
    assert pygrad.grad(z, [x])[0].data == 0.5
    with pytest.raises(TypeError, match="local gradients"):
        pygrad.grad(z, [x], create_graph=True)


@pytest.mark.parametrize("V", ENGINES)
def test_a_custom_ops_python_backward_is_refused_clearly(V):
    x = V(0.5)
    out = V(x.data ** 2, (x,), "square")

    def _backward():
        x.grad += 2 * x.data * out.grad
    out._backward = _backward
    y = out * 3.0
    for create_graph in (True, False):
        with pytest.raises(TypeError, match="custom op 'square' has a Python _backward"):
            pygrad.grad(y, [x], create_graph=create_graph)
    def custom(v):
        made = V(v.data * 2, (v,), "double")
        made._backward = lambda: None
        made._backward = lambda: setattr(v, "grad", v.grad + 2 * made.grad)
        return made
    with pytest.raises(TypeError, match="custom op 'double'"):
        pygrad.jvp(custom, [V(0.5)], [1.0])
    y.backward()                        # backward() still runs it
    assert x.grad == 3.0


@pytest.mark.parametrize("V", ENGINES)
def test_hvp_hessian_and_jvp_agree_with_each_other_and_finite_differences(V):
    def f(a, b, c):
        return (a * b).tanh() * c.exp() + (a / (c * c + 1.0)).sin() - b ** 3
    x = [V(0.4), V(-0.8), V(0.3)]
    h = pygrad.hessian(f, x)
    assert (h == h.T).all()
    v = [0.5, -1.0, 2.0]
    assert pygrad.hvp(f, x, v) == pytest.approx(h @ v, rel=1e-12)
    value, tangent = pygrad.jvp(f, x, v)
    leaves = [V(t.data) for t in x]
    grads = [d.data for d in pygrad.grad(f(*leaves), leaves)]
    assert tangent == pytest.approx(sum(gi * vi for gi, vi in zip(grads, v)), rel=1e-13)
    assert value == f(*[V(t.data) for t in x]).data
    eps = 1e-6
    up = f(*[V(t.data + eps * vi) for t, vi in zip(x, v)]).data
    down = f(*[V(t.data - eps * vi) for t, vi in zip(x, v)]).data
    assert tangent == pytest.approx((up - down) / (2 * eps), rel=1e-7)
    assert all(t.grad == 0.0 for t in x)


def test_jvp_through_fused_ops_and_functions():
    def f(a, b):
        hidden = pygrad.dot([a, b], [b, 2.0], a, act="tanh")
        return pygrad.logsumexp([hidden, a * b]) + pygrad.sum([a, hidden]) + Cube.apply(b)
    x, t = [0.3, -0.6], [0.7, 1.1]
    _, tangent = pygrad.jvp(f, x, t)
    leaves = [Value(v) for v in x]
    grads = [d.data for d in pygrad.grad(f(*leaves), leaves)]
    assert tangent == pytest.approx(grads[0] * t[0] + grads[1] * t[1], rel=1e-13)


def test_gradcheck_order_two():
    res = pygrad.gradcheck(lambda a, b: (a * b).sin() + a ** 3 / b, [0.7, 1.4], order=2)
    assert res.ok and len(res.analytic) == 4
    # a wrong second derivative fails it: Cube's backward off by a factor
    class Wrong(Cube):
        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_values
            c = getattr(x, "data", x)      # a number: the graph loses one factor's gradient
            return (3 * c * x * grad,)
    assert pygrad.gradcheck(lambda a: Wrong.apply(a), [0.9]).ok      # first order right
    assert not pygrad.gradcheck(lambda a: Wrong.apply(a), [0.9], order=2).ok


def test_bad_arguments_get_clear_errors():
    x = Value(1.0)
    with pytest.raises(TypeError, match="outputs must be"):
        pygrad.grad(3.0, [x])
    with pytest.raises(TypeError, match="inputs must be Values"):
        pygrad.grad(x * 2, [1.0])
    with pytest.raises(ValueError, match="2 entries for 1 outputs"):
        pygrad.grad(x * 2, [x], grad_outputs=[1.0, 2.0])
    with pytest.raises(TypeError, match="same engine"):
        pygrad.grad(x * 2, [R.Value(1.0)])
    with pytest.raises(ValueError, match="3 numbers for 2 inputs"):
        pygrad.hvp(lambda a, b: a * b, [1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="must return a Value"):
        pygrad.hessian(lambda a: 3.0, [1.0])
    with pytest.raises(TypeError, match="grad_outputs must be numbers or Values"):
        pygrad.grad(x * 2, [x], grad_outputs=["1"])


def doubling(seen, stop_at):
    """A differentiable Function 2x whose backward notes whether the
    collector runs (into seen) and raises KeyboardInterrupt on its
    stop_at-th call (the first is apply's, at forward time): a Ctrl-C at a
    chosen point of a sweep."""
    class Double(pygrad.Function):
        differentiable = True

        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append(gc.isenabled())
            if len(seen) == stop_at:
                raise KeyboardInterrupt
            return (grad * 2,)
    return Double


def test_a_ctrl_c_inside_a_create_graph_sweep_changes_nothing():
    Stop = doubling([], 2)
    x = Value(0.5)
    x.grad = 7.0
    y = (Stop.apply(x.tanh()) * x).exp()
    gc.collect()
    before = lib.pg_live_nodes()
    with pytest.raises(KeyboardInterrupt):
        pygrad.grad(y, [x], create_graph=True)
    gc.collect()
    assert lib.pg_live_nodes() == before and x.grad == 7.0
    (d,) = pygrad.grad(y, [x], create_graph=True)
    assert d.data == pygrad.grad(y, [x])[0].data


def test_threads_differentiating_one_graph_get_the_serial_results():
    rng = random.Random(11)
    xs = [Value(rng.uniform(-1, 1)) for _ in range(4)]
    y = random_expression(Value, rng, xs, ops=80)
    expected = [d.data for d in pygrad.grad(pygrad.grad(y, xs, create_graph=True)[1], xs)]
    results = []

    def work():
        for _ in range(5):
            g = pygrad.grad(y, xs, create_graph=True)
            results.append([d.data for d in pygrad.grad(g[1], xs)])
            y.backward()                # and backward()s between, on the same graph
    assert run_in_threads(work) == []
    assert all(r == expected for r in results) and len(results) == 15


def test_gradient_graphs_are_freed():
    def round_trip():
        x = Value(0.3)
        y = (x.sin() * x).tanh() / (x + 2.0)
        (d,) = pygrad.grad(y, [x], create_graph=True)
        pygrad.grad(d, [x])
    round_trip()
    gc.collect()
    before = lib.pg_live_nodes()
    for _ in range(500):
        round_trip()
    assert lib.pg_live_nodes() == before      # no cycle: reference counting frees them


@pytest.mark.slow
def test_twenty_thousand_rounds_leave_memory_flat():
    import resource

    def round_trip():
        x, w = Value(0.3), Value(-1.1)
        y = ((x * w).tanh() + (x / w).exp()) ** 2
        gs = pygrad.grad(y, [x, w], create_graph=True)
        pygrad.grad(gs[0] + gs[1], [x, w])
    for _ in range(2000):
        round_trip()
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    nodes = lib.pg_live_nodes()
    for _ in range(20000):
        round_trip()
    gc.collect()
    assert lib.pg_live_nodes() == nodes
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 4096   # KiB


def test_compiled_and_traced_tiers():
    # A graph that replay compiled is still a graph of Values: grad works.
    x = Value(0.4)
    y = (x * x).sin()
    program = pygrad.compile(y)
    program.forward()
    (d,) = pygrad.grad(y, [x], create_graph=True)
    assert d.data == pytest.approx(2 * 0.4 * math.cos(0.16))
    # the program itself runs numbers: the error names what to do instead
    with pytest.raises(TypeError, match="differentiate the eager graph"):
        pygrad.grad(program, [x])
    with pytest.raises(TypeError, match="differentiate the eager graph"):
        pygrad.grad(y, program.inputs or program)


def test_pygrad_nn_models_differentiate_twice_as_the_reference_engine():
    # fused layers (C) against the reference engine's micrograd graph
    from pygrad import nn
    c_model = nn.MLP(2, [3, 3, 1])
    r_model = nn.MLP(2, [3, 3, 1], engine="reference", fused=False)
    for p, q in zip(r_model.parameters(), c_model.parameters()):
        p.data = q.data
    points = [([0.5, -1.0], 0.3), ([-0.2, 0.8], -0.7), ([1.1, 0.4], 0.9)]

    def rows(model):
        params = model.parameters()
        loss = sum(((model(x) - t) ** 2 for x, t in points), model.parameters()[0] * 0.0)
        first = pygrad.grad(loss, params, create_graph=True)
        return [[d.data for d in pygrad.grad(g, params)] for g in first[:6]]
    for c_row, r_row in zip(rows(c_model), rows(r_model)):
        assert c_row == pytest.approx(r_row, rel=1e-12, abs=1e-14)


def test_the_collector_is_paused_only_during_the_sweep():
    seen = []
    Peek = doubling(seen, 3)                     # a Ctrl-C inside the paused sweep
    x = Value(0.5)
    y = Peek.apply(x) * x                        # (apply's backward: seen[0])
    assert gc.isenabled()
    pygrad.grad(y, [x], create_graph=True)
    with pytest.raises(KeyboardInterrupt):
        pygrad.grad(y, [x], create_graph=True)
    assert seen == [True, False, False] and gc.isenabled()
    gc.disable()
    try:
        pygrad.grad(y * 1.0, [x], create_graph=True)
        assert not gc.isenabled()               # the user's choice, kept
    finally:
        gc.enable()
