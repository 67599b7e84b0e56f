"""Python's side of node lifetime.  csrc/memory.c has the whole design and
its state diagram; in short:

* **Claims.**  A Value holds its node through ``_s``: either the
  ``Segment`` its node was made in (op results share one per C graph
  segment, so an op costs no per-node bookkeeping), or a node claim of its
  own (leaves, custom ops, Values met through ``_prev``).  Both release in C
  (``ffi.gc`` with ``lib.pg_release``): no Python code runs when a Value
  dies, so an interrupt can't cut a release in half.
* **Python-held nodes.**  A node made in Python (``Value(x, children, op)``,
  usually with a ``_backward`` closure) and every node above one keep their
  children's Values in ``_kids``, as micrograd's ``_prev`` does, so the
  closure's cycle is one the garbage collector sees and frees.
* **One Value per node.**  ``_prev`` hands out the Value that already
  exists for a node: registered ones (leaves, Python-held nodes, Values
  ``_prev`` made), or, for op results, the Values found holding the node's
  segment (``gc.get_referrers``), once per segment.
* **Settling.**  A Value kept after its graph is dropped would keep its whole
  segment (and all the segment reaches).  When closed segments pile up,
  their remaining Values trade the segment claim for a node claim of their
  own, and the segment goes: a kept Value pins only its own subgraph.
* **Node records.**  ``label`` and custom op names belong to the node, not to
  a Value object, so they live in ``extras``, indexed from the C node.
"""
import gc
import os
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Type

from ._core import ffi, lib

_SEG_BITS = lib.PG_SEG_BITS


def _claim(_gc: Any = ffi.gc, _new: Any = ffi.new, _release: Any = lib.pg_release) -> Any:
    """An empty claim, released in C when it dies: made first, filled by one
    C call after, so that it can never be lost or released twice."""
    return _gc(_new("pg_claim *"), _release)


def _check(rc: int, what: str) -> int:
    if rc == lib.PG_E_SPACE:
        raise MemoryError(f"pygrad: the handle space is full ({lib.PG_MAX_SEGS:,} segments of "
                          f"{lib.PG_SEG_NODES:,} nodes, 2**30 nodes) while making {what}; "
                          "too many Values are alive")
    if rc == lib.PG_E_NOMEM:
        raise MemoryError(f"pygrad: out of memory for {what}")
    if rc < 0:
        raise ValueError(f"pygrad: invalid node for {what} (a Value whose node no longer exists)")
    return rc


class Segment:
    """Python's claim on one C graph segment, shared by the Values made in
    it.  ``found``: its Values have been registered (see ``find_values``)."""

    __slots__ = ("sid", "claim", "found", "__weakref__")

    def __init__(self) -> None:
        claim = _claim()
        self.sid = _check(lib.pg_open_segment(claim), "a new node segment")
        self.claim = claim
        self.found = False

    def __reduce__(self) -> Any:
        raise TypeError("a pygrad claim on C memory can't be copied or pickled")


def hold(h: int) -> Any:
    """A node claim on live node h."""
    claim = _claim()
    _check(lib.pg_hold(claim, h), "a node claim")
    return claim


def new_leaf(data: float, _leaf: Any = lib.pg_new_leaf) -> "tuple[int, Any]":
    """A new leaf in the leaf pool: its handle and the claim that holds it."""
    claim = _claim()
    h = _leaf(claim, data)
    return (h if h >= 0 else _check(h, "a leaf")), claim


# -- one Value per node ---------------------------------------------------------

class Registry:
    """Handle -> the live Value of that node, by weak reference (no
    callbacks, which would run Python code when a Value dies); dead entries
    are purged when the table has doubled."""

    __slots__ = ("refs", "live", "segments", "lock")

    def __init__(self) -> None:
        self.refs: Dict[int, "weakref.ref[Any]"] = {}
        self.live = 64
        # sid -> weak reference to its Segment, for find_values and settle.
        self.segments: Dict[int, "weakref.ref[Segment]"] = {}
        self.lock = threading.RLock()

    def add(self, v: Any, _ref: Any = weakref.ref) -> None:
        refs = self.refs
        refs[v._h] = _ref(v)
        if len(refs) > 2 * self.live:
            self._purge()

    def _purge(self) -> None:
        # In place, from a snapshot, since other threads add without the
        # lock: an entry is dropped only if it is still the dead one seen in
        # the snapshot.  dict.copy() makes it in C with no thread switch
        # (list(items) can't: its tuples may start a GC that runs other
        # Python code); only then may the GIL move.
        with self.lock:
            refs = self.refs
            if len(refs) <= 2 * self.live:
                return
            for h, r in refs.copy().items():
                if r() is None and refs.get(h) is r:
                    del refs[h]
            self.live = max(64, len(refs))

    def get(self, h: int) -> Any:
        r = self.refs.get(h)
        return r() if r is not None else None

    def add_segment(self, seg: Segment) -> None:
        self.segments[seg.sid] = weakref.ref(seg)     # a reused sid overwrites

    def segments_alive(self) -> List[Segment]:
        entries = self.segments.copy().items()      # a snapshot, as in _purge
        alive = [s for s in (r() for _, r in entries) if s is not None]
        if len(alive) * 2 < len(entries):
            with self.lock:           # in place, as in _purge
                for sid, r in entries:
                    if r() is None and self.segments.get(sid) is r:
                        del self.segments[sid]
        return alive

    def segment(self, sid: int) -> Optional[Segment]:
        r = self.segments.get(sid)
        seg = r() if r is not None else None
        return seg if seg is not None and seg.sid == sid else None


