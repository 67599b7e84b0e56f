"""Bad input gets a clear TypeError/ValueError; numbers of every real kind
are accepted; nothing crashes."""
import fractions

import numpy as np

import pytest

from pygrad import Value
from pygrad.reference import Value as RefValue

ENGINES = [Value, RefValue]


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("bad", ["abc", None, [1], (1,), 1j, {"x": 1}, object(), np.array([1.0, 2.0])])
def test_constructor_rejects_non_numbers(V, bad):
    with pytest.raises(TypeError, match="real number"):
        V(bad)


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("good, expected", [
    (True, 1.0), (False, 0.0), (3, 3.0), (2.5, 2.5),
    (np.float64(1.25), 1.25), (np.float32(1.5), 1.5), (np.int64(7), 7.0),
    (np.bool_(True), 1.0), (np.array(4.5), 4.5), (fractions.Fraction(1, 4), 0.25),
])
def test_real_numbers_of_every_kind_are_accepted(V, good, expected):
    v = V(good)
    assert v.data == expected and type(v.data) is float
    assert (v * good).data == expected * expected
    assert (good * v).data == expected * expected


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("expr", ["v + 'x'", "'x' + v", "v * None", "v - [1]", "v / 1j",
                                  "v ** 'x'", "'x' ** v", "v ** None", "v ** [2]"])
def test_operators_reject_non_numbers(V, expr):
    with pytest.raises(TypeError, match="unsupported operand|can only concatenate"):
        eval(expr, {"v": V(2.0)})


@pytest.mark.parametrize("V", ENGINES)
def test_huge_int_is_a_value_error(V):
    with pytest.raises(ValueError, match="too large") as info:
        V(10 ** 400)
    message = str(info.value)
    # Short, with the size and what to do, not the number's 401 digits.
    assert "401 digits" in message and "fits" in message and "000000" not in message
    assert len(message) < 200


def test_setters_check_their_input():
    v = Value(1.0)
    with pytest.raises(TypeError, match="Value.data"):
        v.data = "x"
    with pytest.raises(TypeError, match="Value.grad"):
        v.grad = None
    with pytest.raises(TypeError, match="callable"):
        v._backward = 5
    v.data = np.float64(2.0)
    v.grad = 1
    assert (v.data, v.grad) == (2.0, 1.0)


@pytest.mark.parametrize("V", ENGINES)
def test_children_must_be_values(V):
    with pytest.raises(TypeError, match="_children"):
        V(1.0, (1.0, 2.0), "op")


def test_a_failing_python_backward_leaves_the_engine_usable():
    x = Value(2.0)
    out = Value(4.0, (x,), "boom")

    def bad():
        raise RuntimeError("user backward failed")
    out._backward = bad
    y = out * 3.0
    with pytest.raises(RuntimeError, match="user backward failed"):
        y.backward()
    z = x * x
    z.backward()
    assert x.grad == 4.0


# -- Values of another engine (lead's engine.py checks) -------------------------

@pytest.mark.parametrize("expr", ["a + r", "r + a", "a * r", "r * a", "a - r", "r - a",
                                  "a / r", "r / a", "a ** r", "r ** a"])
def test_mixing_engines_in_an_operator_names_both_engines(expr):
    a, r = Value(1.5), RefValue(2.0)
    with pytest.raises(TypeError, match="cannot mix a pygrad.Value .C engine. with a "
                                        "pygrad.reference.Value"):
        eval(expr)
    assert (a * 2.0).data == 3.0


def test_children_of_another_engine_are_named():
    with pytest.raises(TypeError, match="pygrad.reference.Value"):
        Value(1.0, (RefValue(2.0),), "op")


# -- every public constructor and function -------------------------------------

import math  # noqa: E402

import pygrad  # noqa: E402
from pygrad import data, losses, nn, optim, viz  # noqa: E402

import internals


def engine_still_works():
    """A tiny graph, built and backpropagated, with its exact result."""
    a, b = Value(2.0), Value(-3.0)
    y = (a * b + a ** 2).tanh()
    y.backward()
    assert (y.data, a.grad) == (math.tanh(-2.0), (1 - math.tanh(-2.0) ** 2) * (-3.0 + 4.0))


