"""A second independent attack, on the fixes of test_adversarial_public_api.py
(the rule watch on compiled programs, traced graphs refused, a Function's
apply-time partials, the smaller fixes).

First part: what it found, now fixed (each comment says what was observed
and what is expected).  Second part: attacks that held.  No test depends on
timing.
"""
import copy
import fractions
import os
import pickle
import random
import threading

import numpy as np
import pytest

import pygrad
from pygrad import Value, nn, optim
from pygrad import reference as R

from helpers import square_function


def _token_loss(w, kept=None):
    def loss_fn(tokens):
        s = Value(0.0)
        for t in tokens:
            v = pygrad.pick(w, t)
            if kept is not None:
                kept.append(v)
            s = s + v * v
        if kept is not None:
            kept.append(s)
        return s
    return loss_fn


# --- findings, fixed ------------------------------------------------------------------------------------

def test_refused_per_length_step_leaves_the_grads_as_they_were():
    # A per_length step refused because a node got a Python _backward after
    # compiling raises ValueError, but the optimizer's zero_grad() already ran:
    # the parameters' grads are wiped.  Program.map(grad=...) and train_step
    # leave everything as it was on the same refusal ("nothing changed").
    # Was: grads [0.0, 0.0, 0.0]; expected: [9.0, 9.0, 9.0].
    w = [Value(0.5), Value(-1.0), Value(2.0)]
    k = w[0] * w[1]                      # a kept interior Value used by the loss

    def loss_fn(tokens):
        s = k * 1.0
        for t in tokens:
            v = pygrad.pick(w, t)
            s = s + v * v
        return s
    opt = optim.SGD(w, lr=0.1)
    pl = pygrad.per_length(loss_fn, 3, opt)
    pl.step([0, 2])
    data = [p.data for p in w]
    for p in w:
        p.grad = 9.0
    k._backward = lambda: None
    with pytest.raises(ValueError, match="after the program was compiled"):
        pl.step([0, 2])
    assert [p.data for p in w] == data
    assert opt.steps == 1
    assert [p.grad for p in w] == [9.0, 9.0, 9.0]


def test_refused_per_length_step_with_own_optimizer_leaves_the_grads():
    # The same with an optimizer of one's own (zero_grad called before the
    # refused run).  Was: grads zeroed; expected: unchanged.
    w = [Value(0.5), Value(-1.0)]

    class Mine:
        def __init__(self, ps):
            self.ps = ps

        def zero_grad(self):
            for p in self.ps:
                p.grad = 0.0

        def step(self):
            for p in self.ps:
                p.data -= 0.1 * p.grad
    pl = pygrad.per_length(_token_loss(w), 2, Mine(w))
    pl.step([0, 1])
    w[1]._backward = lambda: w[0].__setattr__("grad", 1.0)   # a leaf hook: refused
    for p in w:
        p.grad = 5.0
    with pytest.raises(ValueError):
        pl.step([0, 1])
    assert [p.grad for p in w] == [5.0, 5.0]


def test_inputs_does_not_read_a_traced_leafs_number():
    # v.data of a per_length traced input is refused (its number is the
    # trace's), but pygrad.Inputs([leaf]).get() hands it out silently.
    # Was: array([1.]) (the last one-hot written); expected: ValueError
    # as leaf.data raises.
    toks = []
    w = [Value(0.5), Value(-1.0), Value(2.0)]

    def loss_fn(tokens):
        toks.append(tokens)
        return _token_loss(w)(tokens)
    pl = pygrad.per_length(loss_fn, 3)
    pl.loss([0])
    leaf = toks[0][0].onehot[0]
    with pytest.raises(ValueError):
        leaf.data
    with pytest.raises(ValueError):
        pygrad.Inputs([leaf]).get()


def test_lr_set_to_a_value_gets_a_clear_error():
    # opt.lr = Value(0.1) (same engine) is refused with "cannot mix Values of
    # different engines in one graph", which is not what went wrong (the lr
    # must be a number).  Expected: an error about lr only.
    opt = optim.SGD([Value(1.0)], lr=0.1)
    opt.lr = Value(0.1)
    with pytest.raises(TypeError) as e:
        opt.step()
    assert "different engines" not in str(e.value)


