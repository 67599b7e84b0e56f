"""Node construction: validate -> reserve -> commit (csrc/nodes.c).

Every creator either makes its node(s) whole or changes nothing: a refused
argument or a failed allocation leaves the live-node count and the
segment's bump index as they were.  And the per-op C entry points the
Value methods call agree bit for bit with the reference engine."""
import gc
import math
import random

import pytest

import pygrad
from pygrad import Value, _ops, engine, nn, reference
from pygrad._core import ffi, lib

from helpers import assert_same_doubles, square_function

Square = square_function()


_anchors = []


def fresh_segment() -> int:
    """Start the calling thread on a new segment (no edge chunk yet: its
    first n-ary node allocates one) and return its sid."""
    gc.collect()
    lib.pg_close_current()
    anchor = Value(0.0) * 1.0           # the new segment's first node (a leaf goes
                                        # to a leaf segment: an op's node opens it)
    _anchors.append(anchor)
    return anchor._h >> lib.PG_SEG_BITS


def counts(sid: int):
    """Live nodes, and the slots left in the thread's segment (sid's)."""
    return lib.pg_live_nodes(), lib.pg_room_left()


# -- each n-ary creator: the edge allocation fails, nothing changes -------------

# Each build: (make its leaves, make the n-ary node from them), so that
# the leaves exist before the graph segment is opened and the armed
# allocation can only be the node's edge run.

def build_dot(V, mod):
    w = [V(0.5), V(-1.25), V(2.0)]
    x = [V(0.75), V(0.5), V(-0.25)]
    b = V(0.125)
    return lambda: [mod.dot(w, x, b, act="tanh").data]


def build_sum(V, mod):
    vs = [V(0.1), V(0.2), V(0.3), V(0.4)]
    return lambda: [mod.sum(vs).data]


def build_custom(V, mod):
    a, b = V(1.5), V(-2.0)
    return lambda: [V(a.data * b.data + 1.0, (a, b), "fma").data]


def build_layer(V, mod):
    random.seed(7)
    layer = nn.Layer(3, 4, engine="c" if V is Value else "reference")
    x = [V(0.5), V(-0.25), V(1.0)]
    return lambda: [v.data for v in layer(x)]


def build_function(V, mod):
    x = V(1.75)
    if V is not Value:          # x * x by plain ops: Square's value
        return lambda: [(x * x).data]
    return lambda: [Square.apply(x).data]


def build_mlp(V, mod):
    random.seed(9)
    model = nn.MLP(3, [4, 2], engine="c" if V is Value else "reference")
    x = [V(0.5), V(-0.25), V(1.0)]
    return lambda: [v.data for v in model(x)]


BUILDS = [build_dot, build_sum, build_custom, build_layer, build_mlp, build_function]


@pytest.mark.test_hooks
@pytest.mark.parametrize("build", BUILDS, ids=lambda f: f.__name__[6:])
def test_failed_edge_allocation_changes_nothing(build):
    expected = build(reference.Value, reference)()
    make = build(Value, pygrad)
    sid = fresh_segment()
    before = counts(sid)
    # claims for the build come from a slab with room (no allocation), so
    # the armed allocation is the build's own
    spare = [lib.pg_claim_new() for _ in range(16)]
    for c in spare:
        lib.pg_claim_drop(c)
    lib.pg_fail_alloc(1)
    try:
        with pytest.raises(MemoryError, match="out of memory"):
            make()
        assert lib.pg_fail_alloc_pending() == 0, "the armed allocation was not reached"
    finally:
        lib.pg_fail_alloc(0)
    gc.collect()
    assert counts(sid) == before
    # with memory back, the same build in the same segment gives exact values
    assert_same_doubles(make(), expected, build.__name__)
    assert 0 < lib.pg_room_left() < before[1]


# -- bad input: refused before anything changes -------------------------------

def C():
    """An empty claim, owned (what every creator takes first)."""
    return ffi.gc(lib.pg_claim_new(), lib.pg_claim_drop)


def _handles(*hs):
    return ffi.new("uint32_t[]", list(hs))


def _mlp(nlayers, acts, params, sizes, x):
    """lib.pg_mlp over Python lists (each layer's parameter handles a list)."""
    arrays = [_handles(*p) for p in params]
    return lib.pg_mlp(C(), nlayers, ffi.new("int[]", acts or [0]),
                      ffi.new("uint32_t *[]", arrays or [ffi.NULL]),
                      ffi.new("uint32_t[]", sizes), _handles(*x))


