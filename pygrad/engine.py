"""The C-backed ``Value``: a drop-in for ``micrograd.engine.Value``.

A Value is a thin handle: ``_h`` names its node in C.  The numbers and the
graph live in C; each operator is one C call, and the forward and gradient
rules of every op are in csrc/ops.c.  Lifetime (csrc/memory.c,
pygrad/_lifetime.py): a new Value is stored in the table of fresh Values, and
settling later gives the Values still in use a claim of their own (``_s``).
A Python-held Value (a custom op, or an op over one) keeps its operands'
Values in ``_hold``; ``_kids`` caches ``_prev``.  There is one Value per
node, so ``_prev`` hands out the Values you hold, and the same ones on
every walk.  Attributes set on a Value are its own, as on any Python object.
"""
import functools
import numbers
import os
import weakref
from typing import Any, Callable, Iterable, Optional, Sequence, Set, Tuple

from . import _lifetime, _ops
from ._core import ffi, lib
from ._lifetime import check as _check
from ._lifetime import extras, held_fresh as _held_fresh, store as _store, values as _values
from ._lifetime import registry as _registry, new_claim as _new_claim, CLAIM as _CLAIM
from ._lifetime import makes_nodes
from ._copies import new_leaf
from ._numbers import real_or_none, value_data

__all__ = ["Value", "settle"]

_new = object.__new__
_ref = weakref.ref
_HELD = lib.PG_HELD
_powk_float, _powk_int = lib.pg_powk_float, lib.pg_powk_int

# The lifetime lock, bound here for custom ops' registrations (one call
# less an op); a forked child remakes it, and this follows.
_registration_lock = _lifetime.lock()


def _after_fork_in_child() -> None:
    global _registration_lock
    _registration_lock = _lifetime.lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def settle() -> None:
    """Free now the nodes whose Values are all gone (it runs a full garbage
    collection too, for custom ops' closure cycles).  pygrad settles by
    itself as each thread's segment of 4,096 nodes fills and at each full
    garbage collection; call it to make live-node counts exact."""
    _lifetime.settle()


@makes_nodes
def _attend(rc: int, kids: tuple, what: str = "a graph node") -> "Value":
    """A creator's result that is no plain handle: a Python-held node
    (PG_HELD - h), whose Value holds its operands' Values; or an error."""
    if rc > _HELD:
        _check(rc, what)
    h = _HELD - rc
    out = _new(Value)
    out._h = h
    out._hold = kids
    try:
        _values[h] = out
    except IndexError:     # a segment id new to the table
        _store(h, out)
    _held_fresh.append(h)
    return out


@makes_nodes
def _create(make: Callable[..., int], kids: tuple, *args: Any) -> "Value":
    """A node from ``make(*args)``, wrapped (the path of the less frequent
    ops; the hot dunders inline it).  ``kids``: the operand Values, held if
    the result is Python-held."""
    h = make(*args)
    if h < 0:
        return _attend(h, kids)
    out = _new(Value)
    out._h = h
    try:
        _values[h] = out
    except IndexError:     # a segment id new to the table
        _store(h, out)
    return out


@makes_nodes
def _run(h: int, n: int, kids: Optional[Callable[[int], tuple]] = None) -> "list[Value]":
    """Values for the n consecutive new nodes h, h + 1, ... (one segment);
    with ``kids``, Python-held ones holding ``kids(j)``."""
    _lifetime.reach(h + n - 1)
    values = []
    for j in range(n):
        v = _new(Value)
        v._h = h + j
        if kids is not None:
            v._hold = kids(j)
            _held_fresh.append(h + j)
        _values[h + j] = v
        values.append(v)
    return values


# -- the node factory the rest of the package builds with (_backend for nn,
# functional, data, Function): package-internal, so not in __all__ --------------

def make_nary(op: int, variant: int, handles: Any, n: int, kids: tuple = ()) -> "Value":
    """A fused n-ary node over the given C array of handles (of ``kids``)."""
    return _create(lib.pg_nary, kids, op, variant, handles, n)