class _Sq(square_function()):     # (x * x; its forward and backward take Values too)
    differentiable = True


@pytest.mark.parametrize("d", [2, fractions.Fraction(1, 2)])
def test_reference_function_create_graph_with_non_float_data(d):
    # Regression of be00ecf (higher_order._function_grads compares
    # k.data.hex() with apply()'s numbers): a reference Value keeps whatever
    # number is assigned to .data (an int: `p.data = 2`), and int/Fraction
    # have no .hex().  pygrad.grad(F.apply(a), [a], create_graph=True) then
    # raises AttributeError: 'int' object has no attribute 'hex', where the
    # C engine gives [4.0] (resp. [1.0]).  The engines disagree; the data did
    # not even change since apply.  Expected: same as pygrad.Value.
    want = [g.data for g in pygrad.grad(_Sq.apply(_set(Value(1.0), d)), [_LAST[0]],
                                        create_graph=True)]
    a = _set(R.Value(1.0), d)
    o = _Sq.apply(a)
    assert [g.data for g in pygrad.grad(o, [a], create_graph=True)] == want


def test_reference_function_create_graph_data_set_to_equal_int_after_apply():
    # The same after apply: a.data = 2 (equal to apply's 2.0).  C engine:
    # [4.0]; reference: AttributeError instead of a result (or, were it
    # different, the documented ValueError).
    out = []
    for V in (Value, R.Value):
        a = V(2.0)
        o = _Sq.apply(a)
        a.data = 2
        out.append([g.data for g in pygrad.grad(o, [a], create_graph=True)])
    assert out[0] == out[1] == [4.0]
    a = R.Value(2.0)
    o = _Sq.apply(a)
    a.data = 3
    with pytest.raises(ValueError, match="changed its .data"):
        pygrad.grad(o, [a], create_graph=True)


_LAST = [None]


def _set(v, d):
    v.data = d
    _LAST[0] = v
    return v


# --- attacks that held ---------------------------------------------------------------------------

def _graph():
    a = Value(2.0)
    b = Value(3.0)
    c = a * b
    d = c + a
    return a, b, c, d, d.tanh()


@pytest.mark.parametrize("where", ["leaf", "interior"])
def test_program_refuses_after_hook_and_changes_nothing(where):
    a, b, c, d, e = _graph()
    p = pygrad.compile(e)
    a.grad = 4.0
    target = a if where == "leaf" else c
    target._backward = lambda: None if where == "interior" else b.__setattr__("grad", 1.0)
    with pytest.raises(ValueError, match="after the program was compiled"):
        p.backward()
    assert a.grad == 4.0 and b.grad == 0.0
    assert p.forward() == e.data            # forward still runs
    with pytest.raises(ValueError):
        p.backward()                        # refused again


def test_noop_on_a_leaf_keeps_the_program_running():
    a, b, c, d, e = _graph()
    p = pygrad.compile(e)
    a._backward = lambda: None
    p.backward()
    assert a.grad != 0.0


def test_hooks_on_copies_and_pickles_do_not_refuse_the_program():
    a, b, c, d, e = _graph()
    p = pygrad.compile(e)
    copy.copy(c)._backward = lambda: None
    copy.deepcopy(e)._backward = lambda: None
    pickle.loads(pickle.dumps(c))._backward = lambda: None
    p.backward()
    ref = Value(2.0)
    (((ref * 3.0) + ref).tanh()).backward()
    assert a.grad == ref.grad


def test_shared_nodes_refuse_both_programs_not_others():
    a, b, c, d, e = _graph()
    p1, p2 = pygrad.compile(e), pygrad.compile(c * 2.0)
    other = pygrad.compile(Value(1.0) * Value(2.0))
    c._backward = lambda: None
    for p in (p1, p2):
        with pytest.raises(ValueError):
            p.backward()
    other.backward()
    with pytest.raises(ValueError, match="cannot compile"):
        pygrad.compile(e)


