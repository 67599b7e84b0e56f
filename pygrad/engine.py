"""The C-backed ``Value``: a drop-in for ``micrograd.engine.Value``.

A Value is a thin handle: ``_h`` names its node in C, ``_s`` holds the claim
that keeps the node's segment alive (pygrad/_lifetime.py).  The numbers and
the graph live in C; each operator is one C call.  The forward and gradient
rules of every op are in csrc/ops.c.
"""
import numbers
import weakref
from typing import Any, Callable, Iterable, Set, Tuple, Union

from . import _lifetime
from ._core import ffi, lib
from ._lifetime import BackwardHolder, Segment, extras
from ._numbers import real_or_none, to_real

__all__ = ["Value"]

Number = Union[int, float]
Operand = Union["Value", int, float]

_new = object.__new__
_SEG_BITS = lib.PG_SEG_BITS
_E_FULL, _E_NOMEM = lib.PG_E_FULL, lib.PG_E_NOMEM

# The segment new nodes go into.  Each op reads it once into a local, so a
# rollover by another thread can't separate a node from its claim.
_seg: Segment = None  # type: ignore[assignment]

# Values that graph walkers may meet again through ``_prev``: the ones made
# by ``Value(...)`` and the ones ``_prev`` handed out, by handle.
_canonical: "weakref.WeakValueDictionary[int, Value]" = weakref.WeakValueDictionary()

_op_names: Tuple[str, ...] = ()


def _retry(rc: int, tried: Segment, make: Callable[..., int], args: tuple) -> Tuple[Segment, int]:
    """Slow path of node creation.  PG_E_FULL means the segment is full, or
    an operand lives in a newer segment (another thread moved on): use the
    current segment, or open a new one."""
    global _seg
    while rc == _E_FULL:
        if _seg is tried:
            _seg = _lifetime.new_segment()
        tried = _seg
        rc = make(tried.sid, *args)
    if rc == _E_NOMEM:
        raise MemoryError("pygrad: out of memory for graph nodes")
    if rc < 0:
        raise ValueError("pygrad: invalid operand (a Value whose node no longer exists)")
    return tried, rc


def _end_segment() -> None:
    """Start new nodes in a fresh segment.  Called at each backward(): the
    graph just built then has no claim from the allocator, so it is freed as
    soon as the user drops it (otherwise the last segment would wait for
    4096 more nodes)."""
    global _seg
    if _seg is not None and lib.pg_seg_used(_seg.sid) > 0:
        _seg = _lifetime.new_segment()


def _current_segment() -> Segment:
    global _seg
    if _seg is None:
        _seg = _lifetime.new_segment()
    return _seg


def _create(make: Callable[..., int], *args: Any) -> "Value":
    """A node from ``make(sid, *args)`` in the current segment, wrapped (the
    path of the less frequent ops; the hot dunders inline it)."""
    seg = _seg or _current_segment()
    h = make(seg.sid, *args)
    if h < 0:
        seg, h = _retry(h, seg, make, args)
    out = _new(Value)
    out._h = h
    out._s = seg
    return out


def _make_nary(op: int, variant: int, handles: Any, n: int) -> "Value":
    """A fused n-ary node over the given C array of handles."""
    return _create(lib.pg_nary, op, variant, handles, n)


def _make_layer(act: int, params: Any, x: Any, nin: int, nout: int) -> "list[Value]":
    """nout fused LINEAR nodes over shared inputs (pygrad.nn.Layer)."""
    out = ffi.new("uint32_t[]", nout)
    seg = _seg or _current_segment()
    rc = lib.pg_linear_layer(seg.sid, act, params, x, nin, nout, out)
    if rc < 0:
        seg, rc = _retry(rc, seg, lib.pg_linear_layer, (act, params, x, nin, nout, out))
    values = []
    for h in out:
        v = _new(Value)
        v._h = h
        v._s = seg
        values.append(v)
    return values


