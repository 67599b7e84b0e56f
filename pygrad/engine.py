"""The C-backed ``Value``: a drop-in for ``micrograd.engine.Value``.

A Value is a thin handle: ``_h`` names its node in C, ``_s`` holds the claim
that keeps the node alive (pygrad/_lifetime.py), and, for a node made in
Python, ``_kids`` holds its children's Values.  The numbers and the graph
live in C; each operator is one C call.  The forward and gradient rules of
every op are in csrc/ops.c.  Attributes set on a Value are its own, as on
any Python object; there is one Value per live node (``_prev`` hands out the
ones you hold).
"""
import numbers
from typing import Any, Callable, Iterable, Optional, Sequence, Set, Tuple, Union

from . import _lifetime, _ops
from ._core import ffi, lib
from ._lifetime import Segment, extras, registry
from ._numbers import real_or_none, value_data

__all__ = ["Value"]

Number = Union[int, float]
Operand = Union["Value", int, float]

_new = object.__new__
_new_leaf = _lifetime.new_leaf
_SEG_BITS = lib.PG_SEG_BITS
_E_FULL, _E_HELD, _HELD = lib.PG_E_FULL, lib.PG_E_HELD, lib.PG_HELD
_powk_float, _powk_int = lib.pg_powk_float, lib.pg_powk_int


class _NoSegment:
    """Stands for "no segment open": C refuses sid 0, which sends an op to
    the slow path, where a segment is opened."""

    __slots__ = ()
    sid = 0


# The segment new nodes go into.  Each op reads it once into a local, so a
# rollover by another thread can't separate a node from its claim.
_seg: Segment = _NoSegment()  # type: ignore[assignment]

_op_names: Tuple[str, ...] = ()


def _open_segment() -> Segment:
    """Start new nodes in a fresh segment (and settle kept Values, now and
    then: see _lifetime.Settler)."""
    global _seg
    try:
        seg = Segment()
    except MemoryError:
        # Let go of the full segment too: what it alone kept can then be freed.
        _seg = _NoSegment()  # type: ignore[assignment]
        raise
    registry.add_segment(seg)
    _seg = seg
    _lifetime.settler.segment_opened(seg, Value)
    return seg


def _end_segment() -> None:
    """Start new nodes in a fresh segment.  Called at each backward(): the
    graph just built then has no claim from the allocator, so it is freed as
    soon as the user drops it (otherwise the last segment would wait for
    4096 more nodes)."""
    if lib.pg_seg_used(_seg.sid) > 0:
        _open_segment()


def settle() -> None:
    """Let go of the segments kept only by Values that outlived their graph:
    each such Value then holds its own node, and the rest of its segment
    is freed.  pygrad does this by itself whenever kept segments have
    doubled (from 64); call it to make live-node counts exact now."""
    _end_segment()
    _lifetime.settler.settle(_seg, Value)


def _close(seg: Segment) -> None:
    """No new node goes into ``seg`` from now on."""
    if _seg is seg:
        _open_segment()


def _wrap(h: int, seg: Segment) -> "Value":
    out = _new(Value)
    out._h = h
    out._s = seg
    return out


def _held(h: int, kids: tuple) -> "Value":
    """The Value of a new Python-held node: it holds its own node claim and
    its children's Values."""
    out = _new(Value)
    out._h = h
    out._s = _lifetime.hold(h)
    out._kids = kids          # found through its parents' _kids: no registry
    return out


def _retry(rc: int, seg: Segment, make: Callable[..., int], args: tuple) -> Tuple[int, Segment]:
    """PG_E_FULL means the segment is full, or an operand lives in a newer
    segment (another thread moved on); sid 0 means none is open: use the
    current segment, or open a new one, until ``make(sid, *args)`` fits."""
    while rc == _E_FULL or not seg.sid:
        if _seg is seg:
            _open_segment()
        seg = _seg
        rc = make(seg.sid, *args)
    return rc, seg


def _finish(rc: int, seg: Segment, make: Callable[..., int], args: tuple,
            kids: tuple) -> "Value":
    """Slow path of node creation (see _retry); rc <= PG_HELD names a
    Python-held node."""
    rc, seg = _retry(rc, seg, make, args)
    if rc <= _HELD:
        return _held(_HELD - rc, kids)
    return _wrap(_lifetime._check(rc, "a graph node"), seg)


