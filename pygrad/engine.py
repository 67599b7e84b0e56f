"""The C-backed ``Value``: a drop-in for ``micrograd.engine.Value``.

A Value is a thin Python object over a C node.  Its one slot ``_pg_keep``
is the node's keep (pygrad/_lifetime.py: the node's memory, and what it
points to, held by an immutable tuple); the numbers and the graph live in
C, each operator is one C call, and the forward and gradient rules of
every op are in csrc/ops.c.  A Value also holds the Values it was made
from (``_pg_a``, ``_pg_b``), as micrograd's ``_prev`` does, so ``_prev``
hands out your own Values, with their class and attributes.

An op's result has the class of the Value whose method ran (the left
operand's, or the right one's when a number is on the left) when that
class keeps Value's ``__init__``; a subclass with its own ``__init__``
gets a plain ``Value`` (its ``__init__`` never ran for the result, so
attributes it sets would be missing).  A subclass names another class with
the class attribute ``_pygrad_result_class`` (``_result_class`` reads it).
"""
import functools
import gc
import numbers
import sys
from typing import Any, Callable, Iterable, Iterator, Optional, Set, Tuple

from . import _ops
from ._core import ffi, lib
from ._copies import new_leaf
from ._lifetime import NODE_SIZE as _NODE_SIZE, POINTERS, Packed, check as _check
from ._lifetime import first_node, within
from ._numbers import real_or_none, value_data

__all__ = ["Value", "settle"]

_new = object.__new__
_alloc = ffi.new
# Node memory (pygrad/_lifetime.py): _node_memory(n * _NODE_SIZE) for n
# nodes, _node_memory(_ONE_SIZE) for one (set below Value: _one_size), and
# _node_memory(_PAIR_SIZE) for an op and its number's leaf
# (tests/internals.py wraps it to count live nodes).
_node_memory = bytes
_PAIR_SIZE = 2 * _NODE_SIZE
_NULL = ffi.NULL
_powk_float, _powk_int = lib.pg_powk_float, lib.pg_powk_int
_pg_leaf, _pg_leaf_v = lib.pg_leaf, lib.pg_leaf_v
# The collector and what an op makes (csrc/value_binding.h says why): the
# keep, and the Value of a class that tracks itself again when an
# attribute is set on it (Value.__setattr__).
_track, _finish = lib.pg_track, lib.pg_finish
_E_NUMBER = lib.PG_E_NUMBER
_is_tracked = gc.is_tracked


def settle() -> None:
    """Kept for code written against pygrad 0.x: a node is freed as soon
    as Python deallocates the last keep that holds it (at ``del``, or at
    the next garbage collection for a cycle), so there is nothing to settle.
    It runs a full garbage collection, which frees closure cycles now."""
    import gc
    gc.collect()


# -- the class an op returns ---------------------------------------------------

_RESULT_CLASS: "dict[type, type]" = {}
_UNTRACKED: "dict[type, bool]" = {}
_TRACKED: "set[type]" = set()      # the classes _untrackable says no to


def _result_class(cls: type) -> type:
    """The class of an op's result on a ``cls`` operand: ``cls`` itself when
    it keeps Value's ``__init__`` (ops make results without calling it),
    else ``Value``.  A subclass may name its own by defining the class
    attribute ``_pygrad_result_class``."""
    found = _RESULT_CLASS.get(cls)
    if found is None:
        found = getattr(cls, "_pygrad_result_class", None)
        if not (isinstance(found, type) and issubclass(found, Value)):
            found = cls if cls.__dict__.get("__init__", Value.__init__) is Value.__init__ \
                and getattr(cls, "__init__") is Value.__init__ else Value
        if isinstance(cls, type) and issubclass(cls, Value):    # (the dunders test operands here)
            _RESULT_CLASS[cls] = found
        _untrackable(found)
    return found


def _untrackable(cls: type) -> bool:
    """Whether a ``cls`` Value may leave the collector (csrc/value_binding.h):
    when nothing but Value.__setattr__ can give it a reference, that is,
    its class adds no slots and keeps Value's ``__setattr__``; and when it
    has no finalizer (the collector runs ``__del__`` of what it finds dead
    in a cycle's garbage, and so should it for such a Value)."""
    found = _UNTRACKED.get(cls)
    if found is None:
        found = _UNTRACKED[cls] = (
            cls.__setattr__ is Value.__setattr__ and not hasattr(cls, "__del__")
            and all(not c.__dict__.get("__slots__") for c in cls.__mro__ if c not in _VALUE_MRO))
        if not found:
            _TRACKED.add(cls)
    return found


