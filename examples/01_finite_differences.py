"""The derivative of a scalar function, two ways.

Nudge an input by a small h and watch the output move: (f(x+h) - f(x-h)) / 2h
approximates df/dx.  pygrad's backward() gives the exact derivative of the
same expression in one pass, for every input at once.  This example prints
both, for a one-input and a three-input function, and shows how rounding
spoils the finite difference once h gets too small.

    python examples/01_finite_differences.py [--quick] [--out DIR]
"""
from typing import Optional, Sequence

from pygrad import Value

from _common import check, parse_args


def f(x):
    """3x^2 - 4x + 5: works on floats and on Values alike."""
    return 3 * x ** 2 - 4 * x + 5


def g(a, b, c):
    """a*b + c, then squashed: d/da = b * (1 - tanh^2), ..."""
    return (a * b + c).tanh()


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(__doc__, argv)
    x0 = 3.0
    x = Value(x0)
    y = f(x)
    y.backward()
    print(f"f(x) = 3x^2 - 4x + 5 at x = {x0}: f = {y.data}")
    print(f"  exact (backward):         df/dx = {x.grad}   (6x - 4 = {6 * x0 - 4})")
    errors = {}
    for h in ([1e-2, 1e-5, 1e-12] if args.quick else [1e-1, 1e-2, 1e-3, 1e-5, 1e-8, 1e-12]):
        estimate = (f(x0 + h) - f(x0 - h)) / (2 * h)
        errors[h] = abs(estimate - x.grad)
        print(f"  finite differences h={h:<6g}: df/dx ~ {estimate:.12f}  (error {errors[h]:.1e})")

    inputs = [Value(2.0), Value(-0.3), Value(0.4)]
    out = g(*inputs)
    out.backward()
    h = 1e-6
    numeric = []
    for i in range(3):
        up = [v.data + (h if j == i else 0.0) for j, v in enumerate(inputs)]
        down = [v.data - (h if j == i else 0.0) for j, v in enumerate(inputs)]
        numeric.append((g(*map(Value, up)).data - g(*map(Value, down)).data) / (2 * h))
    exact = [v.grad for v in inputs]
    print("g(a, b, c) = tanh(a*b + c) at (2, -0.3, 0.4):")
    for name, e, n in zip("abc", exact, numeric):
        print(f"  dg/d{name}: exact {e:+.10f}, finite differences {n:+.10f}")

    check(x.grad == 6 * x0 - 4, "backward gives exactly 6x - 4")
    check(errors[1e-5] < 1e-6, "h = 1e-5 agrees to 1e-6")
    check(errors[1e-12] > errors[1e-5], "a tiny h loses to rounding")
    check(all(abs(e - n) < 1e-8 for e, n in zip(exact, numeric)), "three inputs agree to 1e-8")
    return {"exact": x.grad, "errors": errors, "exact3": exact, "numeric3": numeric}


if __name__ == "__main__":
    main()
