"""Python's side of node lifetime (csrc/memory.c has the design and its
state diagram).  Python decides when a node dies; pygrad reads no
reference count.

* **Claims.**  Every Value owns its node through a claim (``_s``): a
  ``pg_claim *`` from C, a cdata that the collector does not track and
  nothing but the Value holds.  It dies only when the Value is
  deallocated for real: after every finalizer, never for a Value one of
  them resurrected, and after a collection's resurrection check when the
  Value sits in a garbage cycle.
* **Owners.**  An ``Owner`` is a weak reference to the claim's cdata that
  carries an ``ffi.gc`` twin of the claim, whose destructor
  ``pg_claim_drop`` lets go of the node.  The set ``owners`` keeps it; its
  callback is ``owners.discard``, a C method: when the claim dies the
  Owner leaves the set and dies, and the twin with it.  No Python code
  runs in between, so an interrupt can't cut it.  (The twin can't be the
  Value's own: the collector runs ffi.gc's destructor as a finalizer,
  before it knows whether a finalizer in the same cycle resurrected the
  Value.  In ``owners``, reachable from a module, it never is cyclic
  garbage.)  A set gives its room back in one C call, which a dict can't
  (``compact``).
* **Order.**  A claim is registered before a creator fills it, so an
  interrupt between any two steps costs at most an empty claim's 16 bytes,
  and the node of an op it cut goes with the claim as the exception
  unwinds.
* **Operands.**  A Value holds the Values it was made from (``_a``,
  ``_b``), as micrograd's ``_prev`` does, so a Value you made keeps its
  class, attributes and identity while a graph above it lives.
* **Values made later.**  A node made without a Value (a number's leaf in
  ``v * 2``, a fused MLP's hidden layers) gets one when ``_prev`` first
  reaches it; ``made_later`` maps its handle to that Value, weakly, so that
  one node has one Value while any parent holds it.  Custom ops' Values
  are there too: ``backward()`` finds their closures by handle.

The interface ``engine`` uses: ``new_claim``, ``own``, ``check``,
``compact``, ``made_later`` (and ``Owner`` and ``owners``, bound in its
hot paths).
"""
import sys
import weakref
from typing import Any, Callable, Dict, Optional, Set

from ._core import ffi, lib

__all__ = ["new_claim", "own", "check", "compact", "made_later", "Owner", "owners"]

_gc = ffi.gc
# Any: cffi returns a plain cdata (the stub names the struct it points to)
_claim_new: Callable[[], Any] = lib.pg_claim_new
_drop = lib.pg_claim_drop
_sizeof = sys.getsizeof


class Owner(weakref.ref):
    """A weak reference to a claim's cdata that keeps the claim's ffi.gc
    twin (``twin``) until the claim dies."""

    __slots__ = ("twin",)
    twin: Any
    # By identity: a weak reference hashes its referent, and fails once the
    # referent is dead if it never did (an Owner whose op an interrupt cut
    # before it reached the set).  These are object's own C slots: no
    # Python code runs in ``owners.discard``.
    __hash__ = object.__hash__
    __eq__ = object.__eq__


#: the Owners of live claims
owners: Set[Owner] = set()
_discard = owners.discard


def new_claim() -> Any:
    """An empty claim, registered: C drops it (and releases what it holds)
    once this object is deallocated.  Its C pointer is NULL when C had no
    memory for it; a creator given one returns PG_E_NOMEM.  (engine's hot
    paths write these lines out.)"""
    claim = _claim_new()
    owner = Owner(claim, _discard)
    owner.twin = _gc(claim + 0, _drop)
    owners.add(owner)
    compact()
    return claim


def compact() -> None:
    """Give back the owner table's room once most of the Values it served
    have died (a freed big graph), as micrograd's memory goes back with its
    Values.  A set never shrinks as entries leave; ``intersection_update``
    with itself rebuilds it at its live size in one C call, with no Python
    code and no thread switch inside: a claim that dies during it (in a
    collection as the new table's set is allocated) leaves the old table
    before it is copied.  Called where pygrad runs
    Python anyway: a leaf, ``backward()``, the slower creators."""
    size = _sizeof(owners)
    if size > 1 << 20 and size > len(owners) << 8:
        owners.intersection_update(owners)


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
    raise ValueError(f"pygrad: invalid node for {what}")


def own(h: int) -> Any:
    """A claim on live node h (which something else holds meanwhile)."""
    claim = new_claim()
    check(lib.pg_hold(claim, h), "a node claim")
    return claim


class MadeLater:
    """Handle -> Value, weakly, for Values made after their node (and for
    custom ops' Values).  A dead entry only means "no Value now": its node
    may have gone and its handle been reused, and the next lookup makes a
    new Value.  When the table has doubled, a purge swaps in a copy without
    the dead entries (no lock: an add that races a purge may be dropped, and
    costs a second Value for that node, never a wrong one; backward() finds
    a custom op's Value below its root all the same)."""

    __slots__ = ("refs", "live")

    def __init__(self) -> None:
        self.refs: Dict[int, "weakref.ref[Any]"] = {}
        self.live = 1024

    def add(self, h: int, v: Any) -> None:
        refs = self.refs
        refs[h] = weakref.ref(v)
        if len(refs) > 2 * self.live:
            self.purge()

    def get(self, h: int) -> Optional[Any]:
        r = self.refs.get(h)
        v = r() if r is not None else None
        # A Value cleared by the collector (its claim gone) is no Value.
        return v if v is not None and getattr(v, "_h", None) == h else None

    def purge(self) -> None:
        kept = {h: r for h, r in self.refs.copy().items() if r() is not None}
        self.refs = kept
        self.live = max(1024, len(kept))

    def __len__(self) -> int:
        return len(self.refs)


made_later = MadeLater()

