"""A Value is a plain Python object to its user: attributes, identity,
subclasses and copies, as on micrograd's Value."""
import copy
import functools
import pickle

import numpy as np
import pytest

import pygrad
from pygrad import Value, nn, optim

from helpers import micrograd_style_tanh
import internals


# -- attributes ---------------------------------------------------------------

@pytest.mark.parametrize("engine", ["c", "reference"])
def test_any_attribute_can_be_set_on_any_value(engine):
    V = pygrad.reference.Value if engine == "reference" else Value
    a = V(2.0)
    b = a * 3.0
    c = b.relu()
    for v in (a, b, c):
        v.m = 0.0          # an AdamW written over micrograd keeps its state on the Value
        v.v = 0.0
        v._vis_color = "lightgreen"
        assert (v.m, v.v, v._vis_color) == (0.0, 0.0, "lightgreen")
    assert vars(b) == {"m": 0.0, "v": 0.0, "_vis_color": "lightgreen"}


def test_hasattr_getattr_and_vars_behave_as_on_a_plain_object():
    v = Value(1.0) + 1.0
    assert not hasattr(v, "color") and getattr(v, "color", "none") == "none"
    with pytest.raises(AttributeError):
        v.color
    v.color = "red"
    assert hasattr(v, "color") and getattr(v, "color", "none") == "red"
    assert vars(v) == {"color": "red"}
    del v.color
    assert not hasattr(v, "color")
    for name in ("data", "grad", "_prev", "_op", "_backward", "label", "backward"):
        assert hasattr(v, name)


def test_an_attribute_is_seen_through_prev():
    """A graph walker meets the very objects the user holds, so it sees
    their attributes (a drawing helper colouring nodes, say)."""
    a, b = Value(2.0), Value(3.0)
    c = a * b
    d = c + 1.0
    c.color = "red"
    (kid,) = [x for x in d._prev if x._op == "*"]
    assert kid is c and kid.color == "red"
    kid.width = 2            # and what the walker sets, the user sees
    assert c.width == 2


def test_prev_hands_out_the_objects_the_user_holds():
    a, b = Value(2.0), Value(3.0)
    c = a * b
    d = a + 1.0
    e = c * d
    assert c._prev == {a, b}
    assert e._prev == {c, d}
    assert any(x is c for x in e._prev) and any(x is d for x in e._prev)
    f = e.tanh()
    (g,) = f._prev
    assert g is e
    assert (a + a)._prev == {a}


def test_a_walk_meets_one_object_per_node():
    a = Value(1.5)
    y = a
    for _ in range(50):
        y = (y * a + 1.0).tanh()
    seen, stack, objects = set(), [y], {}
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        assert objects.setdefault(internals.node_of(v), v) is v, "two objects for one node"
        stack.extend(v._prev)
    # the walk again gives the same objects
    assert all(objects[internals.node_of(v)] is v for v in y._prev)


def test_fused_and_function_nodes_hand_out_user_objects():
    w = [Value(0.5), Value(-1.5)]
    x = [Value(2.0), Value(3.0)]
    b = Value(0.25)
    y = pygrad.dot(w, x, b, act="tanh")
    assert y._prev == set(w + x + [b])
    layer = nn.Layer(2, 3)
    outs = layer(x)
    assert outs[0]._prev == set(layer.neurons[0].parameters() + x)
    s = pygrad.sum([w[0], x[1]])
    assert s._prev == {w[0], x[1]}


def test_label_and_op_belong_to_the_node():
    a = Value(2.0, label="a")
    c = a * 3.0
    c.label = "c"
    d = c + 1.0
    cid = internals.node_of(c)
    del c                      # only the graph holds c's node now
    (kid,) = [x for x in d._prev if internals.node_of(x) == cid]
    assert kid.label == "c" and kid._op == "*"


@pytest.mark.parametrize("engine", ["c", "reference"])
def test_op_names_can_be_set_as_on_micrograds_value(engine):
    # micrograd-style code names its own ops: out = self + (-other); out._op = '-'
    V = pygrad.reference.Value if engine == "reference" else Value
    a, b = V(2.0), V(5.0)
    out = a + (-b)
    out._op = "-"
    d = out * 2.0
    ref = out._prev
    del out
    (kid,) = [x for x in d._prev if x.data == -3.0]
    assert kid._op == "-" and kid._prev == ref
    d.backward()
    assert (a.grad, b.grad) == (2.0, -2.0)          # the math is the op's, not the name's
    custom = V(1.0, (a,), "mine")
    assert custom._op == "mine"
    custom._op = "renamed"
    assert custom._op == "renamed"


