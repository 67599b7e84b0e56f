"""pygrad.optim: SGD and Adam against the update written out with plain
float arithmetic (the formulas of pygrad/optim.py's docstring), on both
engines; C and reference agree bit for bit; schedules; bad arguments."""
import math
import random

import pytest

from pygrad import Value as C
from pygrad import nn
from pygrad.optim import SGD, Adam
from pygrad.reference import Value as R

from helpers import assert_same_doubles

ENGINES = [pytest.param(C, id="C"), pytest.param(R, id="ref")]

START = [0.5, -1.25, 2.0]


def loss_of(ps):
    """a*a + 3*b + b*c: grads (2a, 3 + c, b), exact in floats."""
    a, b, c = ps
    return a * a + 3 * b + b * c


def grads_of(xs):
    a, b, c = xs
    return [a + a, 3.0 + c, b]


def run(V, make_opt, steps=3):
    """Train the three parameters on loss_of for a few steps; returns the data
    after each step and the optimizer.  Also checks the engine's grads."""
    ps = [V(x) for x in START]
    opt = make_opt(ps)
    history = []
    for _ in range(steps):
        opt.zero_grad()
        loss_of(ps).backward()
        assert [p.grad for p in ps] == grads_of([p.data for p in ps])
        opt.step()
        history.append([p.data for p in ps])
    return history, opt


# ---------------------------------------------------------------------------
# the updates written out by hand


def sgd_by_hand(lr, momentum=0.0, weight_decay=0.0, steps=3):
    xs, vel, history = list(START), [0.0] * len(START), []
    for _ in range(steps):
        gs = grads_of(xs)
        for i in range(len(xs)):
            g = gs[i]
            if weight_decay != 0.0:
                g = g + weight_decay * xs[i]
            if momentum != 0.0:
                vel[i] = momentum * vel[i] + g
                g = vel[i]
            xs[i] = xs[i] - lr * g
        history.append(list(xs))
    return history, vel