def _create(make: Callable[..., int], kids: tuple, *args: Any) -> "Value":
    """A node from ``make(sid, *args)`` in the current segment, wrapped (the
    path of the less frequent ops; the hot dunders inline it).  ``kids``:
    the operand Values, held if the result is Python-held."""
    seg = _seg
    h = make(seg.sid, *args)
    if h < 0:
        return _finish(h, seg, make, args, kids)
    return _wrap(h, seg)


def _make_nary(op: int, variant: int, handles: Any, n: int, kids: tuple = ()) -> "Value":
    """A fused n-ary node over the given C array of handles (of ``kids``)."""
    return _create(lib.pg_nary, kids, op, variant, handles, n)


def _make_layer(act: int, params: Any, x: Any, nin: int, nout: int,
                param_values: "Sequence[Value]" = (), xs: "Sequence[Value]" = ()) -> "list[Value]":
    """nout fused LINEAR nodes over shared inputs (pygrad.nn.Layer)."""
    out = ffi.new("uint32_t[]", nout)
    seg = _seg
    rc = lib.pg_linear_layer(seg.sid, act, params, x, nin, nout, out)
    if rc != 0:
        args = (act, params, x, nin, nout, out)
        rc, seg = _retry(rc, seg, lib.pg_linear_layer, args)
        _lifetime._check(rc, "a layer")
        if rc == 1:
            k = nin + 1
            inputs = tuple(xs)
            return [_held(out[j], tuple(param_values[j * k:(j + 1) * k]) + inputs)
                    for j in range(nout)]
    values = [_new(Value) for _ in range(nout)]
    for v, h in zip(values, out):
        v._h = h
        v._s = seg
    return values


def _make_mlp(nlayers: int, acts: Any, params: Any, sizes: Any, x: Any,
              nout: int) -> "Optional[list[Value]]":
    """The layers of a fused MLP in one C call (pg_mlp): the hidden layers'
    outputs are nodes without Values (``_prev`` makes them on demand); the
    last layer's ``nout`` outputs become Values.  None when an input or
    parameter is Python-held: then the layers must be built one by one."""
    seg = _seg
    h = lib.pg_mlp(seg.sid, nlayers, acts, params, sizes, x)
    if h < 0:
        if h == _E_HELD:
            return None
        h, seg = _retry(h, seg, lib.pg_mlp, (nlayers, acts, params, sizes, x))
        if h == _E_HELD:
            return None
        _lifetime._check(h, "a model's layers")
    values = [_new(Value) for _ in range(nout)]
    for v in values:
        v._h = h
        v._s = seg
        h += 1
    return values


def _make_leaves(data: "Sequence[float]") -> "list[Value]":
    """Leaves holding ``data`` (pygrad.data.to_values), made like op results
    in the current segment, one C call per segment's worth: no leaf-pool
    claim or registry entry per Value."""
    buf = ffi.new("double[]", data)
    values: "list[Value]" = []
    step = lib.PG_SEG_NODES
    for start in range(0, len(data), step):
        n = min(step, len(data) - start)
        args = (buf + start, n)
        seg = _seg
        h = lib.pg_segment_leaves(seg.sid, *args)
        if h < 0:
            h, seg = _retry(h, seg, lib.pg_segment_leaves, args)
            _lifetime._check(h, "leaves")
        for hi in range(h, h + n):
            v = _new(Value)
            v._h = hi
            v._s = seg
            values.append(v)
    return values


def _make_function(data: float, kids: Any, partials: Any, n: int, name: str,
                   values: tuple = ()) -> "Value":
    """A pygrad.Function node with its captured partials."""
    out = _create(lib.pg_function, values, data, kids, partials, n)
    extras.get_or_create(out._h).op = name
    return out


def _not_a_number(other: Any) -> Any:
    """NotImplemented for an operand that is no number (Python then raises
    its TypeError), or a clearer TypeError for a Value of another engine."""
    if hasattr(other, "_prev") and hasattr(other, "grad"):
        raise TypeError(f"cannot mix a pygrad.Value (C engine) with a {type(other).__module__}."
                        f"{type(other).__qualname__} of another engine in one graph")
    return NotImplemented


def _other_operand(self: "Value", other: Any, make: Callable[..., int],
                   make_k: Callable[..., int], swapped: bool) -> "Value":
    """The less common operands of a binary dunder: a Value subclass, a
    huge int, bool, Fraction, numpy scalar, or no number at all."""
    if isinstance(other, Value):
        if swapped:
            return _create(make, (other, self), other._h, self._h)
        return _create(make, (self, other), self._h, other._h)
    k = real_or_none(other)
    if k is None:
        return _not_a_number(other)
    return _create(make_k, (self,), *((k, self._h) if swapped else (self._h, k)))