@makes_nodes
def make_layer(act: int, params: Any, x: Any, nin: int, nout: int,
                param_values: "Sequence[Value]" = (), xs: "Sequence[Value]" = ()) -> "list[Value]":
    """nout fused LINEAR nodes over shared inputs (pygrad.nn.Layer)."""
    rc = lib.pg_linear_layer(act, params, x, nin, nout)
    if rc >= 0:
        return _run(rc, nout)
    if rc > _HELD:
        _check(rc, "a layer")
    k = nin + 1
    inputs = tuple(xs)
    return _run(_HELD - rc, nout, lambda j: tuple(param_values[j * k:(j + 1) * k]) + inputs)


@makes_nodes
def make_mlp(nlayers: int, acts: Any, params: Any, sizes: Any, x: Any,
              nout: int) -> "Optional[list[Value]]":
    """The layers of a fused MLP in one C call (pg_mlp): the hidden layers'
    outputs are nodes without Values (``_prev`` makes them on demand); the
    last layer's ``nout`` outputs become Values.  None when an input or
    parameter is Python-held: then the layers must be built one by one."""
    rc = lib.pg_mlp(nlayers, acts, params, sizes, x)
    if rc == lib.PG_E_HELD:
        return None
    return _run(_check(rc, "a model's layers"), nout)


@makes_nodes
def make_leaves(data: "Sequence[float]") -> "list[Value]":
    """Leaves holding ``data`` (pygrad.data.to_values), one C call per
    segment's worth."""
    buf = ffi.new("double[]", data)
    values: "list[Value]" = []
    step = lib.PG_SEG_NODES
    for start in range(0, len(data), step):
        n = min(step, len(data) - start)
        values += _run(_check(lib.pg_leaves(buf + start, n), "leaves"), n)
    return values


def make_function(data: float, kids: Any, partials: Any, n: int, name: str,
                   values: tuple = ()) -> "Value":
    """A pygrad.Function node with its captured partials."""
    out = _create(lib.pg_function, values, data, kids, partials, n)
    extras.get_or_create(out._h).op = name
    return out


_pg_leaf = lib.pg_leaf
_closed_segments = lib.pg_closed_segments


def _new_leaf(data: Any) -> int:
    """A new leaf's handle (or a PG_E_*): ``Value(x)``'s C call, for any
    real x but a float."""
    t = type(data)
    if t is float or t is int:
        try:
            h = lib.pg_leaf(data)      # cffi turns an int into a double as float(int) does
        except OverflowError:
            h = lib.pg_leaf(value_data(data, Value))
    else:
        h = lib.pg_leaf(value_data(data, Value))
    return h


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

    @makes_nodes
    def method(self: "Value", other: Any) -> "Value":
        t = type(other)
        if t is Value:
            h = make(self._h, other._h)
            if h >= 0:
                out = _new(Value)
                out._h = h
                try:
                    _values[h] = out
                except IndexError:     # a segment id new to the table
                    _store(h, out)
                return out
            return _attend(h, (self, other))
        if t is float or t is int:
            try:
                # cffi turns an int into a double as float(int) does
                h = make_k(self._h, other)
            except OverflowError:
                return _other_operand(self, other, make, make_k, False)
            if h >= 0:
                out = _new(Value)
                out._h = h
                try:
                    _values[h] = out
                except IndexError:     # a segment id new to the table
                    _store(h, out)
                return out
            return _attend(h, (self,))
        return _other_operand(self, other, make, make_k, False)

    method.__doc__ = doc
    return method


def _binary_swapped(op: _ops.Op, doc: str) -> Callable[["Value", Any], "Value"]:
    """A reflected dunder that keeps Python's operand order: other (op) self
    (``__rsub__``: ``2 - v``)."""
    code = op.key.upper()
    make = getattr(lib, "pg_binary_" + code)
    make_rk = getattr(lib, "pg_binary_rk_" + code)

    @makes_nodes
    def method(self: "Value", other: Any) -> "Value":
        t = type(other)
        if t is float or t is int:
            try:
                h = make_rk(other, self._h)
            except OverflowError:
                return _other_operand(self, other, make, make_rk, True)
            if h >= 0:
                out = _new(Value)
                out._h = h
                try:
                    _values[h] = out
                except IndexError:     # a segment id new to the table
                    _store(h, out)
                return out
            return _attend(h, (self,))
        return _other_operand(self, other, make, make_rk, True)

    method.__doc__ = doc
    return method


