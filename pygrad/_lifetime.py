"""Python's side of node lifetime (see csrc/memory.c for the C side).

Every ``Value`` holds a ``Segment``: Python's claim on the C segment its node
lives in.  No per-Value finalizer runs; when the last Value of a segment goes,
the ``Segment`` dies and one C call frees every node of it that no parent
holds, cascading down the graph.

Python-side data a node needs beyond its numbers (a label, a custom op name,
a backward written in Python) lives in ``NodeExtra`` records indexed from the
C node; when C frees such a node it queues the index, and ``ExtraTable.drain``
drops the record.
"""
import threading
import weakref
from typing import Any, Callable, List, Optional

from ._core import ffi, lib


class ExtraTable:
    """Index -> NodeExtra, for the few nodes that carry Python data."""

    __slots__ = ("items", "free", "lock", "draining", "buf")

    def __init__(self) -> None:
        self.items: List[Optional["NodeExtra"]] = [None]   # index 0 means "none"
        self.free: List[int] = []
        # Re-entrant: a finalizer may run drain() while this thread holds it.
        self.lock = threading.RLock()
        self.draining = False
        self.buf = ffi.new("uint32_t[]", 256)

    def get(self, h: int) -> "Optional[NodeExtra]":
        i = lib.pg_extra(h)
        return self.items[i] if i else None

    def get_or_create(self, h: int) -> "NodeExtra":
        with self.lock:
            i = lib.pg_extra(h)
            if i:
                return self.items[i]
            extra = NodeExtra()
            if self.free:
                i = self.free.pop()
                self.items[i] = extra
            else:
                i = len(self.items)
                self.items.append(extra)
            if lib.pg_set_extra(h, i) < 0:
                self.items[i] = None
                self.free.append(i)
                raise MemoryError("pygrad: out of memory for node extras")
            return extra

    def drain(self) -> None:
        """Act on C's notices: drop the records of freed nodes, and let go of
        the closures of pinned nodes whose parents are gone.  Letting go can
        free more nodes (and run this again from a finalizer): the nested
        call returns at once and this loop picks its notices up."""
        with self.lock:
            if self.draining:
                return
            self.draining = True
            try:
                while self._drain_reaped() + self._drain_orphans():
                    pass
            finally:
                self.draining = False

    def _drain_reaped(self) -> int:
        n = lib.pg_take_reaped(self.buf, 256)
        for k in range(n):
            i = self.buf[k]
            self.items[i] = None
            self.free.append(i)
        return n

    def _drain_orphans(self) -> int:
        n = lib.pg_take_orphans(self.buf, 256)
        handles = [self.buf[k] for k in range(n)]
        for h in handles:
            extra = self.get(h)
            if lib.pg_unpin_orphan(h) and extra is not None:
                extra.backward = None
        return n


class NodeExtra:
    """Python data of one node: label, custom op name, Python backward."""

    __slots__ = ("label", "op", "backward", "holder")

    def __init__(self) -> None:
        self.label = ""
        self.op = ""
        # A Python backward is held by a BackwardHolder while a Value of the
        # node is alive, and moves here when the last one goes (see below).
        self.backward: Optional[Callable[[], None]] = None
        self.holder: "Optional[weakref.ref[BackwardHolder]]" = None

    def python_backward(self) -> Optional[Callable[[], None]]:
        if self.backward is not None:
            return self.backward
        holder = self.holder() if self.holder is not None else None
        return holder.backward if holder is not None else None


extras = ExtraTable()


class Claim:
    """A claim on C memory is released exactly once, when it dies: a copy
    would release it twice, so copying or pickling one is refused."""

    __slots__ = ()

    def __reduce__(self) -> Any:
        raise TypeError("a pygrad claim on C memory can't be copied or pickled")


class Segment(Claim):
    """Python's claim on one C segment of nodes; released when it dies."""

    __slots__ = ("sid",)

    def __init__(self, sid: int) -> None:
        self.sid = sid

    def __del__(self, _release=lib.pg_seg_release, _drain=extras.drain) -> None:
        # Defaults bind what is needed: this may run after module teardown.
        if _release(self.sid) > 0:
            _drain()


