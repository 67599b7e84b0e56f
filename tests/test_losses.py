"""pygrad.losses on both engines: values and gradients against closed forms
written with floats, against finite differences, C against reference bit
for bit, stability at large logits, and bad input."""
import math

import pytest

from pygrad import Value as C
from pygrad import gradcheck
from pygrad.losses import bce_with_logits, mse, softmax_cross_entropy, svm_hinge
from pygrad.reference import Value as R

from helpers import assert_same_doubles

ENGINES = [pytest.param(C, id="C"), pytest.param(R, id="ref")]


def values(V, xs):
    return [V(x) for x in xs]


def sigmoid(z):
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def softplus(z):
    """log(1 + exp(z)) without overflow."""
    return max(z, 0.0) + math.log1p(math.exp(-abs(z)))


def logsumexp(zs):
    m = max(zs)
    return m + math.log(math.fsum(math.exp(z - m) for z in zs))


# ---------------------------------------------------------------------------
# mse


@pytest.mark.parametrize("V", ENGINES)
def test_mse_value_and_grads(V):
    ps, ts = values(V, [0.5, -1.0, 2.25]), [1.0, -1.5, 0.0]
    loss = mse(ps, ts)
    n = len(ts)
    assert loss.data == pytest.approx(math.fsum((p.data - t) ** 2 for p, t in zip(ps, ts)) / n,
                                      rel=1e-15)
    loss.backward()
    assert [p.grad for p in ps] == pytest.approx([2 * (p.data - t) / n for p, t in zip(ps, ts)],
                                                 rel=1e-15)


@pytest.mark.parametrize("V", ENGINES)
def test_mse_of_a_perfect_fit_is_zero(V):
    ps = values(V, [1.0, 2.0])
    loss = mse(ps, [1, 2])
    assert loss.data == 0.0
    loss.backward()
    assert [p.grad for p in ps] == [0.0, 0.0]


@pytest.mark.parametrize("V", ENGINES)
def test_mse_gradcheck(V):
    res = gradcheck(lambda a, b, c: mse([a * b, b.tanh(), c], [0.3, -0.2, 1.0]),
                    [0.7, -0.4, 1.9], value_type=V)
    assert res, str(res)


# ---------------------------------------------------------------------------
# svm_hinge


def hinge_by_hand(scores, labels, params=(), alpha=1e-4):
    n = len(scores)
    data = math.fsum(max(0.0, 1 - y * s) for s, y in zip(scores, labels)) / n
    reg = alpha * math.fsum(p * p for p in params)
    dscores = [(-y / n if 1 - y * s > 0 else 0.0) for s, y in zip(scores, labels)]
    dparams = [2 * alpha * p for p in params]
    return data + reg, dscores, dparams


@pytest.mark.parametrize("V", ENGINES)
def test_svm_hinge_without_regularisation(V):
    s, y = [0.5, -2.0, 1.5, 0.25], [1, -1, -1, 1.0]
    scores = values(V, s)
    loss = svm_hinge(scores, y)
    exp, dscores, _ = hinge_by_hand(s, y)
    assert loss.data == pytest.approx(exp, rel=1e-15)
    loss.backward()
    assert [v.grad for v in scores] == pytest.approx(dscores, rel=1e-15)


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("alpha", [1e-4, 0.5])
def test_svm_hinge_with_regularisation(V, alpha):
    s, y, w = [0.5, -2.0, 1.5], [1, -1, -1], [0.3, -1.2, 2.0, 0.0]
    scores, params = values(V, s), values(V, w)
    loss = svm_hinge(scores, y, params, alpha=alpha)
    exp, dscores, dparams = hinge_by_hand(s, y, w, alpha)
    assert loss.data == pytest.approx(exp, rel=1e-15)
    loss.backward()
    assert [v.grad for v in scores] == pytest.approx(dscores, rel=1e-15)
    assert [p.grad for p in params] == pytest.approx(dparams, rel=1e-15)


@pytest.mark.parametrize("V", ENGINES)
def test_svm_hinge_with_an_empty_params_list_is_unregularised(V):
    scores = values(V, [0.5, -0.5])
    assert svm_hinge(scores, [1, 1], []).data == svm_hinge(scores, [1, 1]).data == 1.0


@pytest.mark.parametrize("V", ENGINES)
def test_svm_hinge_gradcheck(V):
    def f(a, b, c):
        return svm_hinge([a * b, b + c, c.tanh()], [1, -1, 1], [a, b, c], alpha=0.1)

    res = gradcheck(f, [0.3, -0.8, 0.6], value_type=V)
    assert res, str(res)


# ---------------------------------------------------------------------------
# bce_with_logits


