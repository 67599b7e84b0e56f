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
from typing import Callable, List, Optional

from ._core import ffi, lib


class ExtraTable:
    """Index -> NodeExtra, for the few nodes that carry Python data."""

    __slots__ = ("items", "free", "lock", "buf")

    def __init__(self) -> None:
        self.items: List[Optional["NodeExtra"]] = [None]   # index 0 means "none"
        self.free: List[int] = []
        # Re-entrant: a Segment finalizer may drain while this thread holds it.
        self.lock = threading.RLock()
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
        """Drop the records of nodes that C has freed."""
        with self.lock:
            while True:
                n = lib.pg_take_reaped(self.buf, 256)
                for k in range(n):
                    i = self.buf[k]
                    self.items[i] = None
                    self.free.append(i)
                if n < 256:
                    return


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


class Segment:
    """Python's claim on one C segment of nodes; released when it dies."""

    __slots__ = ("sid",)

    def __init__(self, sid: int) -> None:
        self.sid = sid

    def __del__(self, _release=lib.pg_seg_release, _drain=extras.drain) -> None:
        # Defaults bind what is needed: this may run after module teardown.
        if _release(self.sid) > 0:
            _drain()


class BackwardHolder:
    """Stands in for the Segment of a Value whose ``_backward`` was set.

    micrograd's ``_backward`` closures refer to their own ``out`` Value.  If
    a global table held the closure, that Value (and its segment) would never
    die.  So the closure lives here, on the Value, and only when the Value
    goes, and parents still need the node's backward, does it move to the
    node's NodeExtra, which C drops with the node.  The moved Value keeps no
    claim (``seg`` is cleared), so the node's lifetime is then its parents'.
    """

    __slots__ = ("seg", "h", "backward", "extra", "__weakref__")

    def __init__(self, seg: Optional[Segment], h: int, backward: Callable[[], None],
                 extra: NodeExtra) -> None:
        self.seg = seg
        self.h = h
        self.backward = backward
        self.extra = extra

    def __del__(self, _refs=lib.pg_refs) -> None:
        if self.seg is not None and _refs(self.h) > 0:
            self.extra.backward = self.backward
        self.seg = None


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
