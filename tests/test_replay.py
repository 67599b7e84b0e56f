"""Replay: a compiled graph re-run in C equals rebuilding it."""
import math
import random

import numpy as np
import pytest

import pygrad
from pygrad import Value, data, losses, nn, optim
from pygrad.reference import Value as RefValue

from helpers import assert_same_doubles, micrograd_style_tanh, square_function


def build(V, xs):
    a, b, c = xs
    h = (a * b + c).tanh()
    return ((h ** 2 + 1.0).log() - a / (c + 3.0) + 2.0 ** b).sigmoid() + (a - h).relu() * c.exp()


def test_forward_recomputes_after_the_leaves_change():
    leaves = [Value(x) for x in (0.3, -1.2, 0.8)]
    out = build(Value, leaves)
    program = pygrad.compile(out)
    for trial in range(5):
        xs = [random.uniform(-1, 1) for _ in range(3)]
        for v, x in zip(leaves, xs):
            v.data = x
            v.grad = 0.0
        assert program.forward() == out.data
        program.backward()
        fresh = [Value(x) for x in xs]
        expected = build(Value, fresh)
        expected.backward()
        assert_same_doubles([out.data] + [v.grad for v in leaves],
                            [expected.data] + [v.grad for v in fresh])


def test_backward_is_that_of_a_fresh_graph_each_time():
    x = Value(0.5)
    y = (x * x + x).tanh()
    program = pygrad.compile(y)
    program.forward()
    program.backward()
    first = x.grad
    x.grad = 0.0
    program.backward()        # interior grads restart from 0, unlike backward()
    assert x.grad == first
    assert y.grad == 1.0


def _train(engine_tier, steps=15):
    X, y = data.make_moons(30, noise=0.1, seed=3)
    ys = data.signed_labels(y).tolist()
    random.seed(7)
    engine = "reference" if engine_tier == "reference" else "c"
    model = nn.MLP(2, [8, 8, 1], engine=engine)
    opt = optim.SGD(model.parameters(), lr=lambda k: 1.0 - 0.9 * k / 100, momentum=0.5)
    V = RefValue if engine == "reference" else Value
    history = []
    if engine_tier == "replay":
        inputs = data.to_values(X)
        scores = [model(x) for x in inputs]
        loss = losses.svm_hinge(scores, ys, model.parameters(), alpha=1e-4)
        program = pygrad.compile(loss)
        for _ in range(steps):
            history.append(program.forward())
            opt.zero_grad()
            program.backward()
            opt.step()
    else:
        for _ in range(steps):
            scores = [model(x) for x in data.to_values(X, V)]
            loss = losses.svm_hinge(scores, ys, model.parameters(), alpha=1e-4)
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(loss.data)
    return history, model.get_data().tolist()


@pytest.mark.slow     # seconds: the default run stays near 90 s
def test_replayed_training_is_bit_identical_to_rebuilding_on_the_reference():
    ref_losses, ref_params = _train("reference")
    rep_losses, rep_params = _train("replay")
    assert_same_doubles(rep_losses, ref_losses)
    assert_same_doubles(rep_params, ref_params)


def test_minibatches_swap_in_through_inputs():
    random.seed(0)
    model = nn.MLP(2, [4, 1])
    xs = [[Value(0.0), Value(0.0)] for _ in range(4)]
    out = pygrad.sum([model(x) for x in xs])
    program = pygrad.compile(out)
    inputs = pygrad.Inputs([v for row in xs for v in row])
    rng = np.random.default_rng(0)
    for _ in range(3):
        batch = rng.normal(size=(4, 2))
        inputs.set(batch)
        np.testing.assert_array_equal(inputs.get(), batch.reshape(-1))
        replayed = program.forward()
        fresh = pygrad.sum([model(row) for row in batch.tolist()]).data
        assert replayed == fresh
    with pytest.raises(ValueError, match="8 numbers"):
        inputs.set(np.zeros(3))


def test_python_control_flow_is_frozen_at_compile_time():
    x = Value(2.0)
    y = x * 3.0 if x.data > 0 else x * -3.0
    program = pygrad.compile(y)
    x.data = -1.0
    assert program.forward() == -3.0          # still the x > 0 branch


def test_python_backward_nodes_refuse_to_compile():
    x = Value(0.4)
    y = micrograd_style_tanh(Value)(x) * 2.0
    with pytest.raises(ValueError, match="made in Python"):
        pygrad.compile(y)


def test_a_node_given_back_its_own_rule_stays_cs_and_compiles():
    """``c._backward = c._backward`` (a wrapper that saves a node's rule and
    puts it back) changes nothing: the node keeps C's rule, a program over
    it compiles and replays, and its grads are the reference engine's.  Any
    other callable, even another node's rule, makes the node Python's."""
    def build(V):
        a, b = V(0.7), V(-1.3)
        c = (a * b).tanh()
        return a, b, c, c + a * 2.0

    a, b, c, y = build(Value)
    saved = c._backward
    c._backward = saved
    program = pygrad.compile(y)
    program.forward()
    program.backward()
    ra, rb, _, ry = build(RefValue)
    ry.backward()
    assert (a.grad, b.grad) == (ra.grad, rb.grad)
    c._backward = y._backward
    with pytest.raises(ValueError):
        program.backward()


