"""A labelled expression graph, drawn, then backpropagated by hand.

Build L = (a*b + c) * f from labelled leaves, draw the graph (an SVG with
graphviz, a text tree without it), then do by hand what backward() does:
set L.grad = 1 and call each node's _backward() once, parents before
children (the reverse of a topological order).  Each _backward() pushes its
node's grad into its children only.  Finally backward() on a fresh copy of
the graph must give the very same grads.

    python examples/02_expression_graph.py [--quick] [--out DIR]
"""
import os
import shutil
from typing import Dict, List, Optional, Sequence

from pygrad import Value, viz

from _common import check, parse_args


def build() -> Dict[str, Value]:
    a = Value(2.0, label="a")
    b = Value(-3.0, label="b")
    c = Value(10.0, label="c")
    e = a * b
    e.label = "e"
    d = e + c
    d.label = "d"
    f = Value(-2.0, label="f")
    L = d * f
    L.label = "L"
    return {"a": a, "b": b, "c": c, "e": e, "d": d, "f": f, "L": L}


def topological_order(root: Value) -> List[Value]:
    """Children before parents, by an iterative depth-first walk over _prev."""
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        v, expanded = stack.pop()
        if expanded:
            order.append(v)
        elif id(v) not in seen:
            seen.add(id(v))
            stack.append((v, True))
            stack.extend((child, False) for child in v._prev)
    return order


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(__doc__, argv, writes="expression_graph.svg if graphviz is installed")
    nodes = build()
    L = nodes["L"]
    print(f"L = (a*b + c) * f = {L.data}")

    drawing = None
    if shutil.which("dot"):
        try:
            path = viz.draw_dot(L).render(os.path.join(args.out, "expression_graph"), cleanup=True)
            drawing = path
            print(f"  drew the graph: {path}")
        except ImportError:
            pass
    if drawing is None:
        print("  (no graphviz: the text tree instead)")
        viz.print_tree(L)

    L.grad = 1.0
    for v in reversed(topological_order(L)):
        v._backward()                # a leaf's does nothing
        if not v._prev:
            continue
        print(f"  after {v.label}._backward(): "
              + ", ".join(f"{k}.grad={n.grad:g}" for k, n in nodes.items() if k != "L"))
    by_hand = {k: n.grad for k, n in nodes.items()}

    fresh = build()
    fresh["L"].backward()
    by_backward = {k: n.grad for k, n in fresh.items()}
    print("backward() on a fresh copy:", by_backward)

    check(by_hand == by_backward, "node-by-node _backward() equals backward()")
    check(by_hand["a"] == -3.0 * -2.0 and by_hand["f"] == 4.0, "dL/da = b*f, dL/df = d")
    return {"by_hand": by_hand, "by_backward": by_backward, "drawing": drawing}


if __name__ == "__main__":
    main()
