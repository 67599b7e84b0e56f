"""microgpt-style code on pygrad (issue 52): the strict swap, microgpt's
``Value(data, children, local_grads)``, and the compiled path
(pygrad.per_length) against eager, on our own microgpt-style model
(tests/microgpt_style.py)."""
import gc
import math
import random
import sys

import pytest

import pygrad
from pygrad import reference
from pygrad._core import lib
from helpers import assert_same_doubles
from interrupts import PYGRAD_CODE, Interrupter
import microgpt_style as mg

SHAPE = mg.Shape()
DOCS = mg.documents(SHAPE, 12)


# -- the strict swap: microgpt's code, on pygrad.Value ------------------------

def test_swap_trains_as_the_reference_engine_bit_for_bit():
    got = mg.train_eagerly(pygrad.Value, SHAPE, DOCS, steps=4)
    want = mg.train_eagerly(reference.Value, SHAPE, DOCS, steps=4)
    assert_same_doubles(got[0], want[0], "loss")
    assert_same_doubles(got[1], want[1], "parameter")


def test_swap_samples_as_the_reference_engine():
    P, R = mg.make_params(pygrad.Value, SHAPE), mg.make_params(reference.Value, SHAPE)
    assert mg.sample(pygrad.Value, P, SHAPE, 3, 5) == mg.sample(reference.Value, R, SHAPE, 3, 5)


# -- Value(data, children, local_grads) ---------------------------------------

def microgpt_value(base):
    """A Value class written as microgpt writes its own, over ``base``: every
    op is ``V(data, children, local_grads)``."""

    class V(base):
        def __add__(self, other):
            other = other if isinstance(other, V) else V(other)
            return V(self.data + other.data, (self, other), (1, 1))

        def __mul__(self, other):
            other = other if isinstance(other, V) else V(other)
            return V(self.data * other.data, (self, other), (other.data, self.data))

        def __pow__(self, k):
            return V(self.data ** k, (self,), (k * self.data ** (k - 1),))

        def log(self):
            return V(math.log(self.data), (self,), (1 / self.data,))

        def exp(self):
            return V(math.exp(self.data), (self,), (math.exp(self.data),))

        def relu(self):
            return V(max(0, self.data), (self,), (float(self.data > 0),))

        def __neg__(self):
            return self * -1

        def __radd__(self, other):
            return self + other

        def __sub__(self, other):
            return self + (-other)

        def __rsub__(self, other):
            return other + (-self)

        def __rmul__(self, other):
            return self * other

        def __truediv__(self, other):
            return self * other ** -1

        def __rtruediv__(self, other):
            return other * self ** -1

    return V


def test_local_grads_values_train_as_the_reference_engine():
    got = mg.train_eagerly(microgpt_value(pygrad.Value), SHAPE, DOCS, steps=3)
    want = mg.train_eagerly(microgpt_value(reference.Value), SHAPE, DOCS, steps=3)
    assert_same_doubles(got[0], want[0], "loss")
    assert_same_doubles(got[1], want[1], "parameter")


def test_local_grads_values_backpropagate_in_c_to_finite_differences():
    V = microgpt_value(pygrad.Value)

    def f(x, y):
        return ((x * y + x ** 3) / (y.exp() + 1)).log() - x.relu()

    x, y = V(0.7), V(-0.4)
    out = f(x, y)
    assert type(out) is V and lib.pg_describe_v(id(out)) & 0xFF == lib.PG_OP_FUNCTION
    out.backward()
    h = 1e-6
    for v, other, first in ((x, y, True), (y, x, False)):
        def at(d):
            a, b = (V(v.data + d), V(other.data)) if first else (V(other.data), V(v.data + d))
            return f(a, b).data
        assert v.grad == pytest.approx((at(h) - at(-h)) / (2 * h), rel=1e-6)


