"""The C-backed ``Value``: a drop-in for ``micrograd.engine.Value``.

A Value is a thin handle: ``_h`` names its node in C, and ``_s`` is the
claim through which it owns that node (pygrad/_lifetime.py, csrc/memory.c):
the node lives while the Value does, and Python alone decides when that
ends.  The numbers and the graph live in C; each operator is one C call,
and the forward and gradient rules of every op are in csrc/ops.c.  A Value
holds the Values it was made from (``_a``, ``_b``), as micrograd's
``_prev`` does, so ``_prev`` hands out your own Values, with their class
and attributes.  An op's result has the class of the Value whose method
ran (``type(self)``): the left operand's, or the Value's when a number is
on the left.
"""
import functools
import numbers
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Set, Tuple

from . import _ops
from ._core import ffi, lib
from ._lifetime import check as _check, made_later as _made_later, own as _own
from ._lifetime import Owner as _Owner, compact as _compact, new_claim as _new_claim
from ._lifetime import owners as _owners
from ._copies import new_leaf
from ._numbers import real_or_none, value_data

__all__ = ["Value", "settle"]

_new = object.__new__
_gc = ffi.gc
# Any: cffi returns a plain cdata (the stub names the struct it points to)
_claim_new: Callable[[], Any] = lib.pg_claim_new
_drop = lib.pg_claim_drop
_add_owner, _discard = _owners.add, _owners.discard
_powk_float, _powk_int = lib.pg_powk_float, lib.pg_powk_int


def settle() -> None:
    """Kept for code written against pygrad 0.x: a node is freed as soon
    as Python deallocates the last Value that reaches it (at ``del``, or at
    the next garbage collection for a cycle), so there is nothing to settle.
    It runs a full garbage collection, which frees closure cycles now."""
    import gc
    gc.collect()


def _wrap(cls: type, h: int, claim: Any, a: Any, b: Any) -> "Value":
    """The Value of new node h, owning it through ``claim`` and holding the
    operands it was made from."""
    out: Value = _new(cls)
    out._h = h
    out._s = claim
    out._a = a
    out._b = b
    out._kids = None        # _prev's cache, empty (a slot read, no exception)
    return out


def _create(cls: type, make: Callable[..., int], a: Any, b: Any, *args: Any,
            what: str = "a graph node") -> "Value":
    """A node from ``make(claim, *args)``, wrapped (the path of the less
    frequent ops; the hot dunders inline it)."""
    claim = _new_claim()
    h = make(claim, *args)
    if h < 0:
        _check(h, what)
    return _wrap(cls, h, claim, a, b)


def _run(h: int, n: int, run_claim: Any, holds: Any) -> "list[Value]":
    """Values for the n consecutive new nodes h, h + 1, ... that
    ``run_claim`` holds meanwhile: each takes a claim of its own (the run's
    goes when the caller drops it), and holds ``holds``."""
    values = []
    for j in range(n):
        values.append(_wrap(Value, h + j, _own(h + j), holds, None))
    return values           # the caller drops run_claim after this


# -- the node factory the rest of the package builds with (_backend for nn,
# functional, data, Function): package-internal, so not in __all__ --------------

def make_nary(op: int, variant: int, handles: Any, n: int, kids: tuple = ()) -> "Value":
    """A fused n-ary node over the given C array of handles (of ``kids``)."""
    return _create(Value, lib.pg_nary, kids, None, op, variant, handles, n)


def make_layer(act: int, params: Any, x: Any, nin: int, nout: int,
                param_values: "Sequence[Value]" = (), xs: "Sequence[Value]" = ()) -> "list[Value]":
    """nout fused LINEAR nodes over shared inputs (pygrad.nn.Layer)."""
    claim = _new_claim()
    h = _check(lib.pg_linear_layer(claim, act, params, x, nin, nout), "a layer")
    return _run(h, nout, claim, (tuple(param_values), tuple(xs)))


