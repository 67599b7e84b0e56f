"""What the tests observe inside pygrad, in one place: live C nodes, a
Value's node.  Tests of the C entry points themselves (test_node_construction,
the fault-injection tests) call the core directly; everything else asks here.

C keeps no record of live nodes (pygrad/_lifetime.py), so the tests count
them from Python's side: importing this module wraps the engine's node
memory (``pygrad.engine._node_memory``, a bytes object) with one that makes
it a bytes subclass holding a token, and keeps a weak reference to the
token (a bytes object takes none): the token dies with the memory.  The
count is the nodes in that memory still alive."""
import weakref
from typing import Any, List, Tuple

import pygrad.engine as _engine
from pygrad._core import ffi, lib

_NODE_BYTES = lib.pg_node_size()
# (weak reference, nodes, address) per node memory
_arrays: List[Tuple[Any, int, int]] = []


class _Counted(bytes):
    """Node memory the tests can watch (the core takes any bytes as node
    memory); its one attribute, ``token``, dies with it."""


class _Token:
    __slots__ = ("__weakref__",)


_prune_at = [1 << 16]      # the list's length that next prunes it (doubling: linear in all)


def _prune() -> None:
    _arrays[:] = [a for a in _arrays if a[0]() is not None]
    _prune_at[0] = max(1 << 16, 2 * len(_arrays))


def _counted_memory(size: int) -> bytes:
    memory = _Counted(size)
    memory.token = token = _Token()
    _arrays.append((weakref.ref(token), size // _NODE_BYTES,
                    int(ffi.cast("uintptr_t", lib.pg_node_ptr(memory)))))
    if len(_arrays) >= _prune_at[0]:
        _prune()
    return memory


_engine._node_memory = _counted_memory


def live_ranges() -> List[Tuple[int, int]]:
    """[start, end) of every node memory alive now."""
    return [(at, at + n * _NODE_BYTES) for ref, n, at in _arrays if ref() is not None]


def memory_ref(v: Any) -> Any:
    """A weak reference that dies with the memory of v's node (v an op's
    Value: its keep's first item is that memory)."""
    return weakref.ref(v._pg_keep[0].token)


def live_nodes() -> int:
    """C nodes alive now: in node arrays that Python has not freed."""
    _prune()
    return sum(n for _, n, _ in _arrays)


def node_of(v: Any) -> int:
    """The address of a C Value's node."""
    return int(ffi.cast("uintptr_t", lib.pg_node_ptr(v._pg_keep[0])))


def runs_python_backward(v: Any) -> bool:
    """Whether a C Value's node runs a Python closure in backward()."""
    return bool(lib.pg_flags(v._pg_keep[0]) & lib.PG_F_PY_BACKWARD)


def zero_hidden_grad(v: Any) -> None:
    """Zero the hidden interior grad a `-` or `/` node carries (micrograd's
    graph has a node there; see csrc/ops.def)."""
    lib.pg_zero_hidden(v._pg_keep[0])
