"""pygrad.nn as a drop-in for micrograd.nn: the same reprs, the same random
draws (so the same initial weights for a seed), the same parameters in the
same order; training gives the same doubles fused, op by op and on the
pure-Python engine; plus the bulk numpy access and state dicts."""
import random

import numpy as np
import pytest

from pygrad import Value as C
from pygrad import data, nn
from pygrad.nn import MLP, Layer, Module, Neuron
from pygrad.reference import Value as R

from helpers import assert_same_doubles, bits
import internals

ENGINES = ["c", "reference"]
VALUE = {"c": C, "reference": R}

# ---------------------------------------------------------------------------
# reprs, written out as micrograd's classes print them


def test_neuron_reprs():
    assert repr(Neuron(3)) == "ReLUNeuron(3)"
    assert repr(Neuron(5, nonlin=False)) == "LinearNeuron(5)"
    assert str(Neuron(1, engine="reference")) == "ReLUNeuron(1)"


def test_layer_repr():
    assert repr(Layer(2, 3)) == "Layer of [ReLUNeuron(2), ReLUNeuron(2), ReLUNeuron(2)]"
    assert repr(Layer(4, 1, nonlin=False)) == "Layer of [LinearNeuron(4)]"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fused", [True, False])
def test_mlp_repr_is_micrografs(engine, fused):
    model = MLP(2, [16, 16, 1], engine=engine, fused=fused)
    expected = ("MLP of [Layer of [" + ", ".join(["ReLUNeuron(2)"] * 16) + "], "
                "Layer of [" + ", ".join(["ReLUNeuron(16)"] * 16) + "], "
                "Layer of [LinearNeuron(16)]]")
    assert repr(model) == expected


def test_small_mlp_repr():
    assert repr(MLP(3, [2, 2])) == ("MLP of [Layer of [ReLUNeuron(3), ReLUNeuron(3)], "
                                    "Layer of [LinearNeuron(2), LinearNeuron(2)]]")


# ---------------------------------------------------------------------------
# initialisation: micrograd's random draws


def weights_of(model):
    return [w for layer in model.layers for n in layer.neurons for w in n.w]


def test_same_seed_gives_the_same_initial_parameters_on_both_engines():
    random.seed(1234)
    c = MLP(3, [8, 5, 2])
    random.seed(1234)
    r = MLP(3, [8, 5, 2], engine="reference")
    random.seed(1234)
    u = MLP(3, [8, 5, 2], fused=False)
    cp, rp, up = c.parameters(), r.parameters(), u.parameters()
    assert all(isinstance(p, C) for p in cp) and all(isinstance(p, R) for p in rp)
    assert_same_doubles([p.data for p in cp], [p.data for p in rp], "C vs reference")
    assert_same_doubles([p.data for p in up], [p.data for p in rp], "unfused vs reference")


@pytest.mark.parametrize("engine", ENGINES)
def test_weights_are_uniform_draws_in_micrograds_order(engine):
    nin, nouts = 2, [16, 16, 1]
    n_weights = 2 * 16 + 16 * 16 + 16 * 1
    random.seed(7)
    expected = [random.uniform(-1, 1) for _ in range(n_weights)]
    after_by_hand = random.random()
    random.seed(7)
    model = MLP(nin, nouts, engine=engine)
    after_model = random.random()
    # exactly n_weights uniform draws, nothing else, in layer/neuron/weight order
    assert after_model == after_by_hand
    assert [w.data for w in weights_of(model)] == expected


@pytest.mark.parametrize("engine", ENGINES)
def test_biases_start_at_positive_zero(engine):
    model = MLP(3, [4, 4, 2], engine=engine)
    biases = [n.b for layer in model.layers for n in layer.neurons]
    assert len(biases) == 10
    assert all(bits(b.data) == bits(0.0) for b in biases)
    assert all(-1 <= w.data <= 1 for w in weights_of(model))


@pytest.mark.parametrize("engine", ENGINES)
def test_parameter_counts_and_order(engine):
    assert len(Neuron(3, engine=engine).parameters()) == 4
    assert len(Layer(3, 4, engine=engine).parameters()) == 16
    model = MLP(2, [16, 16, 1], engine=engine)
    assert len(model.parameters()) == (2 + 1) * 16 + (16 + 1) * 16 + (16 + 1) * 1 == 337
    # micrograd's order: each neuron's weights, then its bias
    expected = [p for layer in model.layers for n in layer.neurons for p in n.w + [n.b]]
    assert all(a is b for a, b in zip(model.parameters(), expected))
    assert len(set(map(id, model.parameters()))) == 337
    assert Module().parameters() == []


