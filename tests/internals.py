"""What the tests observe inside pygrad, in one place: live C nodes, a
Value's node.  Tests of the C entry points themselves (test_node_construction,
the fault-injection tests) call the core directly; everything else asks here.

C keeps no record of which nodes live (pygrad/_lifetime.py), only a count
of the nodes in node objects not yet freed: that is what ``live_nodes``
reads."""
from typing import Any

from pygrad._core import lib


def live_nodes() -> int:
    """C nodes alive now: in node objects that Python has not freed."""
    return lib.pg_live_nodes()


def node_of(v: Any) -> int:
    """The address of a C Value's node (0 for none)."""
    return lib.pg_node_addr(id(v))


def runs_python_backward(v: Any) -> bool:
    """Whether a C Value's node runs a Python closure in backward()."""
    return bool((lib.pg_describe_v(id(v)) >> 8) & lib.PG_F_PY_BACKWARD)


def zero_hidden_grad(v: Any) -> None:
    """Zero the hidden interior grad a `-` or `/` node carries (micrograd's
    graph has a node there; see csrc/ops.def)."""
    lib.pg_zero_hidden_v(id(v))
