"""pygrad.Value behaves as micrograd.engine.Value: API, op names, _prev,
labels, repr, identity, reflected ops, repeated backward, micrograd idioms."""

import pytest

import pygrad
import pygrad.engine
from pygrad import Value
from pygrad.reference import Value as RefValue

from helpers import micrograd_style_tanh
import internals


def test_import_paths_name_one_class():
    assert pygrad.Value is pygrad.engine.Value
    assert isinstance(pygrad.__version__, str) and pygrad.__version__


def test_constructor_signature_matches_micrograd():
    a = Value(2.0)
    b = Value(3, (a,), "myop", label="b")
    assert a.data == 2.0 and a.grad == 0.0 and a._op == "" and a.label == ""
    assert b.data == 3.0 and b._op == "myop" and b.label == "b"
    assert b._prev == {a}


def test_data_and_grad_are_writable_like_an_sgd_step():
    p = Value(1.0)
    p.grad = 0.5
    p.data -= 0.1 * p.grad
    assert p.data == 1.0 - 0.1 * 0.5
    p.grad = 0  # micrograd's zero_grad writes an int
    assert p.grad == 0.0


@pytest.mark.parametrize("make, op", [
    (lambda a, b: a + b, "+"),
    (lambda a, b: a * b, "*"),
    (lambda a, b: a ** 2, "**2"),
    (lambda a, b: a ** -1, "**-1"),
    (lambda a, b: a ** 0.5, "**0.5"),
    (lambda a, b: a.relu(), "ReLU"),
    (lambda a, b: a.tanh(), "tanh"),
    (lambda a, b: a.exp(), "exp"),
    (lambda a, b: a - b, "-"),
    (lambda a, b: a / b, "/"),
    (lambda a, b: -a, "neg"),
    (lambda a, b: a ** b, "**"),
])
def test_op_names_agree_with_micrograd_and_reference(make, op):
    assert make(Value(2.0), Value(3.0))._op == op
    assert make(RefValue(2.0), RefValue(3.0))._op == op


def test_prev_holds_the_children_and_constants():
    a, b = Value(2.0), Value(3.0)
    assert (a * b)._prev == {a, b}
    c = a + 5
    kids = c._prev
    assert len(kids) == 2 and a in kids
    assert sorted(k.data for k in kids) == [2.0, 5.0]
    assert (a ** 2)._prev == {a}
    assert a._prev == set()


def test_prev_of_an_op_result_finds_the_variable_that_holds_it():
    a, b = Value(2.0), Value(3.0)
    c = a * b
    d = c + 1
    assert c in d._prev


def test_labels_show_on_the_values_prev_hands_out():
    a = Value(2.0, label="a")
    b = Value(3.0)
    b.label = "b"
    e = a * b
    e.label = "e"
    d = e + 1.0
    del a, b, e
    (e2,) = [k for k in d._prev if k.label == "e"]
    assert sorted(k.label for k in e2._prev) == ["a", "b"]


def test_repr_is_micrograds():
    v = Value(2.5)
    assert repr(v) == "Value(data=2.5, grad=0.0)"
    assert repr(RefValue(2.5)) == "Value(data=2.5, grad=0.0)"


def test_hashable_by_identity():
    a, b = Value(1.0), Value(1.0)
    d = {a: "a", b: "b"}
    assert d[a] == "a" and d[b] == "b" and a != b and a == a


@pytest.mark.parametrize("expr, expected", [
    ("2 + v", 5.0), ("2.0 + v", 5.0), ("v + 2", 5.0),
    ("2 * v", 6.0), ("2.5 * v", 7.5),
    ("2 - v", -1.0), ("v - 2", 1.0),
    ("2 / v", 2 / 3), ("v / 2", 1.5),
    ("2 ** v", 8.0), ("v ** 2", 9.0),
    ("-v", -3.0),
])
def test_reflected_and_plain_forms_with_numbers(expr, expected):
    for V in (Value, RefValue):
        v = V(3.0)
        out = eval(expr)
        assert out.data == expected
        out.backward()
        assert v.grad != 0.0


