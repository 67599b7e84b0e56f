"""Two toy classifiers with pygrad.nn: XOR, and micrograd's 4-sample set.

XOR is the classic problem no single neuron can solve; a hidden layer can.
The 4-sample set is the one from micrograd's README walkthrough (targets
+1 / -1).  Each is trained twice: with ReLU hidden neurons (nn.MLP, as in
micrograd) and with tanh neurons (a tiny Module over pygrad.dot, which fuses
w.x + b and the activation into one node).  The loss is the mean squared
error, minimised by plain gradient descent written out by hand.

    python examples/03_toy_classifiers.py [--quick] [--out DIR]
"""
import random
from typing import Any, List, Optional, Sequence

import pygrad
from pygrad import Value, data, nn

from _common import check, parse_args


class TanhMLP(nn.Module):
    """Layers of tanh neurons; the last layer is linear."""

    def __init__(self, nin: int, nouts: List[int]) -> None:
        sizes = [nin] + nouts
        self.layers = [[([Value(random.uniform(-1, 1)) for _ in range(sizes[i])], Value(0.0))
                        for _ in range(sizes[i + 1])] for i in range(len(nouts))]

    def __call__(self, x: Sequence[Any]) -> Any:
        for i, layer in enumerate(self.layers):
            act = "tanh" if i < len(self.layers) - 1 else None
            x = [pygrad.dot(w, x, b, act) for w, b in layer]
        return x[0] if len(x) == 1 else x

    def parameters(self) -> List[Value]:
        return [p for layer in self.layers for w, b in layer for p in w + [b]]


def train(model: nn.Module, X: List[List[float]], y: List[float], steps: int, lr: float) -> List[float]:
    """Gradient descent on the mean squared error; returns the losses."""
    losses = []
    for _ in range(steps):
        preds = [model(x) for x in X]
        loss = sum(((p - t) ** 2 for p, t in zip(preds, y)), Value(0.0)) * (1.0 / len(X))
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data -= lr * p.grad
        losses.append(loss.data)
    return losses


def correct(model: nn.Module, X: List[List[float]], y: List[float]) -> int:
    return sum((model(x).data > 0) == (t > 0) for x, t in zip(X, y))


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(__doc__, argv)
    steps = 150 if args.quick else 500
    Xx, yx = data.make_xor(4)
    tasks = {
        "xor": (Xx.tolist(), data.signed_labels(yx).tolist()),
        "micrograd 4-sample": ([[2.0, 3.0, -1.0], [3.0, -1.0, 0.5], [0.5, 1.0, 1.0], [1.0, 1.0, -1.0]],
                               [1.0, -1.0, -1.0, 1.0]),
    }
    results = {}
    for task, (X, y) in tasks.items():
        for kind in ("relu", "tanh"):
            random.seed(1)
            nin = len(X[0])
            model = nn.MLP(nin, [8, 8, 1]) if kind == "relu" else TanhMLP(nin, [8, 8, 1])
            losses = train(model, X, y, steps, lr=0.05)
            hits = correct(model, X, y)
            results[(task, kind)] = {"losses": losses, "correct": hits}
            print(f"{task:>18}, {kind} neurons: loss {losses[0]:.4f} -> {losses[-1]:.6f}, "
                  f"{hits}/{len(X)} correct")
    for (task, kind), r in results.items():
        check(r["losses"][-1] < 0.1 * r["losses"][0], f"{task}/{kind}: the loss fell tenfold")
        check(r["correct"] == 4, f"{task}/{kind}: all 4 samples classified")
    return results


if __name__ == "__main__":
    main()