def test_unknown_engine_raises():
    with pytest.raises(ValueError, match="engine"):
        MLP(2, [3], engine="torch")


# ---------------------------------------------------------------------------
# forward passes


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fused", [True, False])
def test_layer_called_with_numbers(engine, fused):
    random.seed(3)
    layer = Layer(3, 2, engine=engine, fused=fused)
    x = [0.5, -1.0, 2.0]
    out = layer(x)
    assert isinstance(out, list) and len(out) == 2
    for n, o in zip(layer.neurons, out):
        assert isinstance(o, VALUE[engine])
        z = n.b.data
        for w, xi in zip(n.w, x):
            z = z + w.data * xi
        assert o.data == max(z, 0.0)
    # numpy numbers and arrays work too, with the same result
    out2 = layer(np.array(x))
    assert [o.data for o in out2] == [o.data for o in out]


@pytest.mark.parametrize("engine", ENGINES)
def test_single_output_layer_returns_a_value(engine):
    layer = Layer(2, 1, nonlin=False, engine=engine)
    out = layer([VALUE[engine](1.0), 2.0])
    assert isinstance(out, VALUE[engine])
    n = layer.neurons[0]
    assert out.data == n.b.data + n.w[0].data * 1.0 + n.w[1].data * 2.0


@pytest.mark.parametrize("fused", [True, False])
def test_layer_outputs_agree_across_engines_and_fusion(fused):
    random.seed(11)
    c = MLP(4, [6, 3], fused=fused)
    random.seed(11)
    r = MLP(4, [6, 3], engine="reference")
    x = [0.25, -0.5, 1.5, 0.75]
    co, ro = c([C(t) for t in x]), r([R(t) for t in x])
    assert_same_doubles([o.data for o in co], [o.data for o in ro], "outputs")
    co[0].backward()
    ro[0].backward()
    assert_same_doubles([p.grad for p in c.parameters()], [p.grad for p in r.parameters()],
                        "grads")


def test_fused_layers_make_linear_nodes():
    model = MLP(2, [3, 1])
    hidden = model.layers[0]([1.0, 2.0])
    assert [h._op for h in hidden] == ["linear+ReLU"] * 3
    assert model(hidden[:2])._op == "linear"
    assert MLP(2, [3, 1], fused=False)([1.0, 2.0])._op == "+"


def test_a_layer_wider_than_a_segment_agrees_with_the_reference():
    # more neurons than one C call makes at once: neuron by neuron instead
    random.seed(4)
    c = Layer(2, 4097)
    random.seed(4)
    r = Layer(2, 4097, engine="reference")
    co, ro = c([0.5, -0.25]), r([0.5, -0.25])
    assert len(co) == 4097
    assert_same_doubles([o.data for o in co], [o.data for o in ro], "outputs")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("n", [1, 3])
def test_wrong_input_length_raises(engine, n):
    model = MLP(2, [3, 1], engine=engine)
    V = VALUE[engine]
    with pytest.raises(ValueError):
        model([V(1.0)] * n)
    with pytest.raises(ValueError):
        Layer(2, 3, engine=engine)([1.0] * n)
    with pytest.raises(ValueError):
        Neuron(2, engine=engine)([1.0] * n)


# ---------------------------------------------------------------------------
# training: fused C, op-by-op C and the reference engine, bit for bit


def train_micrograd_style(model, V, X, y, steps):
    """micrograd's demo loop: SVM max-margin loss + 1e-4 L2, plain SGD with
    its decaying learning rate; returns the losses."""
    losses = []
    for k in range(steps):
        inputs = [list(map(V, xrow)) for xrow in X]
        scores = list(map(model, inputs))
        data_loss = sum((1 + -yi * si).relu() for yi, si in zip(y, scores)) * (1.0 / len(y))
        reg_loss = 1e-4 * sum((p * p for p in model.parameters()))
        total_loss = data_loss + reg_loss
        model.zero_grad()
        total_loss.backward()
        learning_rate = 1.0 - 0.9 * k / 100
        for p in model.parameters():
            p.data -= learning_rate * p.grad
        losses.append(total_loss.data)
    return losses


@pytest.mark.slow
def test_training_is_bit_identical_fused_unfused_and_reference():
    X, y01 = data.make_moons(24, noise=0.1, seed=0)
    X = X.tolist()
    y = [2.0 * t - 1.0 for t in y01.tolist()]
    runs = {}
    for name, engine, fused in [("fused C", "c", True), ("op-by-op C", "c", False),
                                ("reference", "reference", True)]:
        random.seed(1337)
        model = MLP(2, [16, 16, 1], engine=engine, fused=fused)
        losses = train_micrograd_style(model, VALUE[engine], X, y, steps=20)
        runs[name] = (losses, [p.data for p in model.parameters()])
    ref_losses, ref_params = runs["reference"]
    assert ref_losses[-1] < ref_losses[0]          # it does train
    for name in ("fused C", "op-by-op C"):
        losses, params = runs[name]
        assert_same_doubles(losses, ref_losses, f"{name} losses")
        assert_same_doubles(params, ref_params, f"{name} final parameters")