def make_mlp(nlayers: int, acts: Any, params: Any, sizes: Any, x: Any, nout: int,
             holds: Any = ()) -> "list[Value]":
    """The layers of a fused MLP in one C call (pg_mlp): the hidden layers'
    outputs are nodes without Values (``_prev`` makes them on demand); the
    last layer's ``nout`` outputs become Values, holding ``holds`` (the
    model's parameters and the inputs)."""
    claim = _new_claim()
    h = _check(lib.pg_mlp(claim, nlayers, acts, params, sizes, x), "a model's layers")
    return _run(h, nout, claim, holds)


def make_leaves(data: "Sequence[float]") -> "list[Value]":
    """Leaves holding ``data`` (pygrad.data.to_values), one C call per
    segment's worth."""
    buf = ffi.new("double[]", data)
    values: "list[Value]" = []
    step = lib.PG_SEG_NODES
    for start in range(0, len(data), step):
        n = min(step, len(data) - start)
        claim = _new_claim()
        h = _check(lib.pg_leaves(claim, buf + start, n), "leaves")
        values += _run(h, n, claim, None)
    return values


def make_function(data: float, kids: Any, partials: Any, n: int, name: str,
                   values: tuple = ()) -> "Value":
    """A pygrad.Function node with its captured partials."""
    out = _create(Value, lib.pg_function, values, None, data, kids, partials, n)
    out._name = name
    _made_later.add(out._h, out)        # replay's messages name it by handle
    return out


_pg_leaf = lib.pg_leaf


def _new_leaf(claim: Any, data: Any) -> int:
    """A new leaf's handle (or a PG_E_*): ``Value(x)``'s C call, for any
    real x but a float."""
    t = type(data)
    if t is float or t is int:
        try:
            h = lib.pg_leaf(claim, data)   # cffi turns an int into a double as float(int) does
        except OverflowError:
            h = lib.pg_leaf(claim, value_data(data, Value))
    else:
        h = lib.pg_leaf(claim, value_data(data, Value))
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
    cls = type(self)
    if isinstance(other, Value):
        if swapped:
            return _create(cls, make, other, self, other._h, self._h)
        return _create(cls, make, self, other, self._h, other._h)
    k = real_or_none(other)
    if k is None:
        return _not_a_number(other)
    return _create(cls, make_k, self, None, *((k, self._h) if swapped else (self._h, k)))


def _binary(op: _ops.Op, doc: str) -> Callable[["Value", Any], "Value"]:
    """An arithmetic dunder: self (op) Value, self (op) number.

    With a number, micrograd wraps it in a leaf Value; the op's
    ``pg_binary_k_<CODE>`` makes that leaf and the op node in one call.
    Each op has its own C entry points, so that no op code is passed.  The
    claim is made first and filled by the op (csrc/memory.c): an interrupt
    anywhere drops it, and with it the node."""
    code = op.key.upper()
    make = getattr(lib, "pg_binary_" + code)
    make_k = getattr(lib, "pg_binary_k_" + code)

    def method(self: "Value", other: Any) -> "Value":
        t = type(other)
        if t is Value:
            claim = _claim_new()
            owner = _Owner(claim, _discard)
            owner.twin = _gc(claim + 0, _drop)
            _add_owner(owner)
            h = make(claim, self._h, other._h)
            if h >= 0:
                out = _new(type(self))
                out._h = h
                out._s = claim
                out._a = self
                out._b = other
                out._kids = None
                return out
            _check(h, "a graph node")
        if t is float or t is int:
            claim = _claim_new()
            owner = _Owner(claim, _discard)
            owner.twin = _gc(claim + 0, _drop)
            _add_owner(owner)
            try:
                # cffi turns an int into a double as float(int) does
                h = make_k(claim, self._h, other)
            except OverflowError:
                return _other_operand(self, other, make, make_k, False)
            if h >= 0:
                out = _new(type(self))
                out._h = h
                out._s = claim
                out._a = self
                out._b = None
                out._kids = None
                return out
            _check(h, "a graph node")
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
            claim = _claim_new()
            owner = _Owner(claim, _discard)
            owner.twin = _gc(claim + 0, _drop)
            _add_owner(owner)
            try:
                h = make_rk(claim, other, self._h)
            except OverflowError:
                return _other_operand(self, other, make, make_rk, True)
            if h >= 0:
                out = _new(type(self))
                out._h = h
                out._s = claim
                out._a = self
                out._b = None
                out._kids = None
                return out
            _check(h, "a graph node")
        return _other_operand(self, other, make, make_rk, True)

    method.__doc__ = doc
    return method


