"""backward() when a Python closure lies below the root (a custom op's
``_backward``, micrograd's way): C records the order and saves the grads it
will touch, then hands Python one closure at a time (csrc/backward.c's
sweep); whatever stops it, the saved grads are put back.  Also how a node
address is mapped back to its Value (``find_below``), for the sweep and
for replay's messages."""
from typing import Any, Optional

from ._core import ffi, lib
from .engine import Value, get_kids, operands


def values_below(root: Value) -> "dict[int, Value]":
    """Every Value ``root`` holds, transitively, by its node's address."""
    found: "dict[int, Value]" = {}
    seen, stack = set(), [root]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        found.setdefault(lib.pg_node_addr(id(v)), v)
        stack.extend(operands(v))
        kids = get_kids(v)         # Values _prev made for nodes without one
        if kids:
            stack.extend(kids)
    return found


def find_below(root: Value, node: int) -> "Optional[Value]":
    """The Value over node address ``node`` among the Values ``root``
    holds, transitively."""
    return values_below(root).get(node)


_GONE = ("pygrad: the _backward set on a Value of this node is not among the Values the "
         "graph holds: that Value is gone (the collector cleared it) or out of the graph's "
         "reach (one _prev made, whose cache _pg_kids was then written over). Set _backward "
         "on a Value the graph holds: an operand, or the one _prev gives now")


def record_backward(root: Value) -> int:
    """backward() when a Python closure lies below the root: C records the
    order and saves the grads, then runs the rules, handing each closure to
    Python; whatever stops it, the saved grads are put back.  ``root``
    holds every node the sweep walks."""
    sweep: Any = ffi.gc(ffi.new("pg_sweep *"), lib.pg_sweep_release)
    below: "Optional[dict[int, Value]]" = None
    try:
        rc = lib.pg_backward_v(id(root), sweep)
        while rc == lib.PG_E_BUSY:
            rc = lib.pg_backward_v(id(root), sweep)
        while rc > 0:
            found: list = []
            if lib.pg_sweep_value(sweep, id(found)):
                v = found[0]
            else:       # a C node whose _backward was set later: find its Value
                if below is None:
                    below = values_below(root)
                v = below.get(lib.pg_sweep_node_addr(sweep))
            if not isinstance(v, Value):
                raise RuntimeError(_GONE)
            fn = v.__dict__.get("_backward")
            if fn is not None:
                fn()
            elif lib.pg_describe_v(id(v)) & 0xFF != lib.PG_OP_CUSTOM:
                # (a custom op's None is micrograd's `lambda: None`; a C
                # node is flagged only as its Value gets a closure)
                raise RuntimeError(_GONE)
            rc = lib.pg_backward_resume_s(sweep)
        if rc == 0:
            # Kept only now: a Ctrl-C that came during the last call rose
            # as it returned, and the grads went back.
            lib.pg_sweep_keep(sweep)
        return rc
    finally:
        lib.pg_sweep_restore_s(sweep)      # nothing, once kept
        del root
