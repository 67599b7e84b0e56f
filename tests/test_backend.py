"""pygrad._backend: the one place that picks the engine.

The choice itself (which Values give which backend, the errors), that the
modules built on Values leave the choice to it (read from their source),
that the two backends' bulk operations give the same doubles, and that the
nn constructors spell out their keyword arguments.
"""
import ast
import copy
import importlib
import inspect
import math
import pickle
import random
import struct

import numpy as np
import pytest

from pygrad import _backend, engine, nn
from pygrad._backend import C, DEFAULT, REFERENCE, backend_named, backend_of
from pygrad.engine import Value as CValue
from pygrad.reference import Value as RValue

import internals

MIX = ("must all come from the same engine: cannot mix pygrad.Values (C engine) with "
       "Values of another engine")


class FakeMicrogradValue:
    """What ``_numbers.is_value`` takes for micrograd's Value: ``_prev`` and
    ``grad`` in the instance's dict."""

    def __init__(self, data):
        self.data, self.grad, self._prev = data, 0, set()


def bits(xs):
    return [struct.pack("<d", float(x)) for x in xs]


# -- the choice --------------------------------------------------------------------

def test_values_pick_their_engine():
    assert backend_of([CValue(1.0), CValue(2.0)]) is C
    assert backend_of([RValue(1.0)]) is REFERENCE
    assert backend_of([FakeMicrogradValue(1.0), RValue(2.0)]) is REFERENCE
    assert C.Value is engine.Value and REFERENCE.Value is RValue
    assert (C.name, REFERENCE.name) == ("c", "reference")


def test_numbers_are_left_to_the_caller_and_give_the_default():
    assert DEFAULT is C
    assert backend_of([]) is DEFAULT and backend_of([1.0, 2]) is DEFAULT
    assert backend_of([1.0, RValue(1.0), "x"]) is REFERENCE
    assert backend_of([None, CValue(1.0)]) is C


def test_a_real_micrograd_value_gets_the_python_backend():
    micrograd = pytest.importorskip("micrograd.engine")
    assert backend_of([micrograd.Value(1.0)]) is REFERENCE


@pytest.mark.parametrize("values", [[CValue(1.0), RValue(1.0)], [RValue(1.0), CValue(1.0)],
                                    [CValue(1.0), 2.0, FakeMicrogradValue(1.0)]])
def test_mixing_engines_is_a_clear_type_error(values):
    with pytest.raises(TypeError) as info:
        backend_of(values, "optimizer parameters")
    assert str(info.value) == "optimizer parameters " + MIX
    with pytest.raises(TypeError, match="^Values " + MIX.replace("(", r"\(").replace(")", r"\)")):
        backend_of(values)
    assert backend_of(values, allow_mixed=True) is REFERENCE


def test_backends_are_found_by_name():
    assert backend_named("c") is C and backend_named("reference") is REFERENCE


@pytest.mark.parametrize("bad", ["C", "python", "", None, 1, [1], b"c"])
def test_a_bad_engine_name_is_a_value_error(bad):
    with pytest.raises(ValueError) as info:
        backend_named(bad)
    assert str(info.value) == f"engine must be 'c' or 'reference', not {bad!r}"
    with pytest.raises(ValueError, match="engine must be"):
        nn.MLP(2, [1], engine=bad)


@pytest.mark.parametrize("b", [C, REFERENCE])
def test_a_backend_stays_one_object_through_copies_and_pickles(b):
    assert copy.copy(b) is b and copy.deepcopy(b) is b
    assert pickle.loads(pickle.dumps(b)) is b
    assert repr(b) == f"<pygrad backend {b.name!r}>"


# -- every module asks the backend -------------------------------------------------

# (pygrad.gradcheck is the function: import the modules by name.)
USERS = [importlib.import_module(f"pygrad.{m}")
         for m in ("nn", "optim", "losses", "function", "gradcheck", "data", "higher_order")]