def test_batch_map_and_train_step_refuse_and_change_nothing():
    w = Value(1.5)
    w2 = w * w                               # a subgraph of parameters only
    x = Value(0.0)
    y = (x * w2).tanh()
    p = pygrad.compile([y, x + w], inputs=[x])
    w.grad = 7.0
    w2._backward = lambda: None
    assert p.map(np.ones((2, 1))).shape == (2, 2)   # forward still runs
    with pytest.raises(ValueError):
        p.map(np.ones((2, 1)), grad=np.ones((2, 2)))
    opt = optim.SGD([w], lr=0.1)
    with pytest.raises(ValueError):
        p.train_step(np.ones((2, 1)), np.ones((2, 2)), opt)
    assert (w.data, w.grad, opt.steps) == (1.5, 7.0, 0)


def test_hook_on_an_input_leaf_refuses_map_grad():
    x, w = Value(0.0), Value(1.5)
    p = pygrad.compile(x * w, inputs=[x])
    x._backward = lambda: w.__setattr__("grad", w.grad + 100)
    with pytest.raises(ValueError):
        p.map(np.ones((1, 1)), grad=np.ones(1))
    assert w.grad == 0.0


@pytest.mark.parametrize("fused", [True, False])
def test_model_programs_refuse_after_a_parameter_hook(fused):
    random.seed(0)
    m = nn.MLP(2, [3, 1], fused=fused)
    xs = [Value(0.3), Value(-0.7)]
    out = m(xs)
    prog, single = pygrad.compile(out, inputs=xs), pygrad.compile(out)
    calls = []
    m.parameters()[0]._backward = lambda: calls.append(1)    # (a no-op would stay a C leaf)
    with pytest.raises(ValueError):
        prog.map(np.ones((1, 2)), grad=np.ones(1))
    with pytest.raises(ValueError):
        single.backward()


def test_compile_in_a_thread_while_another_sets_hooks():
    # Whatever the interleaving: a program that compiled over a hooked node
    # must refuse its backward.
    graphs = []
    for i in range(200):
        a = Value(float(i) / 200)
        b = a * 2.0
        graphs.append((a, b, b.exp() * a))
    progs = [None] * len(graphs)

    def compiler():
        for i, (_, _, c) in enumerate(graphs):
            try:
                progs[i] = pygrad.compile(c)
            except ValueError:
                progs[i] = "refused"

    def hooker():
        for i, (_, b, _) in enumerate(graphs):
            if i % 2 == 0:
                b._backward = lambda: None
    t1, t2 = threading.Thread(target=compiler), threading.Thread(target=hooker)
    t1.start(); t2.start(); t1.join(); t2.join()
    for i, p in enumerate(progs):
        if p == "refused":
            assert i % 2 == 0
        elif i % 2 == 0:
            with pytest.raises(ValueError):
                p.backward()
        else:
            p.backward()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_hook_in_forked_child_refuses_there_only():
    a = Value(2.0)
    b = a * a
    p = pygrad.compile(b)
    pid = os.fork()
    if pid == 0:
        b._backward = lambda: None
        try:
            p.backward()
            os._exit(1)
        except ValueError:
            os._exit(0)
        except BaseException:
            os._exit(2)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0
    p.backward()
    assert a.grad == 4.0


def test_per_length_noop_on_parameter_leaf_still_trains():
    w = [Value(0.5), Value(-1.0)]
    pl = pygrad.per_length(_token_loss(w), 2, optim.SGD(w, lr=0.1))
    pl.step([0, 1])
    w[0]._backward = lambda: None
    pl.step([0, 1])


def test_per_length_hook_refuses_step_loss_runs_new_length_refused():
    w = [Value(0.5), Value(-1.0)]
    k = w[0] * 1.0

    def loss_fn(tokens):
        return _token_loss(w)(tokens) + k
    pl = pygrad.per_length(loss_fn, 2, optim.SGD(w, lr=0.1))
    pl.step([0, 1])
    k._backward = lambda: None
    with pytest.raises(ValueError):
        pl.step([0, 1])
    assert pl.loss([0, 1]) == pytest.approx(w[0].data ** 2 + w[1].data ** 2 + w[0].data)
    with pytest.raises(ValueError, match="cannot compile"):
        pl.step([0, 1, 0])


