"""The node factory the rest of the package builds with (``_backend`` for
nn, ``functional``, ``data``, ``Function``, ``token_programs``): nodes made
in one C call each (csrc/value_binding.h), given to new Values.
Package-internal."""
from typing import Any

from ._core import ffi, lib
from ._lifetime import Packed, check
from .engine import Value, op_failed

_new = object.__new__
_alloc = ffi.new


def make_nary(op: int, variant: int, values: "tuple[Value, ...]") -> "Value":
    """A fused n-ary node over ``values`` (their nodes, in order)."""
    out = _new(Value)
    rc = lib.pg_nary_v(id(out), op, variant, id(values))
    if rc:
        op_failed(rc)
    return out


def make_layer(act: int, params: Packed, param_values: tuple, xs: "tuple[Value, ...]",
               nin: int, nout: int) -> "list[Value]":
    """nout fused LINEAR nodes over shared inputs (pygrad.nn.Layer)."""
    out: "list[Value]" = []
    holds = (param_values, xs)     # (every object passed by id() is held for the call)
    rc = lib.pg_layer_v(id(out), id(Value), act, id(params.nodes), id(xs), nin, nout, id(holds))
    if rc:
        op_failed(rc)
    return out


def make_mlp(acts: Any, params: "list[Packed]", sizes: "list[int]", param_values: tuple,
             xs: "tuple[Value, ...]") -> "list[Value]":
    """The layers of a fused MLP in one C call (pg_mlp): the hidden layers'
    outputs are nodes without Values (``_prev`` makes them on demand, one
    per node: the table in ``_pg_b``); the last layer's outputs become
    Values, holding the model's parameters and the inputs."""
    if len(acts) != len(sizes) - 1:
        # (a fused cache's parts, rebound: C reads one activation per layer)
        raise ValueError(f"a fused MLP of {len(sizes) - 1} layers got {len(acts)} activations")
    out: "list[Value]" = []
    table: "dict[int, Value]" = {}
    lists = tuple(p.nodes for p in params)
    holds = (param_values, xs)
    rc = lib.pg_mlp_v(id(out), id(Value), len(sizes) - 1, acts, id(lists),
                      _alloc("uint32_t[]", sizes), id(xs), id(holds), id(table))
    if rc:
        op_failed(rc)
    return out


def make_leaves(data: "list[float]") -> "list[Value]":
    """Leaves holding ``data`` (pygrad.data.to_values), in one C call."""
    out: "list[Value]" = []
    rc = lib.pg_leaves_v(id(out), id(Value), _alloc("double[]", data), len(data))
    if rc:
        check(rc, "leaves")
    return out


def make_function(data: float, values: "tuple[Value, ...]", partials: "list[float]",
                  name: str) -> "Value":
    """A pygrad.Function node with its captured partials."""
    if not isinstance(values, tuple) or len(partials) != len(values):
        # (C refuses it too; this says what was wrong: a crafted pickle)
        raise ValueError(f"a pygrad.Function node needs one partial per input: "
                         f"{len(partials)} for {len(values)}")
    out = _new(Value)
    grads = _alloc("double[]", partials)
    rc = lib.pg_function_v(id(out), data, id(values), grads, len(grads))
    if rc:
        op_failed(rc)
    out._op = name
    return out
