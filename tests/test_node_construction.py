"""Node construction (csrc/nodes.c): every creator checks all its arguments
before it writes a byte of the memory it is given, and the per-op C entry
points the Value methods call agree bit for bit with the reference
engine."""
import gc
import math
import random

import pytest

import pygrad
from pygrad import Value, _ops, engine, nn, reference
from pygrad._core import ffi, lib

from helpers import assert_same_doubles, square_function

Square = square_function()


# -- bad input: refused before anything is written ----------------------------

N = ffi.NULL


def out(n=2):
    """Node memory for a creator, filled with a pattern that a refused call
    must leave as it is."""
    mem = ffi.new("pg_node[]", n)
    ffi.memmove(mem, b"\xa5" * ffi.sizeof(mem), ffi.sizeof(mem))
    return mem


def ptrs(*nodes):
    return ffi.new("pg_node *[]", list(nodes))


def _mlp(o, nlayers, acts, params, sizes, x):
    """lib.pg_mlp over Python lists (each layer's parameters a list)."""
    arrays = [ptrs(*p) for p in params]
    return lib.pg_mlp(o, ptrs(*[N] * 64), nlayers, ffi.new("int[]", acts or [0]),
                      ffi.new("pg_node *const *[]", arrays or [N]),
                      ffi.new("uint32_t[]", sizes), ptrs(*x))


def test_every_creator_refuses_bad_input_without_writing():
    a, b = Value(0.5), Value(2.0)
    keep = a * b
    good = ffi.cast("pg_node *", lib.pg_node_addr(id(keep)))
    mem = out(4)
    before = bytes(ffi.buffer(mem))
    E = lib.PG_E_ARG
    cases = {
        "unary op": lib.pg_unary(mem, lib.PG_OP_ADD, good),
        "unary POWK": lib.pg_unary(mem, lib.PG_OP_POWK, good),
        "unary kid": lib.pg_unary(mem, lib.PG_OP_EXP, N),
        "unary out": lib.pg_unary(N, lib.PG_OP_EXP, good),
        "binary op": lib.pg_binary(mem, lib.PG_OP_EXP, good, good),
        "binary op range": lib.pg_binary(mem, lib.PG_OP_COUNT, good, good),
        "binary 2nd kid": lib.pg_binary(mem, lib.PG_OP_MUL, good, N),
        "binary_k op": lib.pg_binary_k(mem, lib.PG_OP_SUM, good, 1.0, 0),
        "binary_k kid": lib.pg_binary_k(mem, lib.PG_OP_MUL, N, 1.0, 1),
        "powk kid": lib.pg_powk(mem, N, 2.0, 1),
        "entry binary": lib.pg_binary_MUL(mem, good, N),
        "entry binary_k": lib.pg_binary_k_SUB(mem, N, 1.0),
        "entry binary_rk": lib.pg_binary_rk_DIV(mem, 1.0, N),
        "entry unary": lib.pg_unary_TANH(mem, N),
        "entry powk": lib.pg_powk_float(mem, N, 0.5),
        "leaf out": lib.pg_leaf(N, 1.0),
        "custom last kid": lib.pg_custom(mem, 1.0, ptrs(good, good, N), 3, N),
        "custom no list": lib.pg_custom(mem, 1.0, N, 2, N),
        "nary op": lib.pg_nary(mem, lib.PG_OP_MUL, 0, ptrs(good, good), 2),
        "nary FUNCTION": lib.pg_nary(mem, lib.PG_OP_FUNCTION, 0, ptrs(good), 1),
        "nary CUSTOM": lib.pg_nary(mem, lib.PG_OP_CUSTOM, 0, ptrs(good), 1),
        "nary empty": lib.pg_nary(mem, lib.PG_OP_SUM, 0, ptrs(good), 0),
        "nary variant": lib.pg_nary(mem, lib.PG_OP_SUM, 1, ptrs(good), 1),
        "nary linear odd": lib.pg_nary(mem, lib.PG_OP_LINEAR, 0, ptrs(good), 1),
        "nary last kid": lib.pg_nary(mem, lib.PG_OP_SUM, 0, ptrs(good, good, N), 3),
        "layer act": lib.pg_linear_layer(mem, ptrs(N, N, N), 9, ptrs(good, good), ptrs(good),
                                         1, 1),
        "layer nout": lib.pg_linear_layer(mem, ptrs(N), 0, ptrs(good), ptrs(), 0, 0),
        "layer x": lib.pg_linear_layer(mem, ptrs(N, N, N), 0, ptrs(good, good), ptrs(N), 1, 1),
        "layer edges": lib.pg_linear_layer(mem, N, 0, ptrs(good, good), ptrs(good), 1, 1),
        "layer last param": lib.pg_linear_layer(mem, ptrs(*[N] * 6), 1,
                                                ptrs(good, good, good, N), ptrs(good), 1, 2),
        "mlp layers": _mlp(mem, 0, [0], [[good, good]], [1, 1], [good]),
        "mlp act": _mlp(mem, 1, [9], [[good, good]], [1, 1], [good]),
        "mlp width": _mlp(mem, 1, [0], [[good]], [1, 0], [good]),
        "mlp x": _mlp(mem, 1, [0], [[good, good]], [1, 1], [N]),
        "mlp 2nd layer's last param": _mlp(mem, 2, [1, 0], [[good, good] * 2, [good, good, N]],
                                           [1, 2, 1], [good]),
        "leaves out": lib.pg_leaves(N, ffi.new("double[]", 1), 1),
        "function last kid": lib.pg_function(mem, 1.0, ptrs(good, N),
                                             ffi.new("double[]", [1.0, 2.0]), 2, ptrs(*[N] * 4)),
        "function edges": lib.pg_function(mem, 1.0, ptrs(good), ffi.new("double[]", [1.0]), 1, N),
    }
    for what, rc in cases.items():
        assert rc == E, f"{what}: {rc}"
        assert bytes(ffi.buffer(mem)) == before, what
    assert (keep + 1.0).data == 2.0