def test_traced_graph_refused_everywhere_and_grads_unchanged():
    w = [Value(0.5), Value(-1.0), Value(2.0)]
    kept = []

    def loss_fn(tokens):
        v = pygrad.pick(w, tokens[0])
        kept.extend([v, pygrad.detached_max([v, w[1]]), Value(0.0, (v,), "c"),
                     pygrad.logsumexp([v, w[0]])])
        return v * v
    pl = pygrad.per_length(loss_fn, 3)
    pl.loss([2])
    x = Value(1.0)
    x.grad = 3.0
    for s in kept:
        with pytest.raises(ValueError):
            s.data
        with pytest.raises(ValueError):
            (s * x).backward()
        with pytest.raises(ValueError):
            pygrad.grad(s * x, [x])
        with pytest.raises(ValueError):
            pygrad.grad(s * x, [x], create_graph=True)
        with pytest.raises(ValueError):
            pygrad.hvp(lambda a: s * a * a, [1.0], [1.0])
        with pytest.raises(ValueError):
            pygrad.jvp(lambda a: s * a, [1.0], [1.0])
        with pytest.raises(ValueError):
            pygrad.compile(s * x)
        with pytest.raises(ValueError):
            pygrad.compile([x * 2.0, s], inputs=[x])
        with pytest.raises(ValueError):
            copy.copy(s)
    assert x.grad == 3.0 and all(p.grad == 0.0 for p in w)


@pytest.mark.parametrize("fused", [True, False])
def test_per_length_through_mlp_matches_eager(fused):
    random.seed(3)
    V = 4
    table = [[Value(random.uniform(-1, 1)) for _ in range(3)] for _ in range(V)]
    m = nn.MLP(3, [5, V], fused=fused)

    def lf(toks):
        tot = Value(0.0)
        for i in range(len(toks) - 1):
            logits = m(pygrad.embed(table, toks[i]))
            tot = tot - pygrad.pick(logits, toks[i + 1]) + pygrad.logsumexp(logits)
        return tot
    pl = pygrad.per_length(lf, V)
    for seq in ([0, 1, 2], [3, 3, 1], [2, 0, 3]):
        assert pl.loss(seq) == lf(seq).data


class _F(pygrad.Function):
    differentiable = True

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_values
        return (g * y * y, g * 2 * x * y)


def _fn_run(V, xs, change):
    a, b = V(xs[0]), V(xs[1])
    z = _F.apply(a, b) * a
    if change is not None:
        a.data = change
    g = pygrad.grad(z, [a, b])
    z.backward()
    return [float(v.data).hex() for v in g] + [a.grad.hex(), b.grad.hex()]


@pytest.mark.parametrize("xs", [(2.0, 3.0), (float("nan"), 1.0), (-0.0, -0.0), (0.0, float("inf")),
                                (1e308, 1e308), (3.0, -0.0)])
@pytest.mark.parametrize("change", [None, 5.0, float("nan"), -0.0])
def test_function_numeric_grads_agree_between_engines(xs, change):
    assert _fn_run(Value, xs, change) == _fn_run(R.Value, xs, change)


@pytest.mark.parametrize("V", [Value, R.Value])
def test_function_create_graph_refuses_changed_inputs(V):
    a, b = V(2.0), V(3.0)
    o = _F.apply(a, b)
    a.data = 2.5
    with pytest.raises(ValueError, match="changed its .data"):
        pygrad.grad(o, [a], create_graph=True)
    a.data = 2.0
    assert [g.data for g in pygrad.grad(o, [a], create_graph=True)] == [9.0]
    m = V(2.0)
    mid = m * 1.0
    o2 = _F.apply(mid, b)
    mid.data = 7.0
    with pytest.raises(ValueError):
        pygrad.grad(o2, [m], create_graph=True)
    assert [g.data for g in pygrad.grad(o2, [m])] == [9.0]
    n = V(float("nan"))
    o3 = _F.apply(n, b)
    assert [g.data for g in pygrad.grad(o3, [n], create_graph=True)] == [9.0]


