"""What counts as a number for a Value, shared by both engines.

int, float, bool, fractions (numbers.Real) and numpy real scalars
(and 0-d arrays) are numbers; str, None, complex, lists and the like are not.
"""
import collections.abc as _abc
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
        # Not the number itself: 10**400 would print all 401 digits.
        raise ValueError(f"integer too large to convert to a float ({_digits(x)} digits; a "
                         f"float holds at most about 1.8e308): pygrad computes in floats, so "
                         f"give a number that fits one") from None


def _digits(x: Any) -> str:
    """How many decimal digits the integer x has, without printing it (str()
    of a huge int is slow, and refused above 4300 digits on Python 3.11+)."""
    n = abs(int(x))
    # 2**(bits-1) <= n < 2**bits, so floor(log10(n)) is e or e + 1:
    e = int((n.bit_length() - 1) * 0.30102999566398)
    return f"{e + 2 if n >= 10 ** (e + 1) else e + 1:,}"


def to_real(x: Any, what: str = "Value data") -> float:
    """``float(x)`` for a real number, else a TypeError that names the type."""
    v = real_or_none(x)
    if v is None:
        raise not_a_number(x, f"{what} must be a real number (int, float, bool, Fraction, "
                              f"numpy scalar or 0-d array), not {type(x).__name__}: {x!r}")
    return v


def value_data(x: Any, value_type: type, what: str = "Value data") -> float:
    """``to_real(x)`` for a Value's data; a Value of the same engine gets a
    TypeError that says what was likely meant."""
    if isinstance(x, value_type):
        raise TypeError(f"{what} must be a real number, not a Value ({x!r}): use the Value "
                        f"itself, or Value(v.data) for a new leaf with its number")
    return to_real(x, what)


def not_a_number(x: Any, message: str) -> TypeError:
    """The TypeError for a non-number x: when x is a Value (of the engine
    that could not take it), one that says engines can't be mixed."""
    if is_value(x):
        return TypeError(f"cannot mix Values of different engines in one graph: got a "
                         f"{type(x).__module__}.{type(x).__qualname__} ({message})")
    return TypeError(message)


def to_setting(x: Any, what: str, minimum: float = 0.0, below: Optional[float] = None) -> float:
    """A finite real number >= minimum (and < below), for a hyperparameter
    such as a learning rate; else a TypeError or ValueError naming it."""
    if is_value(x):
        raise TypeError(f"{what} must be a number, not a Value ({x!r}): pass v.data")
    v = to_real(x, what)
    if not (minimum <= v < (below if below is not None else float("inf"))):
        bound = f"in [{minimum:g}, {below:g})" if below is not None else f"finite and >= {minimum:g}"
        raise ValueError(f"{what} must be {bound}, not {x!r}")
    return v


def to_size(x: Any, what: str, minimum: int = 1) -> int:
    """An int >= minimum, for a size or count; else a TypeError or ValueError."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{what} must be an int, not {type(x).__name__}: {x!r}")
    if x < minimum:
        raise ValueError(f"{what} must be >= {minimum}, not {x!r}")
    return int(x)


def real_array(x: Any, what: str) -> Any:
    """``x`` as a contiguous float64 numpy array, for a bulk path (map,
    Inputs.set, set_data, load_state_dict, to_values): real numbers only,
    as ``Value()`` takes them.  A TypeError names the path and the dtype
    (None, strings, complex, ...); numpy would turn None into nan, "1e3"
    into 1000.0 and drop an imaginary part with only a warning."""
    import numpy as np
    try:
        arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    except (TypeError, ValueError) as e:        # ragged rows, ...
        raise TypeError(f"{what} must be an array of real numbers: {e}") from None
    kind = arr.dtype.kind
    if kind == "O":             # Python objects: each as Value() takes it
        flat = [to_real(v, f"each number of {what}") if not is_value(v) else _no_values(v, what)
                for v in arr.ravel().tolist()]
        return np.array(flat, dtype=np.float64).reshape(arr.shape)
    if kind not in "biuf":
        raise TypeError(f"{what} must hold real numbers (bool, int or float), not "
                        f"{arr.dtype} ({_KIND_NAMES.get(kind, 'other')})")
    out = np.ascontiguousarray(arr, dtype=np.float64)
    # C reads doubles: a view at an odd address (a slice of a byte buffer)
    # is copied to one that is aligned.
    return out if out.flags.aligned else out.copy()


def _no_values(v: Any, what: str) -> float:
    """The TypeError for a Value among a bulk path's numbers: these paths
    set or read many numbers at once and take no graph, so a Value is a
    mix-up (its number is ``.data``), not another engine."""
    raise TypeError(f"{what} must be numbers (floats, or a numpy array), not Values: got "
                    f"{v!r}; pass their numbers instead, v.data for each Value v")


_KIND_NAMES = {"c": "complex numbers", "U": "strings", "S": "bytes", "M": "datetimes",
              "m": "time deltas", "V": "raw records"}


def is_value(x: Any) -> bool:
    """Whether x is a Value of a micrograd-compatible engine, judged without
    running ``_prev`` (a property of pygrad's Values, which may walk the
    graph): on the class for pygrad's engines, on the instance for
    micrograd's."""
    t = type(x)
    if hasattr(t, "_prev"):
        return hasattr(t, "grad")
    d = getattr(x, "__dict__", None)
    return isinstance(d, dict) and "_prev" in d and "grad" in d


def local_grad_numbers(local_grads: Any, children: tuple) -> "list[float]":
    """microgpt's local gradients as floats, one per child, or a TypeError
    or ValueError that says what was wrong."""
    try:
        grads = list(local_grads)
    except TypeError:
        raise TypeError(
            f"Value's third argument is micrograd's op name (a str) or microgpt's local "
            f"gradients (one number per child), not {type(local_grads).__name__}") from None
    if len(grads) != len(children):
        raise ValueError(f"Value got {len(grads)} local gradient(s) for {len(children)} "
                         f"child(ren): give one number per child, in the children's order")
    out = []
    for g in grads:
        x = real_or_none(g)
        if x is None:
            raise TypeError(f"a local gradient must be a real number, not "
                            f"{type(g).__name__} ({g!r})")
        out.append(x)
    return out


def refuse_unordered(xs: Any, what: str) -> None:
    """A TypeError for a set or a mapping given where the order of the
    items names what each result is (compile's inputs and outputs,
    ``Inputs``, ``grad``'s inputs): iterating one gives an order the caller
    can't know."""
    if isinstance(xs, (_abc.Set, _abc.Mapping)):
        raise TypeError(f"{what} must be a sequence in order (a list or a tuple), not a "
                        f"{type(xs).__name__}: its order names each result")
