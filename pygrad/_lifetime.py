"""Python's side of node lifetime (csrc/memory.c has the design and its
state diagram).  Python decides when a node dies; pygrad reads no
reference count.

* **Claims.**  Every Value owns its node through a claim (``_s``): a
  ``pg_claim *`` from C, a cdata that the collector does not track and
  nothing but the Value holds.  It dies only when the Value is
  deallocated for real: after every finalizer, never for a Value one of
  them resurrected, and after a collection's resurrection check when the
  Value sits in a garbage cycle.  Its death fires a weak reference whose
  callback is a C method, ``owners.pop``: the entry goes, and with it an
  ``ffi.gc`` twin of the claim, whose destructor ``pg_claim_drop`` lets go
  of the node.  No Python code runs in between, so an interrupt can't cut
  it.  (The ``ffi.gc`` object can't be the Value's own: the collector runs
  its destructor as a finalizer, before it knows whether a finalizer in
  the same cycle resurrected the Value.  In ``owners``, reachable from a
  module, it never is cyclic garbage.)
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
``made_later`` (and ``owners``, bound in its hot paths).
"""
import weakref
from typing import Any, Callable, Dict, Optional

from ._core import ffi, lib

__all__ = ["new_claim", "own", "check", "made_later", "owners"]

_gc = ffi.gc
# Any: cffi returns a plain cdata (the stub names the struct it points to)
_claim_new: Callable[[], Any] = lib.pg_claim_new
_drop = lib.pg_claim_drop
_ref = weakref.ref

#: weak reference to a live claim -> the ffi.gc twin that drops it.
owners: Dict[Any, Any] = {}
_pop = owners.pop


def new_claim() -> Any:
    """An empty claim, registered: C drops it (and releases what it holds)
    once this object is deallocated.  Its C pointer is NULL when C had no
    memory for it; a creator given one returns PG_E_NOMEM.  (engine's hot
    paths write these two lines out.)"""
    claim = _claim_new()
    owners[_ref(claim, _pop)] = _gc(claim + 0, _drop)
    return claim


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