# ---------------------------------------------------------------------------
# zero_grad, bulk access, state dicts


def backprop_something(model, V):
    out = model([V(0.5), V(-1.5)])
    (out * out).backward()


@pytest.mark.parametrize("engine", ENGINES)
def test_zero_grad(engine):
    random.seed(0)
    model = MLP(2, [4, 1], engine=engine)
    backprop_something(model, VALUE[engine])
    assert any(p.grad != 0.0 for p in model.parameters())
    model.zero_grad()
    assert all(bits(p.grad) == bits(0.0) for p in model.parameters())
    layer = model.layers[0]
    layer.neurons[0].b.grad = 5.0
    layer.zero_grad()
    assert layer.neurons[0].b.grad == 0.0


@pytest.mark.parametrize("engine", ENGINES)
def test_get_data_get_grad_set_data(engine):
    random.seed(0)
    model = MLP(2, [4, 3, 1], engine=engine)
    params = model.parameters()
    backprop_something(model, VALUE[engine])
    d, g = model.get_data(), model.get_grad()
    assert d.dtype == np.float64 and d.shape == (len(params),) and g.shape == d.shape
    assert d.tolist() == [p.data for p in params]
    assert g.tolist() == [p.grad for p in params]
    new = np.linspace(-2.0, 2.0, len(params))
    model.set_data(new)
    assert [p.data for p in params] == new.tolist()
    model.set_data(new.tolist())            # any array-like
    model.set_data((new * 3).astype(np.float32))
    assert [p.data for p in params] == (new * 3).astype(np.float32).astype(float).tolist()
    # the model computes with the new data
    model.set_data(np.zeros(len(params)))
    assert model([VALUE[engine](1.0), 2.0]).data == 0.0


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("shape", [(0,), (28,), (30,), (29, 1), (1, 29), ()])
def test_set_data_with_the_wrong_shape_raises(engine, shape):
    model = MLP(2, [4, 3, 1], engine=engine)     # 29 parameters
    before = model.get_data()
    with pytest.raises(ValueError, match="shape"):
        model.set_data(np.ones(shape))
    assert model.get_data().tolist() == before.tolist()


@pytest.mark.parametrize("engine", ENGINES)
def test_state_dict_round_trips_exactly(engine):
    random.seed(5)
    a = MLP(3, [5, 2], engine=engine)
    a.set_data(a.get_data() / 3.0)        # digits that a text round trip could lose
    random.seed(6)
    b = MLP(3, [5, 2], engine=engine)
    assert a.get_data().tolist() != b.get_data().tolist()
    state = a.state_dict()
    assert set(state) >= {"parameters"}
    b.load_state_dict(state)
    assert_same_doubles(b.get_data(), a.get_data(), "loaded parameters")
    # the state is a copy, not a view of the model
    state["parameters"][:] = 0.0
    assert a.get_data().tolist() != [0.0] * len(a.parameters())


def test_state_dict_moves_between_engines():
    random.seed(5)
    c = MLP(3, [5, 2])
    r = MLP(3, [5, 2], engine="reference")
    r.load_state_dict(c.state_dict())
    assert_same_doubles(r.get_data(), c.get_data(), "reference loaded from C")


@pytest.mark.parametrize("engine", ENGINES)
def test_load_state_dict_of_another_shape_raises(engine):
    a = MLP(2, [4, 1], engine=engine)       # 17 parameters
    b = MLP(2, [3, 2], engine=engine)       # also 17 parameters, another shape
    assert len(a.parameters()) == len(b.parameters())
    before = b.get_data().tolist()
    with pytest.raises(ValueError):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ValueError):
        MLP(2, [4, 2], engine=engine).load_state_dict(a.state_dict())
    with pytest.raises(ValueError):         # no structure, wrong length
        MLP(2, [4, 2], engine=engine).load_state_dict({"parameters": a.get_data()})
    with pytest.raises(ValueError):
        b.load_state_dict({})
    assert b.get_data().tolist() == before