def bce_by_hand(zs, ts):
    n = len(zs)
    loss = math.fsum(softplus(z) - z * t for z, t in zip(zs, ts)) / n
    grads = [(sigmoid(z) - t) / n for z, t in zip(zs, ts)]
    return loss, grads


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("zs, ts", [
    ([0.3, -1.2, 2.0, 0.0], [1, 0, 0.25, 1]),
    ([50.0, -50.0, 50.0, -50.0], [1, 0, 0, 1]),
    ([1000.0, -1000.0], [1.0, 0.0]),
    ([-1000.0, 1000.0, 30.0], [1.0, 0.0, 0.5]),
])
def test_bce_with_logits_against_the_closed_form(V, zs, ts):
    logits = values(V, zs)
    loss = bce_with_logits(logits, ts)
    exp, grads = bce_by_hand(zs, ts)
    assert math.isfinite(loss.data)
    assert loss.data == pytest.approx(exp, rel=1e-12, abs=1e-15)
    loss.backward()
    got = [z.grad for z in logits]
    assert all(math.isfinite(g) for g in got)
    assert got == pytest.approx(grads, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("V", ENGINES)
def test_bce_with_logits_is_minus_log_sigmoid(V):
    # t = 1: -log(sigmoid(z)); t = 0: -log(1 - sigmoid(z))
    for z in (-3.0, -0.5, 0.0, 0.7, 4.0):
        assert bce_with_logits([V(z)], [1]).data == pytest.approx(-math.log(sigmoid(z)), rel=1e-12)
        assert bce_with_logits([V(z)], [0]).data == pytest.approx(-math.log(1 - sigmoid(z)),
                                                                  rel=1e-12)


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("z", [-2.0, -0.3, 0.4, 3.0])
def test_bce_with_logits_gradcheck(V, z):
    res = gradcheck(lambda a, b: bce_with_logits([a, a * b], [0.8, 0.1]), [z, 0.7], value_type=V)
    assert res, str(res)


# ---------------------------------------------------------------------------
# softmax_cross_entropy


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("zs, target", [
    ([0.3, -1.2, 2.0], 0), ([0.3, -1.2, 2.0], 2), ([1.0, 1.0], 1),
    ([1000.0, 0.0, -1000.0], 0), ([1000.0, 0.0, -1000.0], 1), ([5.0], 0),
])
def test_softmax_cross_entropy_single_sample(V, zs, target):
    logits = values(V, zs)
    loss = softmax_cross_entropy(logits, target)
    lse = logsumexp(zs)
    assert math.isfinite(loss.data)
    assert loss.data == pytest.approx(lse - zs[target], rel=1e-14, abs=1e-14)
    if max(zs) < 700:
        softmax = [math.exp(z) / math.fsum(math.exp(u) for u in zs) for z in zs]
        assert loss.data == pytest.approx(-math.log(softmax[target]), rel=1e-12, abs=1e-14)
    loss.backward()
    expected = [math.exp(z - lse) - (i == target) for i, z in enumerate(zs)]
    assert [v.grad for v in logits] == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("V", ENGINES)
def test_softmax_cross_entropy_batch_is_the_mean(V):
    batch = [[0.3, -1.2, 2.0], [1.0, 0.5, -0.5], [-2.0, 0.0, 2.0]]
    targets = [1, 0, 2]
    logits = [values(V, zs) for zs in batch]
    loss = softmax_cross_entropy(logits, targets)
    per = [logsumexp(zs) - zs[t] for zs, t in zip(batch, targets)]
    assert loss.data == pytest.approx(math.fsum(per) / 3, rel=1e-14)
    loss.backward()
    for zs, t, vs in zip(batch, targets, logits):
        lse = logsumexp(zs)
        expected = [(math.exp(z - lse) - (i == t)) / 3 for i, z in enumerate(zs)]
        assert [v.grad for v in vs] == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("V", ENGINES)
def test_softmax_cross_entropy_batch_of_tuples(V):
    a = softmax_cross_entropy([tuple(values(V, [0.1, 0.2])), tuple(values(V, [0.3, 0.1]))], [1, 0])
    b = softmax_cross_entropy([values(V, [0.1, 0.2]), values(V, [0.3, 0.1])], [1, 0])
    assert a.data == b.data


@pytest.mark.parametrize("V", ENGINES)
def test_softmax_cross_entropy_gradcheck(V):
    def f(a, b, c, d):
        return softmax_cross_entropy([[a, b * c, d], [c, a + d, b]], [2, 0])

    res = gradcheck(f, [0.4, -0.9, 1.3, 0.2], value_type=V)
    assert res, str(res)


# ---------------------------------------------------------------------------
# C and reference agree bit for bit


def all_losses(V):
    zs = values(V, [0.7, -1.3, 2.1, -0.2])
    ws = values(V, [0.5, -0.25])
    losses = [
        mse(zs, [1.0, 0.0, 2.0, -1.0]),
        svm_hinge(zs, [1, -1, -1, 1], ws, alpha=0.01),
        bce_with_logits(zs, [1, 0, 0.5, 0.3]),
        bce_with_logits(values(V, [60.0, -60.0]), [0.2, 0.9]),
        softmax_cross_entropy(zs, 2),
        softmax_cross_entropy([zs[:2], zs[2:], [zs[0], zs[3]]], [0, 1, 1]),
    ]
    out = []
    for loss in losses:
        for v in zs + ws:
            v.grad = 0.0
        loss.backward()
        out.append([loss.data] + [v.grad for v in zs + ws])
    return out


def test_losses_are_bit_identical_on_both_engines():
    for k, (c, r) in enumerate(zip(all_losses(C), all_losses(R))):
        assert_same_doubles(c, r, f"loss {k} (data, then grads)")


# ---------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("V", ENGINES)
def test_mismatched_lengths_raise(V):
    v = values(V, [0.1, 0.2])
    with pytest.raises(ValueError, match="mse"):
        mse(v, [1.0])
    with pytest.raises(ValueError, match="svm_hinge"):
        svm_hinge(v, [1, -1, 1])
    with pytest.raises(ValueError, match="bce_with_logits"):
        bce_with_logits(v, [0.5])
    with pytest.raises(ValueError, match="softmax_cross_entropy"):
        softmax_cross_entropy([v, v], [0])


@pytest.mark.parametrize("V", ENGINES)
def test_empty_batches_raise(V):
    for call in (lambda: mse([], []), lambda: svm_hinge([], []),
                 lambda: bce_with_logits([], []), lambda: softmax_cross_entropy([], [])):
        with pytest.raises(ValueError):
            call()


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("label", [0, 2, 0.5, -2, math.nan])
def test_svm_labels_must_be_plus_or_minus_one(V, label):
    with pytest.raises(ValueError, match="-1 or \\+1"):
        svm_hinge(values(V, [0.1, 0.2]), [1, label])


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("target", [3, -1, 10, True])
def test_softmax_target_out_of_range_raises(V, target):
    with pytest.raises(ValueError, match="class index"):
        softmax_cross_entropy(values(V, [0.1, 0.2, 0.3]), target)


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("target", [1.0, "1", None])
def test_softmax_target_of_wrong_type_raises(V, target):
    with pytest.raises(TypeError, match="class index"):
        softmax_cross_entropy(values(V, [0.1, 0.2, 0.3]), target)


@pytest.mark.parametrize("V", ENGINES)
def test_softmax_batch_target_out_of_range_raises(V):
    with pytest.raises(ValueError, match="class index"):
        softmax_cross_entropy([values(V, [0.1, 0.2]), values(V, [0.3, 0.4])], [0, 2])


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("t", [1.5, -0.1, 2, math.nan, math.inf])
def test_bce_targets_outside_zero_one_raise(V, t):
    with pytest.raises(ValueError, match="\\[0, 1\\]"):
        bce_with_logits(values(V, [0.1, 0.2]), [0.5, t])


@pytest.mark.parametrize("V", ENGINES)
def test_non_number_targets_raise_type_error(V):
    v = values(V, [0.1])
    with pytest.raises(TypeError):
        mse(v, ["1"])
    with pytest.raises(TypeError):
        svm_hinge(v, [None])
    with pytest.raises(TypeError):
        bce_with_logits(v, ["0"])


@pytest.mark.parametrize("V", ENGINES)
def test_softmax_cross_entropy_takes_numpy_integer_targets(V):
    import numpy as np
    zs = values(V, [0.1, 0.2, 0.3])
    assert softmax_cross_entropy(zs, np.int64(1)).data == softmax_cross_entropy(zs, 1).data
    batch = softmax_cross_entropy([zs, zs], np.array([1, 2]))
    assert batch.data == softmax_cross_entropy([zs, zs], [1, 2]).data


def test_a_loss_over_fused_outputs_never_walks_the_graph(monkeypatch):
    """Losses recognise Values without running ``_prev`` (which may walk)."""
    from pygrad import data, engine, losses, nn

    def no_walk(self):
        raise AssertionError("a loss read _prev")
    model = nn.MLP(2, [4, 1])
    X, y = data.make_moons(8, seed=0)
    scores = [model(x) for x in data.to_values(X)]
    monkeypatch.setattr(engine.Value, "_prev", property(no_walk))
    loss = losses.svm_hinge(scores, data.signed_labels(y), model.parameters())
    loss2 = losses.mse(scores, [0.5] * len(scores))
    assert loss.data > 0 and loss2.data > 0