def _result(self: "Value", keep: tuple, a: Any, b: Any) -> "Value":
    """The Value of an op on ``self`` (a subclass's instance), over keep."""
    cls = _result_class(type(self))
    out: Value = _new(cls)
    made = (out, keep, a, b)
    _finish(id(made))           # its slots, and the collector, as an op's entry point does
    if cls in _TRACKED:
        _track_below(out)
    return out


def _fail(rc: int, what: str = "a graph node") -> None:
    _check(rc, what)


def _op_failed(rc: int) -> None:
    """The exception of an op's entry point: its operands' nodes come from
    their keeps, so a bad argument means a keep that was overwritten."""
    if rc == lib.PG_E_ARG:
        raise TypeError("pygrad: an operand's node is missing (its _pg_keep was overwritten): "
                        "make the operand again from its data")
    _check(rc, "a graph node")


def _wrap(cls: type, keep: tuple, a: Any, b: Any) -> "Value":
    """A new ``cls`` over the node keep[0], holding the operands it was made
    from (a Value, None, or tuples of them); tracked by the collector (its
    maker tracks the op results below it: _track_below)."""
    out: Value = _new(cls)
    _set_keep(out, keep)
    _set_a(out, a)
    _set_b(out, b)
    return out


# -- the node factory the rest of the package builds with (_backend for nn,
# functional, data, Function): package-internal, so not in __all__ -------------

def make_nary(op: int, variant: int, values: "tuple[Value, ...]") -> "Value":
    """A fused n-ary node over ``values`` (their nodes, in order)."""
    kids = Packed(values)
    node = _node_memory(_ONE_SIZE)
    keep = (node, kids.ptrs, kids.keeps)
    rc = lib.pg_nary(node, op, variant, kids.ptrs, len(kids))
    if rc:
        _fail(rc)
    _track_below(*values)
    return _wrap(Value, keep, values, None)


def make_layer(act: int, params: Packed, param_values: tuple, xs: "tuple[Value, ...]",
               nin: int, nout: int) -> "list[Value]":
    """nout fused LINEAR nodes over shared inputs (pygrad.nn.Layer)."""
    x = Packed(xs)
    nodes = _node_memory(nout * _NODE_SIZE)
    edges = _alloc(POINTERS, lib.pg_layer_words(nin, nout))
    layer = (nodes, edges, params.keeps, x.keeps)
    rc = lib.pg_linear_layer(nodes, edges, act, params.ptrs, x.ptrs, nin, nout)
    if rc:
        _fail(rc, "a layer")
    _track_below(*xs)
    holds = (param_values, xs)
    first = first_node(nodes)
    return [_wrap(Value, (first + j, layer), holds, None) for j in range(nout)]


def make_mlp(acts: Any, params: "list[Packed]", sizes: "list[int]", param_values: tuple,
             xs: "tuple[Value, ...]") -> "list[Value]":
    """The layers of a fused MLP in one C call (pg_mlp): the hidden layers'
    outputs are nodes without Values (``_prev`` makes them on demand, one
    per node: the table in ``_pg_b``); the last layer's outputs become
    Values, holding the model's parameters and the inputs."""
    x = Packed(xs)
    nlayers = len(sizes) - 1
    total = sum(sizes[1:])
    words = sum(lib.pg_layer_words(sizes[i], sizes[i + 1]) for i in range(nlayers))
    nodes = _node_memory(total * _NODE_SIZE)
    edges = _alloc(POINTERS, words)
    arrays = _alloc("pg_node *const *[]", [p.ptrs for p in params])
    layer = (nodes, edges, tuple(p.keeps for p in params), x.keeps)
    rc = lib.pg_mlp(nodes, edges, nlayers, acts, arrays, _alloc("uint32_t[]", sizes), x.ptrs)
    if rc:
        _fail(rc, "a model's layers")
    _track_below(*xs)
    holds = (param_values, xs)
    table: "dict[Any, Value]" = {}
    last = first_node(nodes) + (total - sizes[-1])
    return [_wrap(Value, (last + j, layer), holds, table) for j in range(sizes[-1])]


def make_leaves(data: "list[float]") -> "list[Value]":
    """Leaves holding ``data`` (pygrad.data.to_values), in one C call."""
    n = len(data)
    nodes = _node_memory(n * _NODE_SIZE)
    rc = lib.pg_leaves(nodes, _alloc("double[]", data), n)
    if rc:
        _fail(rc, "leaves")
    keep = (nodes,)
    first = first_node(nodes)
    return [_wrap(Value, (first + i, keep), None, None) for i in range(n)]