# -- per-op entry points --------------------------------------------------------

def _numbers_for(op):
    if op.key in ("log", "log2", "log10", "sqrt", "acosh"):
        return 1.5, 2.25
    if op.key in ("asin", "acos", "atanh"):
        return 0.25, -0.5
    return 0.75, -1.25


def _rk(method: str) -> bool:
    return method.startswith("__r")


def test_every_method_op_has_its_entry_points():
    for op in _ops.METHOD_OPS:
        code = op.key.upper()
        if op.arity == 2:
            for form in ("pg_binary_", "pg_binary_k_", "pg_binary_rk_"):
                assert callable(getattr(lib, form + code)), form + code
        elif op.code == lib.PG_OP_POWK:
            assert callable(lib.pg_powk_float) and callable(lib.pg_powk_int)
        else:
            assert op.arity == 1
            assert callable(getattr(lib, "pg_unary_" + code)), code
        for form in ("pg_unary_", "pg_binary_", "pg_binary_k_", "pg_binary_rk_"):
            if (op.arity == 2) != (form != "pg_unary_") or op.code == lib.PG_OP_POWK:
                assert not hasattr(lib, form + code), f"{form}{code} does not fit {op.key}"


def _same(c, r, what, c_leaves=(), r_leaves=()):
    """The results agree bit for bit, and so do the leaves' grads after one
    backward() on each engine."""
    assert_same_doubles([c.data], [r.data], what)
    assert c._op == r._op, what
    c.backward()
    r.backward()
    assert_same_doubles([v.grad for v in c_leaves], [v.grad for v in r_leaves], f"grads of {what}")


_SYMBOLS = {"add": "+", "mul": "*", "sub": "-", "truediv": "/", "pow": "**"}


