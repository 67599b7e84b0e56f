"""What the tests observe inside pygrad, in one place: live C nodes, a
Value's node.  Tests of the C entry points themselves (test_node_construction,
the fault-injection tests) call the core directly; everything else asks here.

C keeps no record of live nodes (pygrad/_lifetime.py), so the tests count
them from Python's side: importing this module wraps the engine's node
allocation (``pygrad.engine._alloc``) with one that keeps a weak reference
to every node array it makes.  The count is the nodes in those arrays that
are still alive."""
import weakref
from typing import Any, List, Tuple

import pygrad.engine as _engine
from pygrad._core import ffi, lib

_NODE_BYTES = lib.pg_node_size()
_arrays: List[Tuple[Any, int]] = []        # (weak reference, nodes) per node array
_real_alloc = _engine._alloc
_node_types = {ffi.typeof("pg_node[1]"), ffi.typeof("pg_node[2]"), ffi.typeof("pg_node[]")}


_prune_at = [1 << 16]      # the list's length that next prunes it (doubling: linear in all)


def _prune() -> None:
    _arrays[:] = [(r, n) for r, n in _arrays if r() is not None]
    _prune_at[0] = max(1 << 16, 2 * len(_arrays))


def _tracked_alloc(ctype: Any, *init: Any) -> Any:
    cdata = _real_alloc(ctype, *init)
    if ctype in _node_types:
        _arrays.append((weakref.ref(cdata), ffi.sizeof(cdata) // _NODE_BYTES))
        if len(_arrays) >= _prune_at[0]:
            _prune()
    return cdata


_engine._alloc = _tracked_alloc


def live_nodes() -> int:
    """C nodes alive now: in node arrays that Python has not freed."""
    _prune()
    return sum(n for _, n in _arrays)


def node_of(v: Any) -> int:
    """The address of a C Value's node."""
    return int(ffi.cast("uintptr_t", v._pg_keep[0]))


def runs_python_backward(v: Any) -> bool:
    """Whether a C Value's node runs a Python closure in backward()."""
    return bool(lib.pg_flags(v._pg_keep[0]) & lib.PG_F_PY_BACKWARD)


def zero_hidden_grad(v: Any) -> None:
    """Zero the hidden interior grad a `-` or `/` node carries (micrograd's
    graph has a node there; see csrc/ops.def)."""
    lib.pg_zero_hidden(v._pg_keep[0])
