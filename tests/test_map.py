"""Program.map: one per-sample program run over many rows (csrc/batch.c).

Every row's outputs must equal the eager graph's bit for bit; grads must be
the per-row eager backward summed in row order (bit for bit when w is all
ones and every leaf is used once, else within 1e-12 relative)."""
import random
import threading

import numpy as np
import pytest

import pygrad
from pygrad import Value, _ops, nn
from pygrad._core import lib
from pygrad.reference import Value as RefValue

CHUNK = lib.PG_CHUNK_ROWS


def bits(a):
    return np.asarray(a, dtype=np.float64).view(np.int64)


def assert_bitwise(got, want):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    same = (bits(got) == bits(want)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"differ at {np.flatnonzero(~same)[:5]}: {got[~same][:5]} vs {want[~same][:5]}"


def eager_rows(build, rows, n_inputs):
    """Each row's outputs, from a graph built eagerly for that row."""
    out = []
    for row in rows:
        res = build([Value(float(x)) for x in row[:n_inputs]])
        res = res if isinstance(res, list) else [res]
        out.append([v.data for v in res])
    return np.array(out)


def eager_backward_in_map_order(build, rows, params):
    """Each row's backward() on its own graph, onto the params' grads as
    they are, summed in map's documented order: row after row within each
    chunk of PG_CHUNK_ROWS rows (chunk 0 from the grads as they were, every
    other chunk from -0.0), then the chunks' sums in chunk order."""
    total = None
    for c0 in range(0, len(rows), CHUNK):
        if c0:
            for p in params:
                p.grad = -0.0
        for row in rows[c0:c0 + CHUNK]:
            build([Value(float(x)) for x in row]).backward()
        part = [p.grad for p in params]
        total = part if total is None else [a + b for a, b in zip(total, part)]
    for p, g in zip(params, total or []):
        p.grad = g


def eager_grads(build, rows, params, w=None):
    """sum_r w[r] * d out_r / d p, each row's backward() on its own graph
    (w None: backward() row after row without zeroing, in map's order)."""
    for p in params:
        p.grad = 0.0
    if w is None:
        eager_backward_in_map_order(build, rows, params)
        return np.array([p.grad for p in params])
    acc = np.zeros(len(params))
    for row, wr in zip(rows, w):
        for p in params:
            p.grad = 0.0
        build([Value(float(x)) for x in row]).backward()
        acc = acc + wr * np.array([p.grad for p in params])
    for p in params:
        p.grad = 0.0
    return acc


def moons_setup(fused=True, seed=0):
    random.seed(seed)
    model = nn.MLP(2, [16, 16, 1], fused=fused)
    rng = np.random.default_rng(seed)
    XY = np.column_stack([rng.normal(size=300), rng.normal(size=300),
                          rng.choice([-1.0, 1.0], size=300)])

    def build(v):
        x0, x1, yi = v
        return (1 + -yi * model([x0, x1])).relu()
    return model, XY, build


@pytest.mark.parametrize("fused", [True, False])
def test_moons_forward_is_the_eager_forward_bit_for_bit(fused):
    model, XY, build = moons_setup(fused)
    leaves = [Value(0.0) for _ in range(3)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    assert_bitwise(prog.map(XY), eager_rows(build, XY, 3)[:, 0])


@pytest.mark.parametrize("fused", [True, False])
def test_unit_weights_give_the_eager_loops_grads_bit_for_bit(fused):
    model, XY, build = moons_setup(fused)
    leaves = [Value(0.0) for _ in range(3)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    params = model.parameters()
    want = eager_grads(build, XY, params)
    model.zero_grad()
    prog.map(XY, grad=np.ones(len(XY)))
    assert_bitwise([p.grad for p in params], want)


def test_weighted_grads_are_the_weighted_eager_sum():
    model, XY, build = moons_setup(True, seed=3)
    leaves = [Value(0.0) for _ in range(3)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    w = np.random.default_rng(1).normal(size=len(XY))
    params = model.parameters()
    want = eager_grads(build, XY, params, w)
    model.zero_grad()
    out = prog.map(XY, grad=w)
    got = np.array([p.grad for p in params])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)
    assert_bitwise(out, eager_rows(build, XY, 3)[:, 0])
    assert any(g != 0.0 for g in got)


def test_grads_accumulate_onto_existing_grads_and_inputs_are_untouched():
    model, XY, build = moons_setup(True, seed=4)
    leaves = [Value(0.0) for _ in range(3)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    model.zero_grad()
    prog.map(XY, grad=np.ones(len(XY)))
    once = np.array([p.grad for p in model.parameters()])
    prog.map(XY, grad=np.ones(len(XY)))
    twice = np.array([p.grad for p in model.parameters()])
    model.zero_grad()
    for _ in range(2):
        eager_backward_in_map_order(build, XY, model.parameters())
    assert_bitwise(twice, [p.grad for p in model.parameters()])
    assert not np.array_equal(twice, once)
    assert [v.grad for v in leaves] == [0.0, 0.0, 0.0]


def test_parameters_changed_between_maps_are_read_again():
    model, XY, build = moons_setup(True, seed=5)
    leaves = [Value(0.0) for _ in range(3)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    before = prog.map(XY)
    for p in model.parameters():
        p.data = p.data * 0.5 + 0.01
    after = prog.map(XY)
    assert not np.array_equal(before, after)
    assert_bitwise(after, eager_rows(build, XY, 3)[:, 0])


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 1000])
def test_block_boundaries(n):
    w0, w1, b = Value(0.3), Value(-1.7), Value(0.25)

    def build(v):
        return (w0 * v[0] + w1 * v[1] + b).tanh() * v[0] + (v[1] * w0).exp()
    rng = np.random.default_rng(n)
    rows = rng.normal(size=(n, 2))
    leaves = [Value(0.0), Value(0.0)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    out = prog.map(rows, grad=np.ones(n))
    assert out.shape == (n,)
    got = [w0.grad, w1.grad, b.grad]
    if n:
        assert_bitwise(out, eager_rows(build, rows, 2)[:, 0])
    # w0 is used twice per row: within rounding of the eager loop.
    want = eager_grads(build, rows, [w0, w1, b])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert got[1:] == want[1:].tolist()   # used once: bit for bit



def layer_program(nin, m, act, bias, seed, share=None):
    """m dot nodes over the same nin per-row hidden values (made from the
    inputs and parameters of their own, so their row grads matter),
    combined into one output; share:
    None, 'input' (one input twice in a neuron), 'weight' (a weight in two
    neurons) or 'reuse' (the hidden values feed other nodes too)."""
    rng = random.Random(seed)
    W = [[Value(rng.uniform(-1, 1)) for _ in range(nin)] for _ in range(m)]
    B = [Value(rng.uniform(-1, 1)) for _ in range(m)] if bias else [None] * m
    if share == "weight":
        W[-1][0] = W[0][0]
    c = [rng.uniform(-2, 2) for _ in range(m)]
    a = [Value(rng.uniform(0.5, 1.5)) for _ in range(nin)]

    def build(v):
        h = [(v[k % 2] * a[k] + 0.25 * k).tanh() if k % 3 else v[k % 2] * v[1 - k % 2] * a[k]
             for k in range(nin)]
        hs = h[:-1] + [h[0]] if share == "input" and nin > 1 else h
        ys = [pygrad.dot(W[i], hs, B[i], act) for i in range(m)]
        out = ys[0] * c[0]
        for y, ci in zip(ys[1:], c[1:]):
            out = out + y * ci
        if share == "reuse":
            out = out + h[-1] * h[0]
        return out
    params = [w for row in W for w in row] + [b for b in B if b is not None] + a
    return build, list({id(p): p for p in params}.values())      # W[0][0] first


def check_layer_program(build, params, n, seed, layers, twice=()):
    rows = np.random.default_rng(seed).normal(size=(n, 2)) * 2
    leaves = [Value(0.0), Value(0.0)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    assert lib.pg_batch_layers(prog._batch) in (layers, -1)    # -1: no layer kernels (MSVC)
    assert_bitwise(prog.map(rows), eager_rows(build, rows, 2)[:, 0])
    want = eager_grads(build, rows, params)
    for p in params:
        p.grad = 0.0
    prog.map(rows, grad=np.ones(n))
    got = np.array([p.grad for p in params])
    # A weight in two neurons sums per row first: within rounding.
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    once = [k for k, p in enumerate(params) if not any(p is q for q in twice)]
    assert_bitwise(got[once], want[once])
    assert np.count_nonzero(got)


@pytest.mark.parametrize("nin,m", [(1, 4), (2, 16), (3, 5), (17, 7), (5, 18), (4, 33)])
@pytest.mark.parametrize("act", [None, "relu", "tanh", "sigmoid"])
@pytest.mark.parametrize("bias", [True, False])
def test_whole_layers_are_the_per_neuron_rules_bit_for_bit(nin, m, act, bias):
    # m dots over the same inputs run as one layer (csrc/layer.c): every
    # row's output and every parameter's grad as the eager loop's, bit for
    # bit, across block and vector tails (n not a multiple of 4 or 8).
    seed = nin * 100 + m
    build, params = layer_program(nin, m, act, bias, seed)
    for n in (1, 3, 10, 263):
        check_layer_program(build, params, n, seed + n, layers=1)


@pytest.mark.parametrize("share", ["input", "weight", "reuse"])
def test_layers_with_shared_inputs_or_weights(share):
    # An input twice in a neuron: no layer, each neuron on its own; a weight
    # in the first and the last neuron: those two on their own, the six
    # between them a layer; hidden values read elsewhere too: still a
    # layer, its row grads added in the sweep's order.
    build, params = layer_program(6, 8, "relu", True, 5, share)
    twice = params[:1] if share == "weight" else ()
    check_layer_program(build, params, 37, 9, 0 if share == "input" else 1, twice)


def unary_ops():
    return [op for op in _ops.METHOD_OPS if op.arity == 1 and op.key not in ("powk",)]


# Inputs across each op's domain, its edges and IEEE specials.
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 1e-300, -1e-300, 5e-324, 1e300, -1e300,
           float("inf"), float("-inf"), float("nan"), 0.999999, 1.000001, 710.0, -745.0]


@pytest.mark.parametrize("op", unary_ops(), ids=lambda op: op.key)
def test_every_unary_op_maps_bit_for_bit(op):
    name = op.methods[0].name
    k = Value(1.25)

    def build(v):
        x = v[0] * k
        return getattr(x, name)() * v[1]
    rng = np.random.default_rng(len(name))
    xs = np.concatenate([SPECIAL, rng.normal(size=40) * 3])
    rows = np.column_stack([xs, rng.normal(size=len(xs))])
    leaves = [Value(0.0), Value(0.0)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    assert_bitwise(prog.map(rows), eager_rows(build, rows, 2)[:, 0])
    k.grad = 0.0
    prog.map(rows, grad=np.ones(len(rows)))
    got = k.grad
    assert_bitwise([got], eager_grads(build, rows, [k]))


BINARY = ["__add__", "__sub__", "__mul__", "__truediv__", "__pow__",
          "__radd__", "__rsub__", "__rmul__", "__rtruediv__", "__rpow__"]


@pytest.mark.parametrize("method", BINARY)
@pytest.mark.parametrize("kind", ["row-row", "row-shared", "shared-row", "row-number"])
def test_binary_ops_over_shared_and_per_row_operands(method, kind):
    s = Value(0.75)

    def build(v):
        a, b = v
        if kind == "row-shared":
            b = s
        elif kind == "shared-row":
            a = s
        elif kind == "row-number":
            b = 1.5
        if method == "__pow__" and not isinstance(b, float):
            return a ** b if kind != "row-row" else a.__pow__(b)
        return getattr(a, method)(b)
    rng = np.random.default_rng(7)
    rows = np.column_stack([np.concatenate([SPECIAL, rng.normal(size=30)]),
                            np.concatenate([SPECIAL[::-1], rng.normal(size=30)])])
    leaves = [Value(0.0), Value(0.0)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    assert_bitwise(prog.map(rows), eager_rows(build, rows, 2)[:, 0])
    s.grad = 0.0
    prog.map(rows, grad=np.ones(len(rows)))
    assert_bitwise([s.grad], eager_grads(build, rows, [s]))


def test_fused_ops_dot_sum_logsumexp():
    ws = [Value(x) for x in (0.5, -0.25, 2.0)]

    def build(v):
        d = pygrad.dot(ws, v, act="tanh")
        return pygrad.logsumexp([d, pygrad.sum(v), v[0] * ws[2]])
    rng = np.random.default_rng(11)
    rows = rng.normal(size=(50, 3)) * 4
    leaves = [Value(0.0) for _ in range(3)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    assert_bitwise(prog.map(rows), eager_rows(build, rows, 3)[:, 0])
    prog.map(rows, grad=np.ones(50))
    got = [w.grad for w in ws]
    np.testing.assert_allclose(got, eager_grads(build, rows, ws), rtol=1e-12)


def test_several_outputs():
    w = Value(1.5)

    def build(v):
        return [v[0] * w, (v[0] + v[1]).relu(), w]
    rng = np.random.default_rng(2)
    rows = rng.normal(size=(20, 2))
    leaves = [Value(0.0), Value(0.0)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    out = prog.map(rows)
    assert out.shape == (20, 3)
    assert_bitwise(out, eager_rows(build, rows, 2))
    weights = rng.normal(size=(20, 3))
    w.grad = 0.0
    prog.map(rows, grad=weights)
    # d/dw: row r gives weights[r, 0] * x0 + weights[r, 2] * 1
    want = 0.0
    for r in range(20):
        want = want + (weights[r, 0] * rows[r, 0] + weights[r, 2])
    assert w.grad == pytest.approx(want, rel=1e-12)
    with pytest.raises(TypeError, match="use map"):
        prog.forward()
    with pytest.raises(TypeError, match="use map"):
        prog.backward()


def test_unused_input_and_an_input_as_output():
    x, unused = Value(0.0), Value(0.0)
    prog = pygrad.compile([x * 2, x], inputs=[x, unused])
    out = prog.map([[1.0, 9.0], [2.0, 8.0]])
    assert out.tolist() == [[2.0, 1.0], [4.0, 2.0]]


def test_one_input_takes_a_flat_array():
    x = Value(0.0)
    prog = pygrad.compile((x * x).exp(), inputs=[x])
    assert_bitwise(prog.map([0.0, 1.0, 2.0]), [1.0, np.exp(1.0), np.exp(4.0)])


def test_single_output_program_still_replays():
    x, w = Value(2.0), Value(3.0)
    y = (x * w).relu() + 1
    prog = pygrad.compile(y, inputs=[x])
    assert prog.inputs == (x,)
    assert prog.forward() == 7.0
    prog.backward()
    assert w.grad == 2.0
    assert prog.map([[1.0], [-1.0]]).tolist() == [4.0, 1.0]
    assert "inputs=1" in repr(prog)


def test_bad_input():
    x, w = Value(1.0), Value(2.0)
    y = x * w
    with pytest.raises(TypeError, match="inputs="):
        pygrad.compile(y).map([[1.0]])
    with pytest.raises(ValueError, match="leaves"):
        pygrad.compile(y, inputs=[y])
    with pytest.raises(ValueError, match="twice"):
        pygrad.compile(y, inputs=[x, x])
    with pytest.raises(TypeError, match="pygrad.Value"):
        pygrad.compile(y, inputs=[1.0])
    with pytest.raises(TypeError, match="engine"):
        pygrad.compile(y, inputs=[RefValue(1.0)])
    with pytest.raises(TypeError, match="pygrad.Value"):
        pygrad.compile(y, inputs=1.0)          # one leaf may be given as itself, a number not
    assert pygrad.compile(y, inputs=x).inputs == (x,)
    with pytest.raises(ValueError, match="at least one"):
        pygrad.compile([], inputs=[x])
    prog = pygrad.compile(y, inputs=[x])
    with pytest.raises(ValueError, match=r"shape \(n, 1\)"):
        prog.map(np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        prog.map(np.zeros((3, 1)), grad=np.ones(4))
    with pytest.raises(TypeError, match="numbers"):
        prog.map([["a"]])
    # nothing was changed by the refusals
    assert (x.grad, w.grad) == (0.0, 0.0)
    assert prog.map([[3.0]], grad=[1.0]).tolist() == [6.0]
    assert w.grad == 3.0


def test_python_nodes_refuse_to_compile_for_map():
    x = Value(0.0)
    y = Value(x.data * 2, (x,), "double")
    with pytest.raises(ValueError, match="made in Python"):
        pygrad.compile(y * 3, inputs=[x])


def test_threads_share_a_program_safely():
    model, XY, build = moons_setup(True, seed=8)
    leaves = [Value(0.0) for _ in range(3)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    want = prog.map(XY)
    results, errors = [], []

    def work():
        try:
            for _ in range(30):
                results.append(prog.map(XY))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 90
    for r in results:
        assert_bitwise(r, want)


def test_map_trains_like_the_eager_loop():
    """Hinge loss, mean over rows, SGD: 5 steps, the eager per-row
    backward summed in row order vs map, within 1e-12."""
    model, XY, build = moons_setup(True, seed=9)
    XY = XY[:64]
    leaves = [Value(0.0) for _ in range(3)]
    prog = pygrad.compile(build(leaves), inputs=leaves)
    w = np.full(len(XY), 1.0 / len(XY))
    opt = pygrad.optim.SGD(model.parameters(), lr=0.5)
    random.seed(9)
    twin = nn.MLP(2, [16, 16, 1])
    twin.set_data(model.get_data())

    def twin_build(v):
        x0, x1, yi = v
        return (1 + -yi * twin([x0, x1])).relu()
    for _ in range(5):
        opt.zero_grad()
        losses = prog.map(XY, grad=w)
        g = eager_grads(twin_build, XY, twin.parameters(), w)
        np.testing.assert_allclose(model.get_grad(), g, rtol=1e-12, atol=1e-15)
        assert_bitwise(losses, eager_rows(twin_build, XY, 3)[:, 0])
        opt.step()
        twin.set_data(twin.get_data() - 0.5 * g)
        np.testing.assert_allclose(model.get_data(), twin.get_data(), rtol=1e-12, atol=1e-14)


def test_a_program_whose_batch_was_freed_refuses_map_and_train_step_clearly():
    """The collector frees a Program's batch when the Program is in a
    reference cycle, and a __del__ in the same garbage may call map() after.
    That is a RuntimeError saying so, not C's "not compiled" ValueError."""
    x, w = Value(0.5), Value(2.0)
    prog = pygrad.compile((x * w).tanh(), inputs=[x])
    opt = pygrad.optim.SGD([w], lr=0.1)
    lib.pg_batch_release(prog._batch)     # what the collector's clear does
    with pytest.raises(RuntimeError, match="freed by the collector"):
        prog.map([[0.25]])
    with pytest.raises(RuntimeError, match="freed by the collector"):
        prog.train_step([[0.25]], [1.0], opt)
    assert w.data == 2.0 and w.grad == 0.0