@pytest.mark.parametrize("name, expected", [
    ("__radd__", 5.0), ("__rsub__", -1.0), ("__rmul__", 6.0), ("__rtruediv__", 2 / 3),
])
def test_reflected_forms_with_a_value_on_the_other_side(name, expected):
    """w.__rsub__(v) is v - w, as Python calls it when v's own method
    declines, or when w's class overrides the reflected method: the value,
    both grads and _prev match the reference engine's."""
    for V in (Value, RefValue):
        v, w = V(2.0), V(3.0)
        out = getattr(w, name)(v)                   # v (op) w
        assert out.data == expected
        out.backward()
        grads = (v.grad, w.grad)
        assert sorted(k.data for k in out._prev) == [2.0, 3.0]
        if V is Value:
            c_grads = grads
        else:
            assert grads == c_grads
    # a subclass that overrides a reflected method is called first by Python
    for V in (Value, RefValue):
        class Sub(V):
            def __rsub__(self, other):
                return super().__rsub__(other)
        v, s = V(5.0), Sub(2.0)
        out = v - s
        assert out.data == 3.0
        out.backward()
        assert (v.grad, s.grad) == (1.0, -1.0)


def test_repeated_backward_accumulates_like_micrograd():
    # micrograd's backward: root.grad = 1, then every node += again, so a
    # second call pushes the already-accumulated grads once more.
    for V in (Value, RefValue):
        a = V(3.0)
        b = a * 2.0      # db/da = 2
        c = b * 5.0      # dc/db = 5
        c.backward()
        assert (c.grad, b.grad, a.grad) == (1.0, 5.0, 10.0)
        c.backward()
        # b: 5 + 5 = 10; a: 10 + 2 * 10 = 30
        assert (c.grad, b.grad, a.grad) == (1.0, 10.0, 30.0)


@pytest.mark.parametrize("V", [Value, RefValue], ids=["c", "reference"])
def test_repeated_backward_keeps_micrograds_hidden_grads_of_sub_and_div(V):
    # micrograd: a - b is a + (b * -1), a / b is a * b**-1; the hidden inner
    # node's grad accumulates too.  Values worked by hand from micrograd's
    # graph (and printed by micrograd 0.1.0: 9 -12, 4.5 -3.0).
    a, b = V(1.0), V(2.0)
    y = (a - b) * 3
    y.backward()
    y.backward()
    assert (a.grad, b.grad) == (9.0, -12.0)
    a, b = V(1.0), V(2.0)
    y = (a / b) * 3
    y.backward()
    y.backward()
    assert (a.grad, b.grad) == (4.5, -3.0)
    # number - Value and number / Value have the hidden node too; Value -
    # number and Value / number do not (micrograd 0.1.0 prints -33.75)
    b = V(2.0)
    y = (5.0 - b) * 3 + (5.0 / b) * 2 + (b - 1.0) + b / 4.0
    y.backward()
    y.backward()
    assert b.grad == -33.75
    # a third call goes on the same way: -3, then -(3 + 6), then -(9 + 9)
    a, b = V(1.0), V(2.0)
    y = (a - b) * 3
    for _ in range(3):
        y.backward()
    assert b.grad == -30.0


def test_manual_backward_pushes_into_children_only():
    for V in (Value, RefValue):
        a, b = V(2.0), V(-3.0)
        e = a * b
        c = V(10.0)
        d = e + c
        d.grad = 1.0
        d._backward()
        assert (e.grad, c.grad, a.grad, b.grad) == (1.0, 1.0, 0.0, 0.0)
        e._backward()
        assert (a.grad, b.grad) == (-3.0, 2.0)


def test_custom_op_written_the_micrograd_way():
    results = []
    for V in (Value, RefValue):
        tanh = micrograd_style_tanh(V)
        x, w = V(0.7), V(-1.3)
        hidden = tanh(x * w)
        assert hidden._op == "mytanh"
        y = hidden * 3.0 + 1.0
        del hidden  # the closure must survive its own Value
        y.backward()
        results.append((y.data, x.grad, w.grad))
    assert results[0] == results[1]
    assert results[0][1] != 0.0


