"""A small training run shared by the memory and thread tests: micrograd's
moons MLP trained on random minibatches, on any of pygrad's tiers."""
import random
from typing import Callable, List, Optional, Tuple

import numpy as np

import pygrad
from pygrad import Value, data, nn, optim

TIERS = ("eager", "fused", "replay")


def moons_model(seed: int, tier: str) -> nn.MLP:
    """MLP(2, [16, 16, 1]) with weights from its own generator (the global
    ``random`` that nn.Neuron draws from is shared by threads)."""
    model = nn.MLP(2, [16, 16, 1], fused=tier != "eager")
    model.set_data(np.random.default_rng(seed).uniform(-1, 1, len(model.parameters())))
    return model


def hinge(scores: List[Value], labels: List[object]) -> Value:
    """micrograd's max-margin loss, with labels that may be Values (replay
    feeds each minibatch's labels as leaves)."""
    return pygrad.sum([(1 + -t * s).relu() for s, t in zip(scores, labels)]) * (1.0 / len(scores))


def train_moons(model: nn.MLP, seed: int, tier: str, steps: int, batch: int = 16,
                after_step: Optional[Callable[[int], None]] = None) -> Tuple[List[float], List[float]]:
    """SGD (even seeds, with momentum) or Adam (odd seeds) on minibatches:
    the graph is rebuilt every step (eager, fused), or compiled once and fed
    each minibatch through pygrad.Inputs (replay).  Returns the losses and
    the final parameters; after_step(k) runs after step k (1-based)."""
    X, y = data.make_moons(100, noise=0.1, seed=seed)
    labels = data.signed_labels(y)
    rng = random.Random(seed)
    params = model.parameters()
    opt = optim.Adam(params, lr=0.02) if seed % 2 else optim.SGD(params, lr=0.1, momentum=0.9)
    if tier == "replay":
        xs = data.to_values(X[:batch])
        targets = [Value(t) for t in labels[:batch]]
        inputs = pygrad.Inputs([v for row in xs for v in row] + targets)
        program = pygrad.compile(hinge([model(x) for x in xs], targets))
    history = []
    for k in range(1, steps + 1):
        idx = rng.sample(range(len(X)), batch)
        if tier == "replay":
            inputs.set(list(X[idx].ravel()) + list(labels[idx]))
            history.append(program.forward())
            opt.zero_grad()
            program.backward()
        else:
            loss = hinge([model(x) for x in data.to_values(X[idx])], labels[idx].tolist())
            opt.zero_grad()
            loss.backward()
            history.append(loss.data)
            del loss
        opt.step()
        if after_step is not None:
            after_step(k)
    return history, model.get_data().tolist()
