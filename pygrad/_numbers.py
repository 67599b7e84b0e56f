"""What counts as a number for a Value, shared by both engines.

int, float, bool, fractions/decimals (numbers.Real) and numpy real scalars
(and 0-d arrays) are numbers; str, None, complex, lists and the like are not.
"""
import numbers
import sys
from typing import Any, Optional


def real_or_none(x: Any) -> Optional[float]:
    """``float(x)`` if x is a real number, else None.  Never raises for a
    non-number, so binary operators can return NotImplemented."""
    t = type(x)
    if t is float:
        return x
    if t is int or t is bool:
        try:
            return float(x)
        except OverflowError:
            return _int_to_float(x)
    if isinstance(x, numbers.Real):
        return _int_to_float(x) if isinstance(x, numbers.Integral) else float(x)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, (np.generic, np.ndarray)):
        if getattr(x, "ndim", 0) == 0 and x.dtype.kind in "biuf":
            return float(x)
    return None


def _int_to_float(x: Any) -> float:
    try:
        return float(x)
    except OverflowError:
        raise ValueError(f"integer {x!r} is too large to convert to a float") from None


def to_real(x: Any, what: str = "Value data") -> float:
    """``float(x)`` for a real number, else a TypeError that names the type."""
    v = real_or_none(x)
    if v is None:
        raise TypeError(f"{what} must be a real number (int, float, bool or numpy "
                        f"scalar), not {type(x).__name__}: {x!r}")
    return v