def _binary(op: _ops.Op, doc: str) -> Callable[["Value", Any], "Value"]:
    """An arithmetic dunder: self (op) Value, self (op) number.

    With a number, micrograd wraps it in a leaf Value; the op's
    ``pg_binary_k_<CODE>`` makes that leaf and the op node in one call.
    Each op has its own C entry points, so that no op code is passed."""
    code = op.key.upper()
    make = getattr(lib, "pg_binary_" + code)
    make_k = getattr(lib, "pg_binary_k_" + code)

    def method(self: "Value", other: Any) -> "Value":
        seg = _seg
        t = type(other)
        if t is Value:
            h = make(seg.sid, self._h, other._h)
            if h >= 0:
                out = _new(Value)
                out._h = h
                out._s = seg
                return out
            return _finish(h, seg, make, (self._h, other._h), (self, other))
        if t is float or t is int:
            try:
                # cffi turns an int into a double as float(int) does
                h = make_k(seg.sid, self._h, other)
            except OverflowError:
                return _other_operand(self, other, make, make_k, False)
            if h >= 0:
                out = _new(Value)
                out._h = h
                out._s = seg
                return out
            return _finish(h, seg, make_k, (self._h, other), (self,))
        return _other_operand(self, other, make, make_k, False)

    method.__doc__ = doc
    return method


def _binary_swapped(op: _ops.Op, doc: str) -> Callable[["Value", Any], "Value"]:
    """A reflected dunder that keeps Python's operand order: other (op) self
    (``__rsub__``: ``2 - v``)."""
    code = op.key.upper()
    make = getattr(lib, "pg_binary_" + code)
    make_rk = getattr(lib, "pg_binary_rk_" + code)

    def method(self: "Value", other: Any) -> "Value":
        t = type(other)
        if t is float or t is int:
            seg = _seg
            try:
                h = make_rk(seg.sid, other, self._h)
            except OverflowError:
                return _other_operand(self, other, make, make_rk, True)
            if h >= 0:
                out = _new(Value)
                out._h = h
                out._s = seg
                return out
            return _finish(h, seg, make_rk, (other, self._h), (self,))
        return _other_operand(self, other, make, make_rk, True)

    method.__doc__ = doc
    return method


def _unary(op: _ops.Op, doc: str) -> Callable[["Value"], "Value"]:
    make = getattr(lib, "pg_unary_" + op.key.upper())

    def method(self: "Value") -> "Value":
        seg = _seg
        h = make(seg.sid, self._h)
        if h >= 0:
            out = _new(Value)
            out._h = h
            out._s = seg
            return out
        return _finish(h, seg, make, (self._h,), (self,))

    method.__doc__ = doc
    return method


def _c_field(get: Callable[[int], float], put: Callable[[int, float], None], name: str,
             doc: str) -> Any:
    """A float field of the C node, readable and writable."""
    def fget(self: "Value") -> float:
        return get(self._h)

    def fset(self: "Value", v: Any) -> None:
        put(self._h, v if type(v) is float else value_data(v, Value, name))

    return property(fget, fset, doc=doc)


from typing import TYPE_CHECKING  # noqa: E402  (beside its one use)

if TYPE_CHECKING:
    # The op methods are made below the class (_add_op_methods), out of a
    # type checker's sight: _value_ops declares them.
    from ._value_ops import TypedOps as _ValueBase
else:
    _ValueBase = object