def make_function(data: float, values: "tuple[Value, ...]", partials: "list[float]",
                  name: str) -> "Value":
    """A pygrad.Function node with its captured partials."""
    kids = Packed(values)
    n = len(kids)
    edges = _alloc(POINTERS, lib.pg_function_words(n))
    node = _node_memory(_ONE_SIZE)
    keep = (node, edges, kids.keeps)
    rc = lib.pg_function(node, data, kids.ptrs, _alloc("double[]", partials), n, edges)
    if rc:
        _fail(rc, "a Function's node")
    _track_below(*values)
    out = _wrap(Value, keep, values, None)
    out._op = name
    return out


def _not_a_number(other: Any) -> Any:
    """NotImplemented for an operand that is no number (Python then raises
    its TypeError), or a clearer TypeError for a Value of another engine."""
    if hasattr(other, "_prev") and hasattr(other, "grad"):
        raise TypeError(_mixed_message(other))
    return NotImplemented


def _mixed_message(other: Any) -> str:
    return (f"cannot mix a pygrad.Value (C engine) with a {type(other).__module__}."
            f"{type(other).__qualname__} of another engine in one graph: build every Value "
            "of a graph with one engine (with micrograd code, import Value and the nn "
            "classes from pygrad: `from pygrad.nn import MLP`)")


# -- the operator methods, made from the op table -------------------------------

def _operator(op: _ops.Op, doc: str, swapped: bool = False) -> Callable[..., "Value"]:
    """The dunder of a unary op, or of a binary op with the Value on the
    left (or, ``swapped``, on the right of a number: ``2 - v``).

    Every form takes the same steps: new node memory, its keep (the
    memory and the operands' keeps), one C call that fills the node, and
    the Value.  With a number, micrograd wraps it in a leaf Value: the
    node's memory has room for that leaf, and one call makes both."""
    code = op.key.upper()
    if op.arity == 1:
        make1 = getattr(lib, "pg_unary_" + code + "_v")

        def unary(self: "Value") -> "Value":
            cls = type(self)
            if cls is not Value:
                try:
                    cls = _RESULT_CLASS[cls]
                except KeyError:
                    cls = _result_class(cls)
            out = _new(cls)
            # both operands known: _prev needs no call
            made = (out, (_node_memory(_ONE_SIZE), self._pg_keep), self, self)
            rc = make1(id(made))
            if rc:
                _op_failed(rc)
            if cls is not Value and cls in _TRACKED:
                _track_below(out)
            return out

        unary.__doc__ = doc
        return unary

    name, name_k = "pg_binary_" + code, ("pg_binary_rk_" if swapped else "pg_binary_k_") + code
    plain, plain_k = getattr(lib, name), getattr(lib, name_k)    # for _odd_operand
    make, make_k = getattr(lib, name + "_v"), getattr(lib, name_k + "_v")

    def binary(self: "Value", other: Any) -> "Value":
        cls = type(self)
        if cls is not Value:
            try:
                cls = _RESULT_CLASS[cls]
            except KeyError:
                cls = _result_class(cls)
        out = _new(cls)
        t = type(other)
        # (a subclass met before as an operand's class is in _RESULT_CLASS:
        # a dict lookup is cheaper than isinstance)
        if t is Value or t in _RESULT_CLASS or (t is not float and t is not int
                                                and isinstance(other, Value)):
            # the node's children in the op's order: other first when swapped
            # (`w.__rsub__(v)` is v - w)
            memory = _node_memory(_ONE_SIZE)
            made: tuple = ((out, (memory, other._pg_keep, self._pg_keep), other, self) if swapped
                           else (out, (memory, self._pg_keep, other._pg_keep), self, other))
            rc = make(id(made))
        elif t is float or t is int:
            made = (out, (_node_memory(_PAIR_SIZE), self._pg_keep), self, None, other)
            rc = make_k(id(made))
            if rc == _E_NUMBER:       # an int too large for a double
                return _odd_operand(self, other, plain, plain_k, swapped)
        else:
            return _odd_operand(self, other, plain, plain_k, swapped)
        if rc:
            _op_failed(rc)
        if cls is not Value and cls in _TRACKED:
            _track_below(out)
        return out

    binary.__doc__ = doc
    return binary


def _odd_operand(self: "Value", other: Any, make: Callable[..., int],
                 make_k: Callable[..., int], swapped: bool) -> "Value":
    """The less common number operands of a binary dunder: a huge int, bool,
    Fraction, numpy scalar, or no number at all."""
    k = real_or_none(other)
    if k is None:
        return _not_a_number(other)
    ka = self._pg_keep
    node = _node_memory(_PAIR_SIZE)
    keep = (node, ka)
    rc = make_k(node, k, ka[0]) if swapped else make_k(node, ka[0], k)
    if rc:
        _fail(rc)
    return _result(self, keep, self, None)