def test_children_and_local_grads_read_as_microgpts():
    a, b = pygrad.Value(2.0), pygrad.Value(-3.0)
    made = pygrad.Value(6.5, (a, b), (0.25, 4))
    assert made._children == (a, b) and made._local_grads == (0.25, 4.0)
    assert made._op == "" and made._prev == {a, b}
    cases = {                      # op -> (children, d self / d child)
        "a + b": (a + b, (a, b), (1.0, 1.0)),
        "a * b": (a * b, (a, b), (-3.0, 2.0)),
        "a * a": (a * a, (a, a), (2.0, 2.0)),
        "a - b": (a - b, (a, b), (1.0, -1.0)),
        "a / b": (a / b, (a, b), (1 / -3.0, -2.0 / 9.0)),
        "a ** 3": (a ** 3, (a,), (12.0,)),
        "a.exp()": (a.exp(), (a,), (math.exp(2.0),)),
        "b.relu()": (b.relu(), (b,), (0.0,)),
        "dot": (pygrad.dot([a, b], [b, a]), (a, b, b, a), (-3.0, 2.0, 2.0, -3.0)),
    }
    for name, (v, kids, grads) in cases.items():
        assert v._children == kids, name
        assert v._local_grads == pytest.approx(grads, rel=1e-15), name
    k = a * 2.0                    # the number's leaf is a child, as micrograd's Value(2.0)
    assert k._children[0] is a and k._children[1].data == 2.0 and k._local_grads == (2.0, 2.0)
    assert a._children == () and a._local_grads == ()


def test_a_custom_ops_local_grads_are_its_closures():
    a = pygrad.Value(1.0)
    out = pygrad.Value(2.0, (a,), "double")
    with pytest.raises(AttributeError, match="Python closure"):
        out._local_grads


def test_a_subclass_that_sets_children_keeps_them():
    class Mine(pygrad.Value):
        def __init__(self, data, children=(), note=""):
            super().__init__(data)
            self._children = tuple(children)

    m = Mine(1.0, ["x"])
    assert m._children == ("x",)


@pytest.mark.parametrize("bad, error, match", [
    ((1, 2, 3), ValueError, "3 local gradient"),
    (("x", 1), TypeError, "real number"),
    (7, TypeError, "op name"),
    ((None, 1), TypeError, "real number"),
])
@pytest.mark.parametrize("engine", [pygrad, reference], ids=["c", "reference"])
def test_bad_local_grads_say_what_to_give(engine, bad, error, match):
    a, b = engine.Value(1.0), engine.Value(2.0)
    with pytest.raises(error, match=match):
        engine.Value(3.0, (a, b), bad)


# -- the compiled path: one program per length ---------------------------------

def compiled(shape=SHAPE, lr=0.05, steps=100):
    P = mg.make_params(pygrad.Value, shape)
    params = mg.flat(P)
    adam = pygrad.optim.Adam(params, lr=lambda t: lr * (1 - t / steps), betas=(0.85, 0.99),
                             eps=1e-8)
    train = pygrad.per_length(lambda toks: mg.sequence_loss(P, shape, mg.traceable(), toks),
                              shape.vocab, adam)
    return P, params, adam, train


def eager_with_adam(docs, steps, lr=0.05):
    """The same training, eagerly, with the same C Adam."""
    P = mg.make_params(pygrad.Value, SHAPE)
    params = mg.flat(P)
    adam = pygrad.optim.Adam(params, lr=lambda t: lr * (1 - t / steps), betas=(0.85, 0.99),
                             eps=1e-8)
    losses = []
    for step in range(steps):
        adam.zero_grad()
        loss = mg.sequence_loss(P, SHAPE, mg.AS_MICROGPT, docs[step % len(docs)])
        loss.backward()
        adam.step()
        losses.append(loss.data)
    return losses, [p.data for p in params]