@pytest.mark.parametrize("V", [Value, R.Value])
def test_function_copies_hvp_hessian_jvp(V):
    a, b = V(2.0), V(3.0)
    o = _F.apply(a, b)
    oc = copy.copy(o)
    assert [g.data for g in pygrad.grad(oc * o, [a, oc], create_graph=True)] == [162.0, 18.0]
    op = pickle.loads(pickle.dumps(o))
    assert [g.data for g in pygrad.grad(op * 2, [op], create_graph=True)] == [2.0]
    assert list(pygrad.hvp(lambda x, y: _F.apply(x, y), [2.0, 3.0], [1.0, 0.0])) == [0.0, 6.0]
    assert np.array(pygrad.hessian(lambda x, y: _F.apply(x, y), [2.0, 3.0])).tolist() == \
        [[0.0, 6.0], [6.0, 4.0]]
    assert tuple(pygrad.jvp(lambda x, y: _F.apply(x, y), [2.0, 3.0], [1.0, 0.0])) == (18.0, 9.0)


def test_tracked_list_init_reaches_fused_layer():
    random.seed(1)
    m = nn.MLP(2, [3, 1])
    x = [Value(1.0), Value(2.0)]
    m(x)
    for n in m.layers[0].neurons:
        n.w.__init__([Value(0.5), Value(0.25)])
    m.layers[1].neurons[0].w.__init__([Value(1.0)] * 3)
    want = sum(max(0.0, 1.0 + n.b.data) for n in m.layers[0].neurons) + m.layers[1].neurons[0].b.data
    assert m(x).data == pytest.approx(want)


def test_reference_copies_keep_subclass_slots():
    class RS(R.Value):
        __slots__ = ("tag", "__priv")

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.tag = "t"
            self.__priv = 5

        def priv(self):
            return self.__priv
    v = RS(2.0)
    v.grad = 3.0
    for c in (copy.copy(v), copy.deepcopy(v)):
        assert (type(c), c.data, c.grad, c.tag, c.priv()) == (RS, 2.0, 3.0, "t", 5)


@pytest.mark.parametrize("bad", [float("nan"), -1.0, float("inf"), "0.1", None])
def test_lr_validated_at_step(bad):
    p = Value(1.0)
    p.grad = 1.0
    opt = optim.SGD([p], lr=0.1)
    opt.lr = bad
    with pytest.raises((TypeError, ValueError)):
        opt.step()
    assert p.data == 1.0 and opt.steps == 0


@pytest.mark.parametrize("g", [1.0, np.float64(1.0), np.array(1.0), True])
def test_map_scalar_grad_refused(g):
    x, w = Value(0.0), Value(2.0)
    p = pygrad.compile(x * w, inputs=[x])
    with pytest.raises(ValueError, match=r"got shape \(\)"):
        p.map(np.array([[1.0]]), grad=g)
    assert w.grad == 0.0


def test_losses_refuse_value_targets_of_either_engine():
    from pygrad import losses
    for t in (Value(2.0), R.Value(2.0)):
        with pytest.raises(TypeError, match="not a Value"):
            losses.mse([Value(1.0)], [t])
    with pytest.raises(TypeError, match="not a Value"):
        losses.svm_hinge([Value(1.0)], [Value(1.0)])
    with pytest.raises(TypeError, match="not a Value"):
        losses.bce_with_logits([Value(1.0)], [Value(1.0)])


def test_predict_classes_shapes():
    from pygrad.boundary import predict_classes
    random.seed(0)
    pts = np.array([[0.1, 0.2], [1.0, -1.0], [-2.0, 0.5]])
    for outs in (1, 3):
        m = nn.MLP(2, [4, outs])
        assert predict_classes(m, pts).shape == (3,)
        assert predict_classes(m, np.zeros((0, 2))).shape == (0,)
        with pytest.raises(ValueError):
            predict_classes(m, np.array([0.1, 0.2]))
    mr = nn.MLP(2, [4, 3], engine="reference")
    assert predict_classes(mr, pts).shape == (3,)
    assert predict_classes(mr, np.zeros((0, 2))).shape == (0,)