def test_custom_backward_is_returned_by_the_getter():
    v = Value(1.0)
    out = Value(2.0, (v,), "f")

    def fn():
        v.grad += 7.0
    out._backward = fn
    assert out._backward is fn
    out._backward()
    assert v.grad == 7.0


def test_a_custom_node_without_a_closure_passes_nothing_down_as_micrograds_default():
    # micrograd's Value starts with `_backward = lambda: None`: a node made
    # over children and never given a closure stops the gradient there.
    results = []
    for V in (Value, RefValue):
        x = V(0.5)
        hidden = V(2.0 * x.data, (x,), "double")    # no _backward set
        y = hidden * x + x
        y.backward()
        assert x.grad == hidden.data + 1.0         # only y's own path
        y.backward()                               # and again, no zero_grad
        getter = hidden._backward
        getter()                                   # the default: does nothing
        results.append((y.data, x.grad, hidden.grad, y.grad))
    assert results[0] == results[1]
    later = Value(0.0, (Value(1.0),), "late")
    calls = []
    later._backward = lambda: calls.append(1)     # set later, after none
    (later * 2.0).backward()
    assert calls == [1]


def _trace(root):
    """The graph walk of micrograd's trace_graph.ipynb."""
    nodes, edges = set(), set()

    def build(v):
        if v not in nodes:
            nodes.add(v)
            for child in v._prev:
                edges.add((child, v))
                build(child)
    build(root)
    return nodes, edges


def test_graph_walker_sees_one_object_per_node():
    graphs = []
    for V in (Value, RefValue):
        a, b = V(2.0, label="a"), V(-3.0, label="b")
        c = a * b
        d = c + a          # a is reached through two paths
        e = (d * c).relu() + d
        nodes, edges = _trace(e)
        by_id = {id(n): n for n in nodes}
        assert len(by_id) == len(nodes)
        graphs.append((len(nodes), len(edges), sorted(n.label for n in nodes)))
    assert graphs[0] == graphs[1]
    assert graphs[0][0] == 7  # a, b, c, d, d*c, relu, e: each once


@pytest.mark.slow      # 5 s (the default run's budget: docs/development.md)
def test_deep_chain_of_a_million_nodes_backprops():
    x = Value(0.0)
    w = Value(1.0)
    for _ in range(1_000_000):
        x = x + w
    x.backward()
    assert x.data == 1_000_000.0
    assert w.grad == 1_000_000.0



