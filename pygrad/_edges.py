"""microgpt's view of a node: ``Value(data, children, local_grads)``, and
``_children`` / ``_local_grads`` on every Value.

Karpathy's microgpt.py has a Value of its own: ``Value(data, children,
local_grads)`` with slots ``_children`` (the children, in order) and
``_local_grads`` (d self / d child, one number each); its backward adds
``local_grad * v.grad`` to each child's grad.  micrograd's third argument is
the op's name instead.  A pygrad Value takes either: a Value made
microgpt's way is a C node with the given partials (csrc/nodes.c,
pg_function), whose backward is that same sum in C, and every Value
answers ``_children`` and ``_local_grads`` as microgpt's do.
"""
from typing import Any, Tuple

from . import engine as _engine   # (imports this module: read at call time)
from ._core import ffi, lib

_alloc = ffi.new
_FUNCTION = lib.PG_OP_FUNCTION


def make_local_grads_node(v: Any, data: float, children: tuple, grads: "list[float]") -> int:
    """Give the new Value ``v`` a node over ``children`` with the given
    local gradients (pg_function_v's return code)."""
    partials = _alloc("double[]", grads) if grads else ffi.NULL
    return lib.pg_function_v(id(v), data, id(children), partials, len(grads))


class _PerChild:
    """A read-only view with one item per child of a Value's node (``()``
    for a leaf); a non-data descriptor, so a subclass that sets the same
    name in its own ``__init__`` keeps what it set."""

    def __get__(self, v: Any, cls: Any = None) -> Any:
        if v is None:
            return self
        n = lib.pg_nkids_v(id(v))
        return self.read(v, n) if n else ()

    def read(self, v: Any, n: int) -> Tuple[Any, ...]:
        raise NotImplementedError


class ChildrenInOrder(_PerChild):
    """``Value._children``: the children as a tuple in the node's order (a
    child used twice appears twice), as microgpt keeps them; the same
    Values ``_prev`` holds."""

    def read(self, v: Any, n: int) -> Tuple[Any, ...]:
        e = _engine
        a = e._get_a(v)
        if type(a) is tuple and lib.pg_describe_v(id(v)) & 0xFF == _FUNCTION:
            return a            # made microgpt's way: the children it was given
        want = [lib.pg_kid_addr(id(v), i) for i in range(n)]
        # Through the C base's own fields, not the attributes: a subclass's
        # _prev property and a set written to _pg_kids change what Python
        # reads there, not which Values are the children.  _prev's own set
        # first (the Values it made for nodes without one, with any
        # _backward set on them), then the operands (a set keeps one of two
        # children that compare equal; the node has both).
        by_node = {}
        cached = e.c_prev(v)
        if isinstance(cached, (set, frozenset)):
            for k in cached:
                if isinstance(k, e.Value):
                    by_node[lib.pg_node_addr(id(k))] = k
        for k in e.operands(v):
            by_node[lib.pg_node_addr(id(k))] = k
        if any(p not in by_node for p in want):     # (_pg_kids written over)
            for k in e._kids_of(v):
                by_node.setdefault(lib.pg_node_addr(id(k)), k)
        return tuple(by_node[p] for p in want)


class LocalGrads(_PerChild):
    """``Value._local_grads``: d self / d child for each child, in
    ``_children``'s order, as floats: the numbers backward() multiplies by
    ``self.grad`` (read from the op's own C rule).  A custom op's gradient
    is a Python closure, so it has none: AttributeError."""

    def read(self, v: Any, n: int) -> Tuple[float, ...]:
        try:
            v.data    # (refused while a loss is traced, or made from traced inputs)
        except ValueError as e:
            raise ValueError(str(e).replace("v.data", "v._local_grads", 1)) from None
        out = _alloc("double[]", n)
        rc = lib.pg_local_grads_v(id(v), out, n)
        if rc == lib.PG_E_NOMEM:
            raise MemoryError("pygrad: out of memory reading _local_grads")
        if rc < 0:
            raise AttributeError("this Value's gradient is a Python closure (a custom op's "
                                 "_backward), so it has no _local_grads: call v._backward()")
        return tuple(ffi.unpack(out, n))
