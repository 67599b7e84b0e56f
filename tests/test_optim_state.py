"""Optimizer state arrays (SGD.velocity, Adam.m, Adam.v) can never make the
C steps read or write out of bounds: every way in (assignment, copies,
pickles, older pickles) checks them, and the C steps check their lengths.
The sanitizer run (.ci/sanitize) runs this file too."""
import copy
import pickle

import numpy as np
import pytest

from pygrad import Value as C
from pygrad import nn
from pygrad._backend import backend_named
from pygrad.optim import PICKLE_FORMAT, SGD, Adam
from pygrad.reference import Value as R

STATES = [(SGD, dict(lr=0.1, momentum=0.9), "velocity"), (Adam, dict(lr=0.01), "m"),
          (Adam, dict(lr=0.01), "v")]
IDS = ["SGD.velocity", "Adam.m", "Adam.v"]


def _trained(Opt, kwargs, V=C, steps=3):
    params = [V(0.5), V(-1.5), V(2.0)]
    opt = Opt(params, **kwargs)
    for _ in range(steps):
        loss = (params[0] * params[1] + params[2] ** 2).tanh()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return params, opt


BAD = [
    (lambda n: np.zeros(1), ValueError, r"must have shape \(3,\), one value per parameter, not \(1,\)"),
    (lambda n: np.zeros(n + 5), ValueError, r"must have shape \(3,\)"),
    (lambda n: np.zeros((n, 1)), ValueError, r"not \(3, 1\)"),
    (lambda n: np.zeros(n, dtype=np.float32), TypeError, "must be a float64 array, not float32"),
    (lambda n: np.zeros(n, dtype=">f8"), TypeError, "must be a float64 array"),
    (lambda n: np.zeros(n, dtype=np.int64), TypeError, "not int64"),
    (lambda n: np.zeros(2 * n)[::2], ValueError, "must be contiguous"),
    (lambda n: np.frombuffer(bytes(8 * n), dtype=np.float64), ValueError, "must be writable"),
    (lambda n: [0.0] * n, TypeError, "must be a numpy float64 array of 3 values, not list"),
    (lambda n: None, TypeError, "not NoneType"),
]
BAD_IDS = ["one", "longer", "2-D", "float32", "big-endian", "int64", "strided", "read-only",
           "list", "None"]


@pytest.mark.parametrize("Opt,kwargs,name", STATES, ids=IDS)
@pytest.mark.parametrize("make,exc,message", BAD, ids=BAD_IDS)
def test_a_bad_state_array_is_refused_and_the_old_one_kept(Opt, kwargs, name, make, exc, message):
    params, opt = _trained(Opt, kwargs)
    before = getattr(opt, name).copy()
    with pytest.raises(exc, match=message):
        setattr(opt, name, make(3))
    np.testing.assert_array_equal(getattr(opt, name), before)
    opt.step()          # still steps with its own state


# what survives pickling as it is (a strided, read-only or big-endian array
# unpickles as a fresh contiguous, writable, native one)
NORMALISED = ("strided", "read-only", "big-endian")
PICKLED_BAD = [b for b, i in zip(BAD, BAD_IDS) if i not in NORMALISED]


@pytest.mark.parametrize("Opt,kwargs,name", STATES, ids=IDS)
@pytest.mark.parametrize("make,exc,message", PICKLED_BAD,
                         ids=[i for i in BAD_IDS if i not in NORMALISED])
def test_a_bad_state_array_in_a_pickle_is_refused(Opt, kwargs, name, make, exc, message):
    """A pickle holding only pygrad and numpy objects, tampered with, gives
    an exception on load, never a step out of bounds."""
    params, opt = _trained(Opt, kwargs)
    state = opt.__getstate__()
    state[name] = make(3)
    data = pickle.dumps((Opt, state))
    with pytest.raises(exc, match=message):
        cls, loaded = pickle.loads(data)
        cls.__new__(cls).__setstate__(loaded)


