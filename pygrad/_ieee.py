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


# -- elementary functions: math's, with C's result where math raises ---------

def _nan(x: float) -> float:
    return nan


def _libm(f, on_value_error=_nan, on_overflow=_nan):
    """``f`` (a math function, which calls libm) with C's results for the
    inputs where Python raises instead: ``on_value_error(x)`` (a domain or
    pole error), ``on_overflow(x)``."""
    def g(x: float) -> float:
        try:
            return f(x)
        except ValueError:
            return on_value_error(x)
        except OverflowError:
            return on_overflow(x)
    g.__name__ = f.__name__
    return g


def _signed_inf(x: float) -> float:
    return math.copysign(inf, x)


def _pole_or_nan(pole: float):
    """log-like: -inf at the pole, nan below it."""
    return lambda x: -inf if x == pole else nan


sin = _libm(math.sin)                 # math raises at +-inf: C gives nan
cos = _libm(math.cos)
tan = _libm(math.tan)
asin = _libm(math.asin)               # |x| > 1: nan
acos = _libm(math.acos)
atan = _libm(math.atan)
sinh = _libm(math.sinh, on_overflow=_signed_inf)
cosh = _libm(math.cosh, on_overflow=lambda x: inf)
asinh = _libm(math.asinh)
acosh = _libm(math.acosh)             # x < 1: nan
atanh = _libm(math.atanh, on_value_error=lambda x: _signed_inf(x) if abs(x) == 1.0 else nan)
sqrt = _libm(math.sqrt)               # x < 0: nan
log2 = _libm(math.log2, on_value_error=_pole_or_nan(0.0))
log10 = _libm(math.log10, on_value_error=_pole_or_nan(0.0))
log1p = _libm(math.log1p, on_value_error=_pole_or_nan(-1.0))
expm1 = _libm(math.expm1, on_overflow=lambda x: inf)
erf = math.erf
erfc = math.erfc
fabs = math.fabs
