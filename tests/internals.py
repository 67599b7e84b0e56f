"""What the tests observe inside pygrad, in one place: live C nodes and
segments, a Value's node, and closing a thread's segment.  Tests of the C
entry points themselves (test_node_construction, the fault-injection tests)
call the core directly; everything else asks here."""
from typing import Any

from pygrad._core import lib

#: Nodes per segment.
SEG_NODES: int = lib.PG_SEG_NODES


def live_nodes() -> int:
    """C nodes alive now (without settling first)."""
    return lib.pg_live_nodes()


def live_segments() -> int:
    """Segments mapped and in use now."""
    return lib.pg_live_segments()


def node_of(v: Any) -> int:
    """The handle of a C Value's node."""
    return v._h


def close_current_segment() -> None:
    """Close the calling thread's segment: its next node opens a new one."""
    lib.pg_close_current()


def segment_of(v: Any) -> int:
    """The id of the segment holding a C Value's node."""
    return v._h >> lib.PG_SEG_BITS


def room_left() -> int:
    """Slots left in the calling thread's segment."""
    return lib.pg_room_left()


def runs_python_backward(v: Any) -> bool:
    """Whether a C Value's node runs a Python closure in backward()."""
    return bool(lib.pg_flags(v._h) & lib.PG_F_PY_BACKWARD)


def zero_hidden_grad(v: Any) -> None:
    """Zero the hidden interior grad a `-` or `/` node carries (micrograd's
    graph has a node there; see csrc/ops.def)."""
    lib.pg_zero_hidden(v._h)


def advice_refused() -> int:
    """madvise calls the OS declined (their pages stayed resident)."""
    return lib.pg_advice_refused()


def unmap_failed() -> int:
    """Segment mappings the OS would not take back (kept pooled)."""
    return lib.pg_unmap_failed()
