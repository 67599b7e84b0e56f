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
    with pytest.raises(ValueError, match="too large"):
        V(10 ** 400)


def test_setters_check_their_input():
    v = Value(1.0)
    with pytest.raises(TypeError, match="Value.data"):
        v.data = "x"
    with pytest.raises(TypeError, match="Value.grad"):
        v.grad = None
    with pytest.raises(TypeError, match="label"):
        v.label = 3
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