def test_submodules_load_on_first_use(tmp_path):
    import subprocess
    import sys
    code = ("import pygrad, sys\n"
            "assert 'pygrad.nn' not in sys.modules\n"
            "print(pygrad.nn.MLP.__name__, pygrad.optim.SGD.__name__, pygrad.losses.mse.__name__,"
            " pygrad.data.make_moons.__name__, pygrad.viz.trace.__name__)\n"
            "try:\n    pygrad.no_such_thing\nexcept AttributeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path)     # not the uncompiled source tree
    assert out.stdout.split("\n")[:2] == [
        "MLP SGD mse make_moons trace", "module 'pygrad' has no attribute 'no_such_thing'"]


def test_a_source_tree_without_the_core_says_how_to_build(tmp_path):
    import pathlib
    import shutil
    import subprocess
    import sys
    src = pathlib.Path(__file__).resolve().parent.parent / "pygrad"
    shutil.copytree(src, tmp_path / "pygrad", ignore=shutil.ignore_patterns("_core*", "__pycache__"))
    # -S: no site-packages, so no installed or editable pygrad can answer instead
    out = subprocess.run([sys.executable, "-S", "-c", "import pygrad"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert "ImportError: pygrad's C core" in out.stderr and "pip install -e ." in out.stderr


def test_micrograds_default_backward_set_on_parameters_changes_nothing():
    """Code written for micrograd sets `p._backward = lambda: None` on its
    parameters (micrograd's own default): the leaves stay plain C leaves, so
    backward stays out of record mode and compile() takes the graph, with
    the same numbers as without it."""
    import pygrad
    from pygrad import nn

    def noop():
        pass

    results = []
    for setting in (None, lambda: None, noop):
        random_state = __import__("random").getstate()
        __import__("random").seed(3)
        model = nn.MLP(2, [4, 1])
        __import__("random").setstate(random_state)
        if setting is not None:
            for p in model.parameters():
                p._backward = setting
        assert not any(internals.runs_python_backward(p) for p in model.parameters())
        out = model([1.0, -2.0])
        out.backward()
        results.append([p.grad for p in model.parameters()])
        pygrad.compile(out)                       # refused for a "node made in Python" before
    assert results[0] == results[1] == results[2]


def test_a_leaf_closure_that_does_something_still_runs():
    from pygrad import Value
    calls = []
    a = Value(2.0)
    a._backward = lambda: calls.append(a.grad)
    (a * a).backward()
    assert calls == [4.0]


def _lecture_custom_training(V):
    """Custom ops added to the Value class as methods (the lecture's way), an
    MLP of them, hand-written SGD, a repeated backward now and then and
    kept losses, as a notebook does; then a walk of a kept loss."""
    import gc
    import math
    import random

    class Net:
        def __init__(self, sizes):
            rng = random.Random(3)
            self.layers = [[([V(rng.uniform(-1, 1)) for _ in range(nin)], V(rng.uniform(-1, 1)))
                            for _ in range(nout)] for nin, nout in zip(sizes, sizes[1:])]

        def __call__(self, x):
            for layer in self.layers:
                x = [sum((wi * xi for wi, xi in zip(w, x)), b).th() for w, b in layer]
            return x[0]

        def parameters(self):
            return [p for layer in self.layers for w, b in layer for p in w + [b]]

    def th(self):
        e = math.exp(2 * self.data)
        t = (e - 1) / (e + 1)
        out = V(t, (self,), "tanh")

        def _backward():
            self.grad += (1 - t ** 2) * out.grad
        out._backward = _backward
        return out

    def ex(self):
        out = V(math.exp(self.data), (self,), "exp")

        def _backward():
            self.grad += out.data * out.grad
        out._backward = _backward
        return out
    V.th, V.ex = th, ex
    try:
        net = Net([3, 4, 4, 1])
        xs = [[2.0, 3.0, -1.0], [3.0, -1.0, 0.5], [0.5, 1.0, 1.0], [1.0, 1.0, -1.0]]
        ys = [1.0, -1.0, -1.0, 1.0]
        losses, kept = [], []
        for k in range(30):
            ypred = [net(x) for x in xs]
            loss = sum(((yp - y) ** 2 for y, yp in zip(ys, ypred)), V(0.0))
            loss = loss + ypred[0].ex() * 0.5
            for p in net.parameters():
                p.grad = 0.0
            loss.backward()
            if k % 10 == 0:
                loss.backward()
                kept.append(loss)
            for p in net.parameters():
                p.data += -0.05 * p.grad
            losses.append(loss.data)
            if k % 7 == 0:
                gc.collect()
        seen = {}
        stack = [kept[-1]]
        while stack:
            v = stack.pop()
            if id(v) not in seen:
                seen[id(v)] = v
                stack.extend(v._prev)
        return losses, [p.data for p in net.parameters()], len(seen), sorted({v._op for v in seen.values()})
    finally:
        del V.th, V.ex


def test_custom_ops_added_as_methods_train_as_on_the_reference_bit_for_bit():
    ours = _lecture_custom_training(Value)
    reference = _lecture_custom_training(RefValue)
    assert ours == reference
    assert ours[0][-1] < ours[0][0] / 2 and {"tanh", "exp"} <= set(ours[3])
    try:
        from micrograd.engine import Value as MicroValue
    except ImportError:
        return                 # micrograd comes with the test extra; the reference is the oracle
    theirs = _lecture_custom_training(MicroValue)
    assert ours[0] == pytest.approx(theirs[0], rel=1e-12, abs=1e-12)
    assert ours[1] == pytest.approx(theirs[1], rel=1e-12, abs=1e-12)
    assert ours[2] == theirs[2]