@pytest.mark.parametrize("Opt,kwargs,name", STATES, ids=IDS)
@pytest.mark.parametrize("make,exc,message", BAD, ids=BAD_IDS)
def test_a_bad_state_array_in_a_copy_is_refused(Opt, kwargs, name, make, exc, message):
    """copy.copy hands the state over as it is: checked the same way."""
    params, opt = _trained(Opt, kwargs)
    state = opt.__getstate__()
    state[name] = make(3)

    class Forged(Opt):
        def __getstate__(self):
            return state

    opt.__class__ = Forged
    with pytest.raises(exc, match=message):
        copy.copy(opt)


@pytest.mark.parametrize("Opt,kwargs,name", STATES, ids=IDS)
def test_an_assigned_state_array_is_the_one_the_next_step_uses(Opt, kwargs, name):
    """Assigning a fresh array (e.g. resetting momentum) takes effect, and a
    pickle made after it carries it: the copy steps exactly as the original."""
    params, opt = _trained(Opt, kwargs)
    fresh = np.full(3, 0.25)
    setattr(opt, name, fresh)
    assert getattr(opt, name) is fresh
    clone_params, clone = pickle.loads(pickle.dumps((params, opt)))
    twin_params, twin = copy.deepcopy((params, opt))
    for ps, o in ((params, opt), (clone_params, clone), (twin_params, twin)):
        o.step()
    assert not np.array_equal(fresh, np.full(3, 0.25))      # updated in place
    for ps in (clone_params, twin_params):
        assert [p.data for p in ps] == [p.data for p in params]
    np.testing.assert_array_equal(getattr(clone, name), fresh)


def test_resetting_velocity_is_the_same_as_a_new_optimizer():
    params, opt = _trained(SGD, dict(lr=0.1, momentum=0.9))
    twin = [C(p.data) for p in params]
    for p, t in zip(params, twin):
        t.grad = p.grad
    opt.velocity = np.zeros_like(opt.velocity)
    opt.step()
    SGD(twin, lr=0.1, momentum=0.9).step()
    assert [p.data for p in params] == [t.data for t in twin]


@pytest.mark.parametrize("V", [C, R], ids=["C", "reference"])
def test_the_reference_engine_checks_the_same_way(V):
    params, opt = _trained(Adam, dict(lr=0.01), V=V)
    with pytest.raises(ValueError, match="must have shape"):
        opt.m = np.zeros(1)


def test_the_c_steps_check_their_lengths_themselves():
    """Below pygrad.optim's checks: the C step refuses a short state array."""
    backend = backend_named("c")
    params = [C(1.0), C(2.0), C(3.0)]
    packed = backend.pack(params)
    short = np.zeros(2)
    steps = np.zeros(1)
    with pytest.raises(ValueError, match="shorter than its parameters"):
        backend.sgd_step(packed, 0.1, 0.9, 0.0, backend.buffer(short), backend.buffer(steps))
    with pytest.raises(ValueError, match="shorter than its parameters"):
        backend.adam_step(packed, 0.1, 0.9, 0.999, 1e-8, 0.0, 0.1, 0.001,
                          backend.buffer(np.zeros(3)), backend.buffer(short),
                          backend.buffer(steps))
    assert [p.data for p in params] == [1.0, 2.0, 3.0]
    assert steps[0] == 0.0          # a refused step does not count


def _older_pickle_state(opt, fmt):
    """The state an optimizer pickled by an earlier main carried: format 1
    named its C views in a "_views" list; format 2 pickled its backend."""
    state = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in opt.__getstate__().items()}
    del state["_format"]
    if fmt == 1:
        state["_views"] = [f"_{k}_c" for k in type(opt)._STATE]
    else:
        state["_backend"] = backend_named("c")
    return state


