"""The pure-Python reference engine: the same API as ``pygrad.Value``,
written as plainly as micrograd.

It is the correctness oracle of the tests and the baseline of the
benchmarks.  Each op mirrors its rule in csrc/ops.c expression for
expression, so the two engines produce identical doubles.  Unlike micrograd,
children are kept in the order given and backward() walks them depth first
with an explicit stack, in csrc/backward.c's order, so results are
reproducible run to run and deep graphs do not recurse.
"""
import itertools
import math
import numbers
from typing import Any, Callable, Iterable, List, Set, Tuple, Union

from ._copies import new_leaf
from ._numbers import local_grad_numbers, real_or_none, value_data

__all__ = ["Value"]

# What an operator takes besides a Value (see pygrad/_value_ops.py).
Operand = Union["Value", float, int, numbers.Real]

_creation_counter = itertools.count()

# The constants of csrc/ops.c, the same doubles.
_LN2 = 0.6931471805599453
_LN10 = 2.302585092994046
_TWO_OVER_SQRT_PI = 1.1283791670955126


# -- IEEE 754 results: C's, where Python's math raises ---------------------------

_inf = math.inf
_nan_value = math.nan


def _ieee_div(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a != a or a == 0.0:
            return _nan_value
        return math.copysign(_inf, a) * math.copysign(1.0, b)


def _ieee_exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return _inf


def _ieee_log(x: float) -> float:
    if x > 0.0 or x != x:
        return math.log(x)
    return -_inf if x == 0.0 else _nan_value


def _odd_integer(y: float) -> bool:
    return math.isfinite(y) and y == math.floor(y) and math.fmod(y, 2.0) != 0.0


def _ieee_pow(x: float, y: float) -> float:
    try:
        return math.pow(x, y)
    except ValueError:
        # math.pow's domain errors: x == 0 with y < 0 (C: _inf), and a
        # negative x with a non-integer y (C: _nan_value).
        if x == 0.0:
            return math.copysign(_inf, x) if _odd_integer(y) else _inf
        return _nan_value
    except OverflowError:
        return -_inf if x < 0.0 and _odd_integer(y) else _inf


def _ieee_tanh(x: float) -> float:
    return math.tanh(x)


# -- elementary functions: math's, with C's result where math raises ---------

def _nan(x: float) -> float:
    return _nan_value


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
    return math.copysign(_inf, x)


def _pole_or_nan(pole: float):
    """log-like: -_inf at the pole, _nan_value below it."""
    return lambda x: -_inf if x == pole else _nan_value


class _ieee:
    """C's IEEE 754 results for Python floats.  Python raises where C returns
    inf or nan (``1/0``, ``math.log(0)``, ``math.exp(1000)``, ``math.pow(0,
    -1)``); these return what C's libm returns, calling the same libm
    functions when no special case applies, so both engines agree bit for
    bit.  A new op whose math function raises gets its line here."""

    div = staticmethod(_ieee_div)
    exp = staticmethod(_ieee_exp)
    log = staticmethod(_ieee_log)
    pow = staticmethod(_ieee_pow)
    tanh = staticmethod(_ieee_tanh)
    sin = staticmethod(_libm(math.sin))                 # math raises at +-inf: C gives nan
    cos = staticmethod(_libm(math.cos))
    tan = staticmethod(_libm(math.tan))
    asin = staticmethod(_libm(math.asin))               # |x| > 1: nan
    acos = staticmethod(_libm(math.acos))
    atan = staticmethod(_libm(math.atan))
    sinh = staticmethod(_libm(math.sinh, on_overflow=_signed_inf))
    cosh = staticmethod(_libm(math.cosh, on_overflow=lambda x: _inf))
    asinh = staticmethod(_libm(math.asinh))
    acosh = staticmethod(_libm(math.acosh))             # x < 1: nan
    atanh = staticmethod(_libm(math.atanh, on_value_error=lambda x: (
        _signed_inf(x) if abs(x) == 1.0 else _nan_value)))
    sqrt = staticmethod(_libm(math.sqrt))               # x < 0: nan
    log2 = staticmethod(_libm(math.log2, on_value_error=_pole_or_nan(0.0)))
    log10 = staticmethod(_libm(math.log10, on_value_error=_pole_or_nan(0.0)))
    log1p = staticmethod(_libm(math.log1p, on_value_error=_pole_or_nan(-1.0)))
    expm1 = staticmethod(_libm(math.expm1, on_overflow=lambda x: _inf))
    erf = staticmethod(math.erf)
    erfc = staticmethod(math.erfc)
    fabs = staticmethod(math.fabs)


def _children_of(children: Iterable[Any]) -> Tuple["Value", ...]:
    """``children`` as a tuple of Values (TypeError for anything else)."""
    kids = tuple(children)
    for c in kids:
        if not isinstance(c, Value):
            raise TypeError(f"Value _children must be Values, not {type(c).__name__}")
    return kids


class Value:
    """A scalar in a computation graph, with its gradient (pure Python)."""

    # __dict__: attributes of one's own (an optimizer's momentum buffer), as
    # on micrograd's Value and pygrad.Value.
    # _local_grads: set only on a Value made microgpt's way (below).
    __slots__ = ("data", "grad", "_backward", "_children", "_op", "label", "_created",
                 "_local_grads", "__dict__", "__weakref__")

    def __init__(self, data: Any, _children: Iterable["Value"] = (),
                 _op: "Union[str, Iterable[float]]" = "", label: str = "") -> None:
        self.data = value_data(data, Value)
        self.grad = 0.0
        self._backward: Callable[[], None] = lambda: None
        self._children: Tuple["Value", ...] = _children_of(_children)
        self._op = _op
        self.label = label
        self._created = next(_creation_counter)
        if not isinstance(_op, str):
            # microgpt's Value(data, children, local_grads)
            self._op = ""
            grads = self._local_grads = tuple(local_grad_numbers(_op, self._children))
            out = self

            def _backward() -> None:
                for child, g in zip(out._children, grads):
                    child.grad += g * out.grad
            self._backward = _backward

    def __copy__(self) -> "Value":
        """A new leaf with the same data, grad, label and attributes (as
        pygrad.Value's copies: the closures of a graph node stay behind)."""
        return _leaf(type(self), self.data, self.grad, self.label, dict(self.__dict__))

    def __reduce_ex__(self, protocol: Any) -> Any:
        """deepcopy and pickle: a new leaf with the same data, grad, label and
        attributes, as ``pygrad.Value``'s (a closure can't be pickled)."""
        return _leaf, (type(self), self.data, self.grad, self.label), dict(self.__dict__) or None

    @property
    def _prev(self) -> Set["Value"]:
        return set(self._children)

    @_prev.setter
    def _prev(self, children: Iterable["Value"]) -> None:
        # As micrograd: the children backward() walks (in the set's order).
        self._children = _children_of(children)

    def _operand(self, other: Any) -> "Value":
        if isinstance(other, Value):
            return other
        k = real_or_none(other)
        return NotImplemented if k is None else Value(k)

    # -- ops: forward value and gradient rule side by side --------------------

    def __add__(self, other: Operand) -> "Value":
        other = self._operand(other)
        if other is NotImplemented:
            return other
        out = Value(self.data + other.data, (self, other), "+")

        def _backward() -> None:
            g = out.grad
            self.grad += g
            other.grad += g
        out._backward = _backward
        return out

    def __mul__(self, other: Operand) -> "Value":
        other = self._operand(other)
        if other is NotImplemented:
            return other
        out = Value(self.data * other.data, (self, other), "*")

        def _backward() -> None:
            g = out.grad
            self.grad += other.data * g
            other.grad += self.data * g
        out._backward = _backward
        return out

    # micrograd makes a - b as a + (b * -1) and a / b as a * b**-1, whose
    # hidden inner node keeps a grad that a second backward() adds to again;
    # `hidden` is that grad (csrc/ops.c keeps it in the node).

    def _sub(self, other: "Value") -> "Value":
        out = Value(self.data - other.data, (self, other), "-")
        hidden = -0.0

        def _backward() -> None:
            nonlocal hidden
            g = out.grad
            hidden += g
            self.grad += g
            other.grad += -hidden
        out._backward = _backward
        return out

    def _div(self, other: "Value") -> "Value":
        out = Value(_ieee.div(self.data, other.data), (self, other), "/")
        hidden = -0.0

        def _backward() -> None:
            nonlocal hidden
            g = out.grad
            hidden += g
            a, b = self.data, other.data
            self.grad += _ieee.div(g, b)
            other.grad += _ieee.div(-hidden * a, b * b)
        out._backward = _backward
        return out

    def __neg__(self) -> "Value":
        out = Value(-self.data, (self,), "neg")

        def _backward() -> None:
            self.grad += -out.grad
        out._backward = _backward
        return out

    def _pow_const(self, k: float, name: str) -> "Value":
        x = self.data
        out = Value(x * x if k == 2.0 else _ieee.pow(x, k), (self,), "**" + name)

        def _backward() -> None:
            if k != 0.0:
                x = self.data
                self.grad += (k * (x if k == 2.0 else _ieee.pow(x, k - 1.0))) * out.grad
        out._backward = _backward
        return out

    def _pow_value(self, other: "Value") -> "Value":
        out = Value(_ieee.pow(self.data, other.data), (self, other), "**")

        def _backward() -> None:
            g = out.grad
            x, y = self.data, other.data
            if y != 0.0:
                self.grad += (y * _ieee.pow(x, y - 1.0)) * g
            if not (x == 0.0 and y >= 0.0):
                other.grad += (out.data * _ieee.log(x)) * g
        out._backward = _backward
        return out

    def exp(self) -> "Value":
        out = Value(_ieee.exp(self.data), (self,), "exp")

        def _backward() -> None:
            self.grad += out.data * out.grad
        out._backward = _backward
        return out

    def log(self) -> "Value":
        out = Value(_ieee.log(self.data), (self,), "log")

        def _backward() -> None:
            self.grad += _ieee.div(out.grad, self.data)
        out._backward = _backward
        return out

    def tanh(self) -> "Value":
        out = Value(_ieee.tanh(self.data), (self,), "tanh")

        def _backward() -> None:
            t = out.data
            self.grad += (1.0 - t * t) * out.grad
        out._backward = _backward
        return out

    def relu(self) -> "Value":
        out = Value(0.0 if self.data < 0.0 else self.data, (self,), "ReLU")

        def _backward() -> None:
            self.grad += float(out.data > 0.0) * out.grad
        out._backward = _backward
        return out

    def sigmoid(self) -> "Value":
        x = self.data
        if x >= 0.0:
            s = _ieee.div(1.0, 1.0 + _ieee.exp(-x))
        else:
            e = _ieee.exp(x)
            s = _ieee.div(e, 1.0 + e)
        out = Value(s, (self,), "sigmoid")

        def _backward() -> None:
            s = out.data
            self.grad += (s * (1.0 - s)) * out.grad
        out._backward = _backward
        return out

    # Elementary functions: libm's, PyTorch's derivative formulas (csrc/ops.c).

    def sin(self) -> "Value":
        out = Value(_ieee.sin(self.data), (self,), "sin")

        def _backward() -> None:
            self.grad += _ieee.cos(self.data) * out.grad
        out._backward = _backward
        return out

    def cos(self) -> "Value":
        out = Value(_ieee.cos(self.data), (self,), "cos")

        def _backward() -> None:
            self.grad += -_ieee.sin(self.data) * out.grad
        out._backward = _backward
        return out

    def tan(self) -> "Value":
        out = Value(_ieee.tan(self.data), (self,), "tan")

        def _backward() -> None:
            self.grad += (1.0 + out.data * out.data) * out.grad
        out._backward = _backward
        return out

    def asin(self) -> "Value":
        out = Value(_ieee.asin(self.data), (self,), "asin")

        def _backward() -> None:
            x = self.data
            self.grad += _ieee.div(out.grad, _ieee.sqrt(1.0 - x * x))
        out._backward = _backward
        return out

    def acos(self) -> "Value":
        out = Value(_ieee.acos(self.data), (self,), "acos")

        def _backward() -> None:
            x = self.data
            self.grad += _ieee.div(-out.grad, _ieee.sqrt(1.0 - x * x))
        out._backward = _backward
        return out

    def atan(self) -> "Value":
        out = Value(_ieee.atan(self.data), (self,), "atan")

        def _backward() -> None:
            x = self.data
            self.grad += _ieee.div(out.grad, 1.0 + x * x)
        out._backward = _backward
        return out

    def sinh(self) -> "Value":
        out = Value(_ieee.sinh(self.data), (self,), "sinh")

        def _backward() -> None:
            self.grad += _ieee.cosh(self.data) * out.grad
        out._backward = _backward
        return out

    def cosh(self) -> "Value":
        out = Value(_ieee.cosh(self.data), (self,), "cosh")

        def _backward() -> None:
            self.grad += _ieee.sinh(self.data) * out.grad
        out._backward = _backward
        return out

    def asinh(self) -> "Value":
        out = Value(_ieee.asinh(self.data), (self,), "asinh")

        def _backward() -> None:
            x = self.data
            self.grad += _ieee.div(out.grad, _ieee.sqrt(x * x + 1.0))
        out._backward = _backward
        return out

    def acosh(self) -> "Value":
        out = Value(_ieee.acosh(self.data), (self,), "acosh")

        def _backward() -> None:
            x = self.data
            self.grad += _ieee.div(out.grad, _ieee.sqrt(x * x - 1.0))
        out._backward = _backward
        return out

    def atanh(self) -> "Value":
        out = Value(_ieee.atanh(self.data), (self,), "atanh")

        def _backward() -> None:
            x = self.data
            self.grad += _ieee.div(out.grad, 1.0 - x * x)
        out._backward = _backward
        return out

    def sqrt(self) -> "Value":
        out = Value(_ieee.sqrt(self.data), (self,), "sqrt")

        def _backward() -> None:
            self.grad += _ieee.div(out.grad, 2.0 * out.data)
        out._backward = _backward
        return out

    def log2(self) -> "Value":
        out = Value(_ieee.log2(self.data), (self,), "log2")

        def _backward() -> None:
            self.grad += _ieee.div(out.grad, self.data * _LN2)
        out._backward = _backward
        return out

    def log10(self) -> "Value":
        out = Value(_ieee.log10(self.data), (self,), "log10")

        def _backward() -> None:
            self.grad += _ieee.div(out.grad, self.data * _LN10)
        out._backward = _backward
        return out

    def log1p(self) -> "Value":
        out = Value(_ieee.log1p(self.data), (self,), "log1p")

        def _backward() -> None:
            self.grad += _ieee.div(out.grad, self.data + 1.0)
        out._backward = _backward
        return out

    def expm1(self) -> "Value":
        out = Value(_ieee.expm1(self.data), (self,), "expm1")

        def _backward() -> None:
            self.grad += (out.data + 1.0) * out.grad
        out._backward = _backward
        return out

    def erf(self) -> "Value":
        out = Value(_ieee.erf(self.data), (self,), "erf")

        def _backward() -> None:
            x = self.data
            self.grad += (_TWO_OVER_SQRT_PI * _ieee.exp(-(x * x))) * out.grad
        out._backward = _backward
        return out

    def erfc(self) -> "Value":
        out = Value(_ieee.erfc(self.data), (self,), "erfc")

        def _backward() -> None:
            x = self.data
            self.grad += (-_TWO_OVER_SQRT_PI * _ieee.exp(-(x * x))) * out.grad
        out._backward = _backward
        return out

    def abs(self) -> "Value":
        out = Value(_ieee.fabs(self.data), (self,), "abs")

        def _backward() -> None:
            x = self.data
            sign = x if x != x else float((x > 0.0) - (x < 0.0))   # 0 at 0, nan at nan
            self.grad += sign * out.grad
        out._backward = _backward
        return out

    def __abs__(self) -> "Value":
        return self.abs()

    # -- operator plumbing, in micrograd's operand order ----------------------

    def __radd__(self, other: Operand) -> "Value":
        return self + other

    def __rmul__(self, other: Operand) -> "Value":
        return self * other

    def __sub__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else self._sub(other)

    def __rsub__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else other._sub(self)

    def __truediv__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else self._div(other)

    def __rtruediv__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else other._div(self)

    def __pow__(self, other: Operand) -> "Value":
        if isinstance(other, Value):
            return self._pow_value(other)
        k = real_or_none(other)
        if k is None:
            return NotImplemented
        name = str(int(k)) if isinstance(other, numbers.Integral) else repr(k)
        return self._pow_const(k, name)

    def __rpow__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else other._pow_value(self)

    # -- backward ---------------------------------------------------------------

    def _topo(self) -> List["Value"]:
        """Every node below this one, children before parents: a depth-first
        walk that visits each node's children in order, as csrc/backward.c
        does (with an explicit stack, not recursion), so both engines add
        up each gradient in the same order."""
        seen = {id(self)}
        order: List["Value"] = []
        stack = [(self, iter(self._children))]
        while stack:
            node, kids = stack[-1]
            for child in kids:
                if id(child) not in seen:
                    seen.add(id(child))
                    stack.append((child, iter(child._children)))
                    break
            else:
                stack.pop()
                order.append(node)
        return order

    def backward(self) -> None:
        """Set this grad to 1 and accumulate (``+=``) every gradient below."""
        topo = self._topo()
        self.grad = 1.0
        for v in reversed(topo):
            v._backward()

    def __repr__(self) -> str:
        return f"Value(data={self.data}, grad={self.grad})"


# -- the fused ops of pygrad.functional, written with the plain ops ------------

def _as_value(v: Any) -> Value:
    return v if isinstance(v, Value) else Value(v)


def dot(w: Iterable[Any], x: Iterable[Any], b: Any = None, act: Any = None) -> Value:
    """``act(b + w[0]*x[0] + ...)`` from plain ops (micrograd's neuron)."""
    w, x = list(w), list(x)
    if len(w) != len(x):
        raise ValueError(f"dot needs as many weights as inputs: {len(w)} != {len(x)}")
    if not w and b is None:
        raise ValueError("dot of nothing: give at least one term or a bias")
    terms = (_as_value(wi) * _as_value(xi) for wi, xi in zip(w, x))
    if b is None:
        out = next(terms)
    else:
        out = _as_value(b)
    for t in terms:
        out = out + t
    if act in ("relu", "tanh", "sigmoid"):
        return getattr(out, act)()
    if act not in (None, "linear"):
        raise ValueError(f"act must be one of None, 'relu', 'tanh', 'sigmoid'; not {act!r}")
    return out


def sum(values: Iterable[Any], start: Any = None) -> Value:  # noqa: A001
    """``v0 + v1 + ...`` (after ``start`` if given), left to right."""
    vs = [] if start is None else [_as_value(start)]
    vs.extend(_as_value(v) for v in values)
    if not vs:
        raise ValueError("sum of nothing: give at least one value")
    out = vs[0]
    for v in vs[1:]:
        out = out + v
    return out


def logsumexp(values: Iterable[Any]) -> Value:
    """``log(sum(exp(v - m))) + m``, m the largest v (0 if infinite)."""
    vs = [_as_value(v) for v in values]
    if not vs:
        raise ValueError("logsumexp of nothing: give at least one value")
    m = vs[0].data
    for v in vs[1:]:
        if v.data > m:
            m = v.data
    if math.isinf(m):
        m = 0.0
    return sum([(v - m).exp() for v in vs]).log() + m


def detached_max(values: Iterable[Any]) -> Value:
    """The largest value's number as a new leaf (no gradient flows back)."""
    vs = [_as_value(v) for v in values]
    if not vs:
        raise ValueError("detached_max of nothing: give at least one value")
    return Value(max(v.data for v in vs))


def _leaf(cls: "type[Value]", data: float, grad: float, label: str, state: Any = None) -> Value:
    """A new leaf (what a copy or an unpickled Value becomes; pickles name
    this function)."""
    return new_leaf(Value, cls, data, grad, label, state)