BAD_SIZES = [("x", TypeError, "must be an int"), (None, TypeError, "must be an int"),
             (2.5, TypeError, "must be an int"), (math.nan, TypeError, "must be an int"),
             (True, TypeError, "must be an int"), (0, ValueError, ">= 1"),
             (-3, ValueError, ">= 1")]


@pytest.mark.parametrize("bad, err, msg", BAD_SIZES)
@pytest.mark.parametrize("make", [lambda n: nn.Neuron(n), lambda n: nn.Layer(n, 2),
                                  lambda n: nn.Layer(2, n), lambda n: nn.MLP(n, [2]),
                                  lambda n: nn.MLP(2, [4, n])],
                         ids=["Neuron nin", "Layer nin", "Layer nout", "MLP nin", "MLP nouts"])
def test_nn_sizes_are_positive_ints(make, bad, err, msg):
    with pytest.raises(err, match=msg):
        make(bad)
    engine_still_works()


@pytest.mark.parametrize("nouts, err, msg", [([], ValueError, "at least one layer"),
                                             ("ab", TypeError, "list of layer sizes"),
                                             (None, TypeError, "list of layer sizes")])
def test_mlp_nouts_is_a_nonempty_list(nouts, err, msg):
    with pytest.raises(err, match=msg):
        nn.MLP(2, nouts)


@pytest.mark.parametrize("kind", ["SGD", "Adam"])
@pytest.mark.parametrize("setting", ["lr", "weight_decay"])
@pytest.mark.parametrize("bad, err", [("x", TypeError), (None, TypeError), (1j, TypeError),
                                      (math.nan, ValueError), (math.inf, ValueError),
                                      (-0.1, ValueError)])
def test_optimizer_settings_are_finite_and_nonnegative(kind, setting, bad, err):
    with pytest.raises(err, match=setting):
        getattr(optim, kind)([Value(1.0)], **{setting: bad})


@pytest.mark.parametrize("kwargs, msg", [({"momentum": -1}, "momentum"),
                                         ({"momentum": math.nan}, "momentum")])
