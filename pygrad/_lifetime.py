"""Node lifetime, in five rules (csrc/value_binding.h, which implements
them, states the same at its top with C's names; docs/lifetime.md links to
both).  What is listed under a rule is where it applies, not a further
rule.  Threads have rules of their own (csrc/lock.h).

1. **A node object owns what its nodes point to, and a node's op and
   children never change.**  A node lives in a node object, pygrad's own
   type, which only C makes: Python can't construct, read, write or resize
   one.  It holds its nodes inline and a reference to every node object or
   node list they point to, so whatever holds a node object holds all C
   can reach.  One node object may hold many nodes (a block of leaves, a
   fused layer's); a Value made for one holds the whole object.  (A custom
   op's node names its Value too, without a reference, for ``backward()``
   to find the closure.)
2. **A Value holds its node object, given once by C, and the operands it
   was made from.**  Before ``__init__`` or an op gives it a node, every
   call that needs it refuses the Value and the views ``_prev``,
   ``_children``, ``_local_grads`` and ``_op`` read as empty.  Attributes,
   ``__class__``, subclasses and the collector reach only the operands and
   ``_prev``'s cache (writable: ``_prev`` may then differ from C's
   children, which C never reads from it).
3. **The collector sees every Value and no node object.**  Node objects
   point only to older ones, so they form no cycle and are not tracked;
   Values' cycles (a user's closure, a fused model's table of the Values
   ``_prev`` makes for its hidden nodes) are collected as any.  A call that
   makes a big batch of Values and no garbage (a trace,
   ``grad(create_graph=True)``) runs with the collector paused, for speed
   only, and turns it back on only if it was on (a ``gc.disable()`` made
   during the call is undone).
4. **Freeing is reference counting, never recursive, and a release
   finishes what its object left open.**  A chain of any length frees in
   constant stack and runs no pygrad Python; nothing reads a reference
   count.  Sweeps, programs and batches are released by ``ffi.gc``: a
   sweep's release puts back the grads it saved unless kept, a program's
   writes back its pending numbers; every run checks ``replay.alive``
   first, since a cycle's ``__del__`` may reach a released program.  C's
   statics (its four types, callbacks and op names) are never released,
   so pygrad runs in one interpreter per process.
5. **Whatever C reads is held by a reference while it reads it.**  A
   call's arguments (passed by ``id()``) are held by its caller; a call
   without the GIL reads what its own reference or its sweep's, program's
   or batch's hold keeps, made before the call so a Ctrl-C can't lose it.
   So a node's address, Python's key for its identity, names one node
   while the Value is held.  The one read without a reference: a custom
   op's node's name for its Value, read with the GIL held and erased by the
   Value's dealloc.

Bulk calls (optimizers, ``Program``, fused layers) take a *node list*
(``pack``): the nodes of many Values, held by an object of pygrad's own
(rule 1's node list; rule 5 for the call).
"""
from typing import Any, Iterable, Tuple

from ._core import ffi, lib

__all__ = ["Packed", "pack", "check", "bulk", "traced"]


class Packed:
    """The nodes of many Values for bulk C calls (reads and writes,
    optimizer steps, fused layers' parameters): ``nodes`` is a node list,
    which C reads; its node pointers never reach Python (a fused step's
    optimizer gets them in C: ``pg_batch_step_l``)."""

    __slots__ = ("nodes", "n")
    nodes: Any
    n: int

    def __init__(self, values: Tuple[Any, ...]) -> None:
        out: list = []
        rc = lib.pg_pack_v(id(values), id(out))
        if rc == lib.PG_E_NOMEM:
            raise MemoryError("pygrad: out of memory making a list of nodes")
        if rc:
            raise TypeError("pygrad: an item is no pygrad.Value with a node (its __init__ "
                            "never ran, or it is another engine's): pass pygrad Values")
        self.nodes = out[0]
        self.n = len(values)

    def __len__(self) -> int:
        return self.n


def pack(values: Iterable[Any]) -> Packed:
    """The nodes of ``values`` (pygrad Values), packed."""
    return Packed(tuple(values))


def bulk(call: Any, packed: Packed, arr: Any) -> None:
    """One bulk read or write between ``packed``'s nodes and the float64
    array ``arr`` (``lib.pg_gather_data_l`` and its kind); C refuses an
    array whose length is not the node list's own."""
    nodes = packed.nodes            # (held by a name for the call)
    rc = call(id(nodes), ffi.from_buffer("double[]", arr), arr.size)
    if rc:
        traced(rc)
        raise ValueError(f"pygrad: {arr.size} numbers for the data of {len(packed)} Values")


def traced(rc: int) -> None:
    """The error of a bulk read made while this thread traces a loss, or of
    Values made from traced inputs (PG_E_TRACED): a trace's numbers."""
    if rc == lib.PG_E_TRACED:
        raise ValueError("pygrad: numbers were read in bulk (Inputs.get, a model's "
                         "get_data or get_grad) while pygrad.per_length traces the loss, "
                         "or from Values made from its traced tokens: those are the trace's "
                         "numbers, made once, not any run's. Read the parameters' numbers "
                         "outside the loss function")


def check(rc: int, what: str) -> int:
    """rc, or the exception a creator's error code means."""
    if rc >= 0:
        return rc
    if rc == lib.PG_E_NOMEM:
        raise MemoryError(f"pygrad: out of memory making {what}")
    raise ValueError(f"pygrad: can't make {what}: a child or a size is not valid")
