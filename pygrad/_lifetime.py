"""Python's side of node lifetime.  csrc/memory.c has the whole design and
its state diagram (eight concepts); what Python does in it:

* **Fresh Values sit in the table.**  Each op result and leaf is stored
  in ``values[h]`` as it is made: one list store per op, indexed by the
  handle itself, no claim or weak reference.  The table is also how
  ``_prev`` finds the Value of a node, so there is one Value per node
  (``values_of``).  It spans every segment id in use (a segment's range is
  PG_SEG_NODES long) and grows when an op's handle is past its end
  (``store``).
* **Settling** reads those Values' reference counts (C-level scans of a
  segment's range), never the heap: a Value that only the table holds is
  dead, so it leaves the table and its node's fresh mark is cleared (the
  node is freed if nothing else holds it); where the segment has
  Python-held Values, a dead chain of them goes newest first, each freeing
  the next.  In a closed segment a live Value takes a claim of its own and
  moves to the registry, and the range is emptied.  Closed segments settle
  at any garbage collection (``_at_collection``: ops fill the young
  generation, so one comes every few hundred ops), after each
  ``backward()`` and when the table grows (the ways with the collector
  off).  Every unsettled segment settles at a
  full collection and on ``settle()`` (Python-held Values then trade the
  table for claims, so that the collection sees their cycles).  A Ctrl-C that lands in the collection
  callback is delivered again (``_unraisable``).
* **Ops cut into.**  Code that runs inside an op (a finalizer, a gc
  callback, a signal handler) may close and settle the op's segment before
  the op stores its Value: while any thread is in an op function
  (``makes_nodes``), a closed segment's fresh node with no Value takes a
  claim (``late``) that goes to its Value when it comes (``_keep_late``,
  ``_settle_late``).
* **Claims.**  A settled Value holds its node through ``_s``, a claim that
  C releases (a cffi allocator's free, ``pg_claim_free``) when the Value
  dies: no Python code runs then, so an interrupt can't cut a release in
  half.
* **Registry.**  Claimed Values by handle, weakly, for ``values_of``.
* **Python-held nodes.**  A custom op's Value, and every op result above
  one, keeps its operands' Values in ``_hold``, as micrograd's ``_prev``
  does, so the closures' cycles stay visible to the garbage collector.  A
  cycle never looks dead from reference counts, so a custom op's Value is
  claimed and registered as it is made (``Value.__init__``), and the
  Python-held Values above one that are still alive trade the table for
  claims at the next collection (``_promote_held``): young cycles die young.
* **Node records.**  ``label`` and op names set by the user belong to the
  node: they live in ``extras``, indexed from the C node.

Every step is ordered so that a KeyboardInterrupt between any two leaves
nothing unheld: a Value is claimed and registered before its range empties,
and a segment is marked settled (``pg_settle``) only after that.
"""
import _thread
import gc
import os
import sys
import threading
import time
import weakref
from types import FrameType
from functools import partial
from itertools import compress, repeat
from operator import eq as _eq, is_not, lt as _lt
from typing import Any, Callable, List, Optional, TypeVar

from ._core import ffi, lib

__all__ = ["values", "store", "reach", "registry", "hold", "new_claim", "CLAIM", "lock",
           "values_of", "makes_nodes", "late",
           "settle", "settle_closed", "extras", "check"]

SEG_BITS: int = lib.PG_SEG_BITS
SEG_NODES: int = lib.PG_SEG_NODES
_getrefcount = sys.getrefcount
_new = object.__new__


# Claims: allocated zeroed by C and released by C (pg_claim_free) when the
# Python object dies.  Made empty first, filled by one C call after
# (pg_hold), so that a claim can never be lost or released twice.
new_claim = _new_claim = ffi.new_allocator(lib.pg_claim_alloc, lib.pg_claim_free,
                                           should_clear_after_alloc=False)
CLAIM = _CLAIM = ffi.typeof("pg_claim *")     # a ctype, not its name: no lookup per claim


