"""Python's side of node lifetime (csrc/memory.c has the design and its
state diagram).  Python decides when a node dies; pygrad reads no
reference count.

* **Claims.**  Every Value owns its node through a claim (``_s``): an empty
  ``pg_claim`` from C, owned by ``ffi.gc`` so that C drops it when CPython
  deallocates the owning cdata, which happens only once the Value itself
  is deallocated (after its finalizers, and never for a Value they
  resurrected).  A creator fills the claim as it makes the node, so an
  interrupt between any two steps costs at most an empty claim, or the
  node of the op it cut, dropped with the claim as the exception unwinds.
* **Operands.**  A Value holds the Values it was made from (``_a``,
  ``_b``), as micrograd's ``_prev`` does, so a Value you made keeps its
  class, attributes and identity while a graph above it lives.
* **Values made later.**  A node made without a Value (a number's leaf in
  ``v * 2``, a fused MLP's hidden layers) gets one when ``_prev`` first
  reaches it; ``made_later`` maps its handle to that Value, weakly, so that
  one node has one Value while any parent holds it.  Custom ops' Values
  are there too: ``backward()`` finds their closures by handle.

The interface ``engine`` uses: ``new_claim``, ``own``, ``check``,
``made_later``.
"""
import os
import threading
import weakref
from typing import Any, Dict, Optional

from ._core import ffi, lib

__all__ = ["new_claim", "own", "check", "made_later"]

_gc = ffi.gc
_claim_new = lib.pg_claim_new
_drop = lib.pg_claim_drop


def new_claim() -> Any:
    """An empty claim, owned: C drops it (and releases what it holds) when
    this object is deallocated.  Its C pointer is NULL when C had no memory
    for it; a creator given one returns PG_E_NOMEM."""
    return _gc(_claim_new(), _drop)


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
    custom ops' Values).  A dead entry only means "no Value now": its
    node may have gone and its handle been reused, and the next lookup
    makes a new Value.  Entries are purged when the table has doubled."""

    __slots__ = ("refs", "live", "lock")

    def __init__(self) -> None:
        self.refs: Dict[int, "weakref.ref[Any]"] = {}
        self.live = 1024
        # Adds and purges of several threads; re-entrant, since a finalizer
        # run by a collection inside one may add a Value of its own.
        self.lock = threading.RLock()

    def add(self, h: int, v: Any) -> None:
        with self.lock:
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
        with self.lock:
            refs = self.refs
            for h, r in list(refs.items()):
                if r() is None and refs.get(h) is r:
                    refs.pop(h, None)
            self.live = max(1024, len(refs))

    def __len__(self) -> int:
        return len(self.refs)


made_later = MadeLater()


def _after_fork_in_child() -> None:
    # A fork from a busy thread may copy the lock held: the child's one
    # thread starts with a free one.
    made_later.lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
