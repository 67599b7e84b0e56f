"""A small GPT on scalar Values, written the way Karpathy's microgpt.py is
written (our own code, not the gist): token and position embedding rows
picked by index, multi-head attention over a growing key/value cache,
rmsnorm, a ReLU MLP, a softmax shifted by the largest logit's number, one
sequence per step and Adam as a plain Python loop over ``.data``/``.grad``.

Every function takes the engine's ``Value`` class (or the model's
parameters) so the same code runs on pygrad.Value, pygrad.reference.Value
and a microgpt-style subclass; ``Picks`` says how rows and the softmax's
shift are taken: by Python indexing and ``max(v.data ...)`` as microgpt
does, or with pygrad's traceable ``embed``/``pick``/``detached_max``.
"""
import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, List


@dataclass(frozen=True)
class Shape:
    vocab: int = 7
    width: int = 8
    context: int = 17
    heads: int = 2


@dataclass(frozen=True)
class Picks:
    row: Callable[[Any, Any], Any]          # table, token -> row
    item: Callable[[Any, Any], Any]         # values, token -> value
    shift: Callable[[Any], Any]             # logits -> the softmax's shift


AS_MICROGPT = Picks(row=lambda table, t: table[t], item=lambda values, t: values[t],
                    shift=lambda zs: max(z.data for z in zs))


def traceable() -> Picks:
    import pygrad
    return Picks(row=pygrad.embed, item=pygrad.pick, shift=pygrad.detached_max)


def make_params(Value: Any, shape: Shape, seed: int = 0) -> Dict[str, List[List[Any]]]:
    rng = random.Random(seed)

    def grid(rows: int, cols: int) -> List[List[Any]]:
        return [[Value(rng.gauss(0.0, 0.2)) for _ in range(cols)] for _ in range(rows)]

    w = shape.width
    return {"tokens": grid(shape.vocab, w), "places": grid(shape.context, w),
            "query": grid(w, w), "key": grid(w, w), "value": grid(w, w), "mix": grid(w, w),
            "up": grid(2 * w, w), "down": grid(w, 2 * w), "out": grid(shape.vocab, w)}


def flat(params: Dict[str, List[List[Any]]]) -> List[Any]:
    return [p for grid in params.values() for row in grid for p in row]


def matvec(w: List[List[Any]], x: List[Any]) -> List[Any]:
    return [sum(wij * xj for wij, xj in zip(row, x)) for row in w]


def normed(x: List[Any]) -> List[Any]:
    scale = (sum(xi * xi for xi in x) / len(x) + 1e-5) ** -0.5
    return [xi * scale for xi in x]


def softmax(zs: List[Any], picks: Picks) -> List[Any]:
    top = picks.shift(zs)
    es = [(z - top).exp() for z in zs]
    total = sum(es)
    return [e / total for e in es]


def next_logits(P: Dict[str, Any], shape: Shape, picks: Picks, token: Any, place: int,
                keys: List[Any], vals: List[Any]) -> List[Any]:
    x = [a + b for a, b in zip(picks.row(P["tokens"], token), P["places"][place])]
    x = normed(x)
    skip = x
    h = normed(x)
    q, k, v = matvec(P["query"], h), matvec(P["key"], h), matvec(P["value"], h)
    keys.append(k)
    vals.append(v)
    d = shape.width // shape.heads
    mixed: List[Any] = []
    for head in range(shape.heads):
        lo = head * d
        scores = [sum(q[lo + j] * kt[lo + j] for j in range(d)) / math.sqrt(d) for kt in keys]
        weights = softmax(scores, picks)
        mixed += [sum(weights[t] * vals[t][lo + j] for t in range(len(vals))) for j in range(d)]
    x = [a + b for a, b in zip(matvec(P["mix"], mixed), skip)]
    skip = x
    h = [u.relu() for u in matvec(P["up"], normed(x))]
    x = [a + b for a, b in zip(matvec(P["down"], h), skip)]
    return matvec(P["out"], x)


def sequence_loss(P: Dict[str, Any], shape: Shape, picks: Picks, tokens: List[Any]) -> Any:
    keys: List[Any] = []
    vals: List[Any] = []
    losses = []
    for place in range(len(tokens) - 1):
        probs = softmax(next_logits(P, shape, picks, tokens[place], place, keys, vals), picks)
        losses.append(-picks.item(probs, tokens[place + 1]).log())
    return (1 / len(losses)) * sum(losses)


class PythonAdam:
    """microgpt's Adam: a Python loop over the parameters' data and grads,
    with its betas, bias correction and linear learning-rate decay."""

    def __init__(self, params: List[Any], lr: float = 0.05, steps: int = 100,
                 betas: "tuple[float, float]" = (0.85, 0.99), eps: float = 1e-8) -> None:
        self.params, self.lr, self.total, self.eps = params, lr, steps, eps
        self.b1, self.b2 = betas
        self.m = [0.0] * len(params)
        self.v = [0.0] * len(params)
        self.t = 0

    def lr_at(self, t: int) -> float:
        return self.lr * (1 - t / self.total)

    def step(self) -> None:
        lr_t, b1, b2, t = self.lr_at(self.t), self.b1, self.b2, self.t + 1
        for i, p in enumerate(self.params):
            self.m[i] = b1 * self.m[i] + (1 - b1) * p.grad
            self.v[i] = b2 * self.v[i] + (1 - b2) * p.grad ** 2
            m_hat = self.m[i] / (1 - b1 ** t)
            v_hat = self.v[i] / (1 - b2 ** t)
            p.data -= lr_t * m_hat / (v_hat ** 0.5 + self.eps)
            p.grad = 0
        self.t = t


def documents(shape: Shape, count: int, seed: int = 1, longest: int = 16) -> List[List[int]]:
    """Token sequences as microgpt makes them: a start/end token (the last
    id) around 1..longest others."""
    rng = random.Random(seed)
    end = shape.vocab - 1
    return [[end] + [rng.randrange(end) for _ in range(rng.randint(1, longest))] + [end]
            for _ in range(count)]


def train_eagerly(Value: Any, shape: Shape, docs: List[List[int]], steps: int,
                  picks: Picks = AS_MICROGPT) -> "tuple[list, list]":
    """microgpt's training loop: losses, and the parameters' final data."""
    P = make_params(Value, shape)
    params = flat(P)
    adam = PythonAdam(params, steps=steps)
    losses = []
    for step in range(steps):
        doc = docs[step % len(docs)][:shape.context + 1]
        loss = sequence_loss(P, shape, picks, doc)
        loss.backward()
        adam.step()
        losses.append(loss.data)
    return losses, [p.data for p in params]


def sample(Value: Any, P: Dict[str, Any], shape: Shape, seed: int, count: int) -> List[List[int]]:
    """microgpt's sampling: random.choices over the softmax's numbers."""
    rng = random.Random(seed)
    end = shape.vocab - 1
    out = []
    for _ in range(count):
        keys: List[Any] = []
        vals: List[Any] = []
        token, seq = end, []
        for place in range(shape.context):
            probs = softmax(next_logits(P, shape, AS_MICROGPT, token, place, keys, vals),
                            AS_MICROGPT)
            token = rng.choices(range(shape.vocab), weights=[p.data for p in probs])[0]
            if token == end:
                break
            seq.append(token)
        out.append(seq)
    return out