def _unary(op: _ops.Op, doc: str) -> Callable[["Value"], "Value"]:
    make = getattr(lib, "pg_unary_" + op.key.upper())

    @makes_nodes
    def method(self: "Value") -> "Value":
        h = make(self._h)
        if h >= 0:
            out = _new(Value)
            out._h = h
            try:
                _values[h] = out
            except IndexError:     # a segment id new to the table
                _store(h, out)
            return out
        return _attend(h, (self,))

    method.__doc__ = doc
    return method


_numbers_of = lib.pg_numbers


def _c_field(get: Callable[[int], float], put: Callable[[int, float], None], index: int,
             name: str, doc: str) -> Any:
    """A float field of the C node, readable and writable.  A Value that is
    written to keeps its node's address (``_p``: data, grad), so that an
    update loop's writes cost a store, not a call; reads cost the same
    either way."""
    def fget(self: "Value", _get: Callable[[int], float] = get) -> float:
        return _get(self._h)

    def fset(self: "Value", v: Any, _put: Callable[[int, float], None] = put,
             _i: int = index) -> None:
        t = type(v)
        if t is float or t is int:
            try:
                p = self._p
            except AttributeError:
                p = None
            if p is None:     # a custom op's Value starts with None (closures write to it)
                p = _numbers_of(self._h)
                if p == ffi.NULL:
                    _put(self._h, value_data(v, Value, name))
                    return
                self._p = p
            try:
                p[_i] = v      # cffi makes an int a double as float(int) does
                return
            except OverflowError:
                pass
        _put(self._h, value_data(v, Value, name))

    return property(fget, fset, doc=doc)


# What _describe says of a node: op, flags, record index (<< 16); and the
# op names of the table (None where the name depends on the node).
_D_OP = 0xFF
_D_PY_BACKWARD = lib.PG_F_PY_BACKWARD << 8
_describe = lib.pg_describe
_records = extras.items
_CUSTOM = lib.PG_OP_CUSTOM
_node_backward = lib.pg_node_backward
_kid_pair = lib.pg_kid_pair
_custom1 = lib.pg_custom1
_OP_NAMES: Tuple[Optional[str], ...] = tuple(
    None if op.code in (lib.PG_OP_POWK, lib.PG_OP_LINEAR, lib.PG_OP_CUSTOM, lib.PG_OP_FUNCTION)
    else op.name for op in _ops.OPS)


