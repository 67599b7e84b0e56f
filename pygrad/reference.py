"""The pure-Python reference engine: the same API as ``pygrad.Value``,
written as plainly as micrograd.

It is the correctness oracle of the tests and the baseline of the
benchmarks.  Each plain op's forward and gradient rule comes from the one
statement the C core is built from (pygrad/op_rules.py), evaluated over
Python floats with C's IEEE results, so the two engines produce identical
doubles.  Unlike micrograd,
children are kept in the order given and backward() walks them depth first
with an explicit stack, in csrc/backward.c's order, so results are
reproducible run to run and deep graphs do not recurse.
"""
import itertools
import math
import numbers
from typing import Any, Callable, Iterable, List, Set, Tuple, Union

from . import op_rules
from ._copies import new_leaf, state_of
from ._numbers import local_grad_numbers, real_or_none, value_data

__all__ = ["Value"]

# What an operator takes besides a Value (see pygrad/_value_ops.py).
Operand = Union["Value", float, int, numbers.Real]

_creation_counter = itertools.count()

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


def _relu_of(x: float) -> float:
    return 0.0 if x < 0.0 else x           # micrograd's: relu(-0.0) is -0.0


def _relu_slope(y: float) -> float:
    return float(y > 0.0)


def _sigmoid_of(x: float) -> float:
    if x >= 0.0:                          # never exp of a large positive number
        return _ieee.div(1.0, 1.0 + _ieee.exp(-x))
    e = _ieee.exp(x)
    return _ieee.div(e, 1.0 + e)


def _sign_of(x: float) -> float:
    return x if x != x else float((x > 0.0) - (x < 0.0))   # 0 at +-0, nan at nan


def _pow(x: float, e: float) -> float:
    return x if e == 1.0 else _ieee.pow(x, e)


def _powk(x: float, k: float) -> float:
    return x * x if k == 2.0 else _ieee.pow(x, k)


#: The functions the rules of pygrad/op_rules.py call, over floats: the
#: same names as C's (csrc/ops.c, csrc/activation.h), the same doubles.
FLOATS = {name: getattr(_ieee, name) for name in (
    "exp", "log", "tanh", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
    "asinh", "acosh", "atanh", "sqrt", "log2", "log10", "log1p", "expm1", "erf", "erfc",
    "fabs")}
FLOATS.update(div=_ieee.div, pow=_pow, powk=_powk, relu_of=_relu_of, relu_slope=_relu_slope,
              sigmoid_of=_sigmoid_of, sign_of=_sign_of)
_compiled: "list[Any]" = []


def float_rules() -> Any:
    """The rules over floats (a pygrad._rule_functions.Rules), compiled on
    first use, not at import."""
    if not _compiled:
        from ._rule_functions import Rules
        _compiled.append(Rules(FLOATS))
    return _compiled[0]


def _children_of(children: Iterable[Any]) -> Tuple["Value", ...]:
    """``children`` as a tuple of Values (TypeError for anything else)."""
    kids = tuple(children)
    for c in kids:
        if not isinstance(c, Value):
            raise TypeError(f"Value _children must be Values, not {type(c).__name__}")
    return kids


def _made(cls: type, data: float, children: Tuple[Any, ...], op: str) -> "Value":
    """An op's result, of the class pygrad.Value's ops give (docs/api.md,
    "The class an op returns"): ``cls`` (the class of the Value whose
    method ran) when it keeps Value's ``__init__``, its
    ``_pygrad_result_class`` if it names one, else Value; made with
    Value's own ``__init__``, as C makes results without the subclass's."""
    if cls is not Value:
        named = getattr(cls, "_pygrad_result_class", None)
        if isinstance(named, type) and issubclass(named, Value):
            cls = named
        elif getattr(cls, "__init__", None) is not Value.__init__:
            cls = Value
    out: "Value" = object.__new__(cls)
    Value.__init__(out, data, children, op)
    return out


