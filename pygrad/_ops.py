"""pygrad's op table, read back from the compiled core.

csrc/ops.def is the one list of ops; the C core compiles each row into
``pg_op_info(op)``, so an installed pygrad needs no csrc/.  From it
pygrad/engine.py makes the Value methods, and the tests iterate it.
"""
from typing import Any, NamedTuple, Tuple

from ._core import ffi, lib

__all__ = ["Method", "Op", "OPS", "BY_KEY", "METHOD_OPS", "ACTIVATIONS"]


class Method(NamedTuple):
    name: str        # "__rsub__"
    swapped: bool    # a binary method computing other (op) self
    doc: str


class Op(NamedTuple):
    code: int        # PG_OP_* value
    key: str         # "sub": the C code in lower case
    name: str        # the node's _op
    arity: int       # 1, 2; 0 leaf; -1 n-ary
    methods: Tuple[Method, ...]
    act: int         # PG_ACT_* if it may be a fused activation, else 0


def _text(p: Any) -> str:
    return ffi.string(p).decode()


def _read() -> Tuple[Op, ...]:
    ops = []
    for code in range(lib.PG_OP_COUNT):
        d = lib.pg_op_info(code)
        names = _text(d.methods).split()
        docs = _text(d.doc).split("|") if names else []
        docs += [""] * (len(names) - len(docs))
        methods = tuple(Method(m.lstrip("~"), m.startswith("~"), doc)
                        for m, doc in zip(names, docs))
        ops.append(Op(code, _text(d.code).lower(), _text(d.name), d.arity, methods, d.act))
    return tuple(ops)


OPS: Tuple[Op, ...] = _read()
BY_KEY = {op.key: op for op in OPS}
# The ops a Value method makes (unary and binary), in code order.
METHOD_OPS: Tuple[Op, ...] = tuple(op for op in OPS if op.methods)
# Fused-activation names (pygrad.dot's act, nn) -> PG_ACT_*.
ACTIVATIONS = {op.methods[0].name: op.act for op in OPS if op.act}