def test_compiled_training_equals_eager():
    """The forward numbers are eager's bit for bit; a parameter's gradient
    gets the same terms, summed in another order (through the one-hot
    picks), so training drifts by rounding only."""
    steps = 12
    _, params, _, train = compiled(steps=steps)
    losses = [train.step(DOCS[s % len(DOCS)]) for s in range(steps)]
    want_losses, want_params = eager_with_adam(DOCS, steps)
    assert losses[0] == want_losses[0]
    assert losses == pytest.approx(want_losses, rel=1e-12)
    assert [p.data for p in params] == pytest.approx(want_params, rel=1e-12, abs=1e-15)


def test_compiled_training_follows_microgpts_python_adam():
    steps = 8
    _, params, _, train = compiled(steps=steps)
    losses = [train.step(DOCS[s % len(DOCS)]) for s in range(steps)]
    want_losses, want_params = mg.train_eagerly(pygrad.Value, SHAPE, DOCS, steps)
    assert losses == pytest.approx(want_losses, rel=1e-12)
    assert [p.data for p in params] == pytest.approx(want_params, rel=1e-12, abs=1e-15)


def test_every_length_from_1_to_16_positions_compiles_once_and_equals_eager():
    P, _, _, train = compiled()
    rng = random.Random(5)
    for n in range(1, 17):
        ids = [rng.randrange(SHAPE.vocab) for _ in range(n + 1)]
        eager = mg.sequence_loss(P, SHAPE, mg.AS_MICROGPT, ids).data
        assert train.loss(ids) == eager, n
    assert train.lengths == list(range(2, 18))
    ids = [1, 2, 3]
    assert train.loss(ids) == mg.sequence_loss(P, SHAPE, mg.AS_MICROGPT, ids).data
    assert train.lengths == list(range(2, 18))          # no new program


def test_reading_data_while_tracing_raises_and_says_what_to_change():
    P, _, _, _ = compiled()
    baked = pygrad.per_length(lambda toks: mg.sequence_loss(P, SHAPE, mg.Picks(
        row=pygrad.embed, item=pygrad.pick, shift=mg.AS_MICROGPT.shift), toks), SHAPE.vocab)
    with pytest.raises(ValueError, match=r"v\.data was read while pygrad.per_length traces "
                                         r"the loss.*detached_max"):
        baked.loss([1, 2, 3])
    assert baked.lengths == []
    p = P["tokens"][0][0]
    for touch in (lambda: p.data, lambda: p.grad, lambda: setattr(p, "data", 1.0),
                  lambda: setattr(p, "grad", 0)):
        # a parameter's number too: read or set once, not on every run
        with pytest.raises(ValueError, match="traces the loss"):
            pygrad.per_length(lambda toks, t=touch: t() or pygrad.pick(column(P, 0), toks[1]),
                              SHAPE.vocab).loss([1, 2])
    assert p.data == p.data and p.grad == 0.0          # and outside, as ever
    x = pygrad.embed(P["tokens"], pygrad.Token(pygrad._node_factory.make_leaves([0.0] * SHAPE.vocab)))
    assert x[0].data == 0.0          # a Token made by hand is no traced input


def column(P, j):
    """One Value per token id: column j of the output layer."""
    return [row[j] for row in P["out"]]


def test_a_value_kept_from_a_trace_can_neither_be_read_nor_reused():
    P, _, _, _ = compiled()
    kept = {}

    def loss(toks):
        kept.setdefault("x", pygrad.pick(column(P, 0), toks[0]))
        return kept["x"] * pygrad.pick(column(P, 1), toks[-1])

    train = pygrad.per_length(loss, SHAPE.vocab)
    assert train.loss([2, 3]) == P["out"][2][0].data * P["out"][3][1].data
    with pytest.raises(ValueError, match="depends on a traced program's input"):
        kept["x"].data
    with pytest.raises(ValueError, match="depends on a traced program's input"):
        kept["x"]._local_grads
    assert repr(kept["x"]) == "Value(traced)"
    with pytest.raises(ValueError, match="7 input.*of another trace"):
        train.loss([2, 3, 4])          # the kept Value belongs to the 2-token trace
    other = pygrad.per_length(lambda toks: kept["x"] * 1.0, SHAPE.vocab)
    with pytest.raises(ValueError, match="another trace"):
        other.loss([0, 1])


