"""Node lifetime, in one paragraph (csrc/pygrad.h says the same for C).

**Python owns every node, through immutable keeps.**  (1) A node lives in
memory that a cffi owning cdata holds (``ffi.new``: one array for every
node one C call makes); C never allocates, frees or records a node.
(2) A Value's *keep* is a tuple whose first item points to the Value's
node and whose other items hold that node's memory and the keeps of every
node it points to; a keep is built before the C call that links the new
node to its children, so a node can only point to what its keep holds.
(3) Tuples can't be cleared by the collector or rebound by user code, so
rebinding or clearing any attribute of a Value drops at most that Value's
own hold, never memory a live node points to; a cdata is freed only when
CPython really deallocates it, after every finalizer.  (4) A call into C
that walks a graph is handed a node whose keep the caller holds in a
local variable for the whole call, so it may let the GIL go.

The Value also holds the Values it was made from (``_prev``: class,
attributes and identity), but nothing C reads depends on them.  Everything
here is a small helper of ``engine``; nothing keeps a record of live
nodes.
"""
from typing import Any, Iterable, Tuple

from ._core import ffi, lib

__all__ = ["NODE", "NODE_PAIR", "NODES", "POINTERS", "Packed", "pack", "check", "within"]

#: One node; a node and the leaf of its number operand (``v * 2``); n nodes.
NODE = ffi.typeof("pg_node[1]")
NODE_PAIR = ffi.typeof("pg_node[2]")
NODES = ffi.typeof("pg_node[]")
#: A list of node pointers (children, parameters).
POINTERS = ffi.typeof("pg_node *[]")


class Packed:
    """Node pointers of many Values for one C call (bulk reads and writes,
    optimizer steps, fused layers' parameters), with the keeps that hold
    their nodes: whoever holds a Packed may pass ``ptrs`` to C."""

    __slots__ = ("ptrs", "keeps")
    ptrs: Any
    keeps: Tuple[tuple, ...]

    def __init__(self, keeps: Tuple[tuple, ...]) -> None:
        self.keeps = keeps
        self.ptrs = ffi.new(POINTERS, [k[0] for k in keeps])

    def __len__(self) -> int:
        return len(self.keeps)


def pack(values: Iterable[Any]) -> Packed:
    """The nodes of ``values`` (pygrad Values), packed."""
    return Packed(tuple(v._pg_keep for v in values))


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