def _unary(op: _ops.Op, doc: str) -> Callable[["Value"], "Value"]:
    make = getattr(lib, "pg_unary_" + op.key.upper())

    def method(self: "Value") -> "Value":
        claim = _claim_new()
        owner = _Owner(claim, _discard)
        owner.twin = _gc(claim + 0, _drop)
        _add_owner(owner)
        h = make(claim, self._h)
        if h >= 0:
            out = _new(type(self))
            out._h = h
            out._s = claim
            out._a = self
            out._b = self           # both operands known: _prev needs no call
            out._kids = None
            return out
        _check(h, "a graph node")
        raise AssertionError

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


# What _describe says of a node: op and flags; and the op names of the
# table (None where the name depends on the node).
_D_OP = 0xFF
_D_PY_BACKWARD = lib.PG_F_PY_BACKWARD << 8
_describe = lib.pg_describe
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


def _operands(v: "Value") -> Iterator["Value"]:
    """The Values ``v`` holds as its operands (``_a``, ``_b``: a Value,
    None, or nested tuples of them)."""
    stack = [getattr(v, "_b", None), getattr(v, "_a", None)]
    while stack:
        x = stack.pop()
        if x is None:
            continue
        if type(x) is tuple:
            stack.extend(reversed(x))
        else:
            yield x


