"""pygrad.viz: graph walks and drawings, the same for both engines."""
import sys

import pytest

from pygrad import Value
from pygrad import reference
from pygrad.viz import draw_dot, format_tree, print_tree, trace

ENGINES = [Value, reference.Value]


def small_graph(V):
    """e = d * d, d = c + a, c = a * b: ``a`` is reached via two paths and
    ``d`` is used twice by one op."""
    a = V(2.0, label="a")
    b = V(-3.0, label="b")
    c = a * b
    c.label = "c"
    d = c + a
    d.label = "d"
    e = d * d
    e.label = "e"
    e.backward()
    return e


def mixed_graph(V):
    """Every kind of op, a shared subexpression and number constants."""
    x, y = V(-1.5, label="x"), V(2.0, label="y")
    s = x * y + 1
    outs = [s * s, s.relu(), x ** 2, y ** x, 2 ** x, 1 - x, 3 / x, -x,
            x.exp(), y.log(), x.tanh(), x.sigmoid()]
    z = sum(outs[1:], outs[0])
    z.backward()
    return z


def op_count(nodes):
    return sum(1 for v in nodes if v._op)


def describe(nodes, edges):
    """What trace found, engine-independently: index-based."""
    index = {id(v): i for i, v in enumerate(nodes)}
    return ([(v._op, v.label, v.data, v.grad) for v in nodes],
            [(index[id(c)], index[id(p)]) for c, p in edges])


@pytest.mark.parametrize("V", ENGINES)
def test_trace_small_graph(V):
    e = small_graph(V)
    nodes, edges = trace(e)
    assert [v.label for v in nodes] == ["e", "d", "a", "c", "b"]
    assert nodes[0] is e
    assert len(edges) == 5  # d->e (once: a set), c->d, a->d, a->c, b->c
    assert all(any(c is k for k in p._prev) for c, p in edges)


def test_trace_agrees_between_engines():
    for build in (small_graph, mixed_graph):
        c_nodes, c_edges = trace(build(Value))
        r_nodes, r_edges = trace(build(reference.Value))
        assert len(c_nodes) == len(r_nodes) and len(c_edges) == len(r_edges)
        assert describe(c_nodes, c_edges) == describe(r_nodes, r_edges)


@pytest.mark.parametrize("V", ENGINES)
def test_trace_counts_of_mixed_graph(V):
    nodes, edges = trace(mixed_graph(V))
    assert len({id(v) for v in nodes}) == len(nodes)
    assert len(edges) == sum(len(v._prev) for v in nodes)
    # leaves x, y; s: x*y, 1, +; outs: 12 ops + the constants 2, 1, 3; 11 sums
    assert len(nodes) == 2 + 3 + 15 + 11
    # s: 2 + 2; s*s: 1 (``_prev`` is a set); 7 unary: 7; 4 other binary: 8; sums: 22
    assert len(edges) == 4 + 1 + 7 + 8 + 22


@pytest.mark.parametrize("V", ENGINES)
def test_trace_of_a_leaf(V):
    x = V(1.0)
    nodes, edges = trace(x)
    assert nodes == [x] and edges == []


@pytest.mark.slow
@pytest.mark.parametrize("V", ENGINES)
def test_deep_chain_traces_without_recursion(V):
    n = 100_000
    x = V(0.0)
    w = V(1.0)
    for _ in range(n):
        x = x + w
    nodes, edges = trace(x)
    assert len(nodes) == n + 2 and len(edges) == 2 * n
    text = format_tree(x)
    assert text.count("\n") == 2 * n
    assert text.count("(see above)") == n - 1  # w, after its first line
    assert max(len(line) for line in text.splitlines()) < 200  # indentation is capped


def dot_counts(dot):
    lines = [ln.strip() for ln in dot.body]
    edges = [ln for ln in lines if " -> " in ln]
    nodes = [ln for ln in lines if " -> " not in ln]
    return len(nodes), len(edges)