@pytest.mark.parametrize("fmt", [1, 2])
@pytest.mark.parametrize("Opt,kwargs", [(SGD, dict(lr=0.1, momentum=0.9)), (Adam, dict(lr=0.01))],
                         ids=["SGD", "Adam"])
def test_pickles_of_earlier_formats_load_and_step_the_same(Opt, kwargs, fmt):
    params, opt = _trained(Opt, kwargs)
    old = Opt.__new__(Opt)
    old.__setstate__(_older_pickle_state(opt, fmt))
    assert old.steps == opt.steps and old.params == opt.params
    expected = [p.data for p in params]
    state = {k: getattr(opt, k).copy() for k in Opt._STATE}
    opt.step()
    after = [p.data for p in params]
    for p, x in zip(params, expected):
        p.data = x
    for k, arr in state.items():
        setattr(opt, k, arr)
    old.step()
    assert [p.data for p in params] == after


def test_a_pickle_from_a_newer_format_names_both():
    params, opt = _trained(Adam, dict(lr=0.01))
    state = opt.__getstate__()
    state["_format"] = PICKLE_FORMAT + 1
    with pytest.raises(ValueError, match=f"format {PICKLE_FORMAT + 1}, which pygrad .* "
                                         f"\\(format {PICKLE_FORMAT}\\) can't read"):
        Adam.__new__(Adam).__setstate__(state)


def test_model_and_optimizer_pickle_together_and_train_identically():
    model = nn.MLP(2, [4, 1])
    opt = Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        model([1.0, -1.0]).backward()
        opt.step()
    model2, opt2 = pickle.loads(pickle.dumps((model, opt)))
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m([0.5, 2.0]).backward()
        o.step()
    assert [p.data for p in model.parameters()] == [p.data for p in model2.parameters()]


@pytest.mark.parametrize("V", [C, R], ids=["C", "ref"])
@pytest.mark.parametrize("Opt, kw", [(SGD, dict(lr=0.1, momentum=0.9)), (Adam, dict(lr=0.01))],
                         ids=["SGD", "Adam"])
def test_a_ctrl_c_as_the_step_returns_leaves_the_count_with_the_update(V, Opt, kw):
    """An interrupt that rises as the update returns (the C step is one call:
    Python raises a pending Ctrl-C just after it) finds the step counted,
    so Adam's bias corrections and lr schedules go on from the right step:
    one more step then matches a twin that was never interrupted."""
    import sys

    def make():
        ps = [V(0.5), V(-1.5), V(2.0)]
        for i, p in enumerate(ps):
            p.grad = 0.25 * (i + 1)
        return ps, Opt(ps, **kw)

    ps, opt = make()
    twin_ps, twin = make()
    names = {"sgd_step", "adam_step", "pg_sgd_step", "pg_adam_step"}

    def interrupt_on_return(frame, event, arg):
        if event == "c_return" and getattr(arg, "__name__", "") in names:
            raise KeyboardInterrupt
        if event == "return" and frame.f_code.co_name in names:
            raise KeyboardInterrupt

    sys.setprofile(interrupt_on_return)
    try:
        with pytest.raises(KeyboardInterrupt):
            opt.step()
    finally:
        sys.setprofile(None)
    twin.step()
    assert [p.data for p in ps] == [p.data for p in twin_ps]      # the update ran
    assert opt.steps == twin.steps == 1
    opt.step()
    twin.step()
    assert [p.data for p in ps] == [p.data for p in twin_ps]
    assert opt.steps == twin.steps == 2


def test_steps_can_be_set_and_survive_a_pickle():
    ps = [C(0.5), C(-1.5)]
    opt = Adam(ps, lr=0.01)
    opt.steps = 41
    opt.step()
    assert opt.steps == 42
    again = pickle.loads(pickle.dumps(opt))
    assert again.steps == 42
    assert copy.deepcopy(opt).steps == 42
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="steps must be an int"):
            opt.steps = bad