@pytest.mark.parametrize("engine", ENGINES)
def test_save_and_load_npz(engine, tmp_path):
    random.seed(8)
    a = MLP(2, [6, 6, 1], engine=engine)
    a.set_data(a.get_data() * np.pi)
    path = tmp_path / "model.npz"
    a.save(str(path))
    assert path.exists()
    random.seed(9)
    b = MLP(2, [6, 6, 1], engine=engine)
    b.load(str(path))
    assert_same_doubles(b.get_data(), a.get_data(), "loaded from npz")
    x = [C(0.3), C(-0.7)] if engine == "c" else [R(0.3), R(-0.7)]
    assert bits(b(x).data) == bits(a(x).data)
    with pytest.raises(ValueError):
        MLP(2, [6, 1], engine=engine).load(str(path))


# ---------------------------------------------------------------------------
# a fused MLP runs its layers in one pass: hidden outputs stay C handles


def _layer_by_layer(model, x):
    for layer in model.layers:
        x = layer(x)
    return x


def test_an_mlp_pass_equals_its_layers_called_one_by_one():
    random.seed(3)
    model = MLP(3, [8, 5, 2])
    x = [C(0.5), C(-1.25), C(2.0)]
    out, by_layer = model(x), _layer_by_layer(model, x)
    assert [o._op for o in out] == ["linear"] * 2
    assert_same_doubles([o.data for o in out], [o.data for o in by_layer], "outputs")
    (out[0] * out[1]).backward()
    grads = [p.grad for p in model.parameters()] + [v.grad for v in x]
    model.zero_grad()
    for v in x:
        v.grad = 0.0
    (by_layer[0] * by_layer[1]).backward()
    assert_same_doubles(grads, [p.grad for p in model.parameters()] + [v.grad for v in x],
                        "grads")


def test_an_mlps_hidden_outputs_are_reached_through_prev():
    random.seed(5)
    model = MLP(2, [4, 3, 1])
    x = [C(0.75), C(-0.5)]
    out = model(x)
    hidden = [p for p in out._prev if p._op == "linear+ReLU"]
    assert len(hidden) == 3
    expected = model.layers[1](model.layers[0](x))
    assert sorted(h.data for h in hidden) == sorted(e.data for e in expected)
    # the same objects on a second walk, and the first layer below them
    again = [p for p in out._prev if p._op == "linear+ReLU"]
    assert sorted(map(id, hidden)) == sorted(map(id, again))
    below = [q for h in hidden for q in h._prev]            # kept: one Value per node
    first = {id(q) for q in below if q._op == "linear+ReLU"}
    assert len(first) == 4
    assert {id(v) for q in below for v in q._prev} >= {id(v) for v in x}


def test_an_mlp_over_a_python_made_node_keeps_its_backward():
    random.seed(6)
    model = MLP(2, [3, 2, 1])
    a = C(0.5)
    doubled = C(2 * a.data, (a,), "double")

    def _backward():
        a.grad += 2 * doubled.grad
    doubled._backward = _backward
    out = model([doubled, a])
    expected = _layer_by_layer(model, [doubled, a])
    assert out.data == expected.data
    out.backward()
    got = [a.grad] + [p.grad for p in model.parameters()]
    model.zero_grad()
    a.grad = doubled.grad = 0.0
    expected.backward()
    assert_same_doubles(got, [a.grad] + [p.grad for p in model.parameters()], "grads")


def test_an_mlp_whose_layers_do_not_chain_raises():
    model = MLP(2, [3, 1])
    model.layers.append(Layer(4, 1))
    with pytest.raises(ValueError, match="layer expects 4 inputs, got 1"):
        model([1.0, 2.0])


def test_an_mlp_copies_and_pickles_after_its_fused_pass():
    import copy
    import pickle
    random.seed(12)
    model = MLP(2, [5, 1])
    x = [C(0.25), C(-0.5)]
    y = model(x).data                            # the pass's cache exists now
    for twin in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert twin(x).data == y
        twin.parameters()[0].data += 1.0         # its own parameters
        assert twin(x).data != y and model(x).data == y


def test_an_mlp_wider_than_a_segment_runs_layer_by_layer():
    random.seed(13)
    c = MLP(2, [4097, 1])
    random.seed(13)
    r = MLP(2, [4097, 1], engine="reference")
    co, ro = c([C(0.5), C(-0.25)]), r([R(0.5), R(-0.25)])
    assert co.data == ro.data


def test_an_mlp_pickled_without_the_fused_cache_loads_and_runs():
    # a model pickled by a pygrad from before the cache existed has no _fused
    import pickle
    random.seed(14)
    model = MLP(2, [3, 1])
    x = [C(0.5), C(0.25)]
    y = model(x).data
    old = MLP.__new__(MLP)
    old.__dict__.update({k: v for k, v in pickle.loads(pickle.dumps(model)).__dict__.items()
                         if k != "_fused"})
    assert "_fused" not in old.__dict__
    assert old(x).data == y


