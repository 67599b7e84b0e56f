"""Sixth adversarial round: legal Python that makes pygrad return a wrong
number (C against the reference engine, the oracle, bit for bit).

Each finding's test fails on the code it was written against (211e1df) and
passes once fixed; the "held" tests at the end are attacks that failed.
"""
import math
import random
import struct
import sys

import pytest

import pygrad
from pygrad import Value, nn
from pygrad import reference as R


def bits(x: float) -> bytes:
    return b"nan" if math.isnan(x) else struct.pack("<d", x)


# =====================================================================================
# 1. Program.map(rows, grad=...): a row's sweep is not backward()'s order
# =====================================================================================

def _three_uses(M, x, p):
    # p feeds three products; the first one's other factor is two levels deep
    X, P = M.Value(x), M.Value(p)
    return X, P, P * X.tanh().tanh() + P * X + P * 0.3


def test_map_adds_a_rows_contributions_in_backwards_order():
    # Found (wrong number, last bit).  docs/api.md (Program.map) and
    # docs/batched-tier.md: "row r's sweep is backward()'s on that sample's
    # graph ... with w all ones the grads are bit-identical to that eager
    # loop".  A batched program is laid out by level (csrc/layout.c:
    # pg_lay_out(..., levels=1), by_level) and run_block (csrc/batch.c) runs
    # its backward as that order reversed, so the products into p add up
    # deepest-level first: (tt + x) + 0.3 where backward() (and the
    # reference) add (0.3 + x) + tt.  p.grad is 0.4993392764294353 on map,
    # 0.49933927642943543 on backward(), on Program.backward() and on the
    # reference.
    xr, pr, outr = _three_uses(R, 0.1, 1.0)
    outr.backward()
    xe, pe, oute = _three_uses(pygrad, 0.1, 1.0)
    oute.backward()
    assert bits(pe.grad) == bits(pr.grad)                 # eager C holds
    xc, pc, outc = _three_uses(pygrad, 0.0, 1.0)
    prog = pygrad.compile(outc, inputs=[xc])
    prog.map([[0.1]], grad=[1.0])
    assert bits(pc.grad) == bits(pr.grad), (pc.grad, pr.grad)


def test_train_step_adds_a_rows_contributions_in_backwards_order():
    # The same sums inside train_step (zero_grad, map, step in one call).
    xr, pr, outr = _three_uses(R, 0.1, 1.0)
    outr.backward()
    xc, pc, outc = _three_uses(pygrad, 0.0, 1.0)
    prog = pygrad.compile(outc, inputs=[xc])
    opt = pygrad.optim.SGD([pc], lr=0.0)
    prog.train_step([[0.1]], [1.0], opt)
    assert bits(pc.grad) == bits(pr.grad), (pc.grad, pr.grad)


# =====================================================================================
# 2. map(grad=): a fused layer below a detached_max only still runs its backward
# =====================================================================================

def _layer_under_max(nonlin):
    random.seed(0)
    layer = nn.Layer(2, 4, nonlin=nonlin)      # four fused neurons: one C layer
    x = [Value(0.0), Value(0.0)]
    p = Value(0.5)
    loss = pygrad.detached_max(layer(x)) + p * x[0]
    return layer, p, pygrad.compile(loss, inputs=x)


@pytest.mark.parametrize("nonlin", [True, False])
@pytest.mark.parametrize("row", [[math.inf, 1.0], [math.nan, 1.0]])
def test_map_runs_no_layer_below_a_detached_max_backward(nonlin, row):
    # Found (wrong number: nan).  The layer's outputs reach the loss only
    # through detached_max, so backward() (and the reference, whose max is a
    # new leaf) gives its weights no gradient.  csrc/batch.c: list_runs
    # keeps a whole layer in b->back even when it is detached, "its rule
    # adds nothing from a 0 grad": but the weight grads it adds are
    # input * 0, nan for an inf or nan input.  The weights of the neuron
    # fed by x[0] get nan.
    layer, p, prog = _layer_under_max(nonlin)
    prog.map([row], grad=[1.0])
    random.seed(0)
    rl = nn.Layer(2, 4, nonlin=nonlin, engine="reference")
    rx = [R.Value(row[0]), R.Value(row[1])]
    rp = R.Value(0.5)
    (R.detached_max(rl(rx)) + rp * rx[0]).backward()
    assert [bits(q.grad) for q in layer.parameters()] == [bits(q.grad) for q in rl.parameters()]
    assert bits(p.grad) == bits(rp.grad)


