"""C's IEEE 754 results for Python floats, for the pure-Python engine.

Python raises where C returns inf or nan (``1/0``, ``math.log(0)``,
``math.exp(1000)``, ``math.pow(0, -1)``).  These helpers return what C's
libm returns, calling the same libm functions when no special case applies,
so both engines agree bit for bit.
"""
import math

inf = math.inf
nan = math.nan


def div(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a != a or a == 0.0:
            return nan
        return math.copysign(inf, a) * math.copysign(1.0, b)


def exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return inf


def log(x: float) -> float:
    if x > 0.0 or x != x:
        return math.log(x)
    return -inf if x == 0.0 else nan


def _odd_integer(y: float) -> bool:
    return math.isfinite(y) and y == math.floor(y) and math.fmod(y, 2.0) != 0.0


def pow(x: float, y: float) -> float:  # noqa: A001 - mirrors C's pow
    try:
        return math.pow(x, y)
    except ValueError:
        # math.pow's domain errors: x == 0 with y < 0 (C: inf), and a
        # negative x with a non-integer y (C: nan).
        if x == 0.0:
            return math.copysign(inf, x) if _odd_integer(y) else inf
        return nan
    except OverflowError:
        return -inf if x < 0.0 and _odd_integer(y) else inf


def tanh(x: float) -> float:
    return math.tanh(x)
