"""Node lifetime, in six concepts (csrc/value_binding.h, which implements
them, states the same at more length at its top; docs/lifetime.md links to
both).  Each is one rule; the forms it takes are listed under it.

1. **A node object owns what its nodes point to, and a node's structure
   is fixed.**  A node lives in a node object, pygrad's own type, which
   only C makes: Python can't construct, read, write or resize one.  It
   holds its node(s) inline and a reference to every node object or node
   list they point to, so whatever holds a node object holds all that C
   can reach from it, and memory goes back per node object (a Value over
   any of its nodes keeps all of them).  A node's op and children never
   change after it is made (any thread may read them; a sweep's restore
   rewrites them with what they were); its mark, numbers, flags and a
   custom op's pointer to its Value do.
2. **A Value holds its node and its operands.**  Its C base
   (``_ValueBase``) has the node object and the node's place in it,
   written at most once, by C, when ``__init__`` or an op gives it a node
   (until then it has none: every call that needs it refuses the Value,
   and the read-only views ``_prev``, ``_children``, ``_local_grads`` and
   ``_op`` read as empty), and changed by nothing Python
   does (attributes, ``__class__``, subclasses, the collector) until the
   Value is deallocated; and the operands it was made from (for
   ``_prev``: the Python graph mirrors C's) and ``_prev``'s cache.  The
   one pointer the other way, a custom op's node to its Value (for the
   sweep that runs its closure), holds nothing: the Value clears it as it
   goes.  A C node given a ``_backward`` later has only a flag: its
   closure is found through the Values above it.
3. **The collector sees every Value and no node object, and runs when
   CPython decides, but around pygrad's own bulk builds.**  Node objects
   refer only to older node objects and node lists, so they form no cycle
   and are not tracked; Values are ordinary collected objects, and their
   cycles (a user's closure; a fused model's table of the Values ``_prev``
   makes for its hidden nodes) are collected as any.  Where pygrad itself
   makes a big batch of Values in one call (``grad(create_graph=True)``,
   a trace), it pauses the process's collector for that call, for speed
   only (back on only if it was on when the call began; a forked child
   turns it back on).
4. **Freeing is reference counting, without recursion, and runs none of
   pygrad's Python; a release first finishes or undoes what its object
   left open, and an object released in a cycle is refused after** (a Value's own ``__del__`` or weakref callbacks run
   as CPython runs them): a node object's references are let go through
   a per-thread list, and a Value's through CPython's trashcan, so a chain
   of any length frees in constant stack; sweeps, programs and batches
   are released by C (``ffi.gc``), with no finalizer or weak registry (a
   released program may still be reached from its cycle's ``__del__``:
   every run checks ``replay.alive`` first).  A
   sweep's release first puts back the grads it saved unless it was kept
   (``pg_sweep_keep``, once its last call has returned), then lets go of
   its hold; a program's first writes its last run's numbers back and
   leaves the list of programs that settling walks (replay's deferred
   write-back).  Nothing reads a Python object's reference count (a threaded
   run's job record counts its threads: the last one out frees it).  What
   lives as long as the process: C's statics (pygrad's three C types,
   ``set.__new__`` and engine's callbacks: the number converter,
   ``_Children``, ``_prev_slow``, ``Value``, ``_op``'s names and slow
   path), engine's ``_RESULT_CLASS`` (each Value subclass an op has met,
   and its result class), and the walks' scratch between walks (capped);
   so pygrad runs in one interpreter per process.
5. **Whatever C reads is held by a reference while it reads it, and is
   current: a compiled program's pending numbers go back into their nodes
   before anything reads or writes one** (replay's deferred write-back,
   ``settle_replays``: every binding call that takes a Value or a node
   list, a ``.data``/``.grad`` read or write of a node a program computes,
   a sweep between closures, a program's release).  A
   call's arguments (passed by ``id()``) are held by its caller for the
   call; a call that lets the GIL go reads only what a reference holds
   for it (its own, or its sweep's, program's or batch's hold, from the
   call that fills it until it is released, made before that call so a
   Ctrl-C can't lose it); C's own worker threads, which may outlive the
   call, touch only their job record once it has returned.  So a node's
   address, Python's key for its identity, names one node while whoever
   keyed it holds the Value.
6. **A lock guards what threads share, held only while C (or pygrad's
   own bookkeeping) runs, never across user code; what pygrad reads or
   builds outside a lock is checked again under it, or keeps the first
   one made**: the GIL (node
   objects, reference counts, flags and the list of compiled programs that
   settling walks; cffi's calls keep it, but those
   csrc/cffi_build.py lists in ``RELEASES_GIL`` and the binding's own
   long calls (backward, compile, a batch's compile and step, hvp, bulk
   reads and writes, optimizer steps), which let it go after taking their
   references; pygrad refuses to run with the GIL disabled), the sweep lock (walks'
   marks and scratch, and a sweep's rules as one step, unless a Python
   closure lies below: that sweep records its order under the lock, then
   runs its rules and closures holding neither it nor, between closures,
   the GIL; its holder never takes the GIL;
   waited for in tries of tens of milliseconds, between which signals
   run; taken around ``fork()``), and each Program's and PerLength's
   ``CallLock`` (their buffers; a RuntimeError when the holding thread
   calls again).  A forked child finds the sweep lock free, remakes each
   CallLock on first use (under replay's ``_remaking`` lock), turns the
   collector back on and counts only the forking thread's own trace; a
   program another thread was running at the fork has its grads reset at
   its first use there.  What may call back (an
   lr schedule, a loss function to trace, your own optimizer's methods)
   runs before a lock is taken or after; what pygrad reads before taking a
   CallLock (an optimizer's step count, the lr) is checked again under it,
   and the step tried again if it changed; and what pygrad builds outside
   any lock keeps the first one made (``_prev``'s cache, a fused model's
   table, per_length's program for a length).  Unguarded by design: a node's numbers outside
   a locked walk, a closure sweep's rules included (they race as floats
   do: two threads' sweeps with a closure below, over shared nodes, may
   lose each other's additions, as two threads' ``+=`` do in micrograd),
   and a program's arrays, which settling (replay's deferred write-back)
   may read while another thread's run writes them.

Bulk calls (optimizers, ``Program``, fused layers) take a *node list*
(``pack``): the nodes of many Values, held by an object of pygrad's own
(concept 1's node list; concept 5 for the call).
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
    """The error of a bulk read made while this thread traces a loss
    (PG_E_TRACED): its numbers would be baked into every run."""
    if rc == lib.PG_E_TRACED:
        raise ValueError("pygrad: numbers were read in bulk (Inputs.get, a model's "
                         "get_data or get_grad) while pygrad.per_length traces the loss: "
                         "that happens once, not on every run of the program. Read them "
                         "outside the loss function")


def check(rc: int, what: str) -> int:
    """rc, or the exception a creator's error code means."""
    if rc >= 0:
        return rc
    if rc == lib.PG_E_NOMEM:
        raise MemoryError(f"pygrad: out of memory making {what}")
    raise ValueError(f"pygrad: can't make {what}: a child or a size is not valid")