class NodePin(Claim):
    """A claim on one node instead of its whole segment (see narrow_claims)."""

    __slots__ = ("h",)

    def __init__(self, h: int) -> None:
        self.h = h
        lib.pg_ref(h)

    def __del__(self, _unref=lib.pg_unref, _drain=extras.drain) -> None:
        if _unref(self.h) > 0:
            _drain()


class BackwardHolder(Claim):
    """Stands in for the Segment of a Value whose ``_backward`` was set.

    micrograd's ``_backward`` closures refer to their own ``out`` Value and
    to its children's Values.  If a table held such a closure for the node's
    whole life, those Values' claims would keep the node alive forever.  So
    the closure lives here, on the Value.  When that Value goes while parents
    still need the backward, the node is pinned in C and the closure moves
    to its NodeExtra; once the parents are gone C reports the node as an
    orphan and ExtraTable.drain lets go of both.  A moved closure must not
    pin whole segments (they hold the very parents that keep it): the Values
    it refers to are narrowed to claims on their own nodes.

    The holder takes its own claim, so that its finalizer can still look at
    the node whatever order the garbage collector finalizes a cycle in.
    """

    __slots__ = ("sid", "h", "backward", "extra", "__weakref__")

    def __init__(self, h: int, backward: Callable[[], None], extra: NodeExtra) -> None:
        self.sid: Optional[int] = h >> lib.PG_SEG_BITS
        self.h = h
        self.backward = backward
        self.extra = extra
        lib.pg_seg_claim(self.sid)

    def narrow(self) -> None:
        """Trade the segment claim for a claim on this node only."""
        if self.sid is not None:
            lib.pg_ref(self.h)
            sid, self.sid = self.sid, None
            if lib.pg_seg_release(sid) > 0:
                extras.drain()

    def __del__(self, _pin=lib.pg_pin_if_parented, _release=lib.pg_seg_release,
                _unref=lib.pg_unref, _drain=extras.drain) -> None:
        fn, self.backward = self.backward, None    # don't keep a cycle alive
        if _pin(self.h):
            self.extra.backward = fn
            narrow_claims(fn, self)
        del fn
        # The garbage collector may finalize this holder before a parent's
        # holder narrows it (both in one cycle): with sid None, narrow()
        # then finds nothing left to release.
        sid, self.sid = self.sid, None
        pending = _release(sid) if sid is not None else _unref(self.h)
        if pending > 0:
            _drain()

    @staticmethod
    def reclaim(h: int, extra: NodeExtra) -> "BackwardHolder":
        """A holder for a new Value of a node whose closure was moved to its
        NodeExtra: the closure moves back, and the pin goes."""
        holder = BackwardHolder(h, extra.backward, extra)   # type: ignore[arg-type]
        extra.backward = None
        lib.pg_unpin(h)
        return holder


def narrow_claims(fn: Callable[[], None], skip: BackwardHolder) -> None:
    """Narrow the claims of the Values a closure refers to (in its cells and
    defaults, and one level into tuples, lists and sets) to their own nodes.
    Values it reaches any other way keep claiming their whole segment, which
    holds memory longer but is never unsafe."""
    found = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())
             if _cell_is_set(c)]
    found.extend(getattr(fn, "__defaults__", None) or ())
    for obj in found:
        for v in obj if isinstance(obj, (tuple, list, set, frozenset)) else (obj,):
            # A C Value is known by its claim: importing engine here could
            # fail, since this runs from finalizers, also at interpreter exit.
            claim = getattr(v, "_s", None)
            if isinstance(claim, Segment):
                v._s = NodePin(v._h)
            elif isinstance(claim, BackwardHolder) and claim is not skip:
                claim.narrow()


def _cell_is_set(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def new_segment() -> Segment:
    """A fresh C segment, already claimed by the returned object."""
    sid = lib.pg_seg_new()
    if sid < 0:
        raise MemoryError("pygrad: out of memory for a new node segment")
    return Segment(sid)


def claim(sid: int) -> Segment:
    """A new claim on an existing segment (to wrap a node found in the graph)."""
    lib.pg_seg_claim(sid)
    return Segment(sid)
