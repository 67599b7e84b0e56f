"""backward() when a Python closure lies below the root (a custom op's
``_backward``, micrograd's way): C records the order and saves the grads it
will touch, then hands Python one closure at a time (csrc/backward.c's
sweep); whatever stops it, the saved grads are put back.  Also how a node
address is mapped back to its Value (``find_below``), for the sweep and
for replay's messages."""
from typing import Any, Optional

from ._core import ffi, lib
from .engine import Value, get_b, get_kids, operands


def values_below(root: Value) -> "dict[int, Value]":
    """Every Value ``root`` holds, transitively, by its node's address:
    operands, a fused model's table and the Values in _prev's cache (the
    C base's own fields, whatever a subclass or a write to _pg_kids put
    in the attributes)."""
    found: "dict[int, Value]" = {}
    seen, stack = set(), [root]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        found.setdefault(lib.pg_node_addr(id(v)), v)
        stack.extend(operands(v))
        table = get_b(v)
        if type(table) is dict:    # a fused model's Values for its hidden nodes
            stack.extend(table.values())
        kids = get_kids(v)         # Values _prev made for nodes without one
        if isinstance(kids, (set, frozenset)):
            stack.extend(k for k in kids if isinstance(k, Value))
    return found


def find_below(root: Value, node: int) -> "Optional[Value]":
    """The Value over node address ``node`` among the Values ``root``
    holds, transitively."""
    return values_below(root).get(node)


#: backward()'s and pygrad.grad's error for a node given a _backward whose
#: closure they can't find.
GONE = ("pygrad: this node was given a _backward that is gone: the Value it was set on is "
        "no longer among the Values the graph holds (one _prev made, whose cache _pg_kids "
        "was then written over; one the collector cleared), or its instance dict lost it. "
        "Set _backward again, on a Value the graph holds (an operand, or the one _prev "
        "gives now)")


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
                node = lib.pg_sweep_node_addr(sweep)
                v = below.get(node) if below is not None else None
                if v is None:       # (again: a closure may have made Values since)
                    below = values_below(root)
                    v = below.get(node)
            if not isinstance(v, Value):
                raise RuntimeError(GONE)
            fn = v.__dict__.get("_backward")
            if fn is not None:
                fn()
            elif lib.pg_describe_v(id(v)) & 0xFF != lib.PG_OP_CUSTOM:
                # (a custom op's None is micrograd's `lambda: None`; a C
                # node is flagged only as its Value gets a closure)
                raise RuntimeError(GONE)
            rc = lib.pg_backward_resume_s(sweep)
        if rc == 0:
            # Kept only now: a Ctrl-C that came during the last call rose
            # as it returned, and the grads went back.
            lib.pg_sweep_keep(sweep)
        return rc
    finally:
        lib.pg_sweep_restore_s(sweep)      # nothing, once kept
        del root
