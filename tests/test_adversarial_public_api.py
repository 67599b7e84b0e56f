"""Public-API attacks on pygrad (an independent adversarial review), and the fixes.

The first part is what an independent attacker found wrong (each test's
comment says what it was); the second, attacks that held.  No test
depends on timing.
"""
import copy
import gc
import heapq
import random
import signal

import numpy as np
import pytest

import pygrad
from pygrad import Value, nn, optim
from pygrad import reference


needs_signals = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")


# --- findings, fixed (one strict xfail, with its reason) -----------------------------------------------------------------

@pytest.mark.xfail(strict=True, reason="heapq's C functions write a list subclass's items "
                   "directly, past the tracked list's methods; watching every list by its "
                   "items on each call would cost the fused step about half its speed. "
                   "Documented in docs/api.md with its remedy (assign the list again): "
                   "test_a_list_assigned_again_after_heapq_reaches_the_fused_layer")
def test_heapq_edit_of_a_neurons_weights_reaches_the_fused_layer():
    # (silently wrong number): heapq's C functions change a list
    # subclass through PyList_* directly, past _Tracked's overrides, so the
    # fused Layer's cache is never marked stale: after heapreplace puts a
    # new weight in neuron.w, the layer keeps computing (and sending
    # gradient to) the old weight, while the neuron's own list, parameters()
    # and an optimizer see the new one.
    random.seed(0)
    layer = nn.Layer(1, 2, nonlin=False)
    x = [Value(2.0)]
    layer(x)                                   # the fused cache is built
    new = Value(5.0)
    heapq.heapreplace(layer.neurons[0].w, new)  # one item: no comparison made
    assert layer.neurons[0].w[0] is new
    out = layer(x)[0]
    assert out.data == (new * 2.0 + layer.neurons[0].b).data   # got the old weight's
    out.backward()
    assert new.grad == 2.0                                     # got 0.0


def test_a_list_assigned_again_after_heapq_reaches_the_fused_layer():
    # docs/api.md's remedy for a change made around the list's methods
    random.seed(0)
    layer = nn.Layer(1, 2, nonlin=False)
    x = [Value(2.0)]
    layer(x)
    new = Value(5.0)
    n = layer.neurons[0]
    heapq.heapreplace(n.w, new)
    n.w = n.w
    out = layer(x)[0]
    assert out.data == (new * 2.0 + n.b).data
    out.backward()
    assert new.grad == 2.0


def test_list_init_of_a_neurons_weights_reaches_the_fused_layer():
    # Was a silently wrong number: list.__init__ refills a _Tracked list in
    # place without any tracked method: the fused layer keeps the old order.
    random.seed(0)
    layer = nn.Layer(2, 2, nonlin=False)
    layer([1.0, 2.0])
    ws = layer.neurons[0].w
    ws.__init__([ws[1], ws[0]])
    expected = (ws[0] * 1.0 + ws[1] * 2.0 + layer.neurons[0].b).data
    assert layer([1.0, 2.0])[0].data == expected


def test_backward_of_a_traced_loss_is_refused_as_its_data_and_grad_are():
    # Was (silently wrong number): a loss Value kept from a per_length trace
    # refuses .data (ValueError) and pygrad.grad refuses it (traced_error),
    # but .backward() runs: its interior numbers are the trace's (all-zero
    # one-hots), so it adds wrong gradients: W[1].grad 0.0, where the eager
    # graph of the same token gives -3.0.
    W = [Value(0.5), Value(-1.5)]
    kept = {}

    def loss_fn(tokens):
        x = pygrad.pick(W, tokens[0])
        kept["l"] = x * x + W[0]
        return kept["l"]

    train = pygrad.per_length(loss_fn, 2, optim.SGD(W, lr=0.1))
    assert train.loss([1]) == 2.75
    with pytest.raises(ValueError):
        kept["l"].data
    with pytest.raises(ValueError):
        pygrad.grad(kept["l"], W)
    with pytest.raises(ValueError):
        kept["l"].backward()            # runs, W grads [1.0, 0.0]


