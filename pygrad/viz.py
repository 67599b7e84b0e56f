"""Drawing computation graphs, as in micrograd's trace_graph notebook.

Everything here reaches the graph only through micrograd's public API
(``_prev``, ``_op``, ``data``, ``grad``, and ``label`` where there is one), so it works for
``pygrad.Value``, ``pygrad.reference.Value`` and micrograd's own Value.
The walks are iterative: graphs of any depth are fine.

``draw_dot`` needs the optional ``graphviz`` package (``pip install
'pygrad-autograd[viz]'``); ``format_tree`` / ``print_tree`` need nothing.
"""
import math
from typing import Any, Dict, List, Optional, Set, Tuple

__all__ = ["trace", "draw_dot", "format_tree", "print_tree"]

Node = Any  # a Value of any micrograd-compatible engine


def _label(v: Node) -> str:
    """``v.label``, or "" for an engine whose Value has none (micrograd's
    package: the lecture's Value added it)."""
    return getattr(v, "label", "")
Edge = Tuple[Node, Node]


def _float_key(x: float) -> Tuple[bool, float]:
    return (True, 0.0) if math.isnan(x) else (False, x)


def _sort_key(v: Node) -> Tuple[Any, ...]:
    return (v._op, _label(v), _float_key(v.data), _float_key(v.grad))


def _children(v: Node) -> List[Node]:
    """``v._prev`` (a set) in a reproducible order: by op, label, data, grad.
    Only siblings that look identical on all four keep the set's order."""
    return sorted(v._prev, key=_sort_key)


def trace(root: Node) -> Tuple[List[Node], List[Edge]]:
    """Every Value reachable from ``root`` through ``_prev``, and the edges.

    Returns ``(nodes, edges)``: ``nodes`` in depth-first discovery order
    (``root`` first, children in ``_children`` order), each once (by
    ``id``); ``edges`` as ``(child, parent)`` pairs, one per element of
    each ``parent._prev``.  Iterative, so any depth works.
    """
    if not hasattr(root, "_prev"):
        raise TypeError(f"trace needs a Value, not {type(root).__name__}: {root!r}")
    nodes: List[Node] = []
    edges: List[Edge] = []
    seen: Set[int] = set()
    stack = [root]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        nodes.append(v)  # also keeps v alive, so its id() is not reused
        kids = _children(v)
        edges.extend((k, v) for k in kids)
        stack.extend(reversed(kids))
    return nodes, edges


def _record_text(s: str) -> str:
    """Escape the characters that structure a graphviz record label."""
    for ch in '\\{}|<>"':
        s = s.replace(ch, "\\" + ch)
    return s


def draw_dot(root: Node, format: str = "svg", rankdir: str = "LR") -> "Any":
    """A ``graphviz.Digraph`` of the graph below ``root``.

    One record node per Value, ``{ label | data 1.2345 | grad 0.5678 }``,
    and for each Value with an ``_op`` an op node feeding it; each child
    has an edge into its parent's op node.  ``rankdir`` is ``'LR'`` (left
    to right) or ``'TB'`` (top to bottom).  Node names are ``v0, v1, ...``
    in ``trace`` order, so the dot source is reproducible.  Rendering
    (``.render()``, ``.pipe()``, notebook display) needs the Graphviz
    binaries; building the Digraph does not.
    """
    if rankdir not in ("LR", "TB"):
        raise ValueError(f"rankdir must be 'LR' or 'TB', not {rankdir!r}")
    try:
        from graphviz import Digraph
    except ImportError as e:
        raise ImportError("draw_dot needs the graphviz package: pip install 'pygrad-autograd[viz]' "
                          "(and the Graphviz binaries to render)") from e
    nodes, edges = trace(root)
    name: Dict[int, str] = {id(v): f"v{i}" for i, v in enumerate(nodes)}
    dot = _drawing_class(Digraph)(format=format, graph_attr={"rankdir": rankdir})
    dot.text_tree = format_tree(root)
    for v in nodes:
        uid = name[id(v)]
        text = "{ %s | data %.4f | grad %.4f }" % (_record_text(_label(v)), v.data, v.grad)
        dot.node(name=uid, label=text, shape="record")
        if v._op:
            dot.node(name=uid + "_op", label=v._op)
            dot.edge(uid + "_op", uid)
    for child, parent in edges:
        dot.edge(name[id(child)], name[id(parent)] + "_op")
    return dot


def _drawing_class(digraph: type) -> type:
    """A Digraph that shows the text tree in a notebook when the Graphviz
    binaries (``dot``) are missing, instead of raising."""
    from graphviz import ExecutableNotFound

    class Drawing(digraph):
        def _repr_mimebundle_(self, include: Any = None, exclude: Any = None,
                              **kwargs: Any) -> Dict[str, str]:
            try:
                return super()._repr_mimebundle_(include, exclude, **kwargs)
            except ExecutableNotFound:
                return {"text/plain": self.text_tree}

    return Drawing


def _line(v: Node) -> str:
    text = f"Value(data={v.data}, grad={v.grad})"
    if v._op:
        text += f" {v._op!r}"
    if _label(v):
        text += f" {_label(v)}"
    return text


_MAX_INDENT = 40


def format_tree(root: Node, max_depth: Optional[int] = None) -> str:
    """The graph below ``root`` as an indented text tree, one Value a line::

        Value(data=-2.0, grad=0.0) '+' c
          Value(data=2.0, grad=0.0) a
          Value(data=-4.0, grad=0.0) '*' b
            ...

    A Value whose subtree was already shown prints ``(see above)`` and is
    not expanded again (shared subexpressions).  Children deeper than
    ``max_depth`` (root is depth 0) are cut and their parent ends in
    ``[...]``.  Indentation stops growing at depth 40; deeper lines start
    with ``[depth N]`` instead, so the text stays linear in the graph size.
    Iterative, so any depth works.
    """
    if max_depth is not None and (isinstance(max_depth, bool) or not isinstance(max_depth, int)
                                  or max_depth < 0):
        raise ValueError(f"max_depth must be None or an int >= 0, not {max_depth!r}")
    lines: List[str] = []
    shown: Set[int] = set()
    keep: List[Node] = []  # keeps every visited Value alive, so ids stay unique
    stack: List[Tuple[Node, int]] = [(root, 0)]
    while stack:
        v, depth = stack.pop()
        keep.append(v)
        indent = "  " * min(depth, _MAX_INDENT)
        if depth > _MAX_INDENT:
            indent += f"[depth {depth}] "
        if id(v) in shown:
            lines.append(f"{indent}{_line(v)} (see above)")
            continue
        kids = _children(v)
        if kids and max_depth is not None and depth >= max_depth:
            lines.append(f"{indent}{_line(v)} [...]")
            continue
        lines.append(indent + _line(v))
        shown.add(id(v))
        stack.extend((k, depth + 1) for k in reversed(kids))
    return "\n".join(lines)


def print_tree(root: Node, max_depth: Optional[int] = None) -> None:
    """Print ``format_tree(root, max_depth)``."""
    print(format_tree(root, max_depth))