class Value(_ValueBase):
    """A scalar in a computation graph, with its gradient.

    ``Value(data, _children=(), _op='', label='')`` as in micrograd.  Data
    and grad are stored as C doubles; any other attribute can be set, as on
    micrograd's Value.
    """

    __slots__ = ("_h", "_s", "_kids", "__dict__", "__weakref__")

    def __init__(self, data: Any, _children: Iterable["Value"] = (), _op: str = "",
                 label: str = "") -> None:
        if not _children and _op == "" and label == "":      # a leaf: the common case
            h, self._s = _new_leaf(data if type(data) is float else value_data(data, Value))
            self._h = h
            registry.add(self)
            return
        x = value_data(data, Value)
        kids = tuple(_children)
        for c in kids:
            if not isinstance(c, Value):
                raise TypeError("Value _children must be pygrad.Values (C engine), not "
                                f"{type(c).__module__}.{type(c).__qualname__}")
        if not isinstance(_op, str) or not isinstance(label, str):
            raise TypeError("Value _op and label must be str")
        seg = _seg
        if kids or _op:
            # Made in Python: held like a micrograd Value, its children too.
            args = (x, ffi.new("uint32_t[]", [c._h for c in kids]), len(kids))
            rc, _ = _retry(lib.pg_custom(seg.sid, *args), seg, lib.pg_custom, args)
            if rc > _HELD:
                _lifetime._check(rc, "a Value")
            h = _HELD - rc
            self._s = _lifetime.hold(h)
            self._kids = kids
        else:
            h, self._s = _new_leaf(x)
            self._h = h
            registry.add(self)
        self._h = h
        if label or _op:
            extra = extras.get_or_create(h)
            extra.label = label
            extra.op = _op or None

    # -- numbers ------------------------------------------------------------

    data: float = _c_field(lib.pg_data, lib.pg_set_data, "Value.data", "The forward value.")
    grad: float = _c_field(lib.pg_grad, lib.pg_set_grad, "Value.grad",
                    "d(root)/d(self), accumulated by ``backward()``.")

    # -- graph --------------------------------------------------------------

    @property
    def _op(self) -> str:
        """The op's name, for drawing (``'+'``, ``'*'``, ``'**2'``, ...):
        micrograd's, or what was set."""
        global _op_names
        h = self._h
        extra = extras.get(h)
        if extra is not None and extra.op is not None:
            return extra.op
        op = lib.pg_op(h)
        if op == lib.PG_OP_POWK:
            k = lib.pg_exponent(h)
            return f"**{int(k)}" if lib.pg_flags(h) & lib.PG_F_INT_EXPONENT else f"**{k!r}"
        if op == lib.PG_OP_CUSTOM or op == lib.PG_OP_FUNCTION:
            return ""
        if op == lib.PG_OP_LINEAR:
            act = lib.pg_variant(h) & lib.PG_ACT_MASK
            return ("linear", "linear+ReLU", "linear+tanh", "linear+sigmoid")[act]
        if not _op_names:
            _op_names = tuple(ffi.string(lib.pg_op_name(i)).decode()
                              for i in range(lib.PG_OP_COUNT))
        return _op_names[op]

    @_op.setter
    def _op(self, name: str) -> None:
        # micrograd-style code names its own ops (out._op = '-'); the name is
        # the node's, like its label.
        if not isinstance(name, str):
            raise TypeError(f"_op must be str, not {type(name).__name__}")
        extras.get_or_create(self._h).op = name

    @property
    def _prev(self) -> Set["Value"]:
        """The children, as micrograd's set of Values: the very Values that
        exist for them (yours, while you hold them)."""
        h = self._h
        n = lib.pg_nkids(h)
        if not n:
            return set()
        try:
            held = {v._h: v for v in self._kids}
        except AttributeError:
            held = {}
        return {held.get(k) or _value_of(k) for k in [lib.pg_kid(h, i) for i in range(n)]}

    @_prev.setter
    def _prev(self, children: Any) -> None:
        raise AttributeError("a pygrad.Value's children are fixed when it is made (they are "
                             "the C node's): make it with Value(data, children, op) and set "
                             "its _backward, as micrograd's own ops do")

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
        fn = self.__dict__.get("_backward")
        if fn is not None:
            return fn
        h = self._h
        return lambda: lib.pg_node_backward(h)

    @_backward.setter
    def _backward(self, fn: Callable[[], None]) -> None:
        # A micrograd custom op: set it before the Value is used in another
        # op, so that the Values above hold this one (and so the closure).
        if not callable(fn):
            raise TypeError(f"_backward must be callable, not {type(fn).__name__}")
        self.__dict__["_backward"] = fn
        try:
            self._kids
        except AttributeError:
            kids = tuple(self._prev)
            self._kids = kids
            self._s = _lifetime.hold(self._h)
        lib.pg_set_py_backward(self._h)

    def backward(self) -> None:
        """Backpropagate from this node: its grad is set to 1, every node
        below it accumulates (``+=``) its gradient, as micrograd does."""
        _end_segment()
        h = self._h
        rc = lib.pg_backward(h, ffi.NULL)
        if rc == lib.PG_E_SWEEP:
            # Python closures to run: C records the order into a sweep that
            # C frees (ffi.gc), however this loop ends.
            sweep = ffi.gc(ffi.new("pg_sweep *"), lib.pg_sweep_clear)
            rc = lib.pg_backward(h, sweep)
            closures = None
            while rc > 0:
                if closures is None:
                    closures = _closures_below(self)
                fn = closures.get(rc - 1)
                if fn is None:
                    raise RuntimeError("pygrad: a custom op's _backward is gone: set _backward "
                                       "before the Value is used in another op, as "
                                       "micrograd's ops do")
                fn()
                rc = lib.pg_backward_resume(sweep)
        if rc == lib.PG_E_NOMEM:
            raise MemoryError("pygrad: out of memory in backward()")
        if rc < 0:
            raise ValueError("pygrad: backward() on a Value whose node no longer exists")

    # -- operators ----------------------------------------------------------

    # The other operator methods (__add__, exp, sin, ...) are made from the
    # op table (csrc/ops.def) below the class: see _add_op_methods.

    def __pow__(self, other: Any) -> "Value":
        """self ** other: a number exponent is a constant ('**2'), a Value
        exponent is differentiated too."""
        t = type(other)
        if t is float:
            make, k = _powk_float, other
        elif t is int:
            make, k = _powk_int, other  # cffi turns it into a double as float() does
        elif isinstance(other, Value):
            return self._pow_value(other)
        else:
            k = real_or_none(other)
            if k is None:
                return _not_a_number(other)
            make = _powk_int if isinstance(other, numbers.Integral) else _powk_float
        seg = _seg
        try:
            h = make(seg.sid, self._h, k)
        except OverflowError:
            return _not_a_number(real_or_none(k))   # an int too large: ValueError
        if h >= 0:
            out = _new(Value)
            out._h = h
            out._s = seg
            return out
        return _finish(h, seg, make, (self._h, k), (self,))

    def __repr__(self) -> str:
        return f"Value(data={self.data}, grad={self.grad})"

    # -- copies ---------------------------------------------------------------

    def __copy__(self) -> "Value":
        """A new leaf with the same data, grad, label and attributes."""
        return _leaf(type(self), self.data, self.grad, self.label, _state(self))

    def __reduce_ex__(self, protocol: Any) -> Any:
        """deepcopy and pickle: a new leaf with the same data, grad, label and
        attributes (a graph node's children stay behind)."""
        return _leaf, (type(self), self.data, self.grad, self.label), _state(self) or None