def _make_function(data: float, kids: Any, partials: Any, n: int, name: str) -> "Value":
    """A pygrad.Function node with its captured partials."""
    out = _create(lib.pg_function, data, kids, partials, n)
    extras.get_or_create(out._h).op = name
    return out


def _not_a_number(other: Any) -> Any:
    """NotImplemented for an operand that is no number (Python then raises
    its TypeError), or a clearer TypeError for a Value of another engine."""
    if hasattr(other, "_prev") and hasattr(other, "grad"):
        raise TypeError(f"cannot mix a pygrad.Value (C engine) with a {type(other).__module__}."
                        f"{type(other).__qualname__} of another engine in one graph")
    return NotImplemented


def _binary(op: int, reflected: bool, doc: str) -> Callable[["Value", Any], "Value"]:
    """An arithmetic dunder: Value (op) Value, Value (op) number, number (op) Value.

    With a number, micrograd wraps it in a leaf Value; ``pg_binary_k`` makes
    that leaf and the op node in one call."""
    binary, binary_k = lib.pg_binary, lib.pg_binary_k
    k_first = 1 if reflected else 0

    def method(self: "Value", other: Any) -> "Value":
        seg = _seg
        if type(other) is Value or isinstance(other, Value):
            a, b = self._h, other._h
            if reflected:
                a, b = b, a
            h = binary(seg.sid, op, a, b)
            if h < 0:
                seg, h = _retry(h, seg, binary, (op, a, b))
        else:
            k = other if type(other) is float else real_or_none(other)
            if k is None:
                return _not_a_number(other)
            h = binary_k(seg.sid, op, self._h, k, k_first)
            if h < 0:
                seg, h = _retry(h, seg, binary_k, (op, self._h, k, k_first))
        out = _new(Value)
        out._h = h
        out._s = seg
        return out

    method.__doc__ = doc
    return method


def _unary(op: int, doc: str) -> Callable[["Value"], "Value"]:
    unary = lib.pg_unary

    def method(self: "Value") -> "Value":
        seg = _seg
        h = unary(seg.sid, op, self._h)
        if h < 0:
            seg, h = _retry(h, seg, unary, (op, self._h))
        out = _new(Value)
        out._h = h
        out._s = seg
        return out

    method.__doc__ = doc
    return method


def _c_field(get: Callable[[int], float], put: Callable[[int, float], None], name: str,
             doc: str) -> property:
    """A float field of the C node, readable and writable."""
    def fget(self: "Value") -> float:
        return get(self._h)

    def fset(self: "Value", v: Any) -> None:
        put(self._h, v if type(v) is float else to_real(v, name))

    return property(fget, fset, doc=doc)