def _add_op_methods(cls: type) -> None:
    """Give ``cls`` one method per ``methods`` entry of each unary and binary
    op of the table; a method written in the class body (``__pow__``) stays."""
    for op in _ops.METHOD_OPS:
        for m in op.methods:
            if m.name in cls.__dict__:
                continue
            if op.arity not in (1, 2):
                raise ValueError(f"op table: {op.key} has methods but arity {op.arity}")
            fn = _operator(op, m.doc, m.swapped)
            fn.__name__ = m.name
            fn.__qualname__ = f"{cls.__name__}.{m.name}"
            setattr(cls, m.name, fn)


# What _describe says of a node: op and flags; and the op names of the
# table (None where the name depends on the node).
_D_OP = 0xFF
_D_PY_BACKWARD = lib.PG_F_PY_BACKWARD << 8
_describe = lib.pg_describe
_CUSTOM = lib.PG_OP_CUSTOM
_node_backward = lib.pg_node_backward
_BINARY = frozenset(op.code for op in _ops.OPS if op.arity == 2)
_OP_NAMES: Tuple[Optional[str], ...] = tuple(
    None if op.code in (lib.PG_OP_POWK, lib.PG_OP_LINEAR, lib.PG_OP_CUSTOM, lib.PG_OP_FUNCTION)
    else op.name for op in _ops.OPS)


def _op_name(node: Any, op: int) -> str:
    """The name of a node's op where it depends on the node."""
    if op == lib.PG_OP_POWK:
        k = lib.pg_exponent(node)
        return f"**{int(k)}" if lib.pg_flags(node) & lib.PG_F_INT_EXPONENT else f"**{k!r}"
    if op == lib.PG_OP_LINEAR:
        act = lib.pg_variant(node) & lib.PG_ACT_MASK
        return ("linear", "linear+ReLU", "linear+tanh", "linear+sigmoid")[act]
    return ""


def _operands(v: "Value") -> Iterator["Value"]:
    """The Values ``v`` holds as its operands (``_pg_a``, ``_pg_b``: a
    Value, None, or nested tuples of them)."""
    stack = [getattr(v, "_pg_b", None), getattr(v, "_pg_a", None)]
    while stack:
        x = stack.pop()
        if x is None or type(x) is dict:
            continue
        if type(x) is tuple:
            stack.extend(reversed(x))
        elif isinstance(x, Value):
            yield x


def _node_of(v: Any) -> Any:
    """v's node pointer, or None for what is no Value with a keep."""
    keep = getattr(v, "_pg_keep", None)
    return first_node(keep[0]) if type(keep) is tuple and keep else None


def _track_below(*values: Any) -> None:
    """Put ``values`` (Values) back in the collector's sight, with every
    Value below them: a cycle closed by an attribute passes through them
    and down to the Value that holds it (``a.out = (a * 2) * 3``), and an
    op's result starts untracked (csrc/value_binding.h).  A Value already
    tracked has everything below it tracked, so the walk stops there: each
    Value is walked at most once in all."""
    stack = list(values)
    while stack:
        x = stack.pop()
        if _is_tracked(x) or (getattr(x, "_pg_a", None) is None
                              and getattr(x, "_pg_b", None) is None):
            continue    # (a leaf can be in a cycle only through an attribute of its own)
        _track(id(x))
        stack.extend(_operands(x))


def _track_referenced(value: Any) -> None:
    """_track_below for the Values an attribute refers to: the Value itself,
    the items of a list, tuple, set or dict, or a closure's cells (one
    level: what lies deeper is not looked for, docs/lifetime.md)."""
    if isinstance(value, Value):
        _track_below(value)
        return
    t = type(value)
    if t is list or t is tuple or t is set or t is frozenset:
        items: Iterable[Any] = value
    elif t is dict:
        items = value.values()
    else:
        cells = getattr(value, "__closure__", None)
        if type(cells) is not tuple:
            return
        items = []
        for c in cells:
            try:
                items.append(c.cell_contents)
            except ValueError:          # an empty cell
                pass
    _track_below(*[x for x in items if isinstance(x, Value)])


def _kids_of(v: "Value") -> Set["Value"]:
    """_prev, the slow way: the node's children, each as the Value that
    holds it (an operand), as the one made for it before (a fused model's
    table), or as a new Value held through v's keep."""
    keep = v._pg_keep
    node = keep[0]
    known = {}
    for x in _operands(v):
        p = _node_of(x)
        if p is not None:
            known[p] = x
    table = getattr(v, "_pg_b", None)
    if type(table) is not dict:
        table = None
    holds = (getattr(v, "_pg_a", None), None)
    kids = set()
    for i in range(lib.pg_nkids(node)):
        p = lib.pg_kid(node, i)
        kid = known.get(p)
        if kid is None and table is not None:
            kid = table.get(p)
        if kid is None:
            kid = _wrap(Value, within(keep, p), holds[0], table)
            if table is not None:
                table[p] = kid
        kids.add(kid)
    return kids