def test_prev_of_a_number_operand_gives_a_value_over_its_leaf():
    # C makes _prev's set (csrc/value_binding.h, get_prev): a number's leaf
    # gets a new engine Value, the same one on every read, even under a
    # subclass's op; other shapes go to Python's slow path
    class Mine(Value):
        pass
    a = Mine(2.0)
    # (y, the leaf's number, d y / d leaf at a = 2)
    for y, k, dk in ((a * 0.5, 0.5, 2.0), (0.5 * a, 0.5, 2.0), (a - 3, 3.0, -1.0),
                     (2 ** a, 2.0, 4.0)):
        kids = y._prev
        assert y._prev is kids and type(kids) is type(a._prev) and a in kids
        (leaf,) = [x for x in kids if x is not a]
        assert type(leaf) is Value and leaf._prev == set() and leaf._op == ""
        y.backward()
        assert (leaf.data, leaf.grad) == (k, dk)
    assert (a ** 3)._prev == {a}             # a power's exponent is no child
    assert pygrad.sum([a, a * 2.0, 1.5])._prev >= {a}


def test_prev_raises_what_a_subclass_hash_raises_and_then_works():
    class Unhashable(Value):
        broken = True

        def __hash__(self):
            if Unhashable.broken:
                raise KeyError("no hash today")
            return id(self)
    a, b = Unhashable(1.0), Unhashable(2.0)
    c = a * b
    with pytest.raises(KeyError, match="no hash today"):
        c._prev
    Unhashable.broken = False
    assert c._prev == {a, b} and c._prev is c._prev


def test_op_reads_the_node_and_a_set_name_comes_first():
    a = Value(3.0)
    assert [x._op for x in (a, a + 1, a * a, a ** 2, a ** 0.5, a.relu(), a.tanh())] == \
        ["", "+", "*", "**2", "**0.5", "ReLU", "tanh"]
    assert pygrad.dot([a], [a], act="relu")._op == "linear+ReLU"
    b = a * 2
    b._op = "twice"
    assert b._op == "twice" and vars(b) == {"_op": "twice"}
    del b._op
    assert b._op == "*"
    unborn = Value.__new__(Value)        # __init__ never ran: no node, no name
    assert unborn._op == ""
    assert isinstance(Value.__dict__["_op"], type(Value._op))


def test_prev_is_fixed_on_the_c_engine_and_settable_on_the_reference():
    a, b = Value(2.0), Value(3.0)
    out = a * b
    with pytest.raises(AttributeError, match="children are fixed when it is made"):
        out._prev = {a}
    assert out._prev == {a, b}
    R = pygrad.reference.Value
    x, y = R(2.0), R(0.0)
    y._prev = {x}                       # micrograd: the children backward() walks
    y._backward = lambda: setattr(x, "grad", x.grad + 3.0 * y.grad)
    y.backward()
    assert x.grad == 3.0
    with pytest.raises(TypeError, match="_children must be Values"):
        y._prev = {1.0}


@pytest.mark.parametrize("engine", ["c", "reference"])
def test_a_value_of_a_value_says_what_was_likely_meant(engine):
    V = pygrad.reference.Value if engine == "reference" else Value
    with pytest.raises(TypeError, match=r"not a Value .*use the Value itself, or Value\(v.data\)"):
        V(V(0.5))


class Named(Value):
    """A user's subclass (module level, so that pickle finds it)."""

    def __init__(self, data, name):
        super().__init__(data)
        self.name = name

    def double(self):
        return self * 2