class Value:
    """A scalar in a computation graph, with its gradient (pure Python)."""

    # __dict__: attributes of one's own (an optimizer's momentum buffer), as
    # on micrograd's Value and pygrad.Value.
    # _local_grads: set only on a Value made microgpt's way (below).
    # _rule: (op code, its constant, the op's own _backward) for an op of
    # pygrad/op_rules.py, which pygrad.grad reads; None for a leaf or a
    # custom op.
    __slots__ = ("data", "grad", "_backward", "_children", "_op", "label", "_created",
                 "_local_grads", "_rule", "__dict__", "__weakref__")

    def __init__(self, data: Any, _children: Iterable["Value"] = (),
                 _op: "Union[str, Iterable[float]]" = "", label: str = "") -> None:
        self.data = value_data(data, Value)
        self.grad = 0.0
        self._backward: Callable[[], None] = lambda: None
        self._children: Tuple["Value", ...] = _children_of(_children)
        self._op = _op
        self.label = label
        self._created = next(_creation_counter)
        self._rule: "Any" = None
        if not isinstance(_op, str):
            # microgpt's Value(data, children, local_grads)
            self._op = ""
            grads = self._local_grads = tuple(local_grad_numbers(_op, self._children))
            out = self

            def _backward() -> None:
                for child, g in zip(out._children, grads):
                    child.grad += g * out.grad
            self._backward = _backward
            self._rule = ("FUNCTION", None, _backward)

    def __copy__(self) -> "Value":
        """A new leaf with the same data, grad, label and attributes (as
        pygrad.Value's copies: the closures of a graph node stay behind)."""
        return _leaf(type(self), self.data, self.grad, self.label, state_of(self, Value))

    def __reduce_ex__(self, protocol: Any) -> Any:
        """deepcopy and pickle: a new leaf with the same data, grad, label and
        attributes, as ``pygrad.Value``'s (a closure can't be pickled)."""
        return _leaf, (type(self), self.data, self.grad, self.label), state_of(self, Value)

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

    # -- ops: each forward and gradient rule from pygrad/op_rules.py --------

    def _unary(self, code: str, name: str, cls: Any = None) -> "Value":
        """op(self); ``cls``: the class of the Value whose method ran, self's
        if None."""
        fwd, (_, grad) = float_rules().unary[code]
        out = _made(type(self) if cls is None else cls, fwd(self.data), (self,), name)

        def _backward() -> None:
            self.grad += grad(self.data, out.data, out.grad)
        out._backward = _backward
        out._rule = (code, None, _backward)
        return out

    def _binary(self, other: "Value", code: str, name: str, cls: Any = None) -> "Value":
        """self (op) other; ``cls``: the class of the Value whose method ran
        (other's, for a reflected operator), self's if None."""
        fwd, (guard_a, grad_a), (guard_b, grad_b) = float_rules().binary[code]
        out = _made(type(self) if cls is None else cls, fwd(self.data, other.data),
                    (self, other), name)
        # micrograd makes a - b as a + (b * -1) and a / b as a * b**-1, whose
        # hidden inner node keeps a grad that a second backward() adds to
        # again; `hidden` is that grad (csrc/ops.c keeps it in the node),
        # which b's rule takes in place of g.
        hidden = -0.0
        keeps_hidden = code in op_rules.HIDDEN_GRAD

        def _backward() -> None:
            nonlocal hidden
            a, b, y, g = self.data, other.data, out.data, out.grad
            if keeps_hidden:
                hidden += g
            if guard_a is None or guard_a(a, b, y, g):
                self.grad += grad_a(a, b, y, g)
            gb = hidden if keeps_hidden else g
            if guard_b is None or guard_b(a, b, y, gb):
                other.grad += grad_b(a, b, y, gb)
        out._backward = _backward
        out._rule = (code, None, _backward)
        return out

    def __add__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else self._binary(other, "ADD", "+")

    def __mul__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else self._binary(other, "MUL", "*")

    def _sub(self, other: "Value", cls: Any = None) -> "Value":
        return self._binary(other, "SUB", "-", cls)

    def _div(self, other: "Value", cls: Any = None) -> "Value":
        return self._binary(other, "DIV", "/", cls)

    def _pow_value(self, other: "Value", cls: Any = None) -> "Value":
        return self._binary(other, "POW", "**", cls)

    def __neg__(self) -> "Value":
        return self._unary("NEG", "neg")

    def _pow_const(self, k: float, name: str) -> "Value":
        fwd, (guard, grad) = float_rules().powk
        out = _made(type(self), fwd(self.data, k), (self,), "**" + name)

        def _backward() -> None:
            x, y, g = self.data, out.data, out.grad
            if guard(x, k, y, g):
                self.grad += grad(x, k, y, g)
        out._backward = _backward
        out._rule = ("POWK", k, _backward)
        return out

    def exp(self) -> "Value":
        return self._unary("EXP", "exp")

    def log(self) -> "Value":
        return self._unary("LOG", "log")

    def tanh(self) -> "Value":
        return self._unary("TANH", "tanh")

    def relu(self) -> "Value":
        return self._unary("RELU", "ReLU")

    def sigmoid(self) -> "Value":
        return self._unary("SIGMOID", "sigmoid")

    def sin(self) -> "Value":
        return self._unary("SIN", "sin")

    def cos(self) -> "Value":
        return self._unary("COS", "cos")

    def tan(self) -> "Value":
        return self._unary("TAN", "tan")

    def asin(self) -> "Value":
        return self._unary("ASIN", "asin")

    def acos(self) -> "Value":
        return self._unary("ACOS", "acos")

    def atan(self) -> "Value":
        return self._unary("ATAN", "atan")

    def sinh(self) -> "Value":
        return self._unary("SINH", "sinh")

    def cosh(self) -> "Value":
        return self._unary("COSH", "cosh")

    def asinh(self) -> "Value":
        return self._unary("ASINH", "asinh")

    def acosh(self) -> "Value":
        return self._unary("ACOSH", "acosh")

    def atanh(self) -> "Value":
        return self._unary("ATANH", "atanh")

    def sqrt(self) -> "Value":
        return self._unary("SQRT", "sqrt")

    def log2(self) -> "Value":
        return self._unary("LOG2", "log2")

    def log10(self) -> "Value":
        return self._unary("LOG10", "log10")

    def log1p(self) -> "Value":
        return self._unary("LOG1P", "log1p")

    def expm1(self) -> "Value":
        return self._unary("EXPM1", "expm1")

    def erf(self) -> "Value":
        return self._unary("ERF", "erf")

    def erfc(self) -> "Value":
        return self._unary("ERFC", "erfc")

    def abs(self) -> "Value":
        return self._unary("ABS", "abs")

    def __abs__(self) -> "Value":
        return self.abs()

    # -- operator plumbing, in micrograd's operand order ----------------------

    def __radd__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else self._binary(other, "ADD", "+")

    def __rmul__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else self._binary(other, "MUL", "*")

    def __sub__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else self._sub(other)

    def __rsub__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else other._sub(self, type(self))

    def __truediv__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else self._div(other)

    def __rtruediv__(self, other: Operand) -> "Value":
        other = self._operand(other)
        return other if other is NotImplemented else other._div(self, type(self))

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
        return other if other is NotImplemented else other._pow_value(self, type(self))

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