def _number_field(get: Callable[[Any], float], put: Callable[[Any, float], None], name: str,
                  doc: str) -> Any:
    """A float field of the C node (data, grad), readable and writable.
    Each access reads the keep into a local before it reads the node: the
    keep holds the node's memory for the call, whatever another thread or a
    number's ``__float__`` does to the attribute meanwhile."""
    def fget(self: "Value") -> float:
        keep = self._pg_keep
        return get(keep[0])

    def fset(self: "Value", v: Any) -> None:
        t = type(v)
        if t is not float and t is not int:
            v = value_data(v, Value, name)      # may run the number's own code
        keep = self._pg_keep
        try:
            put(keep[0], v)      # cffi makes an int a double as float(int) does
        except OverflowError:
            put(keep[0], value_data(v, Value, name))

    return property(fget, fset, doc=doc)


class _OpName:
    """``Value._op``: the op's name, for drawing (``'+'``, ``'*'``,
    ``'**2'``, ...), micrograd's.  A name set on a Value (``out._op =
    '-'``, a custom op's) lives in its instance dict, as micrograd keeps
    it, and comes first (this descriptor has no ``__set__``); else the
    name is read from the C node."""

    def __get__(self, v: Any, cls: Any = None) -> Any:
        if v is None:
            return self
        keep = v._pg_keep
        op = _describe(keep[0]) & _D_OP
        name = _OP_NAMES[op]
        if name is None:
            name = "" if op == _CUSTOM else _op_name(keep[0], op)
        return name


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
    micrograd's Value.  An op's result has the class of the operand whose
    method runs, when that class keeps Value's ``__init__`` (module doc).
    """

    __slots__ = ("_pg_keep", "_pg_a", "_pg_b", "_pg_kids", "__dict__", "__weakref__")
    _pg_keep: tuple   # the node's keep (pygrad/_lifetime.py): never written but here
    _pg_a: Any        # the operand Values it was made from (or None, or tuples)
    _pg_b: Any
    _pg_kids: Optional[Set["Value"]]
    #: A name for drawing: a str, kept in the instance dict once set (as the
    #: micrograd lecture's Value keeps it), "" until then.
    label: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # C takes any bytes object as node memory, so a keep must come from
        # the slot itself: a subclass may not answer for these names.
        super().__init_subclass__(**kwargs)
        taken = sorted(_OWN_SLOTS & cls.__dict__.keys())
        if taken:
            raise TypeError(f"{cls.__name__} defines {', '.join(taken)}: pygrad.Value's own "
                            f"slots (its C node's hold); give yours another name")

    def __init__(self, data: Any, _children: Iterable["Value"] = (), _op: str = "",
                 label: str = "") -> None:
        if getattr(self, "_pg_keep", _FRESH) is not _FRESH:     # (None once let go)
            raise TypeError("a pygrad.Value is initialised once: make a new Value instead")
        if not _children and _op == "":      # a leaf: the common case
            node = _node_memory(_ONE_SIZE)
            made = (self, (node,), None, None)
            if type(data) is float:
                rc = _pg_leaf_v(node, data, id(made))
            else:
                _new_leaf(node, data)
                rc = _finish(id(made))
            if rc:
                raise TypeError(f"Value.__init__ needs a Value, not {type(self).__name__}")
            t = type(self)
            if t is not Value and not _untrackable(t):
                _track(id(self))
            if label:
                self.label = label
            return
        x = data if type(data) is float else value_data(data, Value)
        kids = tuple(_children)
        for c in kids:
            if not isinstance(c, Value):
                raise TypeError(f"Value _children must be pygrad.Values (C engine), not "
                                f"{type(c).__module__}.{type(c).__qualname__}"
                                + (": " + _mixed_message(c) if hasattr(c, "_prev") else ""))
        if not isinstance(_op, str) or not isinstance(label, str):
            raise TypeError("Value _op and label must be str")
        # Made in Python, as micrograd's custom ops are: its backward is the
        # closure set on it (None until then: micrograd's `lambda: None`),
        # kept where micrograd keeps it, in the instance dict; backward()
        # finds this Value through the node's handle, which its keep holds.
        packed = Packed(kids)
        handle = ffi.new_handle(self)
        node = _node_memory(_ONE_SIZE)
        keep = (node, packed.ptrs, handle, packed.keeps)
        rc = lib.pg_custom(node, x, packed.ptrs, len(packed), handle)
        if rc:
            _fail(rc, "a Value")
        _track_below(*kids)
        _set_keep(self, keep)
        _set_b(self, None)
        _set_a(self, kids)
        if kids:
            self.__dict__["_backward"] = None
        self._op = _op
        if label:
            self.label = label

    def __setattr__(self, name: str, value: Any) -> None:
        # An attribute may refer back to this Value, or to a Value made from
        # it: the collector must see both, and an op's result starts
        # untracked (csrc/value_binding.h).
        # (Tracked first: a Ctrl-C between the two steps then leaves at
        # most a tracked Value without its attribute.)
        if name not in _NUMBER_FIELDS and type(value) not in _ATOMIC_TYPES:
            if name == "_pg_keep":
                # C reads the node from a keep without a check (a number
                # field is one cffi call): only pygrad makes keeps.  (An
                # atomic value has no node to read: what reads it raises.)
                raise TypeError("a pygrad.Value's _pg_keep holds its C node: it can be let go "
                                "(None), not replaced; make a new Value instead")
            if getattr(self, "_pg_a", _FRESH) is _FRESH:
                _set_a(self, None)      # being made: C then leaves it tracked
            if not _is_tracked(self):
                _track(id(self))
                _track_below(*_operands(self))
            _track_referenced(value)
        if (name == "label" or name == "_op") and not isinstance(value, str):
            raise TypeError(f"{name} must be str, not {type(value).__name__}")
        _setattr(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name == "_pg_keep":
            # let go, as `= None`: an empty slot would let __init__ run
            # again, over a node no optimizer or model holds
            _set_keep(self, None)
            return
        _delattr(self, name)

    # -- numbers ------------------------------------------------------------

    data: float = _number_field(lib.pg_data, lib.pg_set_data, "Value.data", "The forward value.")
    grad: float = _number_field(lib.pg_grad, lib.pg_set_grad, "Value.grad",
                                "d(root)/d(self), accumulated by ``backward()``.")

    # -- graph --------------------------------------------------------------

    _op: str = _OpName()  # type: ignore[assignment]

    @property
    def _prev(self) -> Set["Value"]:
        """The children, as micrograd's set of Values: the Values this one
        was made from (yours, with their class and attributes), and for a
        node made without one (a number's leaf, a fused layer's hidden
        node) a Value made on first read; the same set on every read.  The
        set can't be changed: the children are the C node's."""
        try:
            kids = self._pg_kids      # None until the first read (csrc/value_binding.h)
        except AttributeError:
            kids = None
        if kids is not None:
            return kids
        # The common case first: an op's Value holds its operands (a unary
        # op's twice), and its keep holds their keeps as they are now, in
        # child order: those are its node's children.
        keep = self._pg_keep
        try:
            a, b = self._pg_a, self._pg_b
        except AttributeError:
            a = b = None
        if isinstance(a, Value) and type(keep) is tuple:
            ka = getattr(a, "_pg_keep", None)
            n = len(keep)
            if n == 3 and keep[1] is ka and b is not None and keep[2] is getattr(b, "_pg_keep", None):
                kids = _Children((a, b))
                _set_kids(self, kids)       # children refer to no parent: no cycle
                return kids
            if n == 2 and keep[1] is ka:
                if b is a:                  # a unary op
                    kids = _Children((a,))
                elif (b is None and isinstance(keep[0], bytes) and len(keep[0]) >= _PAIR_SIZE
                      and _describe(keep[0]) & _D_OP in _BINARY):
                    # an op with a number: the number's leaf is the node
                    # after it, in the same memory
                    leaf = within(keep, first_node(keep[0]) + 1)
                    kids = _Children((a, _wrap(Value, leaf, None, None)))
                else:
                    kids = _Children(_kids_of(self))
                _set_kids(self, kids)
                return kids
        kids = _Children(_kids_of(self))
        _set_kids(self, kids)       # children refer to no parent: no cycle
        return kids

    @_prev.setter
    def _prev(self, children: Any) -> None:
        raise AttributeError("a pygrad.Value's children are fixed when it is made (they are "
                             "the C node's): make it with Value(data, children, op) and set "
                             "its _backward, as micrograd's own ops do")

    @property
    def _backward(self) -> Callable[[], None]:
        """Push this node's grad into its children's grads (only them)."""
        keep = self._pg_keep
        if _describe(keep[0]) & _D_PY_BACKWARD:   # first: most Values have no instance dict
            fn = self.__dict__.get("_backward")
            if fn is not None:
                return fn                       # None: micrograd's `lambda: None`
        rule: Any = functools.partial(_node_backward, keep[0])
        rule.keep = keep            # it holds what the rule touches
        return rule

    @_backward.setter
    def _backward(self, fn: Callable[[], None]) -> None:
        if not callable(fn):
            raise TypeError(f"_backward must be callable, not {type(fn).__name__}")
        own = self.__dict__
        if "_backward" in own:       # made by Value(data, children, op): flagged in C
            own["_backward"] = fn
            return
        keep = self._pg_keep
        if _is_noop(fn) and lib.pg_nkids(keep[0]) == 0:
            # micrograd's own default (`lambda: None`) set on a leaf, as code
            # written for micrograd does to its parameters: it changes nothing,
            # so the leaf stays a plain C leaf (fast, and compile() takes it).
            return
        own["_backward"] = fn
        lib.pg_set_py_backward(keep[0])

    def backward(self) -> None:
        """Backpropagate from this node: its grad is set to 1, every node
        below it accumulates (``+=``) its gradient, as micrograd does.  If it
        fails (a closure raises, Ctrl-C, no memory), every grad is left as
        it was; but a sweep with no custom op below is one call into C, and
        a Ctrl-C during it rises as it returns, with every grad applied."""
        keep = _get_keep(self)        # held for the whole sweep (_lifetime.py)
        rc = lib.pg_backward(keep[0], _NULL)
        if rc == lib.PG_E_SWEEP:
            rc = _record_backward(self, keep)
        if rc == lib.PG_E_NOMEM:
            raise MemoryError("pygrad: out of memory in backward()")
        if rc < 0:
            raise ValueError("pygrad: backward() on a Value without a node")

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
        ka = self._pg_keep
        node = _node_memory(_ONE_SIZE)
        keep = (node, ka)
        try:
            rc = make(node, ka[0], k)
        except OverflowError:
            return _not_a_number(real_or_none(k))   # an int too large: ValueError
        if rc:
            _fail(rc)
        return _result(self, keep, self, self)   # one child: self (see _prev)

    def __repr__(self) -> str:
        return f"Value(data={self.data}, grad={self.grad})"

    def _compared(self, other: Any) -> bool:
        raise TypeError(f"a pygrad.Value can't be ordered against {type(other).__name__}: "
                        "compare v.data (a float); inside micrograd's own code this means "
                        "a pygrad.Value became a micrograd Value's data, so the two engines "
                        "were mixed: import Value and the nn classes from pygrad "
                        "(`from pygrad.nn import MLP`)")

    __lt__ = __le__ = __gt__ = __ge__ = _compared

    # -- copies ---------------------------------------------------------------

    def __copy__(self) -> "Value":
        """A new leaf with the same data, grad, label and attributes."""
        return _leaf(type(self), self.data, self.grad, self.label, _state(self))

    def __reduce_ex__(self, protocol: Any) -> Any:
        """deepcopy and pickle: a new leaf with the same data, grad, label and
        attributes (a graph node's children stay behind)."""
        return _leaf, (type(self), self.data, self.grad, self.label), _state(self)


_setattr = object.__setattr__
_delattr = object.__delattr__
# Attributes that hold no reference a cycle could go through: numbers in C,
# and strings.
_ATOMIC_TYPES = frozenset({str, int, float, bool, type(None)})
# Fields whose value goes to the C node, not to the Value.
_NUMBER_FIELDS = frozenset({"data", "grad"})
_FRESH = object()
# Value's own slots: no subclass may define these names (__init_subclass__).
_OWN_SLOTS = frozenset({"_pg_keep", "_pg_a", "_pg_b", "_pg_kids"})
# The slots' own setters: the op path's stores, past Value.__setattr__.
_set_keep = Value.__dict__["_pg_keep"].__set__
# The slot itself, for backward(): nothing a subclass or an object that
# claims to be a Value answers for the name.
_get_keep = Value.__dict__["_pg_keep"].__get__
_set_a = Value.__dict__["_pg_a"].__set__
_set_b = Value.__dict__["_pg_b"].__set__
_set_kids = Value.__dict__["_pg_kids"].__set__


def _bind() -> None:
    """Tell C where a Value keeps its keep and operands, and where a node
    cdata keeps its pointer (csrc/value_binding.h), from objects whose
    fields hold known values."""
    probe, keep, a, b, kids = _new(Value), object(), object(), object(), object()
    _set_keep(probe, keep)
    _set_a(probe, a)
    _set_b(probe, b)
    _set_kids(probe, kids)
    memory = bytes(_PAIR_SIZE)
    pointer = first_node(memory) + 1
    described = (pointer, int(ffi.cast("uintptr_t", pointer)), ffi.typeof(pointer))
    if lib.pg_binding_init(id(probe), Value.__basicsize__, id(keep), id(a), id(b), id(kids),
                           id(described)):
        raise ImportError("pygrad: could not find Value's slots or a cdata's pointer in "
                          "their layouts")


_bind()


def _one_size() -> int:
    """The bytes of one node's memory.  CPython's allocator keeps small
    objects of each size (rounded up to 16 bytes) together; a Value and a
    node's bytes object can round to the same size (96 bytes on CPython
    3.11), and then a graph's nodes lie between its Values and backward(),
    which reads only nodes, reads twice the memory (measured: about 20% slower
    over a 600k-node chain).  So one node's memory is made 16 bytes larger
    where that happens."""
    def block(size: int) -> int:
        return -(-size // 16) * 16
    one = block(sys.getsizeof(bytes(_NODE_SIZE)))
    return _NODE_SIZE + (16 if one == block(sys.getsizeof(_new(Value))) else 0)


_ONE_SIZE = _one_size()
_VALUE_MRO = frozenset(Value.__mro__)


class _Children(set):
    """``_prev``: a set of the children's Values that can't be changed (the
    children are the C node's: micrograd's ``_prev.add(x)`` would change
    nothing pygrad's backward() does, so it raises instead)."""

    __slots__ = ()

    def _fixed(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a pygrad.Value's _prev can't be changed: its children are the C "
                        "node's, fixed when it is made; make a custom op with "
                        "Value(data, children, op) and set its _backward instead")

    def __repr__(self) -> str:
        return repr(set(self))

    add = discard = remove = pop = clear = update = _fixed
    difference_update = intersection_update = symmetric_difference_update = _fixed
    __ior__ = __iand__ = __isub__ = __ixor__ = _fixed  # type: ignore[assignment]


def _new_leaf(node: Any, data: Any) -> None:
    """``Value(x)``'s C call, for any real x but a float."""
    t = type(data)
    if t is int:
        try:
            _pg_leaf(node, data)   # cffi turns an int into a double as float(int) does
            return
        except OverflowError:
            pass
    _pg_leaf(node, value_data(data, Value))


def find_below(root: Value, node: Any) -> "Optional[Value]":
    """The Value over ``node`` among the Values ``root`` holds, transitively."""
    seen, stack = set(), [root]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if _node_of(v) == node:
            return v
        stack.extend(_operands(v))
    return None


def _record_backward(root: Value, keep: tuple) -> int:
    """backward() when a Python closure lies below the root: C records the
    order and saves the grads, then runs the rules, handing each closure to
    Python; whatever stops it, the saved grads are put back.  ``keep``
    holds every node the sweep walks."""
    sweep: Any = ffi.gc(ffi.new("pg_sweep *"), lib.pg_sweep_clear)
    try:
        rc = lib.pg_backward(keep[0], sweep)
        while rc > 0:
            node = sweep.py         # Any: the stub's cdata has no fields
            handle = lib.pg_py_handle(node)
            v = ffi.from_handle(handle) if handle != _NULL else find_below(root, node)
            if not isinstance(v, Value):
                raise RuntimeError("pygrad: a custom op's _backward is gone (its Value was "
                                   "cleared while its node lived on): keep the Value, as "
                                   "micrograd's _prev does")
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
        del keep


_add_op_methods(Value)


_NOOP_CODE = (lambda: None).__code__.co_code


def _is_noop(fn: Any) -> bool:
    """Whether ``fn`` is a function of no arguments whose body only returns
    None (``lambda: None``, ``def f(): pass``)."""
    code = getattr(fn, "__code__", None)
    return (code is not None and code.co_code == _NOOP_CODE and code.co_argcount == 0
            and not getattr(fn, "__closure__", None))


def _own_getstate(cls: type) -> bool:
    """Whether a subclass of Value below ``cls`` defines ``__getstate__``."""
    for c in cls.__mro__:
        if c is Value:
            return False
        if "__getstate__" in c.__dict__:
            return True
    return False


def _state(v: Value) -> Any:
    """What a copy or pickle of ``v`` carries besides its numbers: the
    subclass's ``__getstate__()`` if it has one, else its own attributes
    (less a custom op's closure and name) and, as ``(dict, slots)`` the way
    pickle does, the slots its subclasses add; None when there are none."""
    if _own_getstate(type(v)):
        return v.__getstate__()
    state = {k: x for k, x in v.__dict__.items() if k not in ("_backward", "_op")}
    slots = {}
    for cls in type(v).__mro__:
        if cls is Value:
            break
        names = cls.__dict__.get("__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{cls.__name__.lstrip('_')}{name}"
            try:
                slots[name] = getattr(v, name)
            except AttributeError:
                pass
    if slots:
        return state or None, slots
    return state or None


def _leaf(cls: "type[Value]", data: float, grad: float, label: str, state: Any = None) -> Value:
    """A new leaf (what a copy or an unpickled Value becomes; pickles name
    this function).  It stays tracked by the collector: copy and pickle
    give it its attributes straight into its instance dict."""
    v: Value = cls.__new__(cls)
    Value.__init__(v, data, label=label)
    _track(id(v))
    return new_leaf(Value, v, data, grad, label, state, made=True)