def _child_value(h: int, known: "dict[int, Value]", holds: Any) -> "Value":
    """The Value of child node h: one its parent holds, one made for it
    before (while it lives), or a new one, which holds ``holds``."""
    v = known.get(h)
    if v is not None:
        return v
    v = _made_later.get(h)
    if v is not None:
        return v
    v = _wrap(Value, h, _own(h), holds, None)
    _made_later.add(h, v)
    return v


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
    micrograd's Value.  An op on a subclass of Value returns that subclass
    (the class of the operand whose method runs: the left one, or the
    Value when a number is on the left).
    """

    __slots__ = ("_h", "_s", "_a", "_b", "_kids", "_name", "_label", "_p", "__dict__",
                 "__weakref__")
    _h: int
    _s: Any          # the claim through which this Value owns its node
    _a: Any          # the operand Values it was made from (or None, or tuples)
    _b: Any
    _p: Any          # the node's data and grad (a cffi double *), once written; or None
    _kids: Optional[Set["Value"]]
    _name: str
    _label: str

    def __init__(self, data: Any, _children: Iterable["Value"] = (), _op: str = "",
                 label: str = "") -> None:
        if getattr(self, "_s", None) is not None:
            raise TypeError("a pygrad.Value is initialised once: make a new Value instead")
        if not _children and _op == "":      # a leaf: the common case
            claim = _claim_new()
            owner = _Owner(claim, _discard)
            owner.twin = _gc(claim + 0, _drop)
            _add_owner(owner)
            h = _pg_leaf(claim, data) if type(data) is float else _new_leaf(claim, data)
            if h < 0:
                _check(h, "a leaf")
            self._h = h
            self._s = claim
            self._a = self._b = self._kids = None
            _compact()
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
        # Made in Python, as micrograd's custom ops are: its backward is the
        # closure set on it (None until then: micrograd's `lambda: None`),
        # kept where micrograd keeps it, in the instance dict.
        claim = _new_claim()
        if len(kids) == 1:
            h = _custom1(claim, x, kids[0]._h)
        else:
            h = lib.pg_custom(claim, x, ffi.new("uint32_t[]", [c._h for c in kids]), len(kids))
        if h < 0:
            _check(h, "a Value")
        self._h = h
        self._s = claim
        self._kids = self._b = None
        self._a = kids
        self._p = None           # where its closure writes, found on the first write
        if kids:
            self.__dict__["_backward"] = None
        self._name = _op
        _made_later.add(h, self)          # backward() finds its closure by handle
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
            return self._name
        except AttributeError:
            pass
        h = self._h
        op = _describe(h) & _D_OP
        name = _OP_NAMES[op]
        if name is None:
            name = "" if op == _CUSTOM else _op_name(h, op)
        self._name = name
        return name

    @_op.setter
    def _op(self, name: str) -> None:
        # micrograd-style code names its own ops (out._op = '-')
        if not isinstance(name, str):
            raise TypeError(f"_op must be str, not {type(name).__name__}")
        self._name = name

    @property
    def _prev(self) -> Set["Value"]:
        """The children, as micrograd's set of Values: the Values this one
        was made from (yours, with their class and attributes), and for a
        node made without one (a number's leaf, a fused layer's hidden
        node) a Value made on first read; the same set on every read."""
        try:
            kids = self._kids       # None until the first read
        except AttributeError:      # a Value made without __init__ (cls.__new__)
            kids = None
        if kids is not None:
            return kids
        # The common case first: an op's Value holds both its operands (a
        # unary op's twice), which are its node's children.
        a = getattr(self, "_a", None)
        if a is not None and type(a) is not tuple:
            b = self._b
            if b is not None:
                kids = self._kids = {a, b}
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
        known = {v._h: v for v in _operands(self)}
        holds = (getattr(self, "_a", None), getattr(self, "_b", None))
        kids = self._kids = {_child_value(k, known, holds) for k in handles}
        return kids

    @_prev.setter
    def _prev(self, children: Any) -> None:
        raise AttributeError("a pygrad.Value's children are fixed when it is made (they are "
                             "the C node's): make it with Value(data, children, op) and set "
                             "its _backward, as micrograd's own ops do")

    @property
    def label(self) -> str:
        """A name for drawing."""
        try:
            return self._label
        except AttributeError:
            return ""

    @label.setter
    def label(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"label must be str, not {type(text).__name__}")
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
        _made_later.add(self._h, self)    # backward() finds its closure by handle

    def backward(self) -> None:
        """Backpropagate from this node: its grad is set to 1, every node
        below it accumulates (``+=``) its gradient, as micrograd does.  If it
        fails (a closure raises, Ctrl-C, no memory), every grad is left as
        it was; but a sweep with no custom op below is one call into C, and
        a Ctrl-C during it rises as it returns, with every grad applied."""
        _compact()
        h = self._h
        rc = lib.pg_backward(h, ffi.NULL)
        if rc == lib.PG_E_SWEEP:
            rc = _record_backward(self)
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
        claim = _claim_new()
        owner = _Owner(claim, _discard)
        owner.twin = _gc(claim + 0, _drop)
        _add_owner(owner)
        try:
            h = make(claim, self._h, k)
        except OverflowError:
            return _not_a_number(real_or_none(k))   # an int too large: ValueError
        if h < 0:
            _check(h, "a graph node")
        return _wrap(type(self), h, claim, self, self)   # one child: self (see _prev)

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


def _find_below(root: "Value", h: int) -> "Optional[Value]":
    """The Value of node h among the Values ``root`` holds, transitively."""
    seen, stack = set(), [root]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if v._h == h:
            return v
        stack.extend(_operands(v))
    return None


def _record_backward(root: "Value") -> int:
    """backward() when a Python closure may lie below h: C records the
    order and saves the grads, then runs the rules, handing each closure to
    Python; whatever stops it, the saved grads are put back."""
    sweep = ffi.gc(ffi.new("pg_sweep *"), lib.pg_sweep_clear)
    try:
        rc = lib.pg_backward(root._h, sweep)
        while rc > 0:
            h = rc - 1
            v = _made_later.get(h)
            if v is None:
                # Its entry went as a collection found it in a cycle, and a
                # finalizer then resurrected it: look for it below the root.
                v = _find_below(root, h)
            if v is None:
                raise RuntimeError("pygrad: a custom op's _backward is gone (its Value was "
                                   "dropped while its node lived on): keep the Value, or set "
                                   "_backward before it is used in another op, as "
                                   "micrograd's ops do")
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
