"""A micrograd program running on pygrad: only the imports changed.

Everything below the imports is written for micrograd 0.1.0 (the command
line and the final check aside, from the examples' _common.py): its Value, its
nn.MLP, a hand-written squared-error loss, zero_grad() and a manual SGD
update.  Swap the two import lines back (they are shown in the comment
above them) and it runs on micrograd with the same results, up to rounding
(micrograd sums gradients in set order); tests/test_examples.py does
exactly that when micrograd is installed.

    python examples/08_micrograd_port.py [--quick] [--out DIR]
"""
import random

from _common import check, parse_args  # the examples' shared command line

# micrograd:
#   from micrograd.engine import Value
#   from micrograd.nn import MLP
from pygrad.engine import Value
from pygrad.nn import MLP


def run(steps):
    random.seed(1337)
    xs = [[2.0, 3.0, -1.0], [3.0, -1.0, 0.5], [0.5, 1.0, 1.0], [1.0, 1.0, -1.0]]
    ys = [1.0, -1.0, -1.0, 1.0]
    model = MLP(3, [4, 4, 1])
    history = []
    for k in range(steps):
        preds = [model(x) for x in xs]
        loss = sum(((p - Value(y)) ** 2 for p, y in zip(preds, ys)), Value(0.0))
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data += -0.01 * p.grad
        history.append(loss.data)
        if k % 10 == 0 or k == steps - 1:
            print(f"step {k:3d}  loss {loss.data:.6f}")
    return {"losses": history, "predictions": [model(x).data for x in xs], "targets": ys}


def main(argv=None):
    args = parse_args(__doc__, argv)
    result = run(30 if args.quick else 200)
    check(result["losses"][-1] < result["losses"][0], "the loss fell")
    return result


if __name__ == "__main__":
    main()