# ---------------------------------------------------------------------------
# A model is plain objects to edit, as in micrograd: edits after a fused pass
# must be seen by the next one (the caches are rebuilt).


def by_hand(model, x):
    """What micrograd's Neuron/Layer/MLP compute, in floats, for the model as
    it now is: act = b + w0*x0 + w1*x1 + ..., ReLU where nonlin."""
    for layer in model.layers:
        out = []
        for n in layer.neurons:
            act = n.b.data
            for wi, xi in zip(n.w, x):
                act = act + wi.data * xi
            out.append(0.0 if n.nonlin and act < 0 else act)
        x = out
    return x


EDITS = {
    "nonlin of the last layer": lambda m: [setattr(n, "nonlin", True) for n in m.layers[-1].neurons],
    "one neuron not fused": lambda m: setattr(m.layers[0].neurons[1], "fused", False),
    "a weight replaced": lambda m: m.layers[0].neurons[0].w.__setitem__(0, C(3.5)),
    "w rebound": lambda m: setattr(m.layers[1].neurons[0], "w", [C(0.5), C(-1.5), C(2.0)]),
    "b rebound": lambda m: setattr(m.layers[0].neurons[2], "b", C(-0.75)),
    "a neuron replaced": lambda m: m.layers[0].neurons.__setitem__(1, Neuron(2)),
    "neurons rebound": lambda m: setattr(m.layers[0], "neurons", [Neuron(2) for _ in range(3)]),
    "a layer appended": lambda m: m.layers.append(Layer(1, 2, nonlin=False)),
    "layers sliced": lambda m: setattr(m, "layers", m.layers[:1]),
    "weights reversed in place": lambda m: m.layers[0].neurons[0].w.reverse(),
    "a neuron's nonlin only": lambda m: setattr(m.layers[0].neurons[0], "nonlin", False),
    "w a list of mine, edited after": lambda m: mine_then_edit(m.layers[0].neurons[1]),
    "w tied to another neuron's": lambda m: tie_then_edit(m.layers[0].neurons),
    "neurons a list of mine, edited after": lambda m: mine_neurons_then_edit(m.layers[0]),
    "layers a list of mine, edited after": lambda m: mine_layers_then_edit(m),
    "w as a slice assignment": lambda m: m.layers[0].neurons[2].w.__setitem__(
        slice(None), [C(0.125), C(-2.0)]),
}


def mine_then_edit(n):
    mine = [C(0.5), C(-1.0)]
    n.w = mine
    assert n.w is mine                  # the user's own list, as in micrograd
    n._pg_test_probe = None             # an attribute of no shape: no edit
    mine[1] = C(4.0)                    # a list of theirs reports nothing


def tie_then_edit(neurons):
    neurons[2].w = neurons[0].w
    assert neurons[2].w is neurons[0].w
    neurons[0].w[0] = C(-3.0)           # both neurons see it


def mine_neurons_then_edit(layer):
    mine = list(layer.neurons)
    layer.neurons = mine
    assert layer.neurons is mine
    mine[0] = Neuron(2)


def mine_layers_then_edit(model):
    mine = list(model.layers)
    model.layers = mine
    model([C(0.5), C(-0.25)])           # cached with a list of the user's
    mine[1].neurons[0].b = C(1.5)
    mine.append(Layer(1, 2, nonlin=False))


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edit_after_a_fused_pass_is_seen_by_the_next(edit):
    random.seed(21)
    model = MLP(2, [3, 1])
    x = [0.5, -0.25]
    model([C(v) for v in x])                       # the fused caches exist now
    EDITS[edit](model)
    want = by_hand(model, x)
    got = model([C(v) for v in x])
    got = got if isinstance(got, list) else [got]
    assert [bits(v.data) for v in got] == [bits(v) for v in want]
    # and a layer called by itself
    layer = model.layers[0]
    assert [bits(v.data) for v in layer([C(v) for v in x])] == \
        [bits(v) for v in by_hand(type("M", (), {"layers": [layer]})(), x)]


def test_a_layer_with_a_call_of_its_own_is_called_by_the_mlp():
    class Tanh(Layer):
        def __call__(self, x):
            out = super().__call__(x)
            return [v.tanh() for v in out] if isinstance(out, list) else out.tanh()

    class Double(Module):
        def __call__(self, x):
            return [2 * v for v in x] if isinstance(x, list) else 2 * x

    random.seed(22)
    model = MLP(2, [2, 2])
    x = [C(0.5), C(-0.25)]
    model(x)
    model.layers[0] = Tanh(2, 2)
    model.layers.append(Double())
    want = x
    for layer in model.layers:
        want = layer(want)
    assert [v.data for v in model(x)] == [v.data for v in want]