def test_a_program_compiled_inside_a_trace_cannot_read_its_numbers():
    # Was (baked number): while per_length traces, every read of a number
    # that depends on a token is refused (.data, Inputs.get, get_data,
    # pygrad.grad), but pygrad.compile(loss).forward() inside the loss
    # function returns one: the loss at all-zero one-hots (log 2 here),
    # which the loss function can then bake into the program.
    W = [Value(0.5), Value(-1.5)]
    seen = {}

    def loss_fn(tokens):
        logits = [pygrad.dot([W[0]], [t]) for t in tokens[0].onehot]
        loss = pygrad.logsumexp(logits)
        try:
            seen["number"] = pygrad.compile(loss).forward()
        except ValueError:
            seen["number"] = None
        return loss

    pygrad.per_length(loss_fn, 2).loss([1])
    assert seen["number"] is None, seen      # got 0.693... (log 2)


def test_reference_copies_keep_a_subclass_slots_as_c_copies_do():
    # Was (engines disagree): pygrad.Value's copy/deepcopy/pickle carry a
    # subclass's __slots__ (pygrad/_copies.state_of); reference.Value's
    # __copy__/__reduce_ex__ carry only __dict__, so the copy has no slot.
    class S(Value):
        __slots__ = ("tag",)

    class T(reference.Value):
        __slots__ = ("tag",)

    for C in (S, T):
        x = C(1.5)
        x.tag = "hi"
        assert copy.copy(x).tag == "hi", C                   # T: AttributeError
        assert copy.deepcopy(x).tag == "hi", C


def test_an_lr_set_to_a_bad_value_names_lr():
    # Was (unclear error): lr is checked (to_setting) at construction and
    # when a schedule returns it, but an lr assigned later (opt.lr = ..., as
    # a training loop lowers it) reaches C unchecked: the error is cffi's
    # bare "must be real number, not str", naming neither lr nor optimizer.
    a = Value(1.0)
    (a * a).backward()
    opt = optim.SGD([a], lr=0.1)
    opt.lr = "0.01"
    with pytest.raises((TypeError, ValueError), match="lr"):
        opt.step()


def test_a_scalar_grad_is_refused_for_one_row_as_for_two():
    # Was (inconsistent / unclear error): map(rows, grad=3.0) with one row
    # is taken as grad=[3.0] (np.ascontiguousarray makes a 0-d array 1-d),
    # but with two rows it is refused with "got shape (1,)", a shape the
    # caller never gave.
    a, b = Value(1.0), Value(2.0)
    p = pygrad.compile(a * b, inputs=[a])
    with pytest.raises(ValueError, match=r"shape \(2,\).*\(\)"):
        p.map([[1.0], [2.0]], grad=3.0)       # says: got shape (1,)
    with pytest.raises(ValueError):
        p.map([[1.0]], grad=3.0)              # accepted


def test_a_value_target_is_not_called_a_mix_of_engines():
    # Was (misleading error): a pygrad.Value given as an mse/bce target
    # (targets are numbers) is reported as "cannot mix Values of different
    # engines in one graph: got a pygrad.engine.Value", though predictions
    # and target are both pygrad.Values of the one engine.
    for loss in (pygrad.losses.mse, pygrad.losses.bce_with_logits):
        with pytest.raises(TypeError) as info:
            loss([Value(1.0)], [Value(3.0)])
        assert "different engines" not in str(info.value), str(info.value)


