"""A 3-class spiral, classified with softmax cross-entropy.

Three arms of points wind around the origin; a straight line can't split
them.  An MLP(2, [16, 16, 3]) gives three scores per point, and
losses.softmax_cross_entropy (a fused, numerically stable log-sum-exp
inside) turns them into a loss; Adam trains it (pygrad.demo.train_spiral,
replayed in C).  With matplotlib it writes spiral_boundary.png.

    python examples/05_spiral_softmax.py [--quick] [--out DIR]
"""
import os
from typing import Optional, Sequence


from pygrad import demo

from _common import check, parse_args, plot_decision_boundary


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(__doc__, argv, writes="spiral_boundary.png if matplotlib is installed")
    steps = 100 if args.quick else 300
    result = demo.train_spiral(steps=steps)
    losses, acc = result["losses"], result["accuracy"]
    print(f"spiral, {steps} steps on the replay tier: loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"accuracy {acc[0]:.0%} -> {acc[-1]:.0%}, {result['seconds']:.2f} s")
    model = result["model"]
    plot = plot_decision_boundary(model, result["X"], result["y"],
                                  os.path.join(args.out, "spiral_boundary.png"), "spiral")
    check(losses[-1] < 0.5 * losses[0], "the loss halved")
    check(acc[-1] >= 0.8, "at least 80% of the training points right (chance: 33%)")
    return {"losses": losses, "accuracy": acc, "plot": plot}


if __name__ == "__main__":
    main()