def test_an_mlp_with_no_layers_returns_its_input():
    model = MLP(2, [1])
    x = [C(1.0), C(2.0)]
    model(x)
    model.layers = []
    assert model(x) == x


@pytest.mark.parametrize("where", ["before", "after"])
def test_neurons_of_unequal_width_raise_instead_of_reading_past_their_weights(where):
    random.seed(23)
    model = MLP(2, [3, 1])
    x = [C(0.5), C(-0.25)]
    if where == "after":
        model(x)
    model.layers[0].neurons[1].w.pop()
    with pytest.raises(ValueError, match="as many weights as inputs"):
        model(x)
    with pytest.raises(ValueError, match="as many weights as inputs"):
        model.layers[0](x)


def test_copies_of_a_model_see_their_own_edits():
    import copy
    import pickle
    random.seed(24)
    model = MLP(2, [3, 1])
    x = [C(0.5), C(-0.25)]
    y = model(x).data
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        twin(x)
        twin.layers[1].neurons[0].w[0] = C(10.0)
        assert twin(x).data == by_hand(twin, [0.5, -0.25])[0] != y
        assert model(x).data == y


def test_an_attribute_of_no_shape_keeps_the_fused_caches():
    # A counter of the user's own, set on every call, must not rebuild them.
    class Counting(MLP):
        def __call__(self, x):
            self.calls = getattr(self, "calls", 0) + 1
            return super().__call__(x)

    random.seed(25)
    model = Counting(2, [3, 1])
    x = [C(0.5), C(-0.25)]
    model(x)
    caches = (model._fused, model.layers[0]._fused)
    model.layers[0].neurons[0].note = "mine"
    model(x)
    assert model.calls == 2
    assert (model._fused, model.layers[0]._fused) == caches
    assert model._fused is caches[0]
    model.layers[0].neurons[0].nonlin = False       # an attribute that shapes it
    model(x)
    assert model._fused is not caches[0]


def test_attributes_named_like_pygrads_internals_of_old_are_the_users():
    class Mine(Neuron):
        def __init__(self, nin):
            super().__init__(nin)
            self._lists = [1, 2]
            self._caches = "mine"

    random.seed(26)
    layer = Layer(2, 2)
    layer.neurons[0] = Mine(2)
    x = [0.5, -0.25]
    assert layer.neurons[0]._lists == [1, 2] and layer.neurons[0]._caches == "mine"
    assert [v.data for v in layer([C(v) for v in x])] == \
        by_hand(type("M", (), {"layers": [layer]})(), x)


@pytest.mark.parametrize("how", ["deepcopy", "copy", "pickle 0", "pickle 2", "pickle 5"])
def test_tied_weights_stay_tied_in_copies(how):
    import copy
    import pickle
    random.seed(27)
    model = MLP(2, [3, 1])
    neurons = model.layers[0].neurons
    neurons[1].w = neurons[0].w
    if how == "deepcopy":
        twin = copy.deepcopy(model)
    elif how == "copy":
        twin = copy.copy(model)
    else:
        twin = pickle.loads(pickle.dumps(model, protocol=int(how.split()[1])))
    tn = twin.layers[0].neurons
    assert tn[1].w is tn[0].w
    assert type(tn[0].w) is type(neurons[0].w)      # still reports its changes
    x = [0.5, -0.25]
    twin([C(v) for v in x])
    tn[0].w[1] = C(7.0)
    assert [bits(twin([C(v) for v in x]).data)] == [bits(v) for v in by_hand(twin, x)]


def test_a_fused_layer_refuses_parameters_that_do_not_match_its_shape():
    # What another thread's edit between reading widths and weights would
    # hand to C: refused, never read past.
    from pygrad._backend import C as CB
    random.seed(28)
    layer = Layer(2, 3)
    params = layer.parameters()[:-1]
    with pytest.raises(ValueError, match="needs 9 parameters, got 8"):
        CB.fused_layer(CB.pack(params), params, [C(1.0), C(2.0)], 2, 3, True)
    with pytest.raises(ValueError, match="needs 9 parameters, got 8"):
        CB.pack_layers([(CB.pack(params), params, 2, 3, True)])