registry = Registry()


def values_holding(seg: Segment, value_type: Type[Any]) -> List[Any]:
    """The Values that hold segment ``seg`` (op results made in it)."""
    return [w for w in gc.get_referrers(seg) if isinstance(w, value_type) and w._s is seg]


def find_values(seg: Segment, value_type: type, close: Callable[[Segment], None]) -> None:
    """Register the Values made in ``seg``, once: the segment is closed
    first (no Value joins it later), so one scan finds them all."""
    with registry.lock:
        if seg.found:
            return
        close(seg)
        for w in values_holding(seg, value_type):
            registry.add(w)
        seg.found = True


class Settler:
    """Trades the segment claims of Values kept in closed segments for node
    claims, so that those segments (and what only they held) are freed.
    Runs when the number of live closed segments has doubled since the last
    time, so its cost (one scan of Python's objects) stays amortized."""

    __slots__ = ("threshold", "opened")

    def __init__(self) -> None:
        self.threshold = 64
        self.opened = 0

    def segment_opened(self, current: Optional[Segment], value_type: type) -> None:
        self.opened += 1
        if self.opened >= self.threshold:
            self.opened = 0
            if len(registry.segments_alive()) > self.threshold:
                self.settle(current, value_type)

    def settle(self, current: Optional[Segment], value_type: type) -> None:
        """Settle every live closed segment now (after another thread that
        is settling, if any)."""
        # A with block, not acquire() then try: an interrupt between those
        # two would leave the lock held and every other thread waiting.
        seg: Optional[Segment]
        with registry.lock:
            for seg in registry.segments_alive():
                if seg is current:
                    continue
                for w in values_holding(seg, value_type):
                    claim = hold(w._h)
                    # Registered before it leaves the segment: a Ctrl-C between
                    # the two must not leave a Value _prev can't find.
                    registry.add(w)
                    w._s = claim        # one store: the Value is never unheld
                seg.found = True
            seg = None
            self.threshold = max(64, 2 * len(registry.segments_alive()))


settler = Settler()


# -- node records: label and custom op name -------------------------------------

class NodeExtra:
    """Python data of one node: its label and op name (None: the op's own)."""

    __slots__ = ("h", "label", "op")

    def __init__(self, h: int) -> None:
        self.h = h
        self.label = ""
        self.op: Optional[str] = None


class ExtraTable:
    """Index -> NodeExtra, for the few nodes that carry Python data.  C
    stores the index in the node and forgets it when the node dies; records
    whose node no longer points at them are purged when the table has
    doubled (a purge only drops and rebuilds, so an interrupt can't lose
    anything)."""

    __slots__ = ("items", "free", "live", "lock")

    def __init__(self) -> None:
        self.items: List[Optional[NodeExtra]] = [None]   # index 0 means "none"
        self.free: List[int] = []
        self.live = 64
        self.lock = threading.RLock()

    def get(self, h: int) -> Optional[NodeExtra]:
        i = lib.pg_extra(h)
        return self.items[i] if i else None

    def get_or_create(self, h: int) -> NodeExtra:
        with self.lock:
            i = lib.pg_extra(h)
            if i and self.items[i] is not None:
                return self.items[i]  # type: ignore[return-value]
            if not self.free and len(self.items) > 2 * self.live:
                self.purge()
            extra = NodeExtra(h)
            if self.free:
                i = self.free.pop()
                self.items[i] = extra
            else:
                i = len(self.items)
                self.items.append(extra)
            _check(lib.pg_set_extra(h, i), "a node record")
            return extra

    def purge(self) -> None:
        with self.lock:
            items = self.items
            for i in range(1, len(items)):
                e = items[i]
                if e is not None and lib.pg_extra(e.h) != i:
                    items[i] = None
            self.free = [i for i in range(1, len(items)) if items[i] is None]
            self.live = max(64, len(items) - len(self.free))


extras = ExtraTable()


def _after_fork_in_child() -> None:
    # Locks held by other threads at fork() stay locked in the child.
    registry.lock = threading.RLock()
    extras.lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