def _op_name(h: int, op: int) -> str:
    """The name of node h's op where it depends on the node."""
    if op == lib.PG_OP_POWK:
        k = lib.pg_exponent(h)
        return f"**{int(k)}" if lib.pg_flags(h) & lib.PG_F_INT_EXPONENT else f"**{k!r}"
    if op == lib.PG_OP_LINEAR:
        act = lib.pg_variant(h) & lib.PG_ACT_MASK
        return ("linear", "linear+ReLU", "linear+tanh", "linear+sigmoid")[act]
    return ""


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

    __slots__ = ("_h", "_s", "_hold", "_kids", "_name", "_label", "_p", "__dict__", "__weakref__")
    _h: int
    _p: Any          # the node's data and grad (a cffi double *), once written; or None
    _kids: Optional[Set["Value"]]
    _name: str
    _label: str

    @makes_nodes
    def __init__(self, data: Any, _children: Iterable["Value"] = (), _op: str = "",
                 label: str = "") -> None:
        if not _children and _op == "":      # a leaf: the common case
            t = type(data)
            h = _pg_leaf(data) if t is float else _new_leaf(data)
            if h < 0:
                _check(h, "a leaf")
            self._h = h
            try:
                _values[h] = self
            except IndexError:     # a segment id new to the table
                _store(h, self)
            if label:
                self.label = label
            return
        x = data if type(data) is float else value_data(data, Value)
        kids = tuple(_children)
        for c in kids:
            if not isinstance(c, Value):
                raise TypeError("Value _children must be pygrad.Values (C engine), not "
                                f"{type(c).__module__}.{type(c).__qualname__}")
        if type(_op) is not str or type(label) is not str:
            if not isinstance(_op, str) or not isinstance(label, str):
                raise TypeError("Value _op and label must be str")
        # Made in Python: held like a micrograd Value, its children too.  Its
        # node is born held by its claim (made empty first, so a Ctrl-C
        # anywhere leaves nothing held), and it is registered at once.
        claim = _new_claim(_CLAIM)
        if len(kids) == 1:
            rc = _custom1(x, kids[0]._h, claim)
        else:
            rc = lib.pg_custom(x, ffi.new("uint32_t[]", [c._h for c in kids]), len(kids), claim)
        if rc > _HELD:
            _check(rc, "a Value")
        h = self._h = _HELD - rc
        self._s = claim
        self._hold = kids
        self._p = None           # where its closure writes, found on the first write
        if kids:
            # C hands this node to Python in backward() already; its closure
            # (None: not set yet) lives where micrograd's does, in the
            # instance dict (a slot would cost every Value a GC visit).
            self.__dict__["_backward"] = None
        # The name of a custom node is its Value's: that Value lives as long
        # as the node (the Values above hold it, for its closure's sake).
        self._name = _op
        with _registration_lock:        # as every registration: a purge may run
            refs = _registry.refs       # Registry.add, written out (one call less)
            refs[h] = _ref(self)
            if len(refs) > 2 * _registry.live:
                _registry.purge()
        if label:
            self.label = label

    # -- numbers ------------------------------------------------------------

    data: float = _c_field(lib.pg_data, lib.pg_set_data, 0, "Value.data", "The forward value.")
    grad: float = _c_field(lib.pg_grad, lib.pg_set_grad, 1, "Value.grad",
                    "d(root)/d(self), accumulated by ``backward()``.")

    # -- graph --------------------------------------------------------------

    @property
    def _op(self) -> str:
        """The op's name, for drawing (``'+'``, ``'*'``, ``'**2'``, ...):
        micrograd's, or what was set."""
        try:
            return self._name       # a node's name never changes but by this setter
        except AttributeError:
            pass
        h = self._h
        d = _describe(h)
        record = _records[d >> 16] if d >> 16 else None
        name = record.op if record is not None else None
        if name is None:
            name = _OP_NAMES[d & _D_OP]
            if name is None:
                name = "" if d & _D_OP == _CUSTOM else _op_name(h, d & _D_OP)
        self._name = name
        return name

    @_op.setter
    def _op(self, name: str) -> None:
        # micrograd-style code names its own ops (out._op = '-'); the name is
        # the node's, like its label.
        if not isinstance(name, str):
            raise TypeError(f"_op must be str, not {type(name).__name__}")
        extras.get_or_create(self._h).op = name     # the node's, for a later Value of it
        self._name = name

    @property
    def _prev(self) -> Set["Value"]:
        """The children, as micrograd's set of Values: the Values that exist
        for them (yours, while you hold them), the same set on every read."""
        try:
            kids = self._kids       # None: a Value _prev made, not read yet
        except AttributeError:
            kids = None
        if kids is not None:
            return kids
        h = self._h
        pair = _kid_pair(h)
        if pair >= 0:
            if not pair:                # a leaf
                kids = self._kids = set()
                return kids
            handles: Any = ((pair >> 2) & 0x3FFFFFFF, pair >> 32)[:pair & 3]
        else:
            handles = ffi.new("uint32_t[]", -pair)
            lib.pg_kids(h, handles, -pair)
        kids = self._kids = set(_lifetime.values_of(handles, Value))
        return kids

    @_prev.setter
    def _prev(self, children: Any) -> None:
        raise AttributeError("a pygrad.Value's children are fixed when it is made (they are "
                             "the C node's): make it with Value(data, children, op) and set "
                             "its _backward, as micrograd's own ops do")

    @property
    def label(self) -> str:
        """A name for drawing; it belongs to the node."""
        try:
            return self._label      # set only by this Value's setter, as the node's
        except AttributeError:
            pass
        e = _describe(self._h) >> 16
        record = _records[e] if e else None
        label = self._label = record.label if record is not None else ""
        return label

    @label.setter
    def label(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"label must be str, not {type(text).__name__}")
        extras.get_or_create(self._h).label = text  # the node's, for a later Value of it
        self._label = text

    @property
    def _backward(self) -> Callable[[], None]:
        """Push this node's grad into its children's grads (only them)."""
        h = self._h
        if _describe(h) & _D_PY_BACKWARD:   # first: most Values have no instance dict
            fn = self.__dict__.get("_backward")
            if fn is not None:
                return fn                       # None: micrograd's `lambda: None`
        return functools.partial(_node_backward, h)

    @_backward.setter
    def _backward(self, fn: Callable[[], None]) -> None:
        # A micrograd custom op: set it before the Value is used in another
        # op, so that the Values above hold this one (and so the closure).
        if not callable(fn):
            raise TypeError(f"_backward must be callable, not {type(fn).__name__}")
        own = self.__dict__
        if "_backward" in own:       # made by Value(data, children, op): flagged in C
            own["_backward"] = fn
            return
        if _is_noop(fn) and lib.pg_nkids(self._h) == 0:
            # micrograd's own default (`lambda: None`) set on a leaf, as code
            # written for micrograd does to its parameters: it changes nothing,
            # so the leaf stays a plain C leaf (fast, and compile() takes it).
            return
        _check(lib.pg_set_py_backward(self._h), "a custom op")
        own["_backward"] = fn

    def backward(self) -> None:
        """Backpropagate from this node: its grad is set to 1, every node
        below it accumulates (``+=``) its gradient, as micrograd does.  If it
        fails (a closure raises, Ctrl-C, no memory), every grad is left as
        it was; but a sweep with no custom op below is one call into C, and
        a Ctrl-C during it rises as it returns, with every grad applied."""
        h = self._h
        rc = lib.pg_backward(h, ffi.NULL)
        if rc == lib.PG_E_SWEEP:
            rc = _record_backward(h)
        if rc == lib.PG_E_NOMEM:
            raise MemoryError("pygrad: out of memory in backward()")
        if rc < 0:
            raise ValueError("pygrad: backward() on a Value whose node no longer exists")
        if _closed_segments(_lifetime.peek, 1):
            _lifetime.settle_closed()       # with the collector off, this is when

    # -- operators ----------------------------------------------------------

    # The other operator methods (__add__, exp, sin, ...) are made from the
    # op table (csrc/ops.def) below the class: see _add_op_methods.

    @makes_nodes
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
        try:
            h = make(self._h, k)
        except OverflowError:
            return _not_a_number(real_or_none(k))   # an int too large: ValueError
        if h >= 0:
            out = _new(Value)
            out._h = h
            try:
                _values[h] = out
            except IndexError:     # a segment id new to the table
                _store(h, out)
            return out
        return _attend(h, (self,))

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