def _plain(a: Value, code: str, name: str, b: Any = None) -> Value:
    """An op of the fused functions below: a plain Value, whatever class its
    operands have (their own operators are not called), as each of
    pygrad's fused functions makes one plain Value."""
    return a._unary(code, name, Value) if b is None else a._binary(b, code, name, Value)


_ACTS = {"relu": ("RELU", "ReLU"), "tanh": ("TANH", "tanh"), "sigmoid": ("SIGMOID", "sigmoid")}


def dot(w: Iterable[Any], x: Iterable[Any], b: Any = None, act: Any = None) -> Value:
    """``act(b + w[0]*x[0] + ...)`` from plain ops (micrograd's neuron)."""
    w, x = list(w), list(x)
    if len(w) != len(x):
        raise ValueError(f"dot needs as many weights as inputs: {len(w)} != {len(x)}")
    if not w and b is None:
        raise ValueError("dot of nothing: give at least one term or a bias")
    terms = (_plain(_as_value(wi), "MUL", "*", _as_value(xi)) for wi, xi in zip(w, x))
    if b is None:
        out = next(terms)
    else:
        out = _as_value(b)
    for t in terms:
        out = _plain(out, "ADD", "+", t)
    if act in _ACTS:
        return _plain(out, *_ACTS[act])
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
        out = _plain(out, "ADD", "+", v)
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
    shifted = sum([_plain(_plain(v, "SUB", "-", Value(m)), "EXP", "exp") for v in vs])
    return _plain(_plain(shifted, "LOG", "log"), "ADD", "+", Value(m))


def sum_of_products(bias: Any, terms: "list[Value]") -> Value:
    """``bias + terms[0] * terms[1] + terms[2] * terms[3] + ...`` (bias None:
    none) as one node, as pygrad.grad(create_graph=True) gathers a
    gradient's terms: csrc/ops.c's fused LINEAR node, the same numbers, and
    a backward that adds to every child at once, in its order (the product
    nodes last term first, the bias just before the first), so gradient
    graphs have the same shape, and the same bits, on both engines."""
    kids = tuple(terms) if bias is None else (bias, *terms)
    first = 0 if bias is None else 1
    acc = kids[0].data if bias is not None else kids[0].data * kids[1].data
    for j in range(2 - first, len(kids), 2):
        acc = acc + kids[j].data * kids[j + 1].data
    out = Value(acc, kids, "linear")

    def _backward() -> None:
        g = out.grad
        j = len(kids)
        while j > first:
            if first and j - 2 == first:
                kids[0].grad += g
            w, x = kids[j - 2], kids[j - 1]
            w.grad += x.data * g
            x.grad += w.data * g
            j -= 2
        if first and len(kids) == 1:
            kids[0].grad += g
    out._backward = _backward
    out._rule = ("LINEAR", (None, bias is not None), _backward)
    return out


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