@pytest.mark.parametrize("V", ENGINES)
@pytest.mark.parametrize("build", [small_graph, mixed_graph])
def test_draw_dot_counts(V, build):
    graphviz = pytest.importorskip("graphviz")
    root = build(V)
    nodes, edges = trace(root)
    dot = draw_dot(root)
    assert isinstance(dot, graphviz.Digraph)
    ops = op_count(nodes)
    assert dot_counts(dot) == (len(nodes) + ops, len(edges) + ops)


def test_draw_dot_source_is_the_same_for_both_engines():
    pytest.importorskip("graphviz")
    sources = [draw_dot(mixed_graph(V)).source for V in ENGINES]
    assert sources[0] == sources[1]


def test_draw_dot_records_and_options():
    pytest.importorskip("graphviz")
    dot = draw_dot(small_graph(Value), format="png", rankdir="TB")
    assert dot.format == "png"
    assert "rankdir=TB" in dot.source
    assert 'v0 [label="{ e | data 16.0000 | grad 1.0000 }" shape=record]' in dot.source
    assert 'v0_op [label="*"]' in dot.source
    assert "v0_op -> v0" in dot.source and "v1 -> v0_op" in dot.source


def test_draw_dot_escapes_record_characters_in_labels():
    pytest.importorskip("graphviz")
    x = Value(1.0, label="{a|b}<c>")
    assert r"\{a\|b\}\<c\>" in draw_dot(x).source


def test_draw_dot_rejects_bad_rankdir():
    with pytest.raises(ValueError, match="rankdir must be 'LR' or 'TB'"):
        draw_dot(Value(1.0), rankdir="RL")


def test_draw_dot_without_graphviz(monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)
    with pytest.raises(ImportError) as info:
        draw_dot(Value(1.0))
    assert str(info.value) == ("draw_dot needs the graphviz package: pip install 'pygrad-autograd[viz]' "
                               "(and the Graphviz binaries to render)")


SMALL_TREE = """\
Value(data=16.0, grad=1.0) '*' e
  Value(data=-4.0, grad=-8.0) '+' d
    Value(data=2.0, grad=16.0) a
    Value(data=-6.0, grad=-8.0) '*' c
      Value(data=2.0, grad=16.0) a (see above)
      Value(data=-3.0, grad=-16.0) b"""


@pytest.mark.parametrize("V", ENGINES)
def test_format_tree(V):
    assert format_tree(small_graph(V)) == SMALL_TREE


@pytest.mark.parametrize("V", ENGINES)
def test_format_tree_max_depth(V):
    e = small_graph(V)
    assert format_tree(e, max_depth=0) == "Value(data=16.0, grad=1.0) '*' e [...]"
    assert format_tree(e, max_depth=1) == "\n".join(SMALL_TREE.splitlines()[:2]) + " [...]"
    assert format_tree(e, max_depth=2) == "\n".join(SMALL_TREE.splitlines()[:4]) + " [...]"
    assert format_tree(e, max_depth=3) == SMALL_TREE


def test_format_tree_same_for_both_engines():
    assert format_tree(mixed_graph(Value)) == format_tree(mixed_graph(reference.Value))


def test_format_tree_rejects_bad_max_depth():
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="max_depth"):
            format_tree(Value(1.0), max_depth=bad)


def test_print_tree(capsys):
    print_tree(small_graph(Value))
    assert capsys.readouterr().out == SMALL_TREE + "\n"


def test_draw_dot_shows_the_text_tree_in_a_notebook_without_graphviz_binaries(monkeypatch):
    graphviz = pytest.importorskip("graphviz")
    from pygrad import Value, viz
    y = Value(1.0) * 2.0

    def missing(*args, **kwargs):
        raise graphviz.ExecutableNotFound(["dot"])
    monkeypatch.setattr(graphviz.Digraph, "_repr_mimebundle_", missing)
    assert viz.draw_dot(y)._repr_mimebundle_() == {"text/plain": viz.format_tree(y)}
