"""micrograd's moons demo on pygrad: a binary classifier and its boundary.

An MLP(2, [16, 16, 1]) learns to separate two interleaved half-moons with
micrograd's max-margin (SVM) loss plus L2, by SGD with a decaying learning
rate (pygrad.demo.train_moons).  The batch is fixed, so the graph is built
once and replayed in C each step (pygrad.compile): the whole run takes a
fraction of a second.  With matplotlib it writes moons_boundary.png.

    python examples/04_moons.py [--quick] [--out DIR]
"""
import os
from typing import Optional, Sequence

from pygrad import demo

from _common import check, parse_args, plot_decision_boundary


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(__doc__, argv, writes="moons_boundary.png if matplotlib is installed")
    steps = 60 if args.quick else 100
    result = demo.train_moons(steps=steps)
    losses, acc = result["losses"], result["accuracy"]
    print(f"moons, {steps} steps on the replay tier: loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"accuracy {acc[0]:.0%} -> {acc[-1]:.0%}, {result['seconds']:.2f} s")
    model = result["model"]
    plot = plot_decision_boundary(model, result["X"], result["y"],
                                  os.path.join(args.out, "moons_boundary.png"), "moons")
    check(losses[-1] < 0.25 * losses[0], "the loss fell to under a quarter")
    check(acc[-1] >= 0.95, "at least 95% of the training points right")
    return {"losses": losses, "accuracy": acc, "plot": plot}


if __name__ == "__main__":
    main()
