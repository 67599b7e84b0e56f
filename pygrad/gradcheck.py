"""Compare backward() gradients with central finite differences."""
import math
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

from . import _backend
from ._numbers import is_value, to_real, to_setting

__all__ = ["gradcheck", "GradcheckResult"]


@dataclass
class GradcheckResult:
    """Per-input analytic and numeric gradients and the worst mismatch."""

    analytic: List[float]
    numeric: List[float]
    worst_index: int
    worst_error: float
    ok: bool

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        i = self.worst_index
        return (f"gradcheck {'passed' if self.ok else 'FAILED'}: worst at input {i}: "
                f"analytic {self.analytic[i]!r} vs numeric {self.numeric[i]!r} "
                f"(error {self.worst_error:.3g})")


def gradcheck(f: Callable[..., Any], inputs: Sequence[Any], eps: float = 1e-6,
              atol: float = 1e-5, rtol: float = 1e-4, value_type: Optional[type] = None,
              raise_on_failure: bool = False, order: int = 1) -> GradcheckResult:
    """Check ``f(*values)`` (a scalar Value) against finite differences.

    ``inputs`` are numbers (or Values, whose data is used).  Each input's
    gradient from ``backward()`` is compared with
    ``(f(x + eps) - f(x - eps)) / (2 eps)``; it passes when
    ``|analytic - numeric| <= atol + rtol * |numeric|`` for every input.
    With ``order=2`` the second derivatives are checked instead: the
    Hessian from ``pygrad.hessian`` (row by row, flattened) against central
    differences of ``backward()``'s gradient.  ``value_type`` picks the
    engine (default: pygrad.Value)."""
    V = value_type or _backend.DEFAULT.Value
    if order not in (1, 2):
        raise ValueError(f"gradcheck's order must be 1 or 2, not {order!r}")
    if not callable(f):
        raise TypeError(f"gradcheck's f must be callable, not {type(f).__name__}")
    if isinstance(inputs, (str, bytes)) or not hasattr(inputs, "__iter__"):
        raise TypeError(f"gradcheck's inputs must be a sequence of numbers, not {inputs!r}")
    eps = to_setting(eps, "eps")
    atol, rtol = to_setting(atol, "atol"), to_setting(rtol, "rtol")
    if eps == 0.0:
        raise ValueError("eps must be > 0")
    # A Value's data; numpy scalars have a .data (a memoryview) of their own.
    xs = [to_real(x.data if is_value(x) else x, "gradcheck input") for x in inputs]
    if not xs:
        raise ValueError("gradcheck needs at least one input")

    def run(values: List[float]) -> Any:
        vs = [V(x) for x in values]
        out = f(*vs)
        if not hasattr(out, "backward"):
            raise TypeError(f"f must return a Value, got {type(out).__name__}")
        return out, vs

    def gradient(values: List[float]) -> List[float]:
        out, vs = run(values)
        out.backward()
        return [v.grad for v in vs]

    def difference(i: int, at: Callable[[List[float]], Any]) -> Any:
        up, down = list(xs), list(xs)
        up[i] += eps
        down[i] -= eps
        return at(up), at(down)

    if order == 1:
        analytic = gradient(xs)
        numeric = []
        for i in range(len(xs)):
            up, down = difference(i, lambda p: run(p)[0].data)
            numeric.append((up - down) / (2 * eps))
    else:
        from .higher_order import hessian
        analytic = [float(h) for h in hessian(f, [V(x) for x in xs]).ravel()]
        columns = [difference(i, gradient) for i in range(len(xs))]
        # entry (j, i): d grad_j / d x_i
        numeric = [(columns[i][0][j] - columns[i][1][j]) / (2 * eps)
                   for j in range(len(xs)) for i in range(len(xs))]
    errors = [abs(a - n) - (atol + rtol * abs(n)) for a, n in zip(analytic, numeric)]
    errors = [math.inf if math.isnan(e) else e for e in errors]
    worst = max(range(len(errors)), key=errors.__getitem__)
    result = GradcheckResult(analytic, numeric, worst, abs(analytic[worst] - numeric[worst]),
                             errors[worst] <= 0)
    if raise_on_failure and not result.ok:
        raise AssertionError(str(result))
    return result
