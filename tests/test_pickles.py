"""Pickles made by earlier mains load and train as they would have.

tests/data/mlp-adam-sgd-main-<commit>.pkl were written by that commit of
main (a checkout built in place, running the script in this docstring's
last paragraph): a trained MLP(2, [3, 1]) with an Adam and an SGD
(momentum) over its parameters, its parameters' data and one output.
- 96e60f8: optimizer format 1 (C views named "_X_c"), model format 1
  (neurons without a backend);
- df7d620: formats 2 (backend pickled);
- 142930a: formats 2, the last main before pickles carried a format number.

The script: seed 7; model = nn.MLP(2, [3, 1]); Adam(lr=0.01) and
SGD(lr=0.05, momentum=0.9) over model.parameters(); for x in ([1, -2],
[0.5, 0.25]) each optimizer in turn: zero_grad, backward of
model(x)**2, step; pickle {version, model, adam, sgd, data, out} with
out = model([0.3, 0.7]).data, at protocol 4.
"""
import pathlib
import pickle

import numpy as np
import pytest

from pygrad import nn, optim

DATA = pathlib.Path(__file__).resolve().parent / "data"
PICKLES = sorted(DATA.glob("mlp-adam-sgd-main-*.pkl"))


def test_the_pickles_are_there():
    assert {p.stem.rsplit("-", 1)[1] for p in PICKLES} == {"96e60f8", "df7d620", "142930a"}


def _load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def _twin(old):
    """The same model and optimizers made by this pygrad, from the numbers."""
    model = nn.MLP(2, [3, 1])
    model.set_data(np.array(old["data"]))
    adam = optim.Adam(model.parameters(), lr=0.01)
    adam.m, adam.v = old["adam"].m.copy(), old["adam"].v.copy()
    adam.steps = old["adam"].steps
    sgd = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sgd.velocity = old["sgd"].velocity.copy()
    sgd.steps = old["sgd"].steps
    return model, adam, sgd


@pytest.mark.parametrize("path", PICKLES, ids=[p.stem for p in PICKLES])
def test_a_pickle_of_an_earlier_main_loads_and_trains_as_this_pygrad(path):
    old = _load(path)
    model = old["model"]
    assert [p.data for p in model.parameters()] == old["data"]
    assert model([0.3, 0.7]).data == old["out"]
    assert old["adam"].params == tuple(model.parameters())
    twin, twin_adam, twin_sgd = _twin(old)
    for m, adam, sgd in ((model, old["adam"], old["sgd"]), (twin, twin_adam, twin_sgd)):
        for x in ([0.2, -0.4], [1.5, 1.0]):
            for opt in (adam, sgd):
                opt.zero_grad()
                out = m(x)
                (out * out).backward()
                opt.step()
    assert [p.data for p in model.parameters()] == [p.data for p in twin.parameters()]
    # and it pickles again, in this format, to the same numbers
    again = pickle.loads(pickle.dumps(old))
    assert [p.data for p in again["model"].parameters()] == [p.data for p in model.parameters()]


def test_a_model_pickled_in_a_newer_format_names_both():
    model = nn.MLP(2, [3, 1])
    state = model.__getstate__()
    state["_format"] = nn.PICKLE_FORMAT + 1
    with pytest.raises(ValueError, match=f"format {nn.PICKLE_FORMAT + 1}, which pygrad"):
        nn.MLP.__new__(nn.MLP).__setstate__(state)