def test_a_token_free_value_kept_from_a_trace_keeps_the_numbers_it_was_made_with():
    """A Value made in the traced call from the parameters only (no token)
    can be read: it is a Value of that call, and keeps its numbers as a
    micrograd Value does (the program's later runs don't write it)."""
    from pygrad.optim import SGD
    w = [pygrad.Value(0.3), pygrad.Value(-0.2)]
    kept = []

    def loss(toks):
        reg = w[0] * w[0] + w[1] * w[1]
        kept.append(reg)
        return pygrad.sum([pygrad.pick(w, t) for t in toks]) + reg

    train = pygrad.per_length(loss, 2, SGD(w, lr=0.1))
    train.step([0, 1])
    made = kept[0].data
    assert made == (pygrad.Value(0.3) * 0.3 + pygrad.Value(-0.2) * -0.2).data
    train.step([1, 0])
    train.step([0, 1])
    assert len(kept) == 1 and w[0].data != 0.3          # traced once; w stepped
    assert kept[0].data == made and kept[0].grad == 0.0
    assert (kept[0] * 2).data == made * 2               # and usable eagerly


@pytest.mark.parametrize("use", [lambda t: t == 0, lambda t: t != 1, lambda t: t < 2,
                                 lambda t: bool(t), lambda t: int(t), lambda t: [5, 6][t],
                                 lambda t: 3 in [t]])
def test_tokens_cant_be_compared_or_branched_on(use):
    P, _, _, _ = compiled()
    loss = pygrad.per_length(lambda toks: use(toks[0]) or pygrad.pick(column(P, 0), toks[1]),
                             SHAPE.vocab)
    with pytest.raises(TypeError, match="can't index, compare or branch"):
        loss.loss([0, 1])


def test_tokens_are_no_ints_while_tracing():
    P, _, _, _ = compiled()
    as_index = pygrad.per_length(lambda toks: mg.sequence_loss(P, SHAPE, mg.AS_MICROGPT, toks),
                                 SHAPE.vocab)
    with pytest.raises(TypeError, match="pygrad.embed"):
        as_index.loss([1, 2])
    assert len({pygrad.Token([]), pygrad.Token([])}) == 2       # hashed by identity


@pytest.mark.parametrize("ids, match", [([], "no tokens"), ([0, SHAPE.vocab], "range"),
                                        ([0, -1], "range"), ([0, 1.0], "range"),
                                        ([True, 1], "range")])
def test_bad_token_ids_say_what_to_give(ids, match):
    _, _, _, train = compiled()
    with pytest.raises(ValueError, match=match):
        train.step(ids)


def test_bad_loss_functions_say_what_is_wrong():
    with pytest.raises(TypeError, match="pygrad.Value"):
        pygrad.per_length(lambda toks: 1.0, 3).loss([0, 1])
    with pytest.raises(ValueError, match="vocab"):
        pygrad.per_length(lambda toks: toks, 0)
    with pytest.raises(TypeError, match="optimizer"):
        pygrad.per_length(lambda toks: pygrad.Value(1.0), 3).step([0, 1])
    custom = pygrad.per_length(
        lambda toks: pygrad.Value(1.0, (pygrad.embed([[pygrad.Value(1.0)]] * 3, toks[0])[0],), "mine"),
        3)
    with pytest.raises(ValueError, match="cannot compile"):
        custom.loss([0, 1])


def state(params, adam):
    return [p.data for p in params], list(adam.m), list(adam.v), adam.steps


