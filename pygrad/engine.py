"""The C-backed ``Value``: a drop-in for ``micrograd.engine.Value``.

A Value is a thin Python object over a C node.  Its C base
(``_ValueBase``, csrc/value_binding.h) holds the node (pygrad/_lifetime.py
says how long it lives) and reads and writes ``data`` and ``grad`` in it;
each operator is one C call, and the forward and gradient rules of every
op are in csrc/ops.c.  A Value also holds the Values it was made from
(``_pg_a``, ``_pg_b``), as micrograd's ``_prev`` does, so ``_prev`` hands
out your own Values, with their class and attributes.

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
from typing import Any, Callable, Iterable, Iterator, Optional, Set, Tuple, Union

from . import _ops
from ._core import ffi, lib
from ._copies import new_leaf, state_of
from ._edges import ChildrenInOrder, LocalGrads, make_local_grads_node
from ._lifetime import check as _check
from ._numbers import local_grad_numbers, real_or_none, value_data

__all__ = ["Value", "settle"]

_new = object.__new__
_NULL = ffi.NULL
_pg_leaf_v = lib.pg_leaf_v
_E_ARG, _E_BUSY = lib.PG_E_ARG, lib.PG_E_BUSY


def _convert(x: Any, name: str) -> float:
    """``v.data = x`` and ``v.grad = x`` for an x that is no float or small
    int (C's setters call this): the float, or the error to raise."""
    return value_data(x, Value, "Value." + name)


def _bind() -> "tuple[type, type, type]":
    """Value's C base and the node object types (csrc/value_binding.h)."""
    if sys.implementation.name != "cpython":
        raise ImportError("pygrad's C engine runs on CPython only (it passes objects to C by "
                          "id()); on " + sys.implementation.name + " use pygrad.reference")
    if getattr(sys, "_is_gil_enabled", lambda: True)() is False:
        raise ImportError("pygrad's C engine needs the GIL (its Values' nodes are guarded by "
                          "it); on a free-threaded CPython run with PYTHON_GIL=1, or use "
                          "pygrad.reference")
    types: list = []
    rc = lib.pg_binding_init(id(types), id(_convert))
    if rc == -2 and "Value" in globals():
        # importlib.reload(pygrad.engine): this module's names are still
        # those of the first import (nothing above has changed what they do)
        raise ImportError("pygrad.engine can't be reloaded (importlib.reload): its C types "
                          "are made once per process, and every Value is of them; the "
                          "loaded pygrad goes on working. Restart the interpreter (the "
                          "notebook's kernel) to load another pygrad")
    if rc == -2:
        raise ImportError("pygrad's C engine was already imported in another interpreter of "
                          "this process: it runs in one interpreter per process (use "
                          "pygrad.reference in subinterpreters)")
    if rc:
        raise ImportError("pygrad: could not make the C engine's types")
    return types[0], types[1], types[2]


_ValueCore, _Node, _NodeList = _bind()
# The C base's own fields, read past anything a subclass names the same
_get_a = _ValueCore.__dict__["_pg_a"].__get__
_get_b = get_b = _ValueCore.__dict__["_pg_b"].__get__
get_kids = _ValueCore.__dict__["_pg_kids"].__get__
c_prev = _ValueCore.__dict__["_prev"].__get__
_set_kids = _ValueCore.__dict__["_pg_kids"].__set__


def settle() -> None:
    """Kept for code written against pygrad 0.x: a node is freed as soon
    as Python deallocates the last object that holds it (at ``del``, or at
    the next garbage collection for a cycle), so there is nothing to settle.
    It runs a full garbage collection, which frees closure cycles now."""
    gc.collect()


# -- the class an op returns ---------------------------------------------------

# The class an op on a cls operand returns, by cls.  At most
# _RESULT_CLASSES_KEPT classes: a full cache is emptied before the next is
# added, so that it keeps few classes alive (a notebook cell's, made again
# and again, and what its methods hold) and a lookup stays one dict read.
_RESULT_CLASS: "dict[type, type]" = {}
_RESULT_CLASSES_KEPT = 64


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
            if len(_RESULT_CLASS) >= _RESULT_CLASSES_KEPT:
                _RESULT_CLASS.clear()
            _RESULT_CLASS[cls] = found
    return found


def _fail(rc: int, what: str = "a graph node") -> None:
    _check(rc, what)


def op_failed(rc: int) -> None:
    """The exception of an op's entry point: an operand without a node."""
    if rc == _E_ARG:
        raise TypeError("pygrad: an operand has no node (a Value whose __init__ never ran): "
                        "make Values with Value(data), or from other Values' operators")
    _check(rc, "a graph node")


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

def _op_function(op: int, form: int) -> Callable[..., Any]:
    """The C function that makes ``op``'s Value in one call (its forms:
    csrc/value_binding.h, "The op functions")."""
    out: list = []
    rc = lib.pg_op_function(id(out), op, form, _FASTCALL)
    if rc == _E_ARG:        # (only a crafted pickle names one)
        raise ValueError(f"pygrad: there is no op function for op {op}, form {form}")
    if rc:
        raise MemoryError("pygrad: out of memory making the op functions")
    return out[0]


# METH_FASTCALL is in CPython's stable ABI from 3.10; 3.9 passes a tuple.
_FASTCALL = int(sys.version_info >= (3, 10))


def _operator(op: _ops.Op, doc: str, swapped: bool = False) -> Callable[..., "Value"]:
    """The dunder of a unary op, or of a binary op with the Value on the
    left (or, ``swapped``, on the right of a number: ``2 - v``).

    Every form is one call of a C op function, ``make(cls, a, b)``, which
    makes the new Value of the result class, its node object and the node.
    With a number, micrograd wraps it in a leaf Value: the node object has
    room for that leaf, and the one call makes both."""
    if op.arity == 1:
        make1 = _op_function(op.code, lib.PG_FORM_UNARY)

        def unary(self: "Value") -> "Value":
            cls = type(self)
            if cls is not Value:
                try:
                    cls = _RESULT_CLASS[cls]
                except KeyError:
                    cls = _result_class(cls)
            return make1(cls, self)

        unary.__doc__ = doc
        return unary

    make = _op_function(op.code, lib.PG_FORM_VALUES)
    make_k = _op_function(op.code, lib.PG_FORM_RK if swapped else lib.PG_FORM_K)

    def binary(self: "Value", other: Any) -> "Value":
        cls = type(self)
        if cls is not Value:
            try:
                cls = _RESULT_CLASS[cls]
            except KeyError:
                cls = _result_class(cls)
        t = type(other)
        # (a subclass met before as an operand's class is in _RESULT_CLASS:
        # a dict lookup is cheaper than isinstance)
        if t is Value or t in _RESULT_CLASS or (t is not float and t is not int
                                                and isinstance(other, Value)):
            # the node's children in the op's order: other first when swapped
            # (`w.__rsub__(v)` is v - w)
            return make(cls, other, self) if swapped else make(cls, self, other)
        if t is float or t is int:
            out = make_k(cls, self, other)
            if out is not None:
                return out               # (None: an int too large for a double)
        return _odd_operand(cls, self, other, make_k)

    binary.__doc__ = doc
    return binary


def _odd_operand(cls: type, self: "Value", other: Any, make_k: Callable[..., Any]) -> "Value":
    """The less common number operands of a binary dunder: a huge int, bool,
    Fraction, numpy scalar, or no number at all."""
    k = real_or_none(other)
    if k is None:
        return _not_a_number(other)
    out: Value = make_k(cls, self, k)
    return out


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
_describe = lib.pg_describe_v
_node_addr = lib.pg_node_addr
_BINARY = frozenset(op.code for op in _ops.OPS if op.arity == 2)
# (a custom op's name, if any, is in its instance dict; a Function's is "")
_OP_NAMES: Tuple[Optional[str], ...] = tuple(
    None if op.code in (lib.PG_OP_POWK, lib.PG_OP_LINEAR)
    else "" if op.code in (lib.PG_OP_CUSTOM, lib.PG_OP_FUNCTION) else op.name for op in _ops.OPS)
assert all(op.code == i for i, op in enumerate(_ops.OPS))      # (C indexes the names by code)


def _op_name(v: Any) -> str:
    """The name of a node's op where it depends on the node (C's _op
    descriptor calls this where _OP_NAMES has None)."""
    op = _describe(id(v)) & _D_OP
    if op == lib.PG_OP_POWK:
        k = lib.pg_exponent_v(id(v))
        return f"**{int(k)}" if (_describe(id(v)) >> 8) & lib.PG_F_INT_EXPONENT else f"**{k!r}"
    if op == lib.PG_OP_LINEAR:
        act = lib.pg_variant_v(id(v)) & lib.PG_ACT_MASK
        return ("linear", "linear+ReLU", "linear+tanh", "linear+sigmoid")[act]
    return ""


def operands(v: "Value") -> Iterator["Value"]:
    """The Values ``v`` holds as its operands (``_pg_a``, ``_pg_b``: a
    Value, None, or nested tuples of them)."""
    stack = [_get_b(v), _get_a(v)]
    while stack:
        x = stack.pop()
        if x is None or type(x) is dict:
            continue
        if type(x) is tuple:
            stack.extend(reversed(x))
        elif isinstance(x, Value):
            yield x


def _kids_of(v: "Value") -> Set["Value"]:
    """_prev, the slow way: the node's children, each as the Value that
    holds it (an operand), as the one made for it before (a fused model's
    table), or as a new Value made over it."""
    known = {}
    for x in operands(v):
        known[_node_addr(id(x))] = x
    table = _get_b(v)
    if type(table) is not dict:
        table = None
    kids = set()
    for i in range(lib.pg_nkids_v(id(v))):
        p = lib.pg_kid_addr(id(v), i)
        kid = known.get(p)
        if kid is None and table is not None:
            kid = table.get(p)
        if kid is None:
            kid = _new(Value)
            holds = _get_a(v) if table is not None else None   # (a name holds it for the call)
            rc = lib.pg_view_v(id(kid), id(v), i, id(holds), id(table))
            if rc:
                _fail(rc, "a child's Value")
            if table is not None:
                # (another thread may have made one meanwhile: one object per node)
                kid = table.setdefault(p, kid)
            known[p] = kid
        kids.add(kid)
    return kids


from typing import TYPE_CHECKING  # noqa: E402  (beside its one use)

if TYPE_CHECKING:
    # The op methods are made below the class (_add_op_methods), out of a
    # type checker's sight: _value_ops declares them.
    from ._value_ops import TypedOps as _ValueBase
else:
    _ValueBase = _ValueCore


class Value(_ValueBase):
    """A scalar in a computation graph, with its gradient.

    ``Value(data, _children=(), _op='', label='')`` as in micrograd, or
    ``Value(data, children, local_grads)`` as in microgpt (pygrad/_edges.py).
    Data and grad are stored as C doubles; any other attribute can be set,
    as on micrograd's Value.  An op's result has the class of the operand whose
    method runs, when that class keeps Value's ``__init__`` (module doc).
    """

    __slots__ = ("__dict__", "__weakref__")
    # Stored in the C node, read and written by the C base's descriptors
    # (annotations only: no class attribute shadows them).
    data: float
    grad: float
    _pg_a: Any            # the operands (read-only: the C base's)
    _pg_b: Any
    _pg_kids: Any         # _prev's cache
    #: micrograd's set of children (the C base's, csrc/value_binding.h:
    #: the operands when they are the node's children, else _prev_slow).
    _prev: Set["Value"]
    #: A name for drawing: a str, kept in the instance dict once set (as the
    #: micrograd lecture's Value keeps it), "" until then.
    label: str = ""

    def __init__(self, data: Any, _children: Iterable["Value"] = (),
                 _op: "Union[str, Iterable[float]]" = "", label: str = "") -> None:
        if type(_op) is str and _op == "" and _no_children(_children):   # a leaf: the common case
            if type(data) is not float:
                data = _leaf_number(data)
            rc = _pg_leaf_v(id(self), data)
            if rc:
                _not_fresh(self, rc)
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
        if not isinstance(label, str):
            raise TypeError(f"Value label must be a str, not {type(label).__name__}")
        if not isinstance(_op, str):
            # microgpt's Value(data, children, local_grads) (pygrad/_edges.py)
            grads = local_grad_numbers(_op, kids)
            rc = (make_local_grads_node(self, x, kids, grads) if kids
                  else _pg_leaf_v(id(self), x))
            if rc:
                _not_fresh(self, rc)
            if label:
                self.label = label
            return
        # Made in Python, as micrograd's custom ops are: its backward is the
        # closure set on it (None until then: micrograd's `lambda: None`),
        # kept where micrograd keeps it, in the instance dict; backward()
        # finds this Value by its node's name for it (pg_custom_v).
        # (with no children, a leaf with a name: compile takes it as an input)
        rc = lib.pg_custom_v(id(self), x, id(kids)) if kids else _pg_leaf_v(id(self), x)
        if rc:
            _not_fresh(self, rc)
        if kids:
            self.__dict__["_backward"] = None
        self._op = _op
        if label:
            self.label = label

    # -- graph --------------------------------------------------------------

    #: The op's name, for drawing ('+', '*', '**2', ...), micrograd's: a
    #: name set on a Value (a custom op's) lives in its instance dict and
    #: comes first, else C's descriptor reads it from the node (set below
    #: the class: _bind_op_name).
    _op: str
    #: microgpt's: the children in order, and d self / d child for each.
    _children: "Tuple[Value, ...]" = ChildrenInOrder()  # type: ignore[assignment]
    _local_grads: "Tuple[float, ...]" = LocalGrads()  # type: ignore[assignment]

    @property
    def _backward(self) -> Callable[[], None]:
        """Push this node's grad into its children's grads (only them)."""
        d = _describe(id(self))
        if d < 0:
            _not_fresh(self, _E_ARG)
        if d & _D_PY_BACKWARD:   # first: most Values have no instance dict
            fn = self.__dict__.get("_backward")
            if fn is not None:
                return fn                       # None: micrograd's `lambda: None`
        # A C node's rule, over this Value (which holds the node): no
        # pointer reaches Python
        return functools.partial(_node_backward, self)

    @_backward.setter
    def _backward(self, fn: Callable[[], None]) -> None:
        if not callable(fn):
            raise TypeError(f"_backward must be callable, not {type(fn).__name__}")
        own = self.__dict__
        if "_backward" in own:       # made by Value(data, children, op): flagged in C
            own["_backward"] = fn
            return
        if (type(fn) is functools.partial and fn.func is _node_backward and not fn.keywords
                and len(fn.args) == 1 and fn.args[0] is self):
            # its own C rule given back (`c._backward = c._backward`, as a
            # wrapper that saves and restores it does): nothing changes, and
            # the node stays C's (compile() takes it)
            return
        if is_noop(fn) and lib.pg_nkids_v(id(self)) == 0:
            # micrograd's own default (`lambda: None`) set on a leaf, as code
            # written for micrograd does to its parameters: it changes nothing,
            # so the leaf stays a plain C leaf (fast, and compile() takes it).
            return
        if lib.pg_set_py_backward_v(id(self)):
            _not_fresh(self, _E_ARG)
        own["_backward"] = fn

    def backward(self) -> None:
        """Backpropagate from this node: its grad is set to 1, every node
        below it accumulates (``+=``) its gradient, as micrograd does.  If it
        fails (a closure raises, Ctrl-C, no memory), every grad is left as
        it was; but a sweep with no custom op below is one call into C, and
        a Ctrl-C during it rises as it returns, with every grad applied."""
        rc = lib.pg_backward_v(id(self), _NULL)
        while rc == _E_BUSY:      # another thread walks: signals run between tries
            rc = lib.pg_backward_v(id(self), _NULL)
        if rc == lib.PG_E_SWEEP:
            rc = record_backward(self)
        if rc == lib.PG_E_TRACED:
            from ._graph_views import traced_error      # (imports this module)
            raise traced_error("backward()")
        if rc == lib.PG_E_NOMEM:
            raise MemoryError("pygrad: out of memory in backward()")
        if rc < 0:
            _not_fresh(self, _E_ARG)

    # -- operators ----------------------------------------------------------

    # The other operator methods (__add__, exp, sin, ...) are made from the
    # op table (csrc/ops.def) below the class: see _add_op_methods.

    def __pow__(self, other: Any) -> "Value":
        """self ** other: a number exponent is a constant ('**2'), a Value
        exponent is differentiated too."""
        t = type(other)
        if t is float:
            is_int, k = 0, other
        elif t is int:
            is_int, k = 1, other
        elif isinstance(other, Value):
            return self._pow_value(other)
        else:
            k = real_or_none(other)
            if k is None:
                return _not_a_number(other)
            is_int = 1 if isinstance(other, numbers.Integral) else 0
        cls = _result_class(type(self)) if type(self) is not Value else Value
        out: Optional[Value] = (_powk_int if is_int else _powk_float)(cls, self, k)
        if out is None:
            return _not_a_number(real_or_none(k))   # an int too large: ValueError
        return out

    def __repr__(self) -> str:
        try:
            return f"Value(data={self.data}, grad={self.grad})"
        except ValueError:      # made from a traced program's input: no number yet
            return "Value(traced)"

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
        return _leaf(type(self), self.data, self.grad, self.label, state_of(self, Value))

    def __reduce_ex__(self, protocol: Any) -> Any:
        """deepcopy and pickle: a new leaf with the same data, grad, label and
        attributes (a graph node's children stay behind)."""
        return _leaf, (type(self), self.data, self.grad, self.label), state_of(self, Value)


def _node_backward(v: Value) -> None:
    """A C node's own gradient rule, run on Value v's node."""
    if lib.pg_node_backward_v(id(v)):
        _not_fresh(v, _E_ARG)


def _not_fresh(v: Any, rc: int) -> None:
    """The error for a C call that found ``v`` without a node, or (making
    one) with a node already."""
    if rc != _E_ARG:
        _check(rc, "a Value")
    if isinstance(v, Value) and _node_addr(id(v)):
        raise TypeError("a pygrad.Value is initialised once: make a new Value instead")
    raise TypeError("this pygrad.Value has no node: its __init__ never ran (make Values "
                    "with Value(data), or from other Values' operators)")


def _no_children(children: Any) -> bool:
    """Whether ``Value(x, children)`` makes a leaf: children is empty (a
    sized container; a numpy array too, whose truth is ambiguous)."""
    if type(children) is tuple or type(children) is list:
        return not children
    try:
        return len(children) == 0
    except TypeError:               # an iterator: made a node, as micrograd's set() of it
        return False


def _leaf_number(data: Any) -> float:
    """``Value(x)``'s number, for any real x but a float."""
    if type(data) is int:
        try:
            return float(data)
        except OverflowError:
            pass
    return value_data(data, Value)


class _Children(set):
    """``_prev``: a set of the children's Values that can't be changed (the
    children are the C node's: micrograd's ``_prev.add(x)`` would change
    nothing pygrad's backward() does, so it raises instead)."""

    __slots__ = ()

    def _fixed(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a pygrad.Value's _prev can't be changed: its children are the C "
                        "node's, fixed when it is made; make a custom op with "
                        "Value(data, children, op) and set its _backward instead")

    def __new__(cls, children: Iterable[Any] = ()) -> "_Children":
        kids = set.__new__(cls)
        set.update(kids, children)
        return kids

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # set.__init__ would empty the set and fill it anew: __new__ (or C,
        # with set.__new__) fills it once
        pass

    def __repr__(self) -> str:
        return repr(set(self))

    add = discard = remove = pop = clear = update = _fixed
    difference_update = intersection_update = symmetric_difference_update = _fixed
    __ior__ = __iand__ = __isub__ = __ixor__ = _fixed  # type: ignore[assignment]


def _prev_slow(v: Value) -> _Children:
    """``v._prev`` where v's operands are not exactly its node's children
    (a number's leaf, a fused model's table, a custom op's tuple): the C
    base calls this once, then caches the set."""
    return _Children(_kids_of(v))


def _bind_op_name() -> None:
    """Value._op: C's non-data descriptor (csrc/value_binding.h)."""
    out: list = []
    if lib.pg_binding_op_name(id(out), id(_OP_NAMES), id(_op_name)):
        raise ImportError("pygrad: could not make Value._op's descriptor")
    setattr(Value, "_op", out[0])


_bind_op_name()
if lib.pg_binding_prev(id(_Children), id(_prev_slow), id(Value)):
    raise ImportError("pygrad: the C engine's _prev was bound already")
_add_op_methods(Value)
_powk_float = _op_function(lib.PG_OP_POWK, lib.PG_FORM_POWK_FLOAT)
_powk_int = _op_function(lib.PG_OP_POWK, lib.PG_FORM_POWK_INT)


_NOOP_CODE = (lambda: None).__code__.co_code


def is_noop(fn: Any) -> bool:
    """Whether ``fn`` is a function of no arguments whose body only returns
    None (``lambda: None``, ``def f(): pass``)."""
    code = getattr(fn, "__code__", None)
    return (code is not None and code.co_code == _NOOP_CODE and code.co_argcount == 0
            and not getattr(fn, "__closure__", None))


def _leaf(cls: "type[Value]", data: float, grad: float, label: str, state: Any = None) -> Value:
    """A new leaf (what a copy or an unpickled Value becomes; pickles name
    this function, so it stays here: pygrad/_copies.py does the work)."""
    v: Value = cls.__new__(cls)
    Value.__init__(v, data, label=label)
    v = new_leaf(Value, v, data, grad, label, state, made=True)
    own = getattr(v, "__dict__", None)
    if own and "_backward" in own and not _describe(id(v)) & _D_PY_BACKWARD:
        # a closure a subclass's own __getstate__ carried (or an old pickle's
        # custom leaf): it stays behind, as the graph's do, and the marker
        # of Value(data, children, op) (the setter's) with it
        del own["_backward"]
    return v


# backward()'s slow path, when a Python closure lies below the root (its own
# module: it imports Value from here)
from ._custom_sweep import record_backward  # noqa: E402