class _PrevSet(set):
    """micrograd's ``_prev`` set; ``v in s`` also finds another Value of the
    same node (a Python variable made before ``_prev`` was first read)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "{" + ", ".join(map(repr, self)) + "}" if self else "set()"

    def __contains__(self, v: object) -> bool:
        if set.__contains__(self, v):
            return True
        h = getattr(v, "_h", None)
        return h is not None and any(x._h == h for x in self)


class Value:
    """A scalar in a computation graph, with its gradient.

    ``Value(data, _children=(), _op='', label='')`` as in micrograd.  Data
    and grad are stored as C doubles.
    """

    __slots__ = ("_h", "_s", "__weakref__")

    def __init__(self, data: Any, _children: Iterable["Value"] = (), _op: str = "",
                 label: str = "") -> None:
        x = to_real(data)
        kids = tuple(_children)
        for c in kids:
            if not isinstance(c, Value):
                raise TypeError("Value _children must be pygrad.Values (C engine), not "
                                f"{type(c).__module__}.{type(c).__qualname__}")
        if not isinstance(_op, str) or not isinstance(label, str):
            raise TypeError("Value _op and label must be str")
        seg = _seg or _current_segment()
        if kids or _op:
            arr = ffi.new("uint32_t[]", [c._h for c in kids])
            h = lib.pg_custom(seg.sid, x, arr, len(kids))
            if h < 0:
                seg, h = _retry(h, seg, lib.pg_custom, (x, arr, len(kids)))
        else:
            h = lib.pg_leaf(seg.sid, x)
            if h < 0:
                seg, h = _retry(h, seg, lib.pg_leaf, (x,))
        self._h = h
        self._s = seg
        if _op or label:
            extra = extras.get_or_create(h)
            extra.op = _op
            extra.label = label
        _canonical[h] = self

    # -- numbers ------------------------------------------------------------

    data = _c_field(lib.pg_data, lib.pg_set_data, "Value.data", "The forward value.")
    grad = _c_field(lib.pg_grad, lib.pg_set_grad, "Value.grad",
                    "d(root)/d(self), accumulated by ``backward()``.")

    # -- graph --------------------------------------------------------------

    @property
    def _op(self) -> str:
        global _op_names
        h = self._h
        op = lib.pg_op(h)
        if op == lib.PG_OP_POWK:
            k = lib.pg_exponent(h)
            return f"**{int(k)}" if lib.pg_flags(h) & lib.PG_F_INT_EXPONENT else f"**{k!r}"
        if op == lib.PG_OP_CUSTOM or op == lib.PG_OP_FUNCTION:
            extra = extras.get(h)
            return extra.op if extra is not None else ""
        if op == lib.PG_OP_LINEAR:
            act = lib.pg_variant(h) & 3
            return ("linear", "linear+ReLU", "linear+tanh", "linear+sigmoid")[act]
        if not _op_names:
            _op_names = tuple(ffi.string(lib.pg_op_name(i)).decode()
                              for i in range(lib.PG_OP_COUNT))
        return _op_names[op]

    @property
    def _prev(self) -> Set["Value"]:
        """The children, as micrograd's set of Values."""
        h = self._h
        _canonical.setdefault(h, self)
        segs = {}
        out = _PrevSet()
        for i in range(lib.pg_nkids(h)):
            k = lib.pg_kid(h, i)
            v = _canonical.get(k)
            if v is None:
                v = _new(Value)
                v._h = k
                extra = extras.get(k)
                if extra is not None and extra.backward is not None:
                    v._s = BackwardHolder.reclaim(k, extra)
                    extra.holder = weakref.ref(v._s)
                else:
                    sid = k >> _SEG_BITS
                    v._s = segs.get(sid) or segs.setdefault(sid, _lifetime.claim(sid))
                _canonical[k] = v
            out.add(v)
        return out

    @property
    def label(self) -> str:
        """A name for drawing; shared by every Value of the same node."""
        extra = extras.get(self._h)
        return extra.label if extra is not None else ""

    @label.setter
    def label(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"label must be str, not {type(text).__name__}")
        extras.get_or_create(self._h).label = text

    @property
    def _backward(self) -> Callable[[], None]:
        """Push this node's grad into its children's grads (only them)."""
        h = self._h
        if lib.pg_flags(h) & lib.PG_F_PY_BACKWARD:
            extra = extras.get(h)
            fn = extra.python_backward() if extra is not None else None
            if fn is not None:
                return fn
        return lambda: lib.pg_node_backward(self._h)

    @_backward.setter
    def _backward(self, fn: Callable[[], None]) -> None:
        if not callable(fn):
            raise TypeError(f"_backward must be callable, not {type(fn).__name__}")
        h = self._h
        extra = extras.get_or_create(h)
        if lib.pg_set_py_backward(h) < 0:
            raise MemoryError("pygrad: out of memory setting _backward")
        holder = self._s
        if isinstance(holder, BackwardHolder):
            holder.backward = fn
        else:
            if extra.backward is not None:     # moved there by an earlier Value
                lib.pg_unpin(h)
                extra.backward = None
            holder = BackwardHolder(h, fn, extra)
            self._s = holder
        extra.holder = weakref.ref(holder)

    def backward(self) -> None:
        """Backpropagate from this node: its grad is set to 1, every node
        below it accumulates (``+=``) its gradient, as micrograd does."""
        _end_segment()
        sweep = ffi.new("pg_sweep **")
        rc = lib.pg_backward(self._h, sweep)
        while rc > 0:
            extra = extras.get(rc - 1)
            fn = extra.python_backward() if extra is not None else None
            try:
                if fn is not None:
                    fn()
            except BaseException:
                lib.pg_sweep_free(sweep[0])
                raise
            rc = lib.pg_backward_resume(sweep[0])
        if rc == _E_NOMEM:
            raise MemoryError("pygrad: out of memory in backward()")
        if rc < 0:
            raise ValueError("pygrad: backward() on a Value whose node no longer exists")

    # -- operators ----------------------------------------------------------

    __add__ = _binary(lib.PG_OP_ADD, False, "self + other")
    __radd__ = _binary(lib.PG_OP_ADD, False, "other + self (as micrograd: self + other)")
    __mul__ = _binary(lib.PG_OP_MUL, False, "self * other")
    __rmul__ = _binary(lib.PG_OP_MUL, False, "other * self (as micrograd: self * other)")
    __sub__ = _binary(lib.PG_OP_SUB, False, "self - other")
    __rsub__ = _binary(lib.PG_OP_SUB, True, "other - self")
    __truediv__ = _binary(lib.PG_OP_DIV, False, "self / other (IEEE: x / 0 is inf or nan)")
    __rtruediv__ = _binary(lib.PG_OP_DIV, True, "other / self")
    __rpow__ = _binary(lib.PG_OP_POW, True, "number ** self")
    __neg__ = _unary(lib.PG_OP_NEG, "-self")
    exp = _unary(lib.PG_OP_EXP, "e ** self")
    log = _unary(lib.PG_OP_LOG, "Natural log (IEEE: log(0) is -inf, log(x < 0) is nan)")
    tanh = _unary(lib.PG_OP_TANH, "Hyperbolic tangent")
    relu = _unary(lib.PG_OP_RELU, "max(0, self), micrograd's 'ReLU'")
    sigmoid = _unary(lib.PG_OP_SIGMOID, "1 / (1 + e ** -self), computed without overflow")
    _pow_value = _binary(lib.PG_OP_POW, False, "self ** Value")

    def __pow__(self, other: Any) -> "Value":
        """self ** other: a number exponent is a constant ('**2'), a Value
        exponent is differentiated too."""
        if isinstance(other, Value):
            return self._pow_value(other)
        k = real_or_none(other)
        if k is None:
            return _not_a_number(other)
        t = type(other)
        is_int = 0 if t is float else 1 if t is int or isinstance(other, numbers.Integral) else 0
        return _create(lib.pg_powk, self._h, k, is_int)

    def __repr__(self) -> str:
        return f"Value(data={self.data}, grad={self.grad})"

    # -- copies ---------------------------------------------------------------

    def __copy__(self) -> "Value":
        """Another Value of the same node (as copying a micrograd Value
        shares its data)."""
        out = _new(Value)
        out._h = self._h
        out._s = self._s
        return out

    def __reduce_ex__(self, protocol: Any) -> Any:
        """deepcopy and pickle: a leaf becomes a new leaf with the same data,
        grad and label; a node with children can't be detached from its graph."""
        if lib.pg_nkids(self._h) or lib.pg_op(self._h) != lib.PG_OP_LEAF:
            raise TypeError("only a leaf Value can be deep-copied or pickled; a graph node "
                            "can't leave its graph (copy its .data instead)")
        return _leaf, (self.data, self.grad, self.label)


def _leaf(data: float, grad: float, label: str) -> Value:
    """A new leaf (what a deep copy or an unpickled leaf Value becomes)."""
    v = Value(data, label=label)
    v.grad = grad
    return v
