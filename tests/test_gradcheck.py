"""pygrad.gradcheck over every op, on both engines, and it catches a wrong
gradient."""
import pytest

import pygrad
from pygrad import Function, Value, gradcheck
from pygrad.reference import Value as RefValue

OPS = {
    "add": (lambda a, b: a + b, [0.3, -1.2]),
    "sub": (lambda a, b: a - b, [0.3, -1.2]),
    "mul": (lambda a, b: a * b, [0.3, -1.2]),
    "div": (lambda a, b: a / b, [0.3, -1.2]),
    "neg": (lambda a: -a, [0.7]),
    "pow_int": (lambda a: a ** 3, [0.7]),
    "pow_float": (lambda a: a ** 1.5, [0.7]),
    "pow_value": (lambda a, b: a ** b, [1.3, 0.6]),
    "rpow": (lambda a: 2.0 ** a, [0.4]),
    "rsub": (lambda a: 2 - a, [0.4]),
    "rdiv": (lambda a: 2 / a, [0.4]),
    "exp": (lambda a: a.exp(), [0.4]),
    "log": (lambda a: a.log(), [0.4]),
    "tanh": (lambda a: a.tanh(), [0.4]),
    "relu": (lambda a: a.relu(), [0.4]),
    "sigmoid": (lambda a: a.sigmoid(), [-0.4]),
}


@pytest.mark.parametrize("V", [Value, RefValue], ids=["c", "reference"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_passes_gradcheck(V, name):
    f, xs = OPS[name]
    result = gradcheck(f, xs, value_type=V)
    assert result.ok, str(result)


@pytest.mark.parametrize("act", [None, "relu", "tanh", "sigmoid"])
def test_fused_ops_pass_gradcheck(act):
    def f(w0, w1, x0, x1, b):
        h = pygrad.dot([w0, w1], [x0, x1], b, act)
        return pygrad.logsumexp([h, pygrad.sum([w0, x1, h]), b * 2])
    assert gradcheck(f, [0.3, -0.8, 1.1, 0.5, 0.2]).ok


def test_gradcheck_flags_a_wrong_gradient():
    class WrongSquare(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_values
            return (3 * x * grad,)       # should be 2x

    result = gradcheck(lambda a: WrongSquare.apply(a), [1.5])
    assert not result.ok
    assert result.analytic[0] == 4.5 and abs(result.numeric[0] - 3.0) < 1e-6
    with pytest.raises(AssertionError, match="FAILED"):
        gradcheck(lambda a: WrongSquare.apply(a), [1.5], raise_on_failure=True)