def test_a_model_edited_from_threads_while_running_never_reads_past_its_weights():
    import threading
    random.seed(29)
    model = MLP(2, [3, 1])
    x = [C(0.5), C(-0.25)]
    stop = threading.Event()
    errors = []

    def edit():
        n = model.layers[0].neurons[1]
        while not stop.is_set():
            n.w.append(C(1.0))
            n.w.pop()

    def run():
        try:
            for _ in range(3000):
                try:
                    model(x)
                except ValueError as e:         # caught mid-edit: widths differ
                    assert "as many weights as inputs" in str(e), e
        except BaseException as e:              # pragma: no cover - reported below
            errors.append(e)

    editor = threading.Thread(target=edit)
    editor.start()
    try:
        run()
    finally:
        stop.set()
        editor.join()
    assert not errors
    assert [bits(model(x).data)] == [bits(v) for v in by_hand(model, [0.5, -0.25])]


def test_a_change_that_fails_midway_is_still_seen():
    random.seed(30)
    model = MLP(2, [3, 1])
    x = [C(0.5), C(-0.25)]
    model(x)
    w = model.layers[1].neurons[0].w

    def values():
        yield C(9.0)
        raise KeyError("midway")
    with pytest.raises(KeyError):
        w.extend(values())                  # one Value went in before it failed
    assert len(w) == 4
    with pytest.raises(ValueError, match="layer expects 4 inputs, got 3"):
        model(x)


# -- tied weights ---------------------------------------------------------------

@pytest.mark.parametrize("engine", ["c", "reference"])
def test_tied_weights_are_one_parameter_in_first_seen_order(engine):
    layer = nn.Layer(2, 2, engine=engine)
    untied = layer.parameters()
    assert len(untied) == 6
    layer.neurons[1].w = layer.neurons[0].w
    n0, n1 = layer.neurons
    assert layer.parameters() == [n0.w[0], n0.w[1], n0.b, n1.b]
    model = nn.MLP(2, [2, 1], engine=engine)
    model.layers[1].neurons[0].w[0] = model.layers[0].neurons[0].w[0]
    params = model.parameters()
    assert len(params) == 9 - 1 and len({id(p) for p in params}) == len(params)
    assert params[0] is model.layers[0].neurons[0].w[0]


@pytest.mark.parametrize("engine", ["c", "reference"])
@pytest.mark.parametrize("Opt", ["SGD", "Adam"])
def test_a_tied_weight_is_stepped_once_by_its_whole_grad(engine, Opt):
    from pygrad import optim
    layer = nn.Layer(2, 2, nonlin=False, engine=engine)
    layer.neurons[1].w = layer.neurons[0].w
    opt = getattr(optim, Opt)(layer.parameters(), lr=0.1)
    if Opt == "Adam":
        assert opt.m.shape == (4,)
    V = type(layer.neurons[0].b)
    out = layer([V(1.0), V(2.0)])
    (out[0] + out[1]).backward()
    w = layer.neurons[0].w[0]
    before, grad = w.data, w.grad
    assert grad == 2.0              # x0 reaches the sum through both neurons
    opt.step()
    if Opt == "SGD":
        assert w.data == before - 0.1 * grad
    else:                          # Adam's first step moves a parameter by about lr, once
        assert abs(before - w.data - 0.1) < 1e-6


@pytest.mark.parametrize("engine", ["c", "reference"])
def test_an_optimizer_given_a_parameter_twice_warns_and_steps_it_once(engine):
    from pygrad import optim
    V = nn.MLP(1, [1], engine=engine).parameters()[0].__class__
    p, q = V(1.0), V(2.0)
    p.grad, q.grad = 1.0, 1.0
    with pytest.warns(UserWarning, match="got 1 parameter\\(s\\) more than once"):
        opt = optim.SGD([p, q, p], lr=0.5)
    assert opt.params == (p, q)
    opt.step()
    assert (p.data, q.data) == (0.5, 1.5)


def test_tied_weights_of_an_unhashable_value_type_are_found_too():
    class EqValue(C):               # defines __eq__: no __hash__, as some micrograd forks do
        def __eq__(self, other):
            return isinstance(other, C) and self.data == other.data

    layer = Layer(2, 2)
    tied = EqValue(0.5)
    layer.neurons[0].w[1] = tied
    layer.neurons[1].w[0] = tied
    params = layer.parameters()
    assert len(params) == 5 and sum(p is tied for p in params) == 1
    assert params.index(tied) == 1


@pytest.mark.parametrize("engine", ["c", "reference"])
@pytest.mark.parametrize("protocol", range(0, 6))
def test_models_and_optimizers_pickle_on_either_engine(engine, protocol):
    """docs: models and optimizers pickle at any time, on either engine."""
    import pickle

    from pygrad import optim
    model = MLP(2, [3, 1], engine=engine)
    opt = optim.Adam(model.parameters(), lr=0.01)
    model([1.0, 2.0]).backward()
    opt.step()
    model2, opt2 = pickle.loads(pickle.dumps((model, opt), protocol=protocol))
    assert type(model2.parameters()[0]) is type(model.parameters()[0])
    assert opt2.params == tuple(model2.parameters())        # still the model's own Values
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m([0.5, -1.0]).backward()
        o.step()
    assert [p.data for p in model2.parameters()] == [p.data for p in model.parameters()]