@pytest.mark.parametrize("op", _ops.METHOD_OPS, ids=lambda op: op.key)
def test_entry_points_agree_with_reference(op):
    x, y = _numbers_for(op)
    for m in op.methods:
        name = m.name
        if op.arity == 1:
            if name == "__pow__":
                for k in (2, 3, 0.5, -1.5, True, 2.0):
                    cx, rx = Value(x), reference.Value(x)
                    _same(cx ** k, rx ** k, f"{x} ** {k!r}", [cx], [rx])
                continue
            cx, rx = Value(x), reference.Value(x)
            _same(getattr(cx, name)(), getattr(rx, name)(), f"{name}({x})", [cx], [rx])
            continue
        if not _rk(name):
            # Value (op) Value
            cx, rx, cy, ry = Value(x), reference.Value(x), Value(y), reference.Value(y)
            _same(getattr(cx, name)(cy), getattr(rx, name)(ry), f"V {name} V", [cx, cy], [rx, ry])
        if name != "_pow_value":        # takes Values only (__pow__ picks it)
            # Value (op) number
            cx, rx = Value(x), reference.Value(x)
            _same(getattr(cx, name)(y), getattr(rx, name)(y), f"V {name} {y}", [cx], [rx])
    # operators as written, each operand order
    dunder = op.methods[0].name.strip("_")
    if op.arity == 2 and dunder in _SYMBOLS or op.key == "pow":
        s = _SYMBOLS["pow" if op.key == "pow" else dunder]
        a, b = abs(x), y
        for lhs, rhs in (("va", "vb"), ("va", repr(b)), (repr(a), "vb")):
            c_leaves, r_leaves = [Value(a), Value(b)], [reference.Value(a), reference.Value(b)]
            c = eval(f"{lhs} {s} {rhs}", dict(zip(("va", "vb"), c_leaves)))
            r = eval(f"{lhs} {s} {rhs}", dict(zip(("va", "vb"), r_leaves)))
            _same(c, r, f"{lhs} {s} {rhs} (va = {a}, vb = {b})", c_leaves, r_leaves)


@pytest.mark.parametrize("where", ["data", "grad"])
def test_a_perturbed_rule_fails_the_comparison(monkeypatch, where):
    # The comparison above can fail: a product whose forward or gradient
    # rule is off by one ulp on the oracle's side is caught.
    real = reference.Value.__mul__

    def perturbed(self, other):
        out = real(self, other)
        if where == "data":
            out.data = math.nextafter(out.data, math.inf)
            return out
        rule = out._backward

        def _backward():
            rule()
            self.grad = math.nextafter(self.grad, math.inf)
        out._backward = _backward
        return out

    monkeypatch.setattr(reference.Value, "__mul__", perturbed)
    mul = next(op for op in _ops.METHOD_OPS if op.key == "mul")
    with pytest.raises(AssertionError, match="grads of" if where == "grad" else "V __mul__"):
        test_entry_points_agree_with_reference(mul)


def test_number_operands_of_every_kind():
    """ints, bools, Fractions and numpy scalars become the leaf of a
    number operand, in the one C call; non-numbers are refused."""
    from fractions import Fraction
    ks = [3, True, Fraction(1, 3), 2 ** 70, 2 ** 53 + 1, -7]
    try:
        import numpy as np
        ks += [np.float64(0.3), np.int32(5), np.float32(0.25)]
    except ImportError:
        pass
    for k in ks:
        for expr in ("v + k", "k + v", "v - k", "k - v", "v * k", "k * v", "v / k", "k / v",
                     "v ** k", "k ** v"):
            c = eval(expr, {"v": Value(1.25), "k": k})
            r = eval(expr, {"v": reference.Value(1.25), "k": k})
            _same(c, r, f"{expr} with k = {k!r}")
    for bad in ("2", None, [1.0], 1j):
        for expr in ("v + k", "k * v", "v ** k", "k ** v"):
            with pytest.raises(TypeError):
                eval(expr, {"v": Value(1.0), "k": bad})
    with pytest.raises(TypeError, match="another engine"):
        Value(1.0) * reference.Value(2.0)
    for expr in ("v ** k", "v * k", "k * v", "v - k", "k - v"):
        with pytest.raises(ValueError, match="too large"):
            eval(expr, {"v": Value(1.0), "k": 10 ** 400})
    assert math.isnan((Value(-1.0) ** 0.5).data)


