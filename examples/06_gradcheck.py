"""Gradient checking: every built-in op, and an op of your own.

pygrad.gradcheck(f, inputs) runs f on Values, calls backward(), and
compares each input's grad with the central difference
(f(x + eps) - f(x - eps)) / 2 eps.  Here it checks every op pygrad has,
the fused ones included, and a user-defined pygrad.Function (softplus);
then it shows that a deliberately wrong backward is caught.

    python examples/06_gradcheck.py [--quick] [--out DIR]
"""
import math
from typing import Optional, Sequence

import pygrad
from pygrad import Function, gradcheck

from _common import check, parse_args


class Softplus(Function):
    """log(1 + e^x), with its derivative, the sigmoid, written by hand."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return math.log1p(math.exp(x))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_values
        return (grad / (1.0 + math.exp(-x)),)


class WrongSoftplus(Softplus):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_values
        return (grad / (1.0 + math.exp(x)),)      # the sign of x is wrong


OPS = {
    "a + b": (lambda a, b: a + b, [0.7, -1.3]),
    "a - b": (lambda a, b: a - b, [0.7, -1.3]),
    "a * b": (lambda a, b: a * b, [0.7, -1.3]),
    "a / b": (lambda a, b: a / b, [0.7, -1.3]),
    "-a": (lambda a: -a, [0.7]),
    "a ** 3": (lambda a: a ** 3, [0.7]),
    "a ** -0.5": (lambda a: a ** -0.5, [0.7]),
    "a ** b": (lambda a, b: a ** b, [0.7, 1.3]),
    "2 ** a": (lambda a: 2 ** a, [0.7]),
    "exp": (lambda a: a.exp(), [0.7]),
    "log": (lambda a: a.log(), [0.7]),
    "tanh": (lambda a: a.tanh(), [0.7]),
    "relu": (lambda a: a.relu(), [0.7]),
    "sigmoid": (lambda a: a.sigmoid(), [0.7]),
    "dot (tanh)": (lambda w0, w1, x0, x1, b: pygrad.dot([w0, w1], [x0, x1], b, "tanh"),
                   [0.3, -0.8, 1.1, 0.5, 0.2]),
    "sum": (lambda a, b, c: pygrad.sum([a, b, c]), [0.7, -1.3, 2.0]),
    "logsumexp": (lambda a, b, c: pygrad.logsumexp([a, b, c]), [0.7, -1.3, 2.0]),
    "softplus (Function)": (lambda a: Softplus.apply(a), [0.7]),
}


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parse_args(__doc__, argv)
    results = {}
    for name, (f, inputs) in OPS.items():
        results[name] = gradcheck(f, inputs)
        print(f"  {name:>20}: {results[name]}")
    wrong = gradcheck(lambda a: WrongSoftplus.apply(a), [0.7])
    print(f"  {'wrong softplus':>20}: {wrong}")
    check(all(r.ok for r in results.values()), f"all {len(results)} ops match finite differences")
    check(not wrong.ok, "the wrong backward is caught")
    return {"results": results, "wrong": wrong}


if __name__ == "__main__":
    main()