def test_map_layer_below_a_detached_max_keeps_a_negative_zero_grad():
    # The same cause with finite numbers: a weight whose grad is -0.0 gets
    # -0.0 + (x * 0.0) = +0.0 from the layer's backward; the reference and
    # backward() leave it -0.0 (no gradient reaches it).
    layer, p, prog = _layer_under_max(True)
    for q in layer.parameters():
        q.grad = -0.0
    prog.map([[1.0, 2.0]], grad=[1.0])
    assert [bits(q.grad) for q in layer.parameters()] == [bits(-0.0)] * len(layer.parameters())


# =====================================================================================
# 3. pygrad.grad(create_graph=True) walks below a detached_max: another order
# =====================================================================================

def _shared_with_a_max(M):
    z = M.Value(1.0)
    p1, p2, p3 = z * 0.1, z * 0.2, z * 0.3
    out = ((M.detached_max([p3]) + p1) + p2) + p3
    return z, out


def test_grad_create_graph_adds_in_backwards_order_past_a_detached_max():
    # Found (wrong number, last bit).  backward() (csrc/backward.c: walk,
    # graded) and grad() without create_graph do not go below a
    # detached_max; pygrad.grad(create_graph=True) orders its sweep by
    # pygrad/higher_order.py's _Walk, whose C walk (csrc/value_binding.h:
    # pg_walk_l, and the Python fallback _Walk._walk) enters the max's
    # children.  p3 is then met under the max, first, and z's three terms
    # add as (0.2 + 0.1) + 0.3 = 0.6000000000000001 instead of backward()'s
    # (0.3 + 0.2) + 0.1 = 0.6 (the reference, backward(), grad()).
    zr, outr = _shared_with_a_max(R)
    outr.backward()
    assert zr.grad == 0.6
    ze, oute = _shared_with_a_max(pygrad)
    oute.backward()
    assert bits(ze.grad) == bits(zr.grad)
    zn, outn = _shared_with_a_max(pygrad)
    assert bits(pygrad.grad(outn, [zn])[0].data) == bits(zr.grad)
    zc, outc = _shared_with_a_max(pygrad)
    (g,) = pygrad.grad(outc, [zc], create_graph=True)
    assert bits(g.data) == bits(zr.grad), g.data


# =====================================================================================
# 4. Fused dot / logsumexp: gradients differ from the plain graph's in the last bit
# =====================================================================================

def test_fused_dot_gradient_with_a_shared_child_is_the_plain_graphs_sum_in_another_order():
    # Found (last bit).  dot([x, x], [c, y]) with y = x * k: the fused node
    # (csrc/ops.c LINEAR rule) adds both products' terms into x at once,
    # then y's; the plain graph's walk visits x * y, then y, then x * c, so
    # x's three terms add in another order: C 0.3, the reference
    # 0.30000000000000004.  docs/api.md (Fused ops) now states this case;
    # without a shared child the two agree bit for bit.
    def f(M, shared):
        x = M.Value(0.1)
        y = x * 0.5 if shared else M.Value(0.05)
        out = M.dot([x, x], [M.Value(0.2), y])
        out.backward()
        return x.grad
    assert f(R, True) == 0.30000000000000004
    assert math.isclose(f(pygrad, True), f(R, True), rel_tol=4 * sys.float_info.epsilon)
    assert bits(f(pygrad, False)) == bits(f(R, False))


def test_fused_logsumexp_gradient_with_a_shared_child_is_the_plain_graphs_sum():
    # The same for logsumexp over [x, x * a, x * b]; over distinct leaves
    # the two agree bit for bit.
    def f(M, xv, a, b, shared):
        x = M.Value(xv)
        out = M.logsumexp([x, x * a, x * b] if shared else [x, M.Value(a), M.Value(b)])
        out.backward()
        return x.grad
    rng = random.Random(1)
    for _ in range(60):
        v = [rng.uniform(-1, 1) for _ in range(3)]
        assert math.isclose(f(pygrad, *v, True), f(R, *v, True), rel_tol=1e-15, abs_tol=1e-300)
        assert bits(f(pygrad, *v, False)) == bits(f(R, *v, False)), v