def test_a_backward_set_after_compile_is_not_silently_skipped_by_the_program():
    # Was (silently wrong number): compile() refuses a graph with a node
    # whose _backward was set in Python ("a program runs only C's rules"),
    # but a Program compiled *before* the _backward was set keeps replaying
    # the node's C rule: backward() and map(grad=...) give a.grad 3.0 where
    # the eager backward, running the closure, gives 100.0.  The program
    # should refuse to run (or run the closure).
    a, b = Value(2.0), Value(3.0)
    y = a * b
    z = y + 1
    p = pygrad.compile(z, inputs=[b])

    def _backward():
        a.grad += 100 * y.grad
    y._backward = _backward
    with pytest.raises(ValueError):
        pygrad.compile(z)                       # refused, as documented
    z.backward()
    assert a.grad == 100.0
    for run in (p.backward, lambda: p.map([[3.0]], grad=[1.0]),
                lambda: p.train_step([[3.0]], [1.0], optim.SGD([a], lr=0.1))):
        a.grad = 0.0
        with pytest.raises(ValueError, match="_backward set in Python after the program"):
            run()
        assert a.grad == 0.0 and a.data == 2.0    # nothing done
    assert p.forward() == 7.0                     # forward needs no gradient rule
    assert p.map([[3.0]]).tolist() == [7.0]


def test_a_hook_set_on_a_leaf_after_compile_is_not_skipped_either():
    a, b = Value(2.0), Value(3.0)
    p = pygrad.compile(a * b + 1, inputs=[b])
    a._backward = lambda: None          # micrograd's no-op default: nothing to skip
    p.backward()
    assert a.grad == 3.0
    a._backward = lambda: None.__class__   # a hook of its own
    with pytest.raises(ValueError, match="after the program was compiled"):
        p.backward()
    with pytest.raises(ValueError, match="after the program was compiled"):
        p.map([[3.0]], grad=[1.0])
    assert a.grad == 3.0


def test_predict_classes_of_no_points_and_of_a_bad_shape():
    # Was (unclear errors): boundary.predict_classes on an empty (0, 2)
    # array raises numpy's "cannot reshape array of size 0 into shape
    # (0,newaxis)" (it should return an empty array of classes), and on a
    # 1-d array of 3 numbers numpy's "cannot reshape array of size 3 into
    # shape (2)", not the "(n, 2) array of points" message grid() gives.
    from pygrad import boundary
    random.seed(0)
    model = nn.MLP(2, [4, 1])
    assert boundary.predict_classes(model, np.empty((0, 2))).shape == (0,)
    with pytest.raises(ValueError, match=r"\(n, 2\)"):
        boundary.predict_classes(model, [1.0, 2.0, 3.0])


# --- attacks that held ----------------------------------------------------------

def _cube(V, v):
    out = V(v.data ** 3, (v,), "x3")

    def _backward():
        v.grad += 3 * v.data ** 2 * out.grad
    out._backward = _backward
    return out


@needs_signals
def test_held_closure_mutating_data_calling_backward_and_a_signal_handler():
    # A custom op's closure changes a leaf's data mid-sweep, runs backward()
    # on other graphs, and raises a signal whose handler runs backward() on
    # a shared subgraph: both engines agree bit for bit.
    def run(V):
        a, b = V(1.5), V(-0.5)
        base = (a * b).tanh() + a
        e = a * a

        def handler(signum, frame):
            base.backward()
        old = signal.signal(signal.SIGUSR1, handler)
        try:
            c = _cube(V, base)
            inner = c._backward

            def _backward():
                inner()
                a.data = 10.0
                e.backward()
                signal.raise_signal(signal.SIGUSR1)
            c._backward = _backward
            r = c * b + b.exp()
            r.backward()
            r.backward()
        finally:
            signal.signal(signal.SIGUSR1, old)
        return a.grad, b.grad, base.grad, e.grad, a.data

    assert run(Value) == run(reference.Value)


def test_held_objects_faking_class_value_are_refused_everywhere():
    # An object whose __class__ property says Value passes isinstance: every
    # path refuses it with a TypeError/ValueError, none reaches C with it.
    class Fake:
        data, grad = 1.0, 0.0

        @property
        def __class__(self):
            return Value
    f = Fake()
    assert isinstance(f, Value)
    calls = [lambda: Value(1.0, (f,), "op"), lambda: Value(1.0, (f,), (1.0,)),
             lambda: Value(1.0) + f, lambda: Value(1.0) ** f, lambda: pygrad.dot([Value(1.0)], [f]),
             lambda: pygrad.sum([Value(1.0), f]), lambda: pygrad.logsumexp([Value(1.0), f]),
             lambda: optim.SGD([f]), lambda: pygrad.Inputs([f]), lambda: pygrad.compile(f),
             lambda: pygrad.compile(Value(1.0) * 2, inputs=[f]), lambda: pygrad.grad(f, [Value(1.0)]),
             lambda: pygrad.grad(Value(1.0) * 2, [f]), lambda: nn.MLP(1, [2, 1])([f]),
             lambda: nn.Layer(1, 2)([f])]
    for call in calls:
        with pytest.raises((TypeError, ValueError)):
            call()