def _record_backward(h: int) -> int:
    """backward() when a Python closure may lie below h: C records the
    order and saves the grads, then runs the rules, handing each closure to
    Python; whatever stops it, the saved grads are put back."""
    sweep = ffi.gc(ffi.new("pg_sweep *"), lib.pg_sweep_clear)
    try:
        rc = lib.pg_backward(h, sweep)
        while rc > 0:
            # No lock: the root's Values hold this one (_hold), so no settle
            # can drop it; it is in the table, or registered before it left.
            h = rc - 1
            v = _values[h] if h < len(_values) else None
            if v is None:
                r = _registry.refs.get(h)
                v = r() if r is not None else None
            if v is None:
                raise RuntimeError("pygrad: a custom op's _backward is gone: set _backward "
                                   "before the Value is used in another op, as micrograd's "
                                   "ops do")
            fn = v.__dict__.get("_backward")
            if fn is not None:     # None: never set, micrograd's `lambda: None`
                fn()
            rc = lib.pg_backward_resume(sweep)
        if rc == 0:
            # Kept only now: a Ctrl-C that came during the last call rose
            # as it returned, and the grads went back.
            lib.pg_sweep_keep(sweep)
        return rc
    finally:
        lib.pg_sweep_restore(sweep)        # nothing, once kept


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


_NOOP_CODE = (lambda: None).__code__.co_code


def _is_noop(fn: Any) -> bool:
    """Whether ``fn`` is a function of no arguments whose body only returns
    None (``lambda: None``, ``def f(): pass``)."""
    code = getattr(fn, "__code__", None)
    return (code is not None and code.co_code == _NOOP_CODE and code.co_argcount == 0
            and not getattr(fn, "__closure__", None))


def _state(v: Value) -> dict:
    """A Value's own attributes, less a custom op's closure and name."""
    return {k: x for k, x in v.__dict__.items() if k not in ("_backward", "_op")}


def _leaf(cls: "type[Value]", data: float, grad: float, label: str, state: Any = None) -> Value:
    """A new leaf (what a copy or an unpickled Value becomes; pickles name
    this function)."""
    return new_leaf(Value, cls, data, grad, label, state)
