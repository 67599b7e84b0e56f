"""Fused n-ary ops on C-backed Values: one C call and one node each.

Each gives exactly the value and gradients of the same expression written
with plain ops (pygrad.reference has those plain versions under the same
names), so fused models and op-by-op models agree bit for bit.
"""
from typing import Dict, Iterable, Optional, Union

from . import _ops
from ._core import ffi, lib
from ._numbers import not_a_number, real_or_none
from ._value_ops import Scalar
from ._node_factory import make_nary
from .engine import Value

__all__ = ["dot", "sum", "logsumexp", "detached_max", "ACTIVATIONS"]

# None / 'linear', and the ops the table (csrc/ops.def) allows as fused activations.
ACTIVATIONS: Dict[Optional[str], int] = {None: lib.PG_ACT_NONE, "linear": lib.PG_ACT_NONE,
               **dict(sorted(_ops.ACTIVATIONS.items(), key=lambda kv: kv[1]))}


def _as_value(v: object, what: str) -> Value:
    if isinstance(v, Value):
        return v
    k = real_or_none(v)
    if k is None:
        raise not_a_number(v, f"{what} must be Values or numbers, not {type(v).__name__}")
    return Value(k)


def _node(op: int, variant: int, values: "list[Value]") -> Value:
    return make_nary(op, variant, tuple(values))


def dot(w: Iterable[Scalar], x: Iterable[Union[Scalar, float]],
        b: Optional[Union[Scalar, float]] = None,
        act: Optional[str] = None) -> Value:
    """``act(b + w[0]*x[0] + w[1]*x[1] + ...)`` as one node: micrograd's
    neuron, ``sum((wi*xi for wi, xi in zip(w, x)), b)``, summed in that
    order.  ``act`` is None, 'relu', 'tanh' or 'sigmoid'; without ``b`` the
    sum starts at ``w[0]*x[0]``."""
    if act not in ACTIVATIONS:
        raise ValueError(f"act must be one of None, 'relu', 'tanh', 'sigmoid'; not {act!r}")
    w, x = list(w), list(x)
    if len(w) != len(x):
        raise ValueError(f"dot needs as many weights as inputs: {len(w)} != {len(x)}")
    if not w and b is None:
        raise ValueError("dot of nothing: give at least one term or a bias")
    values = [] if b is None else [_as_value(b, "dot's bias")]
    for wi, xi in zip(w, x):
        values.append(_as_value(wi, "dot's weights"))
        values.append(_as_value(xi, "dot's inputs"))
    variant = ACTIVATIONS[act] | (0 if b is None else lib.PG_LINEAR_BIAS)
    return _node(lib.PG_OP_LINEAR, variant, values)


def sum(values: Iterable[Union[Scalar, float]],  # noqa: A001
        start: Optional[Union[Scalar, float]] = None) -> Value:
    """``v0 + v1 + ...`` (after ``start`` if given) as one node, left to
    right like Python's ``sum``."""
    vs = [] if start is None else [_as_value(start, "sum's start")]
    vs.extend(_as_value(v, "sum's values") for v in values)
    if not vs:
        raise ValueError("sum of nothing: give at least one value")
    return _node(lib.PG_OP_SUM, 0, vs)


def logsumexp(values: Iterable[Union[Scalar, float]]) -> Value:
    """``log(sum(exp(v)))`` as one node, computed as
    ``log(sum(exp(v - m))) + m`` with m the largest v, so it never
    overflows."""
    vs = [_as_value(v, "logsumexp's values") for v in values]
    if not vs:
        raise ValueError("logsumexp of nothing: give at least one value")
    return _node(lib.PG_OP_LOGSUMEXP, 0, vs)


def detached_max(values: Iterable[Union[Scalar, float]]) -> Value:
    """The largest of ``values`` as a Value through which no gradient flows:
    ``max(v.data for v in values)`` (the first of equal values, as Python's
    ``max``) kept in the graph, so that a compiled program recomputes it,
    where a float read from ``.data`` would be baked in.  The shift of a
    stable softmax: ``[(v - m).exp() for v in values]`` gives the same
    numbers and gradients with ``m = detached_max(values)`` as with
    ``m = max(v.data for v in values)``."""
    vs = [_as_value(v, "detached_max's values") for v in values]
    if not vs:
        raise ValueError("detached_max of nothing: give at least one value")
    return _node(lib.PG_OP_MAX, 0, vs)