@pytest.mark.parametrize("kind", ["sum", "dot", "lse", "function", "microgpt", "layer", "mlp"])
def test_held_a_closure_below_an_nary_or_fused_node_survives_collection(kind):
    # A C node given a Python _backward, whose Value no name holds, below an
    # n-ary, fused, Function or microgpt node: gc.collect() keeps it, and
    # backward() runs the closure.
    def build():
        a, b, c = Value(2.0), Value(3.0), Value(0.5)
        y = a * b

        def _backward():
            a.grad += 100 * y.grad
        y._backward = _backward
        random.seed(0)
        if kind == "sum":
            s = pygrad.sum([y, c])
        elif kind == "dot":
            s = pygrad.dot([y], [c])
        elif kind == "lse":
            s = pygrad.logsumexp([y, c])
        elif kind == "function":
            from helpers import square_function
            s = square_function().apply(y)
        elif kind == "microgpt":
            s = Value(1.0, (y,), (2.0,))
        elif kind == "layer":
            s = nn.Layer(1, 1, nonlin=False)([y])
        else:
            s = nn.MLP(1, [2, 1], fused=True)([y])
        return a, s             # y: held by s only
    a, s = build()
    gc.collect()
    s.backward()
    assert a.grad != 0.0


def test_held_programs_sharing_nodes_the_latest_forward_wins():
    # Two programs over one interior node: deferred write-back keeps the
    # numbers of the run made last, and backward reads the current data.
    a, b = Value(1.0), Value(2.0)
    m = a * b
    out_a, out_b = m + 1, m * 3
    pa, pb = pygrad.compile(out_a), pygrad.compile(out_b)
    a.data = 5.0
    pa.forward()
    a.data = 7.0
    pb.forward()
    assert (m.data, out_a.data, out_b.data) == (14.0, 11.0, 42.0)
    pa.backward()
    pb.backward()
    assert (m.grad, a.grad, b.grad) == (3.0, 8.0, 28.0)


def test_held_map_is_thread_count_independent_and_equals_forward_on_odd_rows():
    random.seed(3)
    x0, x1 = Value(0.0), Value(0.0)
    model = nn.MLP(2, [8, 8, 1])
    h = model([x0, x1])
    out = pygrad.sum([h, x1 ** 3, pygrad.logsumexp([x0, x1, h]),
                      pygrad.detached_max([x0, x1]) * x0, x0 ** x1, 2 ** x0, x1 / (x0 + 0.5),
                      (x0 * x0 + 1).log(), x0.exp().tanh()])
    params = model.parameters()
    p = pygrad.compile(out, inputs=[x0, x1])
    rows = np.random.default_rng(0).normal(size=(600, 2)) * 2
    rows[3:8] = [[0.0, 0.0], [-1.0, 0.5], [np.nan, 1.0], [np.inf, -np.inf], [-0.5, -0.0]]
    w = np.random.default_rng(1).normal(size=600)
    seen = []
    for threads in (1, 3, 8):
        p.threads = threads
        for q in params:
            q.grad = 0.0
        o = p.map(rows, w)
        seen.append((o.tobytes(), np.array([q.grad for q in params]).tobytes()))
    assert seen[0] == seen[1] == seen[2]
    single = pygrad.compile(out)
    o = p.map(rows)
    for i, r in enumerate(rows):
        x0.data, x1.data = r
        f = single.forward()
        assert np.array(f).tobytes() == o[i:i + 1].tobytes() or (np.isnan(f) and np.isnan(o[i]))