def _imports_of(tree):
    """Modules of this package a source imports (relative imports)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("pygrad"))
    return out


@pytest.mark.parametrize("mod", USERS, ids=[m.__name__ for m in USERS])
def test_modules_leave_the_engine_choice_to_the_backend(mod):
    tree = ast.parse(inspect.getsource(mod))
    # Of the package, they import only the backend, the number rules and the
    # version (for messages): not the engines, their fused ops or the C core.
    # (and _value_ops: the Value protocols, types only; higher_order and
    # _rule_functions and _second_order, themselves engine-free: the
    # backend's graph views)
    assert _imports_of(tree) <= {"_backend", "_numbers", "_version", "_value_ops",
                                 "higher_order", "_rule_functions", "_second_order", "_lazy",
                                 "function", "op_rules"}, mod.__name__
    assert "_backend" in _imports_of(tree), mod.__name__
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    # Nor reach the engines through the backend module.
    assert not names & {"ffi", "lib"}, mod.__name__
    assert not attrs & {"_engine", "_reference", "_functional", "ffi", "lib"}, mod.__name__
    # No class test against an engine's Value, and no allocator policy.
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            assert "Value" not in ast.dump(node.args[1]), (mod.__name__, ast.unparse(node))
    assert not [a for a in attrs | names if "segment" in a.lower()], mod.__name__


def test_only_the_backend_knows_both_engines():
    imported = _imports_of(ast.parse(inspect.getsource(_backend)))
    assert {"engine", "reference", "functional", "_core"} <= imported


# -- bulk operations: the same doubles on both engines ----------------------------

NUMBERS = [0.0, -0.0, 1.5, -2.25, 5e-324, -1e308, math.pi, 1 / 3, math.inf, -math.inf, 7.0]


def _packed(b, xs):
    values = [b.Value(x) for x in xs]
    return values, b.pack(values)


def test_gather_reads_every_values_data_and_grad():
    for b in (C, REFERENCE):
        values, packed = _packed(b, NUMBERS)
        for i, v in enumerate(values):
            v.grad = NUMBERS[-1 - i]
        assert bits(b.gather_data(packed)) == bits(NUMBERS)
        assert bits(b.gather_grad(packed)) == bits(NUMBERS[::-1])
        assert b.gather_data(packed).dtype == np.float64


def test_bulk_operations_agree_bit_for_bit_between_engines():
    results = {}
    for b in (C, REFERENCE):
        values, packed = _packed(b, NUMBERS)
        b.fill_grad(packed, -0.0)
        steps = [bits(b.gather_grad(packed))]
        b.scatter_data(packed, np.array(NUMBERS[::-1]))
        steps.append(bits(v.data for v in values))
        b.fill_grad(packed, 2.5)
        steps.append(bits(v.grad for v in values))
        results[b.name] = steps
    assert results["c"] == results["reference"]
    assert results["c"][0] == bits([-0.0] * len(NUMBERS))
    assert results["c"][1] == bits(NUMBERS[::-1])
    assert results["c"][2] == bits([2.5] * len(NUMBERS))


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 1e-3)])
def test_sgd_steps_agree_bit_for_bit(momentum, weight_decay):
    rng = random.Random(5)
    start = [rng.uniform(-3, 3) for _ in range(20)]
    grads = [[rng.uniform(-1, 1) for _ in start] for _ in range(4)]
    out = {}
    for b in (C, REFERENCE):
        values, packed = _packed(b, start)
        velocity, steps = np.zeros(len(values)), np.zeros(1)
        view = b.buffer(velocity)
        for g in grads:
            for v, x in zip(values, g):
                v.grad = x
            b.sgd_step(packed, 0.05, momentum, weight_decay, view, b.buffer(steps))
        out[b.name] = (bits(v.data for v in values), bits(velocity), steps[0])
    assert out["c"] == out["reference"]
    assert out["c"][2] == len(grads)
    assert out["c"][0] != bits(start)


def test_adam_steps_agree_bit_for_bit():
    rng = random.Random(6)
    start = [rng.uniform(-3, 3) for _ in range(20)]
    out = {}
    for b in (C, REFERENCE):
        values, packed = _packed(b, start)
        m, v2, steps = np.zeros(len(values)), np.zeros(len(values)), np.zeros(1)
        mv, vv, sv = b.buffer(m), b.buffer(v2), b.buffer(steps)
        r = random.Random(7)
        for t in range(1, 4):
            for v in values:
                v.grad = r.uniform(-1, 1)
            b.adam_step(packed, 0.01, 0.9, 0.999, 1e-8, 1e-4, 1 - 0.9 ** t, 1 - 0.999 ** t,
                        mv, vv, sv)
        out[b.name] = (bits(v.data for v in values), bits(m), bits(v2), steps[0])
    assert out["c"] == out["reference"]
    assert out["c"][3] == 3


def test_make_function_builds_the_same_node_on_both_engines():
    out = {}
    for b in (C, REFERENCE):
        xs = [b.Value(2.0), b.Value(-3.0)]
        y = b.make_function("Mine", 7.25, xs, [0.5, -4.0])
        (y * 3.0).backward()
        out[b.name] = (y.data, y._op, [x.grad for x in xs])
    assert out["c"] == out["reference"] == (7.25, "Mine", [1.5, -12.0])


def test_only_the_c_engine_fuses_layers():
    assert C.fuses_layers(3) and not REFERENCE.fuses_layers(3)
    with pytest.raises(NotImplementedError):
        REFERENCE.fused_layer((), [], [1.0], 1, 1, True)
    random.seed(2)
    layer = nn.Layer(3, 2, nonlin=False)
    params = [p for n in layer.neurons for p in [n.b] + n.w]
    fused = C.fused_layer(C.pack(params), params, [1.0, -2.0, 0.5], 3, 2, False)
    assert [y.data for y in fused] == [n([1.0, -2.0, 0.5]).data for n in layer.neurons]
    with pytest.raises(ValueError, match="layer expects 3 inputs, got 2"):
        C.fused_layer(C.pack(params), params, [1.0, 2.0], 3, 2, False)


def test_modules_bulk_operations_work_empty_and_mixed():
    empty = nn.Module()
    empty.zero_grad()
    empty.set_data([])
    assert empty.get_data().shape == (0,) and empty.get_grad().shape == (0,)

    class Mixed(nn.Module):
        def __init__(self):
            self.ps = [CValue(1.0), RValue(2.0)]

        def parameters(self):
            return self.ps

    m = Mixed()
    m.set_data([3.0, 4.0])
    m.ps[0].grad = m.ps[1].grad = 5.0
    m.zero_grad()
    assert m.get_data().tolist() == [3.0, 4.0] and m.get_grad().tolist() == [0.0, 0.0]


# -- nn constructors: explicit keywords ---------------------------------------------

P = inspect.Parameter
SIGNATURES = {
    nn.Neuron: [("nin", P.POSITIONAL_OR_KEYWORD, P.empty), ("nonlin", P.POSITIONAL_OR_KEYWORD, True),
                ("fused", P.KEYWORD_ONLY, True), ("engine", P.KEYWORD_ONLY, "c")],
    nn.Layer: [("nin", P.POSITIONAL_OR_KEYWORD, P.empty), ("nout", P.POSITIONAL_OR_KEYWORD, P.empty),
               ("nonlin", P.KEYWORD_ONLY, True), ("fused", P.KEYWORD_ONLY, True),
               ("engine", P.KEYWORD_ONLY, "c")],
    nn.MLP: [("nin", P.POSITIONAL_OR_KEYWORD, P.empty), ("nouts", P.POSITIONAL_OR_KEYWORD, P.empty),
             ("fused", P.KEYWORD_ONLY, True), ("engine", P.KEYWORD_ONLY, "c")],
}


@pytest.mark.parametrize("cls", list(SIGNATURES), ids=lambda c: c.__name__)
def test_nn_constructors_spell_out_their_arguments(cls):
    params = list(inspect.signature(cls).parameters.values())
    assert [(p.name, p.kind, p.default) for p in params] == SIGNATURES[cls]
    assert all(p.annotation is not P.empty for p in params)
    assert cls.__init__.__doc__


def test_nn_constructors_take_micrograds_calls():
    random.seed(0)
    assert repr(nn.Neuron(3, False)) == "LinearNeuron(3)"
    assert repr(nn.Neuron(2, nonlin=True)) == "ReLUNeuron(2)"
    assert repr(nn.Layer(2, 2, nonlin=False)) == "Layer of [LinearNeuron(2), LinearNeuron(2)]"
    assert repr(nn.MLP(1, [1])) == "MLP of [Layer of [LinearNeuron(1)]]"
    with pytest.raises(TypeError):
        nn.Layer(2, 2, colour="red")
    with pytest.raises(TypeError):
        nn.MLP(2, [1], nonlin=True)
    with pytest.raises(TypeError):
        nn.Neuron(2, True, False)   # fused is keyword-only


def test_engine_keyword_reaches_every_parameter():
    model = nn.MLP(2, [3, 1], engine="reference", fused=False)
    assert all(type(p) is RValue for p in model.parameters())
    assert all(not n.fused for layer in model.layers for n in layer.neurons)
    assert all(type(p) is CValue for p in nn.MLP(2, [3, 1]).parameters())


def test_no_module_reaches_into_another_modules_private_names():
    # The engine offers the rest of the package its node factory as
    # make_* (engine.py); a `module._name` across modules would bypass it.
    import pathlib
    package = pathlib.Path(engine.__file__).parent
    modules = {p.stem for p in package.glob("*.py")} | {"_core"}
    found = []
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("pygrad")):
                for a in node.names:
                    if a.name in modules:
                        aliases.add(a.asname or a.name)
                    elif a.name.startswith("_") and not a.name.startswith("__"):
                        found.append(f"{path.name}: from {node.module} import {a.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.value.id != "_core"
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert found == []