def test_function_nodes_refuse_to_compile():
    Square = square_function()
    with pytest.raises(ValueError, match="Function"):
        pygrad.compile(Square.apply(Value(3.0)) + 1.0)


def test_compile_needs_a_c_value():
    with pytest.raises(TypeError, match="pygrad.Value"):
        pygrad.compile(RefValue(1.0))
    with pytest.raises(TypeError):
        pygrad.compile(1.0)


def test_a_program_keeps_its_graph_alive_after_the_user_drops_it():
    x = Value(1.5)
    program = pygrad.compile(((x * x).exp() + 1.0).log())
    expected = math.log(math.exp(1.5 * 1.5) + 1.0)
    import gc
    gc.collect()
    assert program.forward() == expected
    assert len(program) == 6     # x, x*x, exp, 1.0, +, log


@pytest.mark.slow      # 10 s; test_demo.py runs the demo's tiers in the default run
def test_demo_tiers_give_the_same_losses_and_replay_is_the_default(capsys):
    from pygrad import demo
    runs = {tier: demo.train_moons(steps=12, tier=tier)["losses"] for tier in demo.TIERS}
    assert runs["replay"] == runs["fused"] == runs["eager"]
    assert demo.main(["--dataset", "moons", "--steps", "3", "--no-plot",
                      "--reference-seconds", "0"]) == 0
    assert "tier: replay" in capsys.readouterr().out


def _random_cheap_graph(V, xs, seed, n_ops=3000):
    """A random sequence of the cheap ops (what replay runs by selection)
    over IEEE specials, with shared operands (x + x, x * x)."""
    rng = random.Random(seed)
    nodes = list(xs)
    for _ in range(n_ops):
        a, b = rng.choice(nodes[-40:]), rng.choice(nodes)
        kind = rng.randrange(7)
        if kind == 0:
            y = a + b
        elif kind == 1:
            y = a * b
        elif kind == 2:
            y = a - b
        elif kind == 3:
            y = -a
        elif kind == 4:
            y = a.relu()
        elif kind == 5:
            y = a + a if rng.random() < 0.5 else a * a
        else:
            y = a * rng.choice([0.5, -2.0, 0.0, -0.0]) + rng.choice([1.0, -1.0, 0.0])
        nodes.append(y)
    return sum(nodes[-200:], V(0.0))


@pytest.mark.parametrize("seed", [1, 2])
def test_a_random_op_sequence_replays_bit_for_bit(seed):
    """Steps chosen by selection rather than a jump give the node rules' bits."""
    specials = [0.0, -0.0, 1.5, -0.75, float("inf"), float("-inf"), float("nan"), 1e-300]
    leaves = [Value(x) for x in specials]
    out = _random_cheap_graph(Value, leaves, seed)
    program = pygrad.compile(out)
    rng = random.Random(seed)
    for _ in range(3):
        xs = [rng.choice(specials) * rng.choice([1.0, -1.0, 0.5]) for _ in specials]
        for v, x in zip(leaves, xs):
            v.data, v.grad = x, 0.0
        program.forward()
        program.backward()
        fresh = [Value(x) for x in xs]
        expected = _random_cheap_graph(Value, fresh, seed)
        expected.backward()
        assert_same_doubles([out.data] + [v.grad for v in leaves],
                            [expected.data] + [v.grad for v in fresh])
        ref = [RefValue(x) for x in xs]
        ref_out = _random_cheap_graph(RefValue, ref, seed)
        ref_out.backward()
        assert_same_doubles([out.data] + [v.grad for v in leaves],
                            [ref_out.data] + [v.grad for v in ref])


def _forest(V, leaves, chains, length):
    """`chains` chains over the leaves, made round-robin, so that each
    chain's nodes lie apart in memory (replay.c then writes the numbers
    back after its sweeps, in address order), and every node in a list."""
    heads = [leaves[i % len(leaves)] for i in range(chains)]
    made = []
    for k in range(length):
        for c in range(chains):
            x = heads[c]
            y = (x * leaves[(c + k) % len(leaves)] + 0.25).tanh() if k % 3 else -x + x * x
            heads[c] = y
            made.append(y)
    return sum(heads, V(0.0)), made


@pytest.mark.parametrize("chains", [1, 64])
def test_every_interior_node_shows_the_replayed_numbers(chains):
    """What a user reads from any node of the graph, data and grad, is a
    fresh graph's, bit for bit, whether the numbers go back in the sweep
    (one chain: its nodes follow one another) or after it (many chains made
    round-robin: each step's node far from the last one's)."""
    xs = [0.5, -0.0, -1.25, 0.75]
    leaves = [Value(x) for x in xs]
    out, made = _forest(Value, leaves, chains, 3000 // chains)
    program = pygrad.compile(out)
    for trial in range(3):
        new = [x * (1.0 - 0.25 * trial) for x in xs]
        for v, x in zip(leaves, new):
            v.data, v.grad = x, 0.0
        program.forward()
        program.backward()
        fresh = [Value(x) for x in new]
        fresh_out, fresh_made = _forest(Value, fresh, chains, 3000 // chains)
        fresh_out.backward()
        assert_same_doubles([v.data for v in made] + [v.grad for v in made],
                            [v.data for v in fresh_made] + [v.grad for v in fresh_made])
        assert_same_doubles([v.grad for v in leaves], [v.grad for v in fresh])