def check(rc: int, what: str) -> int:
    """rc if it is a handle, else the exception its PG_E_* code means."""
    if rc >= 0:
        return rc
    if rc == lib.PG_E_SPACE:
        raise MemoryError(f"pygrad: the handle space is full ({lib.PG_MAX_SEGS:,} segments of "
                          f"{lib.PG_SEG_NODES:,} nodes, 2**30 nodes) while making {what}; "
                          "too many Values are alive")
    if rc == lib.PG_E_NOMEM:
        raise MemoryError(f"pygrad: out of memory for {what}")
    raise ValueError(f"pygrad: invalid node for {what} (a Value whose node no longer exists)")


def hold(h: int, _hold: Any = lib.pg_hold) -> Any:
    """A claim on live node h."""
    try:
        claim = _new_claim(_CLAIM)
    except MemoryError:
        raise MemoryError("pygrad: out of memory for a node claim") from None
    rc = _hold(claim, h)
    return claim if rc == 0 else check(rc, "a node claim")


def store(h: int, v: Any) -> None:
    """values[h] = v where the table does not reach h yet: a segment id
    this process had not used, so the table grows by whole segments.  Then
    the closed segments settle (without the collector, this is when)."""
    while len(values) <= h:
        values.extend(_EMPTY)
    values[h] = v
    settle_closed()


def reach(h: int) -> None:
    """Grow the table to cover handle h (a run of new nodes up to h, whose
    Values the caller stores next)."""
    if len(values) <= h:
        store(h, None)


class Registry:
    """Handle -> claimed Value, by weak reference.  No callbacks (they would
    run Python code as Values die): dead entries are purged when the table
    has doubled, and at each full garbage collection."""

    __slots__ = ("refs", "live")

    def __init__(self) -> None:
        self.refs: "dict[int, weakref.ref[Any]]" = {}
        self.live = 1024

    def add(self, v: Any, _ref: Any = weakref.ref) -> None:
        refs = self.refs
        refs[v._h] = _ref(v)
        if len(refs) > 2 * self.live:
            self.purge()

    def get(self, h: int) -> Any:
        r = self.refs.get(h)
        return r() if r is not None else None

    def purge(self) -> None:
        # From a snapshot: an entry goes only if it is still the dead one.
        refs = self.refs
        for h, r in refs.copy().items():
            if r() is None and refs.get(h) is r:
                del refs[h]
        self.live = max(1024, len(refs))

    def __len__(self) -> int:
        return len(self.refs)


# Handle -> the Value made for that node while its segment is unsettled
# (None: no Value).  Only ever mutated in place: engine binds it.
values: List[Any] = []
_EMPTY: List[None] = [None] * SEG_NODES
registry = Registry()
# Handles of the Python-held Values stored since the last full collection
# (they are few: custom ops and what is above them).
held_fresh: List[int] = []
# Guards the table against a lookup and a settle at once (another thread's,
# or a garbage collection's).  Taken only by `with` (an interrupt can't
# leave it held); re-entrant, because a collection may start while this
# thread settles: every step of a settle may safely run twice.
_lock = threading.RLock()


def _dead_counts() -> "tuple[int, int, int]":
    """The reference counts a Value only the table holds shows to the scans
    below, which read a copy of its segment's range (``vals``): in a map
    over the copy, in ``_survivors``' scan (compress holds the item it is
    deciding on), and in ``_sweep``'s second pass (its loop variable)."""
    table: List[Any] = [None, object()]
    vals = table[1:2]
    in_map = list(map(_getrefcount, vals))[0]
    seen: List[int] = []
    list(compress(vals, map(seen.append, map(_getrefcount, vals))))
    for i in (0,):
        v = vals[i]
        return in_map, seen[0], _getrefcount(v)
    raise AssertionError


def _dead_count_by_handle() -> int:
    """The same, for a Value read by handle into a local (``_promote_held``)."""
    table: List[Any] = [object()]
    n = len(table)
    for h in (0,):
        v = table[h] if h < n else None
        return _getrefcount(v)
    raise AssertionError


def _untraced(measure: Any) -> Any:
    """measure() with no trace or profile function: one that reads a
    frame's f_locals (a debugger, a variable snooper) holds the measured
    object once more, and a count one too high would make a live Value look
    dead to every settle after."""
    trace, profile = sys.gettrace(), sys.getprofile()
    sys.settrace(None)
    sys.setprofile(None)
    try:
        return measure()
    finally:
        sys.settrace(trace)
        sys.setprofile(profile)