def test_a_reference_value_copies_as_a_new_leaf_as_a_c_value_does():
    import copy
    import pickle
    for V in (C, R):
        a = V(2.0, label="a")
        a.tag = "kept"
        y = a * a
        y.grad = 3.0
        for clone in (copy.copy(y), copy.deepcopy(y), pickle.loads(pickle.dumps(y))):
            assert (clone.data, clone.grad, clone._prev, type(clone)) == (4.0, 3.0, set(), V)
        b = copy.deepcopy(a)
        assert (b.label, b.tag) == ("a", "kept")


def _interrupt_at(n, prefix):
    """A trace function raising KeyboardInterrupt at the n-th event (lines
    and opcodes) of code under ``prefix``: where a Ctrl-C can land."""
    import sys
    seen = [0]

    def tracer(frame, event, arg):
        if not frame.f_code.co_filename.startswith(prefix):
            return None
        frame.f_trace_opcodes = True
        return local

    def local(frame, event, arg):
        if event == "line" and sys.version_info < (3, 10):
            return local        # 3.9 loses a line event's error (tests/test_fuzz.py)
        seen[0] += 1
        if seen[0] == n:
            raise KeyboardInterrupt
        return local
    return tracer, seen


@pytest.mark.parametrize("edit", ["setitem", "append-pop", "setattr"])
def test_an_interrupted_model_edit_never_leaves_a_stale_fused_result(edit):
    """Ctrl-C at every point of an edit of a fused model (each event of the
    edit's Python code in turn): whether the edit took effect or not, the
    next forward agrees with an unfused copy of the model as it now is."""
    import copy
    import os
    import sys

    import pygrad.nn
    prefix = os.path.abspath(pygrad.nn.__file__)       # the edit's own bookkeeping
    x = [0.7, -1.3]

    def make_edit(model, k):
        neuron = model.layers[0].neurons[0]
        if edit == "setitem":
            neuron.w[0] = C(100.0 + k)
        elif edit == "append-pop":
            neuron.w.append(C(50.0 + k))
            neuron.w.pop()
            neuron.w[1] = C(-20.0 - k)
        else:
            model.layers[0].neurons[1].nonlin = not model.layers[0].neurons[1].nonlin

    def unfused(model):
        twin = copy.deepcopy(model)
        for layer in twin.layers:
            for n in layer.neurons:
                n.fused = False
        return twin(x).data

    random_state = __import__("random").getstate()
    __import__("random").seed(11)
    model = MLP(2, [4, 4, 1])
    __import__("random").setstate(random_state)
    model(x)
    counting, seen = _interrupt_at(0, prefix)
    rehearsal = copy.deepcopy(model)
    rehearsal(x)
    sys.settrace(counting)
    try:
        make_edit(rehearsal, 0)
    finally:
        sys.settrace(None)
    assert seen[0] > 3
    for n in range(1, seen[0] + 2):
        model(x)                            # a warm cache, to go stale
        tracer, _ = _interrupt_at(n, prefix)
        sys.settrace(tracer)
        try:
            make_edit(model, n)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        w = model.layers[0].neurons[0].w
        if len(w) == 3:         # cut between append and pop: 3 weights for 2 inputs
            with pytest.raises(ValueError, match="3 != 2"):
                model(x)
            w.pop()
        expected = unfused(model)
        assert model(x).data == pytest.approx(expected, rel=1e-12, abs=1e-12), n


@pytest.mark.parametrize("neuron", [0, 2])
def test_a_layer_with_a_custom_op_weight_in_any_neuron_keeps_its_closure(neuron):
    """A fused layer whose weights include a custom op's Value holds it from
    every output, whichever neuron it is in: the model may let it go, and a
    backward() from the outputs still runs its closure."""
    import gc
    layer = nn.Layer(2, 3, nonlin=False)
    base = layer.neurons[neuron].w[0]

    def doubled(w):
        out = C(2 * w.data, (w,), "double")

        def _backward():
            w.grad += 2 * out.grad
        out._backward = _backward
        return out
    layer.neurons[neuron].w[0] = doubled(base)
    outs = layer([C(1.0), C(2.0)])
    layer.neurons[neuron].w[0] = base         # the model lets it go
    layer([C(0.0), C(0.0)])
    gc.collect()
    outs[neuron].backward()
    assert base.grad == 2.0