@pytest.mark.parametrize("stage", ["trace", "replay"])
def test_ctrl_c_anywhere_in_a_step_leaves_it_done_or_not_done(stage):
    """A KeyboardInterrupt at every Python event of step()'s own code and
    the optimizer's (the ops a trace runs are fuzzed in test_fuzz.py): the
    parameters, Adam's state and its step count are all as before the step
    or all as after it, and training goes on to the uninterrupted run's
    numbers."""
    shape = mg.Shape(vocab=4, width=4, context=4, heads=1)     # (small: one trace per event)
    docs = [[3, 0, 1, 3], [3, 2, 3], [3, 0, 1, 3]]
    _, params, adam, train = compiled(shape)
    clean = [state(params, adam)]
    clean_losses = []
    for d in docs:
        clean_losses.append(train.step(d))
        clean.append(state(params, adam))

    where = (PYGRAD_CODE + "token_programs.py", PYGRAD_CODE + "optim.py",
             PYGRAD_CODE + "_backend.py", PYGRAD_CODE + "_lifetime.py")
    events = Interrupter(None, prefixes=where)
    _, params, adam, train = compiled(shape)
    if stage == "replay":
        train.step(docs[0])
    sys.settrace(events)
    try:
        train.step(docs[1] if stage == "replay" else docs[0])
    finally:
        sys.settrace(None)
    assert events.events > 10
    first = 1 if stage == "replay" else 0
    for n in range(1, events.events + 1):
        _, params, adam, train = compiled(shape)
        for d in docs[:first]:
            train.step(d)
        hit = Interrupter(n, prefixes=where)
        sys.settrace(hit)
        try:
            train.step(docs[first])
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        assert gc.isenabled(), hit.fired          # (a trace pauses it: call_paused)
        now = state(params, adam)
        assert now in (clean[first], clean[first + 1]), hit.fired
        done = now[3]
        # training goes on: the next step gives the clean run's numbers
        loss = train.step(docs[done])
        assert loss == clean_losses[done], hit.fired
        assert state(params, adam) == clean[done + 1], hit.fired


def test_programs_hold_no_values_for_the_collector():
    _, _, _, train = compiled()
    gc.collect()
    before = len(gc.get_objects())
    for n in (3, 5, 9):
        train.loss([i % SHAPE.vocab for i in range(n)])
    gc.collect()
    assert len(gc.get_objects()) - before < 200          # (thousands of nodes each)
    assert train.lengths == [3, 5, 9]


def test_a_trace_pauses_the_collector_and_gives_it_back_whatever_happens():
    from pygrad.token_programs import _call_tracing
    seen = []
    assert _call_tracing(lambda x: seen.append(gc.isenabled()) or x * 2, 21) == 42
    assert seen == [False] and gc.isenabled()

    def interrupted(_):
        raise KeyboardInterrupt("in the traced function")

    with pytest.raises(KeyboardInterrupt, match="in the traced function"):
        pygrad.per_length(interrupted, 3).loss([0, 1])
    assert gc.isenabled()
    gc.disable()
    try:
        assert _call_tracing(lambda x: gc.isenabled(), None) is False
        assert not gc.isenabled()            # left as it was: off
    finally:
        gc.enable()
    with pytest.raises(TypeError):
        _call_tracing(len)


def test_op_functions_take_floats_and_ints_only():
    make_k = pygrad.engine._op_function(lib.PG_OP_MUL, lib.PG_FORM_K)
    v = pygrad.Value(2.0)
    assert make_k(pygrad.Value, v, 3).data == 6.0 and make_k(pygrad.Value, v, 0.5).data == 1.0
    assert make_k(pygrad.Value, v, 10 ** 400) is None      # (the operator's slow path says why)

    class Loud:
        def __float__(self):
            raise KeyboardInterrupt

    for bad in ("x", 1j, v, Loud(), True):
        with pytest.raises(TypeError, match="must be a float or an int"):
            make_k(pygrad.Value, v, bad)
    assert (v * True).data == 2.0 and (v * 10 ** 0).data == 2.0