_DEAD, _DEAD_IN_SCAN, _DEAD_IN_LOOP = _untraced(_dead_counts)
_DEAD_BY_HANDLE = _untraced(_dead_count_by_handle)

# The scans compare with operator's functions, not the int's own methods:
# a method-wrapper call packs a tuple, 25% of a scan's cost per Value.
_DEAD_EACH, _DEAD_IN_SCAN_EACH = repeat(_DEAD), repeat(_DEAD_IN_SCAN)


def _survivors(sid: int) -> "tuple[List[Any], int]":
    """The Values of segment sid that something besides the table holds,
    by C-level scans: the dead ones are not touched.  In a sparse segment
    (most nodes of a fused layer have no Value) the empty slots go first,
    by the cheapest scan.  Either way ``vals`` holds each Value once.

    Python-held Values hold their operands' (``_hold``), so a dropped chain
    of them (ops above a custom op) shows one dead Value and the rest held:
    where the segment has any, ``_sweep`` drops the whole chain first,
    rather than claiming every Value of it only to see them die.

    Also returns how many fresh nodes have no Value in the table: none,
    unless an op's Python side was cut into (see ``_keep_late``)."""
    base = sid << SEG_BITS
    fresh = lib.pg_fresh_nodes(sid, _held_count)
    if _held_count[0]:
        _sweep(base, base + SEG_NODES)
        fresh = lib.pg_fresh_nodes(sid, _held_count)
    vals = values[base:base + SEG_NODES]
    if 2 * fresh < SEG_NODES:
        vals = list(filter(_not_none, vals))     # the copy it replaces goes at once
        return (list(compress(vals, map(_lt, _DEAD_IN_SCAN_EACH, map(_getrefcount, vals)))),
                fresh - len(vals))
    # The Nones pass the scan too (None's count is huge): they are counted
    # on the way, so that the dense case pays nothing for the count.
    kept = list(compress(vals, map(_lt, _DEAD_IN_SCAN_EACH, map(_getrefcount, vals))))
    survivors = list(filter(_not_none, kept))
    return survivors, fresh - (len(vals) - (len(kept) - len(survivors)))


def _sweep(lo: int, hi: int) -> None:
    """Drop from the table's handles lo..hi (one segment's) every Value only
    the table holds, and clear their nodes' fresh marks.  A C-level pass
    finds the dead; if there were any, what they held may be free now
    (``_hold``, ``_prev``: always older Values), so one pass over the rest,
    newest first, drops those too, a whole chain at once."""
    vals = values[lo:hi]
    gone = list(compress(range(len(vals)), map(_eq, _DEAD_EACH, list(map(_getrefcount, vals)))))
    if not gone:
        return
    for i in reversed(gone):
        values[lo + i] = vals[i] = None
    for i in reversed(list(compress(range(len(vals)), map(is_not, vals, repeat(None))))):
        v = vals[i]
        if _getrefcount(v) <= _DEAD_IN_LOOP:
            values[lo + i] = vals[i] = None
            gone.append(i)
    del vals      # the last hold on the dead Values but the loop's
    v = None
    lib.pg_unfresh(ffi.new("uint32_t[]", [lo + i for i in gone]), len(gone))


# pg_fresh_nodes' second count (settles run under _lock: one buffer serves).
_held_count = ffi.new("uint32_t[1]")
_not_none = partial(is_not, None)    # not falsiness: a Value subclass may define __bool__


