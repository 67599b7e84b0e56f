"""User-defined ops with pygrad.Function: gradients against finite
differences on both engines, C and reference bit for bit, inside larger
graphs, and misuse."""
import math

import pytest

import pygrad
from pygrad import Context, Function, gradcheck
from pygrad import Value as C
from pygrad.reference import Value as R

from helpers import assert_same_doubles

ENGINES = [pytest.param(C, id="C"), pytest.param(R, id="ref")]


class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_values
        return (3 * x * x * grad,)


class DifferentiableCube(Cube):
    differentiable = True


class Hypot(Function):
    @staticmethod
    def forward(ctx, x, y):
        h = math.hypot(x, y)
        ctx.save_for_backward(x, y, h)
        return h

    @staticmethod
    def backward(ctx, grad):
        x, y, h = ctx.saved_values
        return x / h * grad, y / h * grad


class Lerp(Function):
    """a + t * (b - a); saves on ctx as plain attributes, returns a list."""

    @staticmethod
    def forward(ctx, a, b, t):
        ctx.a, ctx.b, ctx.t = a, b, t
        return a + t * (b - a)

    @staticmethod
    def backward(ctx, grad):
        return [(1 - ctx.t) * grad, ctx.t * grad, (ctx.b - ctx.a) * grad]


class Softplus(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return max(x, 0.0) + math.log1p(math.exp(-abs(x)))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_values
        s = 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
        return (s * grad,)


CASES = [
    (Cube.apply, [0.7]), (Cube.apply, [-1.3]),
    (Hypot.apply, [0.6, -0.8]), (Hypot.apply, [3.0, 4.0]),
    (Lerp.apply, [1.5, -0.5, 0.3]),
    (Softplus.apply, [-2.0]), (Softplus.apply, [0.5]),
]


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("f, xs", CASES)
def test_function_gradcheck(V, f, xs):
    res = gradcheck(f, xs, value_type=V)
    assert res, str(res)


@pytest.mark.parametrize("V", ENGINES)
def test_function_values_and_grads(V):
    x, y = V(3.0), V(4.0)
    h = Hypot.apply(x, y)
    assert h.data == 5.0
    h.backward()
    assert (x.grad, y.grad) == (0.6, 0.8)
    c = V(2.0)
    out = Cube.apply(c)
    assert out.data == 8.0
    out.backward()
    assert c.grad == 12.0


@pytest.mark.parametrize("V", ENGINES)
def test_op_is_the_class_name(V):
    a, b = V(1.0), V(2.0)
    assert Cube.apply(a)._op == "Cube"
    assert Hypot.apply(a, b)._op == "Hypot"
    assert Lerp.apply(a, b, 0.5)._op == "Lerp"
    assert Hypot.apply(a, b)._prev == {a, b}


@pytest.mark.parametrize("V", ENGINES)
def test_numbers_become_constant_inputs(V):
    a = V(2.0)
    out = Lerp.apply(a, 10, 0.25)
    assert out.data == 2.0 + 0.25 * (10 - 2.0)
    out.backward()
    assert a.grad == 0.75
    assert Cube.apply(3).data == 27.0


@pytest.mark.parametrize("V", ENGINES)
def test_the_same_value_as_several_inputs(V):
    a = V(1.5)
    h = Hypot.apply(a, a)
    assert h.data == pytest.approx(1.5 * math.sqrt(2), rel=1e-15)
    h.backward()
    assert a.grad == pytest.approx(math.sqrt(2), rel=1e-15)
    res = gradcheck(lambda a, t: Lerp.apply(a, a * a, t), [0.8, 0.3], value_type=V)
    assert res, str(res)


def larger_graph(a, b, c):
    """Functions mixed with plain ops, with shared subexpressions."""
    u = Cube.apply(a * b)
    h = Hypot.apply(u + c, b.tanh())
    v = Lerp.apply(h, a, c.sigmoid())
    return (v * Softplus.apply(u - c) + h.exp()).relu() + Cube.apply(h) * 0.5


@pytest.mark.parametrize("V", ENGINES)
def test_functions_inside_a_larger_graph_gradcheck(V):
    res = gradcheck(larger_graph, [0.6, -0.9, 0.4], value_type=V)
    assert res, str(res)


def test_functions_are_bit_identical_on_both_engines():
    got = []
    for V in (C, R):
        xs = [V(0.6), V(-0.9), V(0.4)]
        out = larger_graph(*xs)
        out.backward()
        got.append([out.data] + [x.grad for x in xs])
    assert_same_doubles(got[0], got[1], "C vs reference (data, then grads)")


@pytest.mark.parametrize("V", ENGINES)
def test_backward_twice_accumulates(V):
    a, b = V(0.6), V(-0.8)
    h = Hypot.apply(a, b)
    h.backward()
    once = (a.grad, b.grad)
    h.backward()
    assert (a.grad, b.grad) == (2 * once[0], 2 * once[1])


def test_context_saves_values():
    ctx = Context()
    assert ctx.saved_values == ()
    ctx.save_for_backward(1.0, 2.0)
    assert ctx.saved_values == (1.0, 2.0)


def test_forward_gets_floats_and_backward_runs_at_apply_time():
    seen = []

    class Spy(Function):
        @staticmethod
        def forward(ctx, x, y):
            seen.append(("forward", type(x), type(y)))
            return x * y

        @staticmethod
        def backward(ctx, grad):
            seen.append(("backward", grad))
            return 1.0, 1.0

    out = Spy.apply(C(2.0), 3)
    assert seen == [("forward", float, float), ("backward", 1.0)]
    out.backward()
    assert len(seen) == 2        # the C backward does not call back into Python


# ---------------------------------------------------------------------------
# misuse


class TooFew(Function):
    @staticmethod
    def forward(ctx, x, y):
        return x + y

    @staticmethod
    def backward(ctx, grad):
        return (grad,)


class TooMany(Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


class BareGrad(Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad          # not a tuple


class StringGrad(Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return ("1",)


class StringForward(Function):
    @staticmethod
    def forward(ctx, x):
        return "x"

    @staticmethod
    def backward(ctx, grad):
        return (grad,)


@pytest.mark.parametrize("V", ENGINES)
def test_wrong_number_of_grads_raises(V):
    with pytest.raises(ValueError, match="2 grads"):
        TooFew.apply(V(1.0), V(2.0))
    with pytest.raises(ValueError, match="1 grads"):
        TooMany.apply(V(1.0))
    with pytest.raises(ValueError, match="1 grads"):
        BareGrad.apply(V(1.0))


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("bad", ["x", None, [1.0], 1j, object()])
def test_non_number_inputs_raise_type_error(V, bad):
    with pytest.raises(TypeError, match="Values or numbers"):
        Hypot.apply(V(1.0), bad)
    with pytest.raises(TypeError, match="Values or numbers"):
        Cube.apply(bad)


@pytest.mark.parametrize("V", ENGINES)
def test_non_number_results_raise_type_error(V):
    with pytest.raises(TypeError):
        StringGrad.apply(V(1.0))
    with pytest.raises(TypeError):
        StringForward.apply(V(1.0))


def test_no_inputs_raises():
    with pytest.raises(ValueError, match="at least one input"):
        Cube.apply()


def test_mixing_engines_raises_type_error():
    with pytest.raises(TypeError):
        Hypot.apply(C(1.0), R(2.0))
    with pytest.raises(TypeError):
        Hypot.apply(R(1.0), C(2.0))


def test_base_class_is_abstract():
    with pytest.raises(NotImplementedError):
        Function.apply(C(1.0))


@pytest.mark.parametrize("V", ENGINES)
def test_partials_stay_apply_times_after_an_input_changes(V):
    # A Function's partials are taken once, at apply() (function.py's doc),
    # and backward() uses them.  After an input's .data changed, the
    # reference engine's numeric pygrad.grad once ran forward/backward again
    # on the current numbers (27.0, C 12.0), and create_graph=True did on
    # both (found by an adversarial review).  Now the numbers are
    # backward()'s on both engines, and create_graph, which would
    # differentiate other numbers, is refused (as torch refuses a tensor
    # saved for backward and changed in place).
    x = V(2.0)
    y = DifferentiableCube.apply(x)
    x.data = 3.0
    y.backward()
    assert x.grad == 12.0
    assert pygrad.grad(y, x)[0].data == x.grad
    with pytest.raises(ValueError, match=r"DifferentiableCube .*changed its \.data after apply"):
        pygrad.grad(y, x, create_graph=True)
    x.data = 2.0                     # apply()'s number again: differentiable
    (g,) = pygrad.grad(y, x, create_graph=True)
    assert g.data == 12.0
    assert pygrad.grad(g, x)[0].data == 12.0       # d/dx 3x^2 = 6x