# =====================================================================================
# Attacks that held
# =====================================================================================

def test_held_python_backward_on_a_detached_max_node():
    # A closure assigned to the max node itself: C's walk still does not go
    # below it (the reference's max is a leaf with that closure).
    def run(M):
        x = M.Value(4.0)
        y = x * 3
        m = M.detached_max([y])

        def bw():
            y.grad += m.grad
        m._backward = bw
        (m * 2).backward()
        return x.grad, y.grad, m.grad
    assert run(pygrad) == run(R)


def test_held_a_traced_max_kept_from_per_length_is_refused():
    # A detached_max over traced values, kept from the trace: backward(),
    # grad, compile and .data all refuse it (its own node is flagged traced,
    # so the graded walk still sees the flag).
    table = [Value(float(i) + 0.5) for i in range(3)]
    p = Value(2.0)
    kept = []

    def loss_fn(tokens):
        vals = [pygrad.pick(table, t) for t in tokens]
        m = pygrad.detached_max(vals)
        kept.append(m)
        return pygrad.sum([(v - m).exp() for v in vals]).log() * p

    pl = pygrad.per_length(loss_fn, 3)
    pl.loss([0, 2])
    y = kept[0] * p
    for call in (y.backward, lambda: pygrad.grad(y, [p]),
                 lambda: pygrad.grad(y, [p], create_graph=True),
                 lambda: pygrad.compile(y), lambda: kept[0].data):
        with pytest.raises(ValueError):
            call()
    assert p.grad == 0.0


def test_held_random_plain_graphs_with_detached_max():
    # Random graphs of plain ops and nested detached_maxes (sqrt, log, abs
    # below them: nan-prone rules): eager backward(), Program.forward/
    # backward at other leaf values and grad() equal the reference bit for
    # bit on every leaf.
    ops = ['+', '-', '*', '/', 'exp', 'tanh', 'neg', 'sq', 'max', 'max', 'sqrt', 'abs',
           'log', 'relu']

    def build(M, vals, seed, nops):
        rng = random.Random(seed)
        leaves = [M.Value(v) for v in vals]
        pool = list(leaves)
        for _ in range(nops):
            op = rng.choice(ops)
            a, b = rng.choice(pool), rng.choice(pool)
            ks = [rng.choice(pool) for _ in range(rng.randint(1, 4))]
            if op == 'max':
                r = M.detached_max(ks)
            else:
                r = {'+': lambda: a + b, '-': lambda: a - b, '*': lambda: a * b,
                     '/': lambda: a / b, 'exp': lambda: (a * 0.1).exp(),
                     'tanh': lambda: a.tanh(), 'neg': lambda: -a, 'sq': lambda: a ** 2,
                     'sqrt': lambda: a.sqrt(), 'abs': lambda: abs(a), 'log': lambda: a.log(),
                     'relu': lambda: a.relu()}[op]()
            pool.append(r)
        out = pool[-1]
        for p in pool[-6:-1]:
            out = out + p * 0.5
        return leaves, out

    for seed in range(150):
        rng = random.Random(seed + 10 ** 6)
        vals = [rng.choice([0.5, -1.25, 2.0, 0.0, 0.1, 0.2, 0.3, 1.5]) for _ in range(4)]
        vals2 = [rng.choice([0.5, -1.25, 2.0, 0.0, 0.1, 0.2, 0.3, -0.7]) for _ in range(4)]
        nops = rng.randint(1, 14)
        rl, ro = build(R, vals2, seed, nops)
        ro.backward()
        want = [bits(v.grad) for v in rl]
        el, eo = build(pygrad, vals2, seed, nops)
        eo.backward()
        assert [bits(v.grad) for v in el] == want, seed
        cl, co = build(pygrad, vals, seed, nops)
        prog = pygrad.compile(co)
        for leaf, x in zip(cl, vals2):
            leaf.data = x
        prog.forward()
        prog.backward()
        assert [bits(v.grad) for v in cl] == want, seed
        gl, go = build(pygrad, vals2, seed, nops)
        assert [bits(g.data) for g in pygrad.grad(go, gl)] == want, seed