def _add_op_methods(cls: type) -> None:
    """Give ``cls`` one method per ``methods`` entry of each unary and binary
    op of the table; a method written in the class body (``__pow__``) stays."""
    for op in _ops.METHOD_OPS:
        for m in op.methods:
            if m.name in cls.__dict__:
                continue
            fn: Callable[..., Value]
            if op.arity == 1:
                fn = _unary(op, m.doc)
            elif op.arity == 2:
                fn = (_binary_swapped if m.swapped else _binary)(op, m.doc)
            else:
                raise ValueError(f"op table: {op.key} has methods but arity {op.arity}")
            fn.__name__ = m.name
            fn.__qualname__ = f"{cls.__name__}.{m.name}"
            setattr(cls, m.name, fn)


_add_op_methods(Value)


def _state(v: Value) -> dict:
    """A Value's own attributes, less a custom op's closure and name."""
    return {k: x for k, x in v.__dict__.items() if k not in ("_backward", "_op")}


def _leaf(cls: "type[Value]", data: float, grad: float, label: str, state: Any = None) -> Value:
    """A new leaf (what a copy or an unpickled Value becomes); a subclass
    stays a subclass, without its __init__ being called (as pickle does)."""
    v = cls.__new__(cls)
    Value.__init__(v, data, label=label)
    v.grad = grad
    if state:
        v.__dict__.update(state)
    return v


def _value_of(h: int) -> Value:
    """The Value of live node h: the one that exists, else a new one."""
    v = registry.get(h)
    if v is None:
        seg = registry.segment(h >> _SEG_BITS)
        if seg is not None and not seg.found:
            _lifetime.find_values(seg, Value, _close)
            v = registry.get(h)
        if v is None:
            v = _new(Value)
            v._h = h
            v._s = _lifetime.hold(h)
            registry.add(v)
    return v


def _closures_below(root: Value) -> "dict[int, Callable[[], None]]":
    """Handle -> Python closure of the custom ops below ``root``.  Every node
    above a custom op holds its children's Values (``_kids``), so walking
    ``_kids`` from the root meets every closure backward() can reach."""
    found: "dict[int, Callable[[], None]]" = {}
    seen = set()
    stack = [root]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if lib.pg_flags(v._h) & lib.PG_F_PY_BACKWARD:     # don't make empty __dict__s
            found[v._h] = v.__dict__["_backward"]
        try:
            stack.extend(v._kids)
        except AttributeError:
            pass
    return found