def adam_by_hand(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, steps=3):
    xs, m, v, history = list(START), [0.0] * len(START), [0.0] * len(START), []
    for t in range(1, steps + 1):
        gs = grads_of(xs)
        for i in range(len(xs)):
            g = gs[i]
            if weight_decay != 0.0:
                g = g + weight_decay * xs[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * (g * g)
            xs[i] = xs[i] - lr * (m[i] / (1 - b1 ** t)) / (math.sqrt(v[i] / (1 - b2 ** t)) + eps)
        history.append(list(xs))
    return history, m, v


def test_plain_sgd_by_hand_is_micrografs_update():
    # with neither momentum nor weight decay: p.data -= lr * p.grad
    history, _ = sgd_by_hand(0.1, steps=1)
    assert history[0] == [x - 0.1 * g for x, g in zip(START, grads_of(START))]


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("lr, momentum, weight_decay", [
    (0.1, 0.0, 0.0), (0.05, 0.9, 0.0), (0.1, 0.0, 0.01), (0.03, 0.5, 0.1)])
def test_sgd_matches_the_hand_computed_update(V, lr, momentum, weight_decay):
    history, opt = run(V, lambda ps: SGD(ps, lr=lr, momentum=momentum,
                                         weight_decay=weight_decay))
    expected, vel = sgd_by_hand(lr, momentum, weight_decay)
    for k, (got, exp) in enumerate(zip(history, expected)):
        assert_same_doubles(got, exp, f"SGD step {k}")
    if momentum:
        assert_same_doubles(opt.velocity.tolist(), vel, "velocity")
    assert opt.steps == 3


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("kwargs", [
    dict(lr=0.1), dict(lr=0.01, betas=(0.8, 0.99)), dict(lr=0.05, weight_decay=0.01),
    dict(lr=0.2, betas=(0.0, 0.5), eps=1e-3)])
def test_adam_matches_the_hand_computed_update(V, kwargs):
    history, opt = run(V, lambda ps: Adam(ps, **kwargs))
    hand = dict(lr=kwargs["lr"], weight_decay=kwargs.get("weight_decay", 0.0),
                eps=kwargs.get("eps", 1e-8))
    hand["b1"], hand["b2"] = kwargs.get("betas", (0.9, 0.999))
    expected, m, v = adam_by_hand(**hand)
    for k, (got, exp) in enumerate(zip(history, expected)):
        assert_same_doubles(got, exp, f"Adam step {k}")
    assert_same_doubles(opt.m.tolist(), m, "first moments")
    assert_same_doubles(opt.v.tolist(), v, "second moments")


@pytest.mark.parametrize("V", ENGINES)
def test_adams_first_step_moves_each_parameter_by_about_lr(V):
    # bias correction: the first step is lr * g / (|g| + eps) ~ lr * sign(g)
    ps = [V(x) for x in START]
    opt = Adam(ps, lr=0.01)
    loss_of(ps).backward()
    opt.step()
    for p, x, g in zip(ps, START, grads_of(START)):
        assert p.data - x == pytest.approx(-0.01 * math.copysign(1.0, g), rel=1e-6)


def test_c_and_reference_optimizers_agree_bit_for_bit_on_an_mlp():
    X = [[0.5, -0.2], [-1.0, 0.3], [0.1, 0.9], [1.2, -0.7]]
    y = [1.0, -1.0, 1.0, -1.0]
    results = []
    for engine, V in (("c", C), ("reference", R)):
        random.seed(42)
        model = nn.MLP(2, [8, 8, 1], engine=engine)
        params = model.parameters()
        opts = [SGD(params[:40], lr=lambda k: 0.1 / (1 + k), momentum=0.9, weight_decay=1e-3),
                Adam(params[40:], lr=0.02, weight_decay=1e-4)]
        losses = []
        for _ in range(8):
            scores = [model([V(a), V(b)]) for a, b in X]
            loss = sum((1 + -yi * s).relu() for yi, s in zip(y, scores)) * (1 / len(y))
            for opt in opts:
                opt.zero_grad()
            loss.backward()
            for opt in opts:
                opt.step()
            losses.append(loss.data)
        results.append((losses, [p.data for p in params]))
    assert_same_doubles(results[0][0], results[1][0], "losses")
    assert_same_doubles(results[0][1], results[1][1], "final parameters")
    assert results[0][0][-1] < results[0][0][0]


# ---------------------------------------------------------------------------
# learning-rate schedules


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("Opt", [SGD, Adam])
def test_lr_schedule_gets_the_step_number(V, Opt):
    calls = []

    def schedule(k):
        calls.append(k)
        return 0.1 / (k + 1)

    ps = [V(1.0)]
    opt = Opt(ps, lr=schedule)
    for _ in range(4):
        ps[0].grad = 1.0
        opt.step()
    assert calls == [0, 1, 2, 3]
    assert opt.current_lr() == 0.1 / 5


@pytest.mark.parametrize("V", ENGINES)
def test_sgd_uses_the_scheduled_rate(V):
    p = V(1.0)
    opt = SGD([p], lr=lambda k: [0.5, 0.25, 0.125][k])
    expected = 1.0
    for k in range(3):
        p.grad = 2.0
        opt.step()
        expected = expected - [0.5, 0.25, 0.125][k] * 2.0
        assert p.data == expected


@pytest.mark.parametrize("V", ENGINES)
def test_optimizer_zero_grad(V):
    ps = [V(1.0), V(2.0)]
    (ps[0] * ps[1]).backward()
    opt = SGD(ps)
    assert [p.grad for p in ps] == [2.0, 1.0]
    opt.zero_grad()
    assert [p.grad for p in ps] == [0.0, 0.0]


@pytest.mark.parametrize("V", ENGINES)
def test_zero_grad_step_changes_nothing_without_weight_decay(V):
    ps = [V(1.5), V(-2.0)]
    for opt in (SGD(ps, lr=0.1, momentum=0.9), Adam(ps, lr=0.1)):
        opt.step()
        assert [p.data for p in ps] == [1.5, -2.0]


# ---------------------------------------------------------------------------
# bad arguments


@pytest.mark.parametrize("Opt", [SGD, Adam])
def test_empty_parameters_raise(Opt):
    with pytest.raises(ValueError, match="no parameters"):
        Opt([])
    with pytest.raises(ValueError, match="no parameters"):
        Opt(iter([]))


@pytest.mark.parametrize("Opt", [SGD, Adam])
def test_mixed_engines_raise(Opt):
    with pytest.raises(TypeError, match="same engine"):
        Opt([C(1.0), R(1.0)])
    with pytest.raises(TypeError, match="same engine"):
        Opt([R(1.0), C(1.0), C(2.0)])


@pytest.mark.parametrize("kwargs", [dict(momentum=-0.1), dict(weight_decay=-1e-4),
                                    dict(momentum=-1, weight_decay=-1)])
def test_sgd_negative_momentum_or_weight_decay_raise(kwargs):
    with pytest.raises(ValueError, match=">= 0"):
        SGD([C(1.0)], **kwargs)


@pytest.mark.parametrize("kwargs", [dict(betas=(1.0, 0.999)), dict(betas=(0.9, 1.0)),
                                    dict(betas=(-0.1, 0.999)), dict(betas=(0.9, -0.5)),
                                    dict(betas=(0.9, 1.5)), dict(eps=0.0), dict(eps=-1e-8)])
def test_adam_bad_betas_or_eps_raise(kwargs):
    with pytest.raises(ValueError, match="betas|eps"):
        Adam([C(1.0)], **kwargs)


def test_adam_betas_must_be_a_pair():
    with pytest.raises((ValueError, TypeError)):
        Adam([C(1.0)], betas=(0.9, 0.99, 0.9))
    with pytest.raises((ValueError, TypeError)):
        Adam([C(1.0)], betas=(0.9,))


@pytest.mark.parametrize("kwargs", [dict(lr="0.1"), dict(lr=None), dict(momentum="x")])
def test_non_number_hyperparameters_raise_type_error(kwargs):
    with pytest.raises(TypeError):
        SGD([C(1.0)], **kwargs)


def test_schedule_returning_a_non_number_raises_type_error():
    p = C(1.0)
    opt = SGD([p], lr=lambda k: "fast")
    with pytest.raises(TypeError):
        opt.step()
    assert p.data == 1.0


def test_optimizers_print_their_settings_and_refuse_a_module_with_a_hint():
    from pygrad import nn
    model = nn.MLP(2, [3, 1])
    assert repr(SGD(model.parameters(), lr=0.1, momentum=0.9)) == \
        "SGD(13 params, lr=0.1, momentum=0.9, weight_decay=0.0, steps=0)"
    assert repr(Adam(model.parameters(), lr=0.01)) == \
        "Adam(13 params, lr=0.01, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0, steps=0)"
    with pytest.raises(TypeError, match=r"pass MLP.parameters\(\), not the MLP itself"):
        SGD(model, lr=0.1)
