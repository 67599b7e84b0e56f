# Generated from the cdef (pygrad/_build.py's cdef_source(): csrc/pygrad.h
# and csrc/ops.def) by tests/test_typing.py, which checks it is current:
# after changing the cdef, run `PYTHONPATH=. python tests/test_typing.py --write`.
"""Types of pygrad's C core, the cffi extension module ``pygrad._core``."""
from typing import Any, overload

from _cffi_backend import FFI as _FFI
from typing_extensions import Buffer

_CData = _FFI.CData


class _CoreFFI(_FFI):
    # The cdef has no wchar_t: a C string comes back as bytes.
    def string(self, cdata: _CData, maxlen: int = -1) -> bytes: ...
    # A numpy array has the buffer protocol, which numpy's stubs declare
    # only for Python >= 3.12 (PEP 688).
    @overload
    def from_buffer(self, cdecl: Buffer, require_writable: bool = ...) -> _CData: ...
    @overload
    def from_buffer(self, cdecl: str | _FFI.CType, python_buffer: Any,
                    require_writable: bool = ...) -> _CData: ...


class pg_claim:
    """struct pg_claim, read through a pointer."""

    kind: int
    id: int


class pg_op_desc:
    """struct pg_op_desc, read through a pointer."""

    code: _CData
    name: _CData
    arity: int
    methods: _CData
    act: int
    doc: _CData


class pg_sweep:
    """struct pg_sweep, read through a pointer."""

    order: _CData
    n: int
    cap: int
    pos: int


class pg_program:
    """struct pg_program, read through a pointer."""

    impl: _CData
    n: int


class pg_batch:
    """struct pg_batch, read through a pointer."""

    impl: _CData