def test_subclasses_work_and_keep_their_attributes():
    a = Named(3.0, "a")
    y = a.double() + a
    y.backward()
    assert (y.data, a.grad, a.name) == (9.0, 3.0, "a")
    assert isinstance(y, Value) and type(a) is Named
    assert any(x is a for x in y._prev)
    for b in (copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert type(b) is Named and (b.data, b.grad, b.name) == (3.0, 3.0, "a") and b is not a


# -- copies ---------------------------------------------------------------------

def _trained(fused: bool):
    model = nn.MLP(2, [4, 1], fused=fused)
    opt = optim.Adam(model.parameters(), lr=0.01)
    xs = [[0.5, -1.0], [1.5, 0.25]]
    for _ in range(3):
        loss = sum((model(x) - 1.0) ** 2 for x in xs)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt, xs


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_models_and_optimizers_copy_at_any_time(fused, how):
    model, opt, xs = _trained(fused)
    dup = (copy.deepcopy if how == "deepcopy" else lambda o: pickle.loads(pickle.dumps(o)))
    model2, opt2 = dup((model, opt))
    assert [p.data for p in model2.parameters()] == [p.data for p in model.parameters()]
    assert [p.grad for p in model2.parameters()] == [p.grad for p in model.parameters()]
    assert all(p is q for p, q in zip(opt2.params, model2.parameters()))
    assert not set(map(id, model2.parameters())) & set(map(id, model.parameters()))
    # both go on training identically, and independently
    for m, o in ((model, opt), (model2, opt2)):
        loss = sum((m(x) - 1.0) ** 2 for x in xs)
        o.zero_grad()
        loss.backward()
        o.step()
    assert [p.data for p in model2.parameters()] == [p.data for p in model.parameters()]
    model2.parameters()[0].data = 99.0
    assert model.parameters()[0].data != 99.0


def test_inputs_copy_and_a_program_refuses_clearly():
    x = [Value(1.0), Value(2.0)]
    inputs = pygrad.Inputs(x)
    for dup in (copy.deepcopy(inputs), pickle.loads(pickle.dumps(inputs))):
        assert dup.get().tolist() == [1.0, 2.0]
        dup.set([5.0, 6.0])
        assert inputs.get().tolist() == [1.0, 2.0] and dup.get().tolist() == [5.0, 6.0]
    program = pygrad.compile(x[0] * x[1])
    for fn in (copy.deepcopy, pickle.dumps, copy.copy):
        with pytest.raises(TypeError, match="Program can't be copied"):
            fn(program)


def test_any_value_copies_as_a_new_leaf_with_its_attributes():
    a = Value(2.0, label="a")
    y = a * 3.0
    y.grad = 0.5
    y.note = {"k": [1]}
    for z in (copy.copy(y), copy.deepcopy(y), pickle.loads(pickle.dumps(y))):
        assert (z.data, z.grad, z._prev, z.note) == (6.0, 0.5, set(), {"k": [1]})
    assert copy.deepcopy(y).note is not y.note and copy.copy(y).note is y.note


def test_custom_op_closures_survive_a_copy_of_the_model_inputs():
    tanh = micrograd_style_tanh(Value)
    a = Value(0.3)
    y = tanh(a * 2.0)
    y2 = copy.deepcopy(y)
    assert y2.data == y.data and y2._prev == set()
    y.backward()
    assert a.grad != 0.0


def test_model_state_arrays_are_numpy_after_a_copy():
    model, opt, _ = _trained(True)
    opt2 = copy.deepcopy(opt)
    assert isinstance(opt2.m, np.ndarray) and opt2.m.tolist() == opt.m.tolist()
    assert opt2.steps == opt.steps == 3


def test_a_bound_method_or_partial_as_backward_works():
    class Op:
        def __init__(self, x):
            self.x = x
            self.out = Value(x.data * 2, (x,), "double")
            self.out._backward = self.backward

        def backward(self):
            self.x.grad += 2 * self.out.grad

    a = Value(1.5)
    op = Op(a)
    y = op.out * 3.0
    del op
    y.backward()
    assert a.grad == 6.0

    b = Value(1.0)
    out = Value(b.data + 1, (b,), "inc")

    def push(x, o):
        x.grad += o.grad
    out._backward = functools.partial(push, b, out)
    (out * 5.0).backward()
    assert b.grad == 5.0


# -- data and grad writes ---------------------------------------------------------

def test_writes_reach_the_node_and_only_its_node_for_every_kind_of_value():
    """A written Value keeps its node's address: the writes of an update
    loop, then C's own reads and writes (backward, an optimizer, a copy),
    all meet in the node, and a copy's writes stay in the copy."""
    from pygrad import reference
    ref_w, ref_b = reference.Value(0.5), reference.Value(-1.5)
    w, b = Value(0.5), Value(-1.5)
    custom = micrograd_style_tanh(w * 2.0)
    values = [w, b, w * b, custom]
    for step in range(3):
        for v, x in zip(values, (1, True, np.float64(0.25), 2 ** 52 + 1)):
            v.grad = 0
            v.data = x
            assert v.data == float(x) and v.grad == 0.0
        w.data, b.data = 0.5 + step, -1.5
        ref_w.data, ref_b.data = 0.5 + step, -1.5
        for p in (w, b, ref_w, ref_b):
            p.grad = 0.0
        (w * b + w).backward()
        (ref_w * ref_b + ref_w).backward()
        assert (w.grad, b.grad) == (ref_w.grad, ref_b.grad)
    optim.SGD([w, b], lr=0.5).step()
    assert w.data == 2.5 - 0.5 * ref_w.grad and b.data == -1.5 - 0.5 * ref_b.grad
    twin = copy.copy(w)
    twin.data, twin.grad = 7.0, 8.0
    assert (w.data, w.grad) == (2.5 - 0.5 * ref_w.grad, ref_w.grad)
    w.data = 3.0
    assert twin.data == 7.0 and pickle.loads(pickle.dumps(w)).data == 3.0
    with pytest.raises(TypeError, match="Value.grad must be a real number"):
        w.grad = "1"
    with pytest.raises(ValueError, match="too large"):
        w.data = 10 ** 400
    assert w.data == 3.0