def test_every_creator_refuses_bad_input_without_changes():
    sid = fresh_segment()
    a, b = Value(0.5), Value(2.0)
    keep = a * b                         # a graph node in this segment
    bad = 0                              # handle 0 is no node
    good = keep._h
    before = counts(sid)
    E = lib.PG_E_ARG
    cases = {
        "unary op": lib.pg_unary(C(), lib.PG_OP_ADD, good),
        "unary POWK": lib.pg_unary(C(), lib.PG_OP_POWK, good),
        "unary kid": lib.pg_unary(C(), lib.PG_OP_EXP, bad),
        "binary op": lib.pg_binary(C(), lib.PG_OP_EXP, good, good),
        "binary op range": lib.pg_binary(C(), lib.PG_OP_COUNT, good, good),
        "binary 2nd kid": lib.pg_binary(C(), lib.PG_OP_MUL, good, bad),
        "binary_k op": lib.pg_binary_k(C(), lib.PG_OP_SUM, good, 1.0, 0),
        "binary_k kid": lib.pg_binary_k(C(), lib.PG_OP_MUL, bad, 1.0, 1),
        "powk kid": lib.pg_powk(C(), bad, 2.0, 1),
        "entry binary": lib.pg_binary_MUL(C(), good, bad),
        "entry binary_k": lib.pg_binary_k_SUB(C(), bad, 1.0),
        "entry binary_rk": lib.pg_binary_rk_DIV(C(), 1.0, bad),
        "entry unary": lib.pg_unary_TANH(C(), bad),
        "entry powk": lib.pg_powk_float(C(), bad, 0.5),
        "custom last kid": lib.pg_custom(C(), 1.0, _handles(good, good, bad), 3),
        "nary op": lib.pg_nary(C(), lib.PG_OP_MUL, 0, _handles(good, good), 2),
        "nary FUNCTION": lib.pg_nary(C(), lib.PG_OP_FUNCTION, 0, _handles(good), 1),
        "nary empty": lib.pg_nary(C(), lib.PG_OP_SUM, 0, _handles(good), 0),
        "nary variant": lib.pg_nary(C(), lib.PG_OP_SUM, 1, _handles(good), 1),
        "nary linear odd": lib.pg_nary(C(), lib.PG_OP_LINEAR, 0, _handles(good), 1),
        "nary last kid": lib.pg_nary(C(), lib.PG_OP_SUM, 0, _handles(good, good, bad), 3),
        "layer act": lib.pg_linear_layer(C(), 9, _handles(good, good), _handles(good), 1, 1),
        "layer nout": lib.pg_linear_layer(C(), 0, _handles(good), _handles(), 0, 0),
        "layer x": lib.pg_linear_layer(C(), 0, _handles(good, good), _handles(bad), 1, 1),
        "layer last param": lib.pg_linear_layer(C(), 1, _handles(good, good, good, bad),
                                                _handles(good), 1, 2),
        "mlp layers": _mlp(0, [0], [[good, good]], [1, 1], [good]),
        "mlp act": _mlp(1, [9], [[good, good]], [1, 1], [good]),
        "mlp width": _mlp(1, [0], [[good]], [1, 0], [good]),
        "mlp too many nodes": _mlp(2, [0, 0], [[good, good] * 4000, [good] * 400100],
                                   [1, 4000, 100], [good]),
        "mlp x": _mlp(1, [0], [[good, good]], [1, 1], [bad]),
        "mlp 2nd layer's last param": _mlp(2, [1, 0], [[good, good] * 2, [good, good, bad]],
                                           [1, 2, 1], [good]),
        "leaves none": lib.pg_leaves(C(), ffi.new("double[]", 1), 0),
        "leaves too many": lib.pg_leaves(C(), ffi.new("double[]", lib.PG_SEG_NODES + 1),
                                         lib.PG_SEG_NODES + 1),
        "function last kid": lib.pg_function(C(), 1.0, _handles(good, bad),
                                             ffi.new("double[]", [1.0, 2.0]), 2),
    }
    full = C()
    assert lib.pg_hold(full, good) == 0
    claims = {
        "no claim": lib.pg_binary_MUL(ffi.NULL, good, good),
        "claim in use": lib.pg_binary_MUL(full, good, good),
    }
    assert claims == {"no claim": lib.PG_E_NOMEM, "claim in use": E}
    for what, rc in cases.items():
        assert rc == E, f"{what}: {rc}"
        assert counts(sid) == before, what
    # the segment is still usable, and makes exact values
    assert (keep + 1.0).data == 2.0
    assert lib.pg_room_left() == before[1] - 2


def test_nodes_that_do_not_fit_go_whole_into_a_new_segment():
    """A creator whose nodes don't fit the slots left takes none of them:
    all of them go into a new segment, consecutive, and the old segment
    keeps its room."""
    fresh_segment()
    x = Value(0.5)
    keep = [x * 1.0]
    while lib.pg_room_left() > 2:
        keep.append(keep[-1] * 1.0)
    old = keep[-1]._h >> lib.PG_SEG_BITS
    layer = nn.Layer(1, 3, nonlin=False)
    out = layer([keep[-1]])
    sids = {v._h >> lib.PG_SEG_BITS for v in out}
    assert len(sids) == 1 and old not in sids
    assert [v._h for v in out] == list(range(out[0]._h, out[0]._h + 3))
    ref = [n.b.data + n.w[0].data * keep[-1].data for n in layer.neurons]
    assert [v.data for v in out] == ref


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