def test_sgd_momentum_is_checked(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        optim.SGD([Value(1.0)], lr=0.1, **kwargs)


@pytest.mark.parametrize("kwargs, err, msg", [({"betas": (0.9, 1.0)}, ValueError, "betas"),
                                              ({"betas": (-0.1, 0.9)}, ValueError, "betas"),
                                              ({"betas": 0.9}, TypeError, "pair"),
                                              ({"eps": 0.0}, ValueError, "eps"),
                                              ({"eps": math.inf}, ValueError, "eps")])
def test_adam_settings_are_checked(kwargs, err, msg):
    with pytest.raises(err, match=msg):
        optim.Adam([Value(1.0)], **kwargs)


def test_a_schedule_returning_nan_is_refused_at_step():
    p = Value(1.0)
    opt = optim.SGD([p], lr=lambda k: math.nan)
    with pytest.raises(ValueError, match="lr schedule"):
        opt.step()
    assert p.data == 1.0


@pytest.mark.parametrize("params", [[1.0], ["x"], [None]])
def test_optimizer_parameters_must_be_values(params):
    with pytest.raises(TypeError, match="must be Values"):
        optim.SGD(params, lr=0.1)


@pytest.mark.parametrize("call", [
    lambda R: pygrad.dot([R(1.0)], [Value(1.0)]),
    lambda R: pygrad.sum([Value(1.0), R(1.0)]),
    lambda R: pygrad.logsumexp([R(1.0)]),
    lambda R: pygrad.compile(R(1.0)),
    lambda R: pygrad.Inputs([R(1.0)]),
    lambda R: nn.MLP(2, [2])([R(1.0), R(2.0)]),
    lambda R: nn.MLP(2, [2], engine="reference")([Value(1.0), Value(2.0)]),
    lambda R: RefValue(1.0) * Value(2.0),
], ids=["dot", "sum", "logsumexp", "compile", "Inputs", "C layer", "reference layer", "op"])
def test_values_of_another_engine_are_named_as_such(call):
    with pytest.raises(TypeError, match="cannot mix"):
        call(RefValue)
    engine_still_works()


@pytest.mark.parametrize("kwargs, err, msg", [({"eps": 0.0}, ValueError, "eps"),
                                              ({"eps": math.nan}, ValueError, "eps"),
                                              ({"atol": -1.0}, ValueError, "atol"),
                                              ({"rtol": "x"}, TypeError, "rtol")])
def test_gradcheck_settings_are_checked(kwargs, err, msg):
    with pytest.raises(err, match=msg):
        pygrad.gradcheck(lambda a: a * a, [1.0], **kwargs)


def test_gradcheck_takes_numpy_scalars_and_rejects_non_sequences():
    assert pygrad.gradcheck(lambda a: a * a, [np.float64(1.5)]).ok
    with pytest.raises(TypeError, match="sequence of numbers"):
        pygrad.gradcheck(lambda a: a * a, 1.5)
    with pytest.raises(TypeError, match="callable"):
        pygrad.gradcheck(3, [1.0])


@pytest.mark.parametrize("bad", ["x", None, 1.5, [Value(1.0)]])
def test_viz_needs_a_value(bad):
    with pytest.raises(TypeError, match="needs a Value"):
        viz.trace(bad)


@pytest.mark.parametrize("loss", [losses.mse, losses.bce_with_logits])
def test_losses_need_value_predictions(loss):
    with pytest.raises(TypeError, match="predictions must be Values"):
        loss([1.0], [0.0])


def test_losses_reject_mismatched_and_empty_batches():
    with pytest.raises(ValueError, match="2 predictions but 1 targets"):
        losses.mse([Value(1.0), Value(2.0)], [1.0])
    with pytest.raises(ValueError, match="empty batch"):
        losses.mse([], [])


@pytest.mark.parametrize("make", [lambda n: data.make_moons(n), lambda n: data.make_xor(n),
                                  lambda n: data.make_spiral(n)])
@pytest.mark.parametrize("bad, err", [(-1, ValueError), ("x", TypeError), (2.5, TypeError)])
def test_data_sizes_are_checked(make, bad, err):
    with pytest.raises(err):
        make(bad)


def test_a_replaced_parameter_is_used_and_the_one_it_replaced_is_freed_safely():
    """Layers cache their parameters' handles: a Value put into a neuron
    after a call is used by the next one, and the Value it replaced (still
    in the old cache until then) is freed without harm."""
    import gc
    layer = nn.Layer(2, 1, nonlin=False)
    layer([1.0, 2.0])
    w1, b = layer.neurons[0].w[1].data, layer.neurons[0].b.data
    layer.neurons[0].w[0] = Value(100.0)
    gc.collect()
    pygrad.engine.settle()
    assert layer([1.0, 2.0]).data == b + 100.0 * 1.0 + w1 * 2.0
    gc.collect()
    engine_still_works()


# -- copies, and state that C reads through handles made at construction ---------

def test_a_leaf_deep_copies_and_pickles_as_a_new_leaf():
    import copy
    import pickle
    a = Value(3.0, label="a")
    a.grad = 2.0
    for b in (copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert (b.data, b.grad, b.label) == (3.0, 2.0, "a") and internals.node_of(b) != internals.node_of(a)
    for b in (copy.copy(a * 2), copy.deepcopy(a * 2)):
        assert b.data == 6.0 and b._prev == set() and b._op == ""
    engine_still_works()


def test_handle_backed_lists_are_read_only():
    p = Value(1.0)
    opt = optim.SGD([p], lr=0.1)
    inputs = pygrad.Inputs([p])
    program = pygrad.compile(p * 2.0)
    for obj, name in ((opt, "params"), (inputs, "values"), (program, "output")):
        with pytest.raises(AttributeError):
            setattr(obj, name, None)
    assert isinstance(opt.params, tuple) and isinstance(inputs.values, tuple)
    assert program.forward() == 2.0


# -- bulk paths check numbers as Value() does ------------------------------------

def _bulk_paths():
    import numpy as np
    import pygrad
    from pygrad import Value, data, nn
    x = Value(0.0)
    w = Value(2.0)
    prog = pygrad.compile(w * x, inputs=[x])
    inputs = pygrad.Inputs([x])
    model = nn.MLP(1, [1])                     # 2 parameters
    return {
        "map's rows": lambda a: prog.map(np.asarray(a, dtype=object).reshape(-1, 1)
                                         if isinstance(a, list) else a),
        "map's grad": lambda a: prog.map([[1.0]], grad=a),
        "Inputs.set's data": lambda a: inputs.set(a),
        "set_data's values": lambda a: model.set_data(a * 2 if isinstance(a, list) else a),
        "load_state_dict's values": lambda a: model.load_state_dict(
            {"parameters": a * 2 if isinstance(a, list) else a}),
        "to_values' X": lambda a: data.to_values([a] if isinstance(a, list) else a),
    }


BULK_BAD = {
    "None": ([None], "NoneType"),
    "numeric string": (["1e3"], "str"),
    "complex": ([1 + 2j], "complex"),
    "string array": ("np:<U3", "strings"),
    "complex array": ("np:complex128", "complex numbers"),
}


@pytest.mark.parametrize("path", list(_bulk_paths()))
@pytest.mark.parametrize("bad", list(BULK_BAD))
def test_bulk_paths_refuse_what_value_refuses(path, bad):
    """None, numeric strings and complex numbers: Value() raises TypeError,
    and so does every bulk path, naming itself and the offending type."""
    import numpy as np
    value, named = BULK_BAD[bad]
    if isinstance(value, str) and value.startswith("np:"):
        dtype = value[3:]
        value = np.array(["1e3"] if dtype.startswith("<U") else [1 + 2j], dtype=dtype)
        if path.startswith(("set_data", "load_state")):
            value = np.repeat(value, 2)
        if path.startswith(("map's rows", "to_values")):
            value = value.reshape(1, 1)
    run = _bulk_paths()[path]
    with pytest.raises(TypeError) as info:
        run(value)
    assert path in str(info.value) and named in str(info.value), str(info.value)


def test_value_itself_refuses_the_same():
    from pygrad import Value
    for value in (None, "1e3", 1 + 2j):
        with pytest.raises(TypeError):
            Value(value)


def test_bulk_paths_take_bools_ints_and_real_objects_as_value_does():
    from fractions import Fraction

    import numpy as np
    import pygrad
    from pygrad import Value, data
    x, w = Value(0.0), Value(2.0)
    prog = pygrad.compile(w * x, inputs=[x])
    rows = np.array([[True], [3], [Fraction(1, 2)], [np.int64(-4)]], dtype=object)
    assert prog.map(rows).tolist() == [2.0 * Value(r[0]).data for r in rows]
    assert [[v.data for v in row] for row in data.to_values([[True, 2], [Fraction(1, 4), 0]])] \
        == [[1.0, 2.0], [0.25, 0.0]]


# -- messages that say what was wrong and what to do (issue 40, item 5) ---------

def test_compile_takes_a_single_input_value_as_it_takes_a_single_output():
    x, w = Value(0.0), Value(3.0)
    prog = pygrad.compile(w * x, inputs=x)
    assert prog.inputs == (x,)
    assert prog.map([1.0, 2.0]).tolist() == [3.0, 6.0]
    assert prog.map([[4.0]]).tolist() == [12.0]


@pytest.mark.parametrize("path", ["map", "set_data", "load_state_dict", "Inputs.set"])
def test_bulk_paths_given_values_say_they_need_numbers_and_how_to_get_them(path):
    """Not "different engines": these paths take numbers, and .data gives them."""
    a, b = Value(0.0), Value(0.0)
    prog = pygrad.compile(a * b, inputs=[a, b])
    model = nn.Neuron(2)                                     # 3 parameters
    run = {"map": lambda: prog.map([[Value(1.0), Value(2.0)]]),
           "set_data": lambda: model.set_data([Value(1.0)] * 3),
           "load_state_dict": lambda: model.load_state_dict({"parameters": [Value(1.0)] * 3}),
           "Inputs.set": lambda: pygrad.Inputs([a, b]).set([Value(1.0), Value(2.0)])}[path]
    with pytest.raises(TypeError) as info:
        run()
    message = str(info.value)
    assert "must be numbers" in message and "not Values" in message and ".data" in message
    assert "engine" not in message
    engine_still_works()


@pytest.mark.parametrize("make, named", [
    (lambda a: Value(5.0, (a,), "x3", label="mine"), "op 'x3', label 'mine'"),
    (lambda a: Value(5.0, (a,), "x3"), "op 'x3'"),
    (lambda a: Value(5.0, (a,), label="mine"), "label 'mine'"),
    (lambda a: Value(5.0, (a,)), "no op or label, data 5.0"),
])
def test_compile_names_a_custom_op_by_its_op_and_label_and_says_what_to_do(make, named):
    a = Value(2.0)
    out = make(a)
    with pytest.raises(ValueError) as info:
        pygrad.compile(out + 1)
    message = str(info.value)
    assert f"({named}, made by Value(x, children, op))" in message, message
    assert "'?'" not in message
    assert "Rebuild the graph each step" in message and "pygrad's ops" in message


def test_a_tied_models_state_dict_loaded_untied_says_weights_are_tied():
    tied, untied = nn.MLP(2, [4, 4, 1]), nn.MLP(2, [4, 4, 1])
    tied.layers[1].neurons[1].w = tied.layers[1].neurons[0].w      # 4 weights in two places
    assert (len(tied.parameters()), len(untied.parameters())) == (33, 37)
    with pytest.raises(ValueError) as info:
        untied.load_state_dict(tied.state_dict())
    message = str(info.value)
    assert "holds 33 parameters and this model 37" in message
    assert "4 more tied weight(s) than this one" in message and "this one has none" in message
    assert "Tie the same weights in this model before loading" in message
    with pytest.raises(ValueError) as info:
        tied.load_state_dict(untied.state_dict())
    message = str(info.value)
    assert "this model has 4 more tied weight(s)" in message and "a fresh one" in message
    again = nn.MLP(2, [4, 4, 1])
    again.layers[1].neurons[1].w = again.layers[1].neurons[0].w
    again.load_state_dict(tied.state_dict())             # tied alike: it loads
    assert again.get_data().tolist() == tied.get_data().tolist()


def test_a_state_dict_of_the_wrong_size_without_ties_keeps_its_plain_message():
    model = nn.MLP(2, [3, 1])
    with pytest.raises(ValueError, match=r"needs shape \(13,\), got \(5,\)"):
        model.load_state_dict({"parameters": np.zeros(5)})


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("call, role", [
    (lambda V: losses.mse(V(1.0), 1), "predictions"),
    (lambda V: losses.mse([V(1.0)], 1.0), "targets"),
    (lambda V: losses.svm_hinge(V(1.0), [1]), "predictions"),
    (lambda V: losses.bce_with_logits(V(1.0), [1]), "predictions"),
])
def test_losses_given_one_value_say_they_need_lists(V, call, role):
    with pytest.raises(TypeError) as info:
        call(V)
    message = str(info.value)
    assert f"{role} must be a list, one per sample, not a single" in message
    assert "([prediction], [target])" in message and "not iterable" not in message
    assert losses.mse([V(1.0)], [3.0]).data == 4.0


@pytest.mark.parametrize("V", ENGINES)
def test_softmax_cross_entropy_given_one_value_says_it_needs_a_list(V):
    with pytest.raises(TypeError, match=r"logits must be a list, one Value per class .*"
                                        r"not a single Value") as info:
        losses.softmax_cross_entropy(V(1.0), 0)
    assert "not iterable" not in str(info.value)
    got = losses.softmax_cross_entropy([V(1.0), V(2.0)], 1).data     # a list still works
    assert got == pytest.approx(math.log(math.exp(1.0) + math.exp(2.0)) - 2.0, rel=1e-15)


def test_the_type_error_for_bad_data_lists_every_kind_of_number_accepted():
    """What the message lists is what Value takes: Fraction and 0-d arrays too."""
    import fractions

    import numpy as np

    from pygrad import Value
    with pytest.raises(TypeError) as exc:
        Value("1.5")
    message = str(exc.value)
    assert message == ("Value data must be a real number (int, float, bool, Fraction, numpy "
                       "scalar or 0-d array), not str: '1.5'"), message
    for accepted in (3, 1.5, True, fractions.Fraction(3, 2), np.float32(1.5), np.array(1.5)):
        assert Value(accepted).data == float(accepted)