def _settle_closed() -> None:
    if late:
        _settle_late()
    sids = ffi.new("uint32_t[16]")
    while True:
        n = lib.pg_closed_segments(sids, 16)
        if not n:
            return
        for sid in list(sids[0:n]):
            base = sid << SEG_BITS
            if base < len(values):
                # The dead go as the range empties; the rest are registered,
                # then claimed, while the table still holds them.  (A Value
                # only a dead one held gets a claim too, released as it dies.)
                survivors, unstored = _survivors(sid)
                for v in survivors:
                    registry.add(v)
                    v._s = hold(v._h)
                v = None
                del survivors
                if unstored > 0:
                    _keep_late(sid)
                else:
                    values[base:base + SEG_NODES] = _EMPTY
            elif lib.pg_fresh_nodes(sid, _held_count):
                _keep_late(sid)         # fresh, and the table does not reach them yet
            lib.pg_settle(sid)
        if len(held_fresh) > 4 * SEG_NODES:
            del held_fresh[:len(held_fresh) // 2]     # settled long since, mostly


# -- ops cut into: "late" nodes ------------------------------------------------
#
# An op makes its node in C, then stores its Value in the table.  Python
# code can run in between, on the same thread: a garbage collection's
# callbacks and finalizers (the op allocates its Value), a signal handler.
# If that code closes the op's segment (it makes nodes till the segment is
# full, or calls settle()) and the segment settles before the op goes on,
# the op's node is fresh with no Value, like the node of an op that a
# Ctrl-C cut short, whose Value never comes.  The two look alike in the
# table; the stacks tell them apart: while a function of ``op_codes`` is
# running in any thread, such a node is kept by a claim of its own
# (``late``), its slot stays in the table, and later settles give that
# claim to the Value that comes, or drop it once no op is under way.

# Code objects of the functions that make a node in C and store its Value
# (engine's ops, marked with makes_nodes), and handle -> claim of the late.
op_codes: "set[Any]" = set()
late: "dict[int, Any]" = {}


_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def makes_nodes(fn: _Fn) -> _Fn:
    """Mark fn as one that makes nodes in C and then stores their Values
    (its frame on a stack means one may be under way)."""
    op_codes.add(fn.__code__)
    return fn


def _op_under_way() -> bool:
    """Is a function of ``op_codes`` running in any thread (this one too)?
    sys._current_frames() makes frame objects under an interpreter lock
    that is not re-entrant: a collection there would run finalizers, and a
    finalizer that settles would come back here and wait on that lock for
    ever.  So the collector is off for that call, and a call that comes
    while one is in it (another thread's) answers yes, which only keeps
    nodes longer."""
    global _in_current_frames
    if _in_current_frames:
        return True
    enabled = gc.isenabled()
    try:
        _in_current_frames = True
        gc.disable()
        tops = list(sys._current_frames().values())
    finally:
        if enabled:
            gc.enable()
        _in_current_frames = False
    codes = op_codes
    for top in tops:
        frame: Optional[FrameType] = top
        while frame is not None:
            if frame.f_code in codes:
                return True
            frame = frame.f_back
    return False


_in_current_frames = False


def _keep_late(sid: int) -> None:
    """Closed segment sid has fresh nodes with no Value in the table.  If an
    op may still be under way, each takes a claim in ``late`` before the
    segment settles; else they are an interrupted op's, and go with it.
    Its Values stored since the scan are claimed here, as survivors; the
    range is emptied but for the late slots, which the ops are still to
    fill (a store can come whenever a C call lets the GIL go)."""
    base = sid << SEG_BITS
    buf = ffi.new("uint32_t[]", SEG_NODES)
    count = lib.pg_fresh_list(sid, buf, SEG_NODES)
    busy = None
    n = len(values)
    for h in list(buf[0:count]):
        v = values[h] if h < n else None
        if v is None:
            if busy is None:
                busy = _op_under_way()
            if busy and h not in late:
                late[h] = hold(h)
        elif _getrefcount(v) > _DEAD_BY_HANDLE:
            # Stored since the scan (or a survivor, claimed once more: a
            # Ctrl-C between registering and claiming must be redone).
            registry.add(v)
            v._s = hold(h)
    v = None
    if base < len(values):
        lo = base
        for h in sorted(h for h in late if h >> SEG_BITS == sid):
            values[lo:h] = _EMPTY[:h - lo]
            lo = h + 1
        values[lo:base + SEG_NODES] = _EMPTY[:base + SEG_NODES - lo]


def _settle_late() -> None:
    """Give each late claim to its Value if it has come and is alive; drop
    it with its Value if that is dead, or if no Value came and no op is
    under way (it never will)."""
    busy = None
    n = len(values)
    for h in list(late):
        # A settle set off inside this one (a finalizer's op that grows the
        # table) may have dealt with h already: hence get and pop.
        v = values[h] if h < n else None
        if v is not None:
            claim = late.get(h)
            if claim is not None and _getrefcount(v) > _DEAD_BY_HANDLE:
                registry.add(v)           # registered, then claimed, then out
                v._s = claim
            values[h] = None
            late.pop(h, None)
        else:
            if busy is None:
                busy = _op_under_way()
            if not busy:
                late.pop(h, None)
    v = None


def settle_closed() -> None:
    """Settle the closed segments."""
    with _lock:
        _settle_closed()


def _unsettled() -> List[int]:
    """The sids of the segments not settled yet (open or closed), newest
    first: the only ranges of the table that may hold Values."""
    while True:
        cap = lib.pg_live_segments() + 16
        sids = ffi.new("uint32_t[]", cap)
        n = lib.pg_unsettled_segments(sids, cap)
        if n < cap:
            return list(sids[0:n])


def _promote_held() -> None:
    """The Python-held Values stored since the last time, newest first: one
    that only the table holds is dropped (so what it held may be, next: a
    dead chain goes at once); any other is registered, claimed and leaves
    the table, so that the collection about to run sees its closure's cycle
    and frees it if no one holds it.  Its claim would come at its segment's
    settle anyway: a cycle never looks dead from its reference count."""
    held = held_fresh[:]
    del held_fresh[:len(held)]
    refs = registry.refs
    gone = []
    n = len(values)
    for h in reversed(held):
        v = values[h] if h < n else None
        if v is None:
            continue
        if _getrefcount(v) > _DEAD_BY_HANDLE:
            refs[h] = _ref(v)           # registered, then claimed, then out
            v._s = hold(h)
        values[h] = None
        gone.append(h)
    v = None
    if gone:
        lib.pg_unfresh(ffi.new("uint32_t[]", gone), len(gone))
    if len(refs) > 2 * registry.live:
        registry.purge()


_ref = weakref.ref


def _settle_open(promote: bool) -> None:
    # As a closed segment's, but the range keeps the Values still to come,
    # and a node whose Value is not stored yet (an op under way in another
    # thread) keeps its fresh mark.  With promote (before a full
    # collection), the Python-held Values trade their place in the table for
    # a claim (_promote_held).
    if not promote:
        del held_fresh[:]
    for sid in _unsettled():
        base = sid << SEG_BITS
        if base < len(values):
            _sweep(base, base + SEG_NODES)
    if promote:
        _promote_held()


def settle() -> None:
    """Settle every segment now: nodes whose Values are gone are freed.  The
    calling thread's segment is closed first (no op of this thread can be
    under way), so even nodes whose Value never came (an op interrupted
    between C and Python) go.  Python-held Values leave the table for
    claims, then a full garbage collection frees the closure cycles no one
    holds, and a second pass what only they held."""
    with _lock:
        lib.pg_close_current()
        _settle_closed()
        _settle_open(promote=True)
    gc.collect()
    with _lock:
        _settle_closed()
        _settle_open(promote=False)
        registry.purge()


def _at_collection(phase: str, info: "dict[str, int]") -> None:
    """Any garbage collection settles the closed segments as it starts.  A
    full one (``gc.collect()``, or Python's own) settles every segment, so
    a graph dropped without ``backward()`` is freed by it, as micrograd's
    (whose closures make cycles) is.  At its start, Python-held Values
    trade their places in the table for claims, so this collection frees
    their cycles; at its stop, a second pass frees what only those cycles
    held.

    It runs in the middle of whatever allocated: if this thread is in a
    settle or a lookup already (the lock is its own), or another thread is,
    it does nothing.  It never closes a segment (an op of this thread may be
    under way).  Any exception is dropped: every step of a settle is safe to
    cut short and redo.  A KeyboardInterrupt landing here would be lost
    (Python reports an exception from a gc callback as unraisable), so it
    is delivered to the main thread again once the callback is over."""
    global _collecting
    if sys.unraisablehook is not _unraisable:      # replaced since (pytest does, per test)
        _hook_unraisable()
    full = info.get("generation") == 2
    if not full and (phase != "start" or not (held_fresh or late
                                                or lib.pg_closed_segments(peek, 1))):
        return
    _collecting = True
    try:
        if not _lock._is_owned() and _lock.acquire(blocking=False):   # type: ignore[attr-defined]
            try:
                _settle_closed()
                if full:
                    _settle_open(promote=phase == "start")
                    if phase == "stop":
                        registry.purge()
                elif held_fresh:
                    _promote_held()
            finally:
                _lock.release()
    except KeyboardInterrupt:
        _interrupt_later()
    except BaseException:   # noqa: B036  (see above: a later settle redoes it)
        pass
    finally:
        _collecting = full and phase == "start"


# Where pg_closed_segments writes when all that is asked is whether any
# segment waits (the sid is never read, so threads may share it).
peek = ffi.new("uint32_t[1]")


# From the start of a full collection's first callback to the end of its
# last: the Python code a collection runs (callbacks, finalizers) may let
# another thread in anywhere in between.
_collecting = False
_in_hook = False          # _unraisable is running


def _interrupt_later() -> None:
    # Raised from this thread (interrupt_main, os.kill), the interrupt would
    # fire at the next bytecode: still inside the callback.  A helper thread
    # raises it once the collection is over.
    def deliver() -> None:
        deadline = time.monotonic() + 10.0       # no collection takes that long: go anyway
        while (_collecting or _in_hook) and time.monotonic() < deadline:
            time.sleep(0.0002)
        _thread.interrupt_main()
    try:
        threading.Thread(target=deliver, name="pygrad-interrupt", daemon=True).start()
    except BaseException:   # noqa: B036  (no thread to be had: lost, as Python loses it)
        pass


def _unraisable(args: Any) -> None:
    """Python checks for a pending signal as a function starts, so a
    KeyboardInterrupt can rise at ``_at_collection``'s first
    instruction, before any ``try`` of its own; the collection then reports
    it as unraisable and drops it (a Ctrl-C lost in a training loop).  That
    one is delivered again; anything else goes to the hook that was there.
    ``_collecting`` is cleared: if that was a full collection's last
    callback, none will clear it (and the delivery would wait for it)."""
    global _collecting, _in_hook
    if args.exc_type is KeyboardInterrupt and args.object is _at_collection:
        _in_hook = True          # the delivery waits for this function to end
        _collecting = False
        _interrupt_later()
        _in_hook = False
    else:
        _previous_hook(args)


_previous_hook: Any = sys.unraisablehook


def _hook_unraisable() -> None:
    """Put _unraisable in front of the current hook (at import, and at a
    collection that finds another hook put in place since)."""
    global _previous_hook
    current = sys.unraisablehook
    if current is not _unraisable:
        _previous_hook = current
        sys.unraisablehook = _unraisable


gc.callbacks.append(_at_collection)
_hook_unraisable()


def lock() -> Any:
    """The lifetime lock, for registrations made outside this module
    (remade in a forked child)."""
    return _lock


def values_of(handles: Any, value_type: type, _ref: Any = weakref.ref,
              _hold: Any = lib.pg_hold) -> List[Any]:
    """The Values of live nodes ``handles``: for each, the one that exists,
    else a new one that holds its node and is registered (one lock).  The
    lookups and ``hold``/``Registry.add`` are written out here: this loop
    is the first ``_prev`` walk's cost, per node."""
    with _lock:
        out = []
        table = values
        refs = registry.refs
        for h in handles:
            if h < len(table):
                v: Any = table[h]
                if v is not None:
                    out.append(v)
                    continue
            r = refs.get(h)
            if r is not None:
                v = r()
                if v is not None:
                    out.append(v)
                    continue
            v = _new(value_type)
            v._h = h
            v._kids = None      # not read yet (an unset slot costs an exception)
            try:
                claim = _new_claim(_CLAIM)
            except MemoryError:
                raise MemoryError("pygrad: out of memory for a node claim") from None
            rc = _hold(claim, h)
            if rc:
                check(rc, "a node claim")
            v._s = claim
            refs[h] = _ref(v)
            out.append(v)
        if len(refs) > 2 * registry.live:
            registry.purge()
        return out


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
            check(lib.pg_set_extra(h, i), "a node record")
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
    global _lock
    _lock = threading.RLock()
    extras.lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