class _Lib:
    """The functions and constants of the cdef."""

    PG_OP_LEAF: int
    PG_OP_ADD: int
    PG_OP_MUL: int
    PG_OP_SUB: int
    PG_OP_DIV: int
    PG_OP_NEG: int
    PG_OP_POWK: int
    PG_OP_POW: int
    PG_OP_EXP: int
    PG_OP_LOG: int
    PG_OP_TANH: int
    PG_OP_RELU: int
    PG_OP_SIGMOID: int
    PG_OP_CUSTOM: int
    PG_OP_LINEAR: int
    PG_OP_SUM: int
    PG_OP_LOGSUMEXP: int
    PG_OP_FUNCTION: int
    PG_OP_SIN: int
    PG_OP_COS: int
    PG_OP_TAN: int
    PG_OP_ASIN: int
    PG_OP_ACOS: int
    PG_OP_ATAN: int
    PG_OP_SINH: int
    PG_OP_COSH: int
    PG_OP_ASINH: int
    PG_OP_ACOSH: int
    PG_OP_ATANH: int
    PG_OP_SQRT: int
    PG_OP_LOG2: int
    PG_OP_LOG10: int
    PG_OP_LOG1P: int
    PG_OP_EXPM1: int
    PG_OP_ERF: int
    PG_OP_ERFC: int
    PG_OP_ABS: int
    PG_OP_COUNT: int
    PG_SEG_BITS: int
    PG_SEG_NODES: int
    PG_MAX_SEGS: int
    PG_E_FULL: int
    PG_E_NOMEM: int
    PG_E_ARG: int
    PG_E_SPACE: int
    PG_E_SWEEP: int
    PG_HELD: int
    PG_ACT_MASK: int
    PG_ACT_NONE: int
    PG_ACT_RELU: int
    PG_ACT_TANH: int
    PG_ACT_SIGMOID: int
    PG_LINEAR_BIAS: int
    PG_F_INT_EXPONENT: int
    PG_F_PY_BACKWARD: int
    PG_F_PY_HELD: int
    PG_CLAIM_NONE: int
    PG_CLAIM_SEGMENT: int
    PG_CLAIM_NODE: int

    def pg_release(self, c: _CData, /) -> None: ...
    def pg_open_segment(self, c: _CData, /) -> int: ...
    def pg_new_leaf(self, c: _CData, data: float, /) -> int: ...
    def pg_hold(self, c: _CData, h: int, /) -> int: ...
    def pg_seg_used(self, sid: int, /) -> int: ...
    def pg_unary(self, sid: int, op: int, a: int, /) -> int: ...
    def pg_binary(self, sid: int, op: int, a: int, b: int, /) -> int: ...
    def pg_binary_k(self, sid: int, op: int, a: int, k: float, k_first: int, /) -> int: ...
    def pg_powk(self, sid: int, a: int, k: float, k_is_int: int, /) -> int: ...
    def pg_custom(self, sid: int, data: float, kids: _CData, n: int, /) -> int: ...
    def pg_nary(self, sid: int, op: int, variant: int, kids: _CData, n: int, /) -> int: ...
    def pg_linear_layer(
        self, sid: int, act: int, params: _CData, x: _CData, nin: int, nout: int, out: _CData, /
    ) -> int: ...
    def pg_function(
        self, sid: int, data: float, kids: _CData, partials: _CData, n: int, /
    ) -> int: ...
    def pg_gather_data(self, h: _CData, n: int, out: _CData, /) -> None: ...
    def pg_gather_grad(self, h: _CData, n: int, out: _CData, /) -> None: ...
    def pg_scatter_data(self, h: _CData, n: int, in_: _CData, /) -> None: ...
    def pg_fill_grad(self, h: _CData, n: int, v: float, /) -> None: ...
    def pg_sgd_step(
        self, h: _CData, n: int, lr: float, momentum: float, weight_decay: float, velocity: _CData,
        /
    ) -> None: ...
    def pg_adam_step(
        self, h: _CData, n: int, lr: float, beta1: float, beta2: float, eps: float,
        weight_decay: float, bias1: float, bias2: float, m: _CData, v: _CData, /
    ) -> None: ...
    def pg_data(self, h: int, /) -> float: ...
    def pg_set_data(self, h: int, v: float, /) -> None: ...
    def pg_grad(self, h: int, /) -> float: ...
    def pg_set_grad(self, h: int, v: float, /) -> None: ...
    def pg_op(self, h: int, /) -> int: ...
    def pg_flags(self, h: int, /) -> int: ...
    def pg_variant(self, h: int, /) -> int: ...
    def pg_exponent(self, h: int, /) -> float: ...
    def pg_nkids(self, h: int, /) -> int: ...
    def pg_kid(self, h: int, i: int, /) -> int: ...
    def pg_op_name(self, op: int, /) -> _CData: ...
    def pg_op_info(self, op: int, /) -> pg_op_desc: ...
    def pg_extra(self, h: int, /) -> int: ...
    def pg_set_extra(self, h: int, extra: int, /) -> int: ...
    def pg_set_py_backward(self, h: int, /) -> int: ...
    def pg_backward(self, root: int, sweep: _CData, /) -> int: ...
    def pg_backward_resume(self, sweep: _CData, /) -> int: ...
    def pg_sweep_clear(self, sweep: _CData, /) -> None: ...
    def pg_node_backward(self, h: int, /) -> None: ...
    def pg_compile(self, root: int, p: _CData, bad_node: _CData, /) -> int: ...
    def pg_program_forward(self, p: _CData, /) -> float: ...
    def pg_program_backward(self, p: _CData, /) -> None: ...
    def pg_program_size(self, p: _CData, /) -> int: ...
    def pg_program_clear(self, p: _CData, /) -> None: ...
    def pg_batch_compile(
        self, outputs: _CData, nout: int, inputs: _CData, ninputs: int, b: _CData, bad: _CData, /
    ) -> int: ...
    def pg_batch_run(self, b: _CData, rows: _CData, n: int, out: _CData, w: _CData, /) -> int: ...
    def pg_batch_slots(self, b: _CData, /) -> int: ...
    def pg_batch_clear(self, b: _CData, /) -> None: ...
    def pg_fail_alloc(self, n: int, /) -> None: ...
    def pg_fail_alloc_pending(self) -> int: ...
    def pg_fail_unmap(self, n: int, /) -> None: ...
    def pg_unmap_failed(self) -> int: ...
    def pg_limit_segments(self, n: int, /) -> None: ...
    def pg_live_nodes(self) -> int: ...
    def pg_live_segments(self) -> int: ...
    def pg_segment_births(self) -> int: ...
    def pg_node_size(self) -> int: ...


ffi: _CoreFFI
lib: _Lib
