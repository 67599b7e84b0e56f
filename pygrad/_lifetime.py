"""Node lifetime, in six rules (csrc/value_binding.h, which implements them,
states the same at its top with C's names; docs/lifetime.md links to both).
Each rule is one sentence; what is listed under it is where it applies, not
a further rule.

1. **A node object owns what its nodes point to, and a node's structure
   never changes.**  A node lives in a node object, pygrad's own type,
   which only C makes: Python can't construct, read, write or resize one.
   It holds its nodes inline and a reference to every node object or node
   list they point to, so whatever holds a node object holds all C can
   reach, and memory goes back per node object.  A node's op and children
   are fixed when it is made; its mark, flags and numbers change (rule 6),
   and a custom op's pointer to its Value holds nothing.
2. **A Value holds its node object and its operands, and nothing Python
   does changes which node it has.**  ``_ValueBase`` gets the node once,
   from C, when ``__init__`` or an op makes it; before that, every call
   that needs it refuses the Value and the views ``_prev``, ``_children``,
   ``_local_grads`` and ``_op`` read as empty.  Attributes, ``__class__``,
   subclasses and the collector reach only the operands and ``_prev``'s
   cache.
3. **The collector sees every Value and no node object.**  Node objects
   point only to older ones, so they form no cycle and are not tracked;
   Values' cycles (a user's closure, a fused model's table of the Values
   ``_prev`` makes for its hidden nodes) are collected as any.  Where
   pygrad itself makes a big batch of Values in one call
   (``grad(create_graph=True)``, a trace), it pauses the collector for that
   call, for speed only, and turns it back on only if it was on.
4. **Freeing is reference counting, never recursive, and a release first
   finishes what its object left open; an object released in a cycle is
   refused after.**  A chain of any length frees in constant stack, runs
   no pygrad Python (ops make only Python classes' Values, which CPython
   frees in its trashcan), and nothing reads a reference count.  Sweeps, programs
   and batches are released by ``ffi.gc``: a sweep's release puts back the
   grads it saved unless kept, a program's writes back its pending numbers
   (rule 5); every run checks ``replay.alive`` first, since a cycle's
   ``__del__`` may reach a released program.  Never released: C's statics
   and ``engine._RESULT_CLASS``, so pygrad runs in one interpreter per
   process.
5. **Whatever C reads is held by a reference while it reads it, and is
   current.**  A call's arguments (passed by ``id()``) are held by its
   caller; a call without the GIL reads what its own reference or its
   sweep's, program's or batch's hold keeps, made before the call so a
   Ctrl-C can't lose it.  So a node's address, Python's key for its
   identity, names one node while the Value is held.  nn's caches (fused
   layers' packed parameters, ``_pg_bulk``) hold their node lists until
   an edit of the model makes them stale and they are rebuilt.  A compiled
   program leaves its interior numbers in its arrays until something reads
   or writes a node (a call taking a Value or node list, a ``.data``/``.grad``
   access, a sweep between closures, a release): they are written back
   first (replay's deferred write-back).  A ``per_length`` program writes
   none back: a Value made from a token refuses reads, and one kept from
   the traced call without a token keeps the numbers it was made with, as
   a micrograd Value does.
6. **A lock is held only while C or pygrad's own bookkeeping runs, never
   across user code, and what was read before it is checked again under
   it.**  The GIL guards node objects and reference counts (pygrad refuses
   to run without it), and flags are set under it (a walk sees one set
   meanwhile or not); C's long calls let it go after taking their
   references.  The sweep lock guards walks, and makes a sweep's rules one
   step unless a Python closure lies below (then the closures and rules
   run without it); waiters try in slices of tens of milliseconds, running
   signals between, and ``fork()`` takes it around itself.  A Program's
   ``CallLock`` guards its buffers (the holding thread calling again, as
   a signal handler or ``__del__`` may, gets a RuntimeError, never a
   wait); what may call back (an lr schedule, a loss to trace, your
   optimizer's methods) runs before it is taken or after, and the optimizer's
   step count, read then, is checked under it (the lr and state go with
   that count).  What pygrad builds outside any lock (``_prev``'s cache,
   ``per_length``'s program for a length, nn's fused cache) is the same
   whichever thread builds it.  A forked child finds every lock free and
   a program another thread was running reset, and the collector back on
   if pygrad had paused it.
   Unguarded by design: a node's numbers outside a locked walk, which race
   as floats do (two threads' ``+=`` in micrograd lose additions too).

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
    array shorter than the nodes."""
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