def test_children_given_as_a_numpy_array():
    np = pytest.importorskip("numpy")
    a, b = pygrad.Value(1.0), pygrad.Value(2.0)
    for engine in (pygrad, reference):
        a, b = engine.Value(1.0), engine.Value(2.0)
        out = engine.Value(1.0, np.array([a, b], dtype=object), (1.0, 2.0))
        out.backward()
        assert (a.grad, b.grad) == (1.0, 2.0)
        assert engine.Value(3.0, np.array([], dtype=object))._prev == set()


def test_compile_names_microgpts_nodes():
    a = pygrad.Value(1.0)
    with pytest.raises(ValueError, match=r"Value\(data, children, local_grads\)"):
        pygrad.compile(pygrad.Value(2.0, (a,), (3.0,)) * 2)


def test_threads_share_a_per_length_one_step_at_a_time():
    import threading
    _, params, _, train = compiled(steps=40)
    errors = []

    def work(k):
        try:
            for s in range(10):
                train.step(DOCS[(k + s) % len(DOCS)])
        except Exception as e:         # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and train.optimizer.steps == 40
    assert all(math.isfinite(p.data) for p in params)


def test_a_per_length_says_it_cant_be_pickled():
    import copy
    import pickle
    _, _, _, train = compiled()
    for attempt in (pickle.dumps, copy.deepcopy):
        with pytest.raises(TypeError, match="can't be pickled"):
            attempt(train)


# -- per_length's lock: held over C calls and the optimizer, never over the
# -- loss function; a forked child and a re-entrant call neither hang

def test_the_loss_function_runs_with_no_lock_held():
    """A loss function that waits for another thread's call of the same
    per_length (another length) finishes: tracing takes no lock."""
    import threading
    P, _, _, _ = compiled()
    done = []

    def loss(toks):
        if len(toks) == 2 and not done:
            t = threading.Thread(target=lambda: done.append(train.loss([1, 2, 3])))
            t.start()
            t.join(120)
        return pygrad.pick(column(P, 0), toks[0]) * pygrad.pick(column(P, 1), toks[-1])

    train = pygrad.per_length(loss, SHAPE.vocab)
    assert train.loss([2, 3]) == P["out"][2][0].data * P["out"][3][1].data
    assert done == [P["out"][1][0].data * P["out"][3][1].data]
    assert train.lengths == [2, 3]


@pytest.mark.parametrize("own", [False, True])
def test_a_schedule_or_optimizer_that_calls_its_per_length_works(own):
    """The lr schedule (SGD's) and your own optimizer's methods run with no
    lock held: calling the same per_length from them neither hangs nor
    raises."""
    P, _, _, _ = compiled()
    params = [v for row in P["out"] for v in row]
    seen = []

    def schedule(step):
        seen.append(train.loss([1, 2]))
        return 0.01

    class Mine(pygrad.optim.SGD):
        def step(self):
            seen.append(train.loss([1, 2]))
            super().step()

    opt = (Mine if own else pygrad.optim.SGD)(params, lr=0.01 if own else schedule)
    train = pygrad.per_length(lambda toks: pygrad.pick(column(P, 0), toks[0]) * 1.0,
                              SHAPE.vocab, opt)
    before = P["out"][2][0].data
    assert train.step([2, 5]) == before
    assert seen == [P["out"][1][0].data] and P["out"][2][0].data == before - 0.01
    now = P["out"][2][0].data
    assert train.step([2, 5]) == now and P["out"][2][0].data == now - 0.01   # it goes on
    assert opt.steps == 2


def test_a_forked_child_uses_a_per_length_whose_lock_was_held():
    from helpers import run_python
    out = run_python("""
        import os
        import pygrad
        from pygrad import Value
        P = [Value(0.5 + i) for i in range(4)]
        train = pygrad.per_length(lambda toks: pygrad.pick(P, toks[0]) * 2.0, 4)
        want = train.loss([3])
        with train._lock.free():          # as a step running in another thread
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = 0 if train.loss([3]) == want else 2
                finally:
                    os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.WEXITSTATUS(status))
    """)
    assert out.strip().splitlines()[-1] == "0"
