"""Node lifetime, in one paragraph (csrc/pygrad.h says the same for C).

**Python owns every node, through immutable keeps.**  (1) A node lives in
the bytes of a bytes object, *node memory* (one for every node one C call
makes); C never allocates, frees or records a node.  (2) A Value's *keep*
is a tuple whose first item is the Value's node (its memory, or a pointer
into memory the keep holds) and whose other items hold that memory and
the keeps of every node it points to; a keep is built before the C call
that links the new node to its children, so a node can only point to what
its keep holds; C takes a keep only from a real Value's own slot (any bytes
object would pass for node memory).  (3) Tuples can't be cleared by the collector or rebound
by user code, so rebinding or clearing any attribute of a Value drops at
most that Value's own hold, never memory a live node points to; a bytes
object can't be resized, and is freed only when CPython really
deallocates it, after every finalizer.  (4) A call into C that walks a
graph is handed a node whose keep the caller holds in a local variable
for the whole call, so it may let the GIL go.

The Value also holds the Values it was made from (``_prev``: class,
attributes and identity), but nothing C reads depends on them.  Everything
here is a small helper of ``engine``; nothing keeps a record of live
nodes.  Why bytes: CPython's small-object allocator takes them (a node and
its header fit 96 bytes), so a graph's nodes lie together in its arenas,
cost less to make than a cffi array, and give their pages back to the
system when the graph is freed (docs/lifetime.md).
"""
from typing import Any, Callable, Iterable, Tuple

from ._core import ffi, lib

__all__ = ["NODE_SIZE", "POINTERS", "Packed", "first_node", "pointers", "pack", "check",
           "within"]

#: The bytes of one node: node memory for n nodes is ``bytes(n * NODE_SIZE)``
#: (zeroed; engine makes it through ``engine._node_memory``).
NODE_SIZE: int = ffi.sizeof("pg_node")
#: A list of node pointers (children, parameters).
POINTERS = ffi.typeof("pg_node *[]")


#: Node memory's first node as a ``pg_node *`` cdata (pointer arithmetic
#: and comparison); the memory must stay held.
first_node: Callable[[Any], Any] = lib.pg_node_ptr


def pointers(values: Tuple[Any, ...], keeps: Tuple[tuple, ...]) -> Any:
    """A new array of the nodes of ``values`` (pygrad Values) for a C call,
    ``keeps`` their keeps (whoever passes the array holds them)."""
    n = len(keeps)
    ptrs = ffi.new(POINTERS, n)
    if lib.pg_pack_keeps(id(values), id(keeps), ptrs, n):
        raise TypeError("pygrad: a Value's node is missing (its _pg_keep was let go), or an "
                        "item is no pygrad.Value: make the Value again from its data")
    return ptrs


class Packed:
    """Node pointers of many Values for one C call (bulk reads and writes,
    optimizer steps, fused layers' parameters), with the keeps that hold
    their nodes: whoever holds a Packed may pass ``ptrs`` to C."""

    __slots__ = ("ptrs", "keeps")
    ptrs: Any
    keeps: Tuple[tuple, ...]

    def __init__(self, values: Tuple[Any, ...]) -> None:
        self.keeps = tuple(v._pg_keep for v in values)
        self.ptrs = pointers(values, self.keeps)

    def __len__(self) -> int:
        return len(self.keeps)


def pack(values: Iterable[Any]) -> Packed:
    """The nodes of ``values`` (pygrad Values), packed."""
    return Packed(tuple(values))


def within(keep: tuple, ptr: Any) -> tuple:
    """The keep of node ``ptr``, which lies below ``keep``'s node: the
    pointer, held by the keep above it."""
    return (ptr, keep)


def check(rc: int, what: str) -> int:
    """rc, or the exception a creator's error code means."""
    if rc >= 0:
        return rc
    if rc == lib.PG_E_NOMEM:
        raise MemoryError(f"pygrad: out of memory making {what}")
    raise ValueError(f"pygrad: can't make {what}: a child or a size is not valid")
