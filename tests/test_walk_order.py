"""backward()'s walk (csrc/backward.c, ``walk``): its order, and its marks.

The walk must list the nodes below its roots exactly as a recursive
depth-first walk does: a node's children in turn, each one looked at (is it
marked?) only once the ones before it are done, then the node.  That order
decides in what order every gradient is added up, so it is what makes the C
engine agree with the reference engine bit for bit.  Three oracles:

- the order itself: ``pg_backward`` with a sweep hands back the walk's order
  (a custom op's probe above the root makes backward() need one), and
  ``pg_record_order`` (pygrad.compile's walk, over several roots) is called
  through ctypes; both are compared with a depth-first walk written here in
  Python over the C nodes' own children (``pg_nkids``/``pg_kid``);
- every grad, bit for bit, against ``pygrad.reference`` on the same graph
  (pygrad.sum is mirrored there by a custom op with SUM's rule, csrc/ops.c);
- with a test core, a walk failed at each of its allocations in turn
  (``pg_fail_alloc``), then the SAME graph walked and backpropagated again:
  a mark left behind would make the next walk skip that node and all below
  it.  A test core keeps at most 4,096 entries of the walk's scratch between
  walks, so graphs deeper than that grow it on every walk.
"""
import ctypes
import math
import random

import pytest

import pygrad
from pygrad import Function, Value, nn
from pygrad._core import ffi, lib
from pygrad.reference import Value as RValue

from helpers import assert_same_doubles

# -- nodes, and the order a recursive depth-first walk gives ------------------

def node(v):
    """v's node as a pg_node * cdata (v must stay alive)."""
    return ffi.cast("pg_node *", lib.pg_node_addr(id(v)))


def addr(p) -> int:
    return int(ffi.cast("uintptr_t", p))


def dfs(roots):
    """Every node below the roots (pg_node * cdata), children first, as the
    recursive walk lists them: each child is looked at only once the
    children before it are done.  (Their addresses, the deepest stack.)"""
    nkids, kid, cast = lib.pg_nkids, lib.pg_kid, ffi.cast
    seen, post, deepest = set(), [], 0
    for r in roots:
        a = addr(r)
        if a in seen:
            continue
        seen.add(a)
        stack = [(a, r, 0, nkids(r))]       # a node, its next child, its children
        while stack:
            deepest = max(deepest, len(stack))
            a, p, i, n = stack[-1]
            while i < n:
                k = kid(p, i)
                i += 1
                ka = int(cast("uintptr_t", k))
                if ka not in seen:
                    seen.add(ka)
                    stack[-1] = (a, p, i, n)
                    stack.append((ka, k, 0, nkids(k)))
                    break
            else:
                stack.pop()
                post.append(a)
    return post, deepest


def dfs_postorder(roots):
    return dfs(roots)[0]


def backward_walk(root):
    """The order backward()'s walk lists below ``root`` (children first),
    read from a sweep: a custom op over the root makes backward() record
    the order; restoring the sweep at once leaves every grad as it was."""
    probe = Value(0.0, (root,), "probe")
    sweep = ffi.gc(ffi.new("pg_sweep *"), lib.pg_sweep_clear)
    try:
        rc = lib.pg_backward(node(probe), sweep)
        assert rc == 1, f"pg_backward: {rc}"
        n = lib.pg_sweep_order(sweep, ffi.NULL, 0)
        out = ffi.new("uintptr_t[]", n)
        lib.pg_sweep_order(sweep, out, n)
        order = list(out)
    finally:
        lib.pg_sweep_restore(sweep)
    assert order[0] == addr(node(probe))
    return order[:0:-1]          # children first, without the probe


def _record_order_fn():
    """pg_record_order (csrc/backward.c, not in the cdef) through ctypes, on
    the very library cffi loaded, or None where the symbol is not exported."""
    try:
        so = ctypes.CDLL(pygrad._core.__file__)
        fn = so.pg_record_order
        free = ctypes.CDLL(None).free
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint32, ctypes.c_int,
                   ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p)),
                   ctypes.POINTER(ctypes.c_size_t)]
    free.argtypes = [ctypes.c_void_p]
    free.restype = None
    return fn, free


_RECORD = _record_order_fn()
needs_record = pytest.mark.skipif(_RECORD is None, reason="pg_record_order is not exported")


def record_order(roots, graded=0):
    """pg_record_order over the roots (Values): (rc, its order children
    first); rc < 0 gives no order.  graded=0: compile's walk (below a
    detached_max too); 1: backward()'s."""
    fn, free = _RECORD
    arr = (ctypes.c_void_p * len(roots))(*[addr(node(v)) for v in roots])
    out = ctypes.POINTER(ctypes.c_void_p)()
    n = ctypes.c_size_t(0)
    rc = fn(arr, len(roots), graded, ctypes.byref(out), ctypes.byref(n))
    if rc < 0:
        return rc, None
    order = [out[i] or 0 for i in range(n.value)]
    free(ctypes.cast(out, ctypes.c_void_p))
    return rc, order[::-1]


# -- graphs, built the same on both engines ------------------------------------

class Mix(Function):
    """A Function of any arity with partials that depend on the inputs."""

    @staticmethod
    def forward(ctx, *xs):
        ctx.save_for_backward(*xs)
        return math.tanh(0.5 * sum(xs))

    @staticmethod
    def backward(ctx, grad):
        t = math.tanh(0.5 * sum(ctx.saved_values))
        return tuple((0.9 - 0.1 * i) * (1 - t * t) * grad
                     for i in range(len(ctx.saved_values)))


def custom_op(V, kids, seed):
    """micrograd's way: Value(data, children, op) with a _backward closure."""
    coefs = [0.5 + 0.1 * ((seed + i) % 5) for i in range(len(kids))]
    out = V(math.tanh(0.3 * sum(k.data for k in kids) + 0.01 * seed), tuple(kids), "custom")

    def _backward():
        for k, c in zip(kids, coefs):
            k.grad += c * out.grad * (1.0 - out.data * out.data)
    out._backward = _backward
    return out


def ref_sum(vs):
    """pygrad.sum as one n-ary reference node: C's SUM (csrc/ops.c), left to
    right forward, gradients to children n-1, ..., 2, then 0, then 1."""
    acc = vs[0].data
    for v in vs[1:]:
        acc = acc + v.data
    out = RValue(acc, tuple(vs), "sum")

    def _backward():
        g = out.grad
        for j in range(len(vs) - 1, 1, -1):
            vs[j].grad += g
        vs[0].grad += g
        if len(vs) > 1:
            vs[1].grad += g
    out._backward = _backward
    return out


C_ENGINE = {"V": Value, "sum": pygrad.sum}
R_ENGINE = {"V": RValue, "sum": ref_sum}

# The kinds of node a graph draws, and each one's weight.  "fused" kinds
# (pygrad.dot, logsumexp, an nn layer) have no bit-exact reference node
# (the reference builds them from plain ops, a different graph): graphs with
# them are checked by their order only.
PLAIN = {"binary": 6, "square": 1, "const": 2, "unary": 3, "sum": 2, "function": 2}
WITH_CUSTOM = dict(PLAIN, custom=3)
FUSED = dict(WITH_CUSTOM, dot=2, lse=1, layer=1)


def build(E, seed, steps, kinds, spine=0.5, deep=False, leaves=6):
    """A random DAG, the same for the same seed on either engine: ``leaves``
    leaves, then ``steps`` ops, each over nodes drawn among all made so far
    (recent ones more often; the same node twice, as x * x, now and then),
    taking the last result as one operand, at a random place, with
    probability ``spine``.  ``deep``: the other operands are mostly nodes
    made from the leaves alone, or a few steps back, so that a depth-first
    walk goes down the whole chain (some 2 nodes deep a step).  Returns
    (root, the nodes made, in order)."""
    rng = random.Random(seed)
    V, nsum = E["V"], E["sum"]
    made = [V(rng.uniform(-1, 1)) for _ in range(leaves)]
    params = [V(rng.uniform(-1, 1)) for _ in range(8)]
    made += params
    side = list(made)
    if deep:
        for _ in range(24):          # shallow nodes, shared all along the chain
            a, b = rng.choice(side), rng.choice(side)
            side.append(rng.choice([lambda: (a * b).tanh(), lambda: (a + b) * 0.5,
                                    lambda: a.sin()])())
        made += side[len(made):]
    layer = None
    names, weights = zip(*kinds.items())

    def pick():
        r = rng.random()
        if deep:
            if r < 0.7:
                return rng.choice(side)
            return made[-1 - min(rng.randint(1, 4), len(made) - 1)]
        if r < 0.5:
            return made[-1 - min(int(rng.expovariate(0.3)), len(made) - 1)]
        return made[rng.randrange(len(made))]

    def operands(k):
        vs = [pick() for _ in range(k)]
        if k > 1 and rng.random() < 0.15:
            vs[rng.randrange(k)] = vs[rng.randrange(k)]     # one node, twice
        if k and rng.random() < spine:
            vs[rng.randrange(k)] = made[-1]
        return vs

    for i in range(steps):
        kind = rng.choices(names, weights)[0]
        if kind == "binary":
            a, b = operands(2)
            op = rng.choice(["+", "-", "*"])
            if op == "-" and a is b:
                op = "+"        # a - a: 0, and every grad below it 0
            if op == "*":       # data stays away from 0: its grads too
                out = a * b + 0.5 if rng.random() < 0.5 else 0.5 + a * b
            else:
                out = a + b if op == "+" else a - b
                out = out * 0.5 if rng.random() < 0.5 else 0.5 * out
        elif kind == "square":
            (a,) = operands(1)
            out = (a * a).tanh()
        elif kind == "const":
            (a,) = operands(1)
            out = rng.choice([lambda: a * 0.75, lambda: 0.25 - a, lambda: a + 0.125,
                              lambda: 0.5 * a])()
        elif kind == "unary":
            (a,) = operands(1)
            out = rng.choice([a.tanh, a.sin, a.sigmoid, a.__neg__])()
        elif kind == "sum":
            out = nsum(operands(rng.randint(1, 5))) * 0.25
        elif kind == "function":
            out = Mix.apply(*operands(rng.randint(1, 3)))
        elif kind == "custom":
            out = custom_op(V, operands(rng.randint(0 if spine < 1 else 1, 4)), i)
        elif kind == "dot":
            n = rng.randint(1, 4)
            out = pygrad.dot(params[:n], operands(n), params[-1] if rng.random() < 0.5 else None,
                             rng.choice([None, "tanh", "sigmoid"]))
        elif kind == "lse":
            out = pygrad.logsumexp(operands(rng.randint(1, 4))) * 0.25
        elif kind == "layer":
            if layer is None:
                state = random.getstate()
                random.seed(seed)        # its weights: random.uniform
                layer = nn.Layer(3, 2, nonlin=False)
                random.setstate(state)
            outs = layer(operands(3))
            made.append(outs[0])
            out = (outs[0] * outs[1]).tanh()
        made.append(out)
    # The root reaches the last node and some others, so that little is left out.
    tail = [made[-1]] + [made[rng.randrange(len(made))] for _ in range(3)]
    root = tail[0]
    for v in tail[1:]:
        root = (root + v) * 0.5
    made.append(root)
    return root, made


def backward_grads(root, made):
    root.backward()
    return [v.grad for v in made]


def assert_walks_in_order(root):
    want = dfs_postorder([node(root)])
    got = backward_walk(root)
    assert len(got) == len(want), f"the walk listed {len(got)} nodes, not {len(want)}"
    assert got == want, f"the walk's order differs first at {first_difference(got, want)}"


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# -- small graphs, orders written out by hand --------------------------------

def _small_graphs():
    """(name, build) pairs: build() gives (root, {name: Value}, expected
    order of names, children first)."""
    def first_and_second():
        a, b = Value(0.3), Value(-0.7)
        s = a + b
        y = s * b            # b is y's second child, and below its first
        return y, dict(a=a, b=b, s=s, y=y), ["a", "b", "s", "y"]

    def second_reached_late():
        a, b = Value(0.3), Value(-0.7)
        s = a + b
        y = b * s            # b first: s's b is already done
        return y, dict(a=a, b=b, s=s, y=y), ["b", "a", "s", "y"]

    def square():
        x = Value(1.5)
        y = x * x
        return y, dict(x=x, y=y), ["x", "y"]

    def interior_below_both():
        a, b = Value(0.3), Value(-0.7)
        m = a * b
        t = m.tanh()
        y = t * m            # m below y's first child and y's second child
        z = y + t
        return z, dict(a=a, b=b, m=m, t=t, y=y, z=z), ["a", "b", "m", "t", "y", "z"]

    def nary_children_in_turn():
        a, b, c = Value(0.1), Value(0.2), Value(0.3)
        p = a * c
        s = pygrad.sum([p, c, b, a, p])      # c, then b, are looked at after p is done
        return s, dict(a=a, b=b, c=c, p=p, s=s), ["a", "c", "p", "b", "s"]

    def nary_under_binary():
        a, b = Value(0.1), Value(0.2)
        t = b.tanh()
        s = pygrad.sum([a, t])
        y = s * b
        return y, dict(a=a, b=b, t=t, s=s, y=y), ["a", "b", "t", "s", "y"]

    def custom_op_children():
        a, b = Value(0.1), Value(0.2)
        t = a.tanh()
        c = Value(1.0, (b, t, a, b), "op")
        y = c * t
        return y, dict(a=a, b=b, t=t, c=c, y=y), ["b", "a", "t", "c", "y"]

    def function_node():
        a, b = Value(0.1), Value(0.2)
        m = a * b
        f = Mix.apply(b, m, a)
        return f, dict(a=a, b=b, m=m, f=f), ["b", "a", "m", "f"]

    def leaf():
        a = Value(0.5)
        return a, dict(a=a), ["a"]

    def custom_without_children():
        a = Value(0.5)
        c = Value(2.0, (), "op")
        y = a * c
        return y, dict(a=a, c=c, y=y), ["a", "c", "y"]

    return [(f.__name__, f) for f in (first_and_second, second_reached_late, square,
                                      interior_below_both, nary_children_in_turn,
                                      nary_under_binary, custom_op_children, function_node,
                                      leaf, custom_without_children)]


@pytest.mark.parametrize("name, make", _small_graphs(), ids=[n for n, _ in _small_graphs()])
def test_small_graphs_walk_in_recursive_order(name, make):
    root, named, expected = make()
    by_addr = {addr(node(v)): k for k, v in named.items()}
    want = [by_addr[a] for a in dfs_postorder([node(root)])]
    assert want == expected, "this file's own depth-first walk"
    for _ in range(2):       # a second walk: the first took its marks off
        assert [by_addr[a] for a in backward_walk(root)] == expected
        if _RECORD is not None:
            rc, order = record_order([root])
            assert rc == 0 and [by_addr[a] for a in order] == expected


def test_backward_walks_not_below_a_detached_max_and_compile_does():
    """backward()'s walk (and pg_record_order graded) lists a detached_max
    node without its children, as the reference engine's new leaf; the
    walk compile makes for its forward pass goes below it."""
    a, b = Value(0.5), Value(2.0)
    p = a * b
    m = pygrad.detached_max([p, b])
    root = m * a
    by_addr = {addr(node(v)): k for k, v in dict(a=a, b=b, p=p, m=m, root=root).items()}
    assert [by_addr[x] for x in backward_walk(root)] == ["m", "a", "root"]
    if _RECORD is not None:
        rc, order = record_order([root], graded=1)
        assert rc == 0 and [by_addr[x] for x in order] == ["m", "a", "root"]
        rc, order = record_order([root])
        assert rc == 0 and [by_addr[x] for x in order] == ["a", "b", "p", "m", "root"]


# -- random graphs: the order ------------------------------------------------

@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_walk_in_recursive_order(seed):
    """Every node kind (binary, x * x, constants, unary, pygrad.sum, dot,
    logsumexp, an nn layer, Functions, custom ops), shared everywhere."""
    spine = [0.0, 0.5, 0.9][seed % 3]
    root, made = build(C_ENGINE, seed, 600, FUSED, spine=spine)
    assert_walks_in_order(root)
    assert_walks_in_order(root)
    root.backward()              # a real backward, then the walk again
    assert_walks_in_order(root)
    if _RECORD is not None:
        rc, order = record_order([root])
        assert rc == 0 and order == dfs_postorder([node(root)])


@needs_record
@pytest.mark.parametrize("seed", range(6))
def test_several_roots_walk_in_recursive_order(seed):
    """pg_record_order over several roots (pygrad.compile's outputs): each
    root's unvisited part in turn; a root already listed (as a node below an
    earlier root, or given twice) adds nothing; a leaf root is itself."""
    root, made = build(C_ENGINE, 100 + seed, 400, FUSED, spine=0.5)
    rng = random.Random(seed)
    roots = [made[rng.randrange(len(made))] for _ in range(5)]
    roots.insert(rng.randrange(len(roots)), roots[rng.randrange(len(roots))])  # twice
    roots.insert(1, root)                       # an ancestor of earlier roots
    roots.append(made[0])                       # a leaf, listed already or not
    roots.insert(0, made[len(made) // 2])
    for _ in range(2):
        rc, order = record_order(roots)
        assert rc == 0
        want = dfs_postorder([node(v) for v in roots])
        assert len(order) == len(set(order)) == len(want)
        assert order == want, f"first difference at {first_difference(order, want)}"


# -- random graphs: every grad against the reference engine -----------------

@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("kinds", [PLAIN, WITH_CUSTOM], ids=["C-only", "custom-ops"])
def test_random_graphs_match_the_reference_bit_for_bit(seed, kinds):
    """Two backwards (SUB's hidden grad makes the second differ) over
    graphs whose nodes are reached many times as first and second children:
    each grad is added up in the walk's order, so any other order changes
    bits."""
    spine = [0.0, 0.5, 0.9][seed % 3]
    c_root, c_made = build(C_ENGINE, seed, 800, kinds, spine=spine)
    r_root, r_made = build(R_ENGINE, seed, 800, kinds, spine=spine)
    assert_same_doubles([v.data for v in c_made], [v.data for v in r_made], "data")
    for k in range(2):
        c = backward_grads(c_root, c_made)
        r = backward_grads(r_root, r_made)
        assert_same_doubles(c, r, f"grads after backward #{k + 1}")
    reached = set(dfs_postorder([node(c_root)]))
    grads = [g for v, g in zip(c_made, c) if addr(node(v)) in reached]
    assert sum(1 for g in grads if math.isfinite(g) and g != 0.0) > 0.8 * len(grads), \
        "the graph's grads should be mostly finite and nonzero"


def test_compile_matches_the_reference_bit_for_bit():
    """pygrad.compile's program runs backward in pg_record_order's order."""
    # compile refuses Functions (and custom ops).
    kinds = {k: w for k, w in PLAIN.items() if k != "function"}
    c_root, c_made = build(C_ENGINE, 7, 800, kinds, spine=0.5)
    r_root, r_made = build(R_ENGINE, 7, 800, kinds, spine=0.5)
    assert_walks_in_order(c_root)       # else compile may not fail cleanly
    program = pygrad.compile(c_root)
    program.backward()
    r_root.backward()
    assert_same_doubles([v.grad for v in c_made], [v.grad for v in r_made], "grads")


def long_chain(E, cycles):
    """A chain a depth-first walk goes down some 12 nodes a cycle: the chain
    as a binary node's first child and as its second, both children of one
    node, one child of an n-ary node (twice in a sum), a Function's and a
    custom op's, with shared shallow nodes as the others; and the cycle's
    first node, a first child above, again as a second child, reached
    already below the first."""
    V, nsum = E["V"], E["sum"]
    side = [V(0.1 * i - 0.5) for i in range(11)]
    y = side[0]
    made = list(side)
    for i in range(cycles):
        s, t = side[i % 11], side[(3 * i + 1) % 11]
        start = y
        y = y * s + 0.5
        y = (s - y) * 0.5
        y = (y * y).tanh()
        y = nsum([s, y, t, y]) * 0.25
        y = Mix.apply(s, y)
        y = custom_op(V, [y, t], i)
        y = (y * start).sin()
        made.append(y)
    return y, made


@pytest.mark.slow          # 2 s: CI's slow stage runs it
def test_a_chain_100k_nodes_deep_walks_in_order_and_matches_the_reference():
    c_root, c_made = long_chain(C_ENGINE, 8_400)
    want, deepest = dfs([node(c_root)])
    assert deepest > 100_000
    assert backward_walk(c_root) == want
    r_root, r_made = long_chain(R_ENGINE, 8_400)
    assert_same_doubles(backward_grads(c_root, c_made), backward_grads(r_root, r_made), "grads")


# -- failed walks leave no mark: the same graph after ---------------------------

@pytest.fixture
def arm():
    """arm(n): the n-th core allocation from now fails; disarmed after."""
    yield lib.pg_fail_alloc
    lib.pg_fail_alloc(0)


def _fail_each_allocation(arm, attempt, check, limit=80):
    """attempt() with its n-th core allocation failed, n = 1, 2, ... until it
    gets through (it says whether it did); check(n, got_through) after each,
    with memory back.  The failures seen."""
    failures = 0
    for n in range(1, limit):
        arm(n)
        try:
            ok = attempt()
        finally:
            arm(0)
        check(n, ok)
        if ok:
            return failures
        failures += 1
    pytest.fail("the walk never got past its failed allocations")


DEEP = 5_000        # ops on a chain: some 6,000 frames deep, past the 4,096 a test core keeps


def deep_graph(E, seed, kinds):
    root, made = build(E, seed, DEEP, kinds, spine=1.0, deep=True)
    if E is C_ENGINE:
        post, deepest = dfs([node(root)])
        assert deepest > 4096 and len(post) > 4096, "the walk's scratch must grow"
    return root, made


@pytest.mark.test_hooks
@pytest.mark.parametrize("kinds", [PLAIN, WITH_CUSTOM], ids=["C-only", "custom-ops"])
def test_failed_walks_then_the_same_graph_matches_the_reference(arm, kinds):
    """backward() failed at each of its allocations in turn (the walk's
    stack, with binary, unary and n-ary frames on it, and its list; then a
    sweep's copies), the grads as they were; then the same graph walked in
    full order, and backpropagated bit for bit as the reference's (which
    backpropagates once for every backward() that got through)."""
    c_root, c_made = deep_graph(C_ENGINE, 5, kinds)
    r_root, r_made = deep_graph(R_ENGINE, 5, kinds)
    want = dfs_postorder([node(c_root)])

    def attempt():
        before = [v.grad for v in c_made]
        try:
            c_root.backward()
        except MemoryError:
            assert_same_doubles([v.grad for v in c_made], before, "grads after a failed backward")
            return False
        return True

    def check(n, got_through):
        if got_through:
            r_root.backward()
        got = backward_walk(c_root)
        assert got == want, (f"after failing allocation {n}: the walk listed {len(got)} of "
                             f"{len(want)} nodes, first differing at "
                             f"{first_difference(got, want)}")
        assert_same_doubles(backward_grads(c_root, c_made), backward_grads(r_root, r_made),
                            f"grads after failing allocation {n}")

    assert _fail_each_allocation(arm, attempt, check) >= 8


@pytest.mark.test_hooks
def test_failed_walks_over_fused_nodes_then_the_same_graph(arm):
    """As above with dot, logsumexp and nn layers on the chain too (no
    bit-exact reference for those: a twin graph, built the same way and
    never failed, is the expectation)."""
    root, made = deep_graph(C_ENGINE, 9, FUSED)
    twin_root, twin_made = deep_graph(C_ENGINE, 9, FUSED)
    want = dfs_postorder([node(root)])

    def attempt():
        try:
            root.backward()
        except MemoryError:
            return False
        return True

    def check(n, got_through):
        if got_through:
            twin_root.backward()
        assert backward_walk(root) == want, f"after failing allocation {n}"
        assert_same_doubles(backward_grads(root, made), backward_grads(twin_root, twin_made),
                            f"grads after failing allocation {n}")

    assert _fail_each_allocation(arm, attempt, check) >= 8


@pytest.mark.test_hooks
@needs_record
def test_failed_record_order_over_several_roots_then_the_same_graph(arm):
    """pg_record_order (pygrad.compile's walk) failed at each allocation,
    some of them while it walks its second or third root: every mark comes
    off, those of the roots walked already too."""
    root, made = deep_graph(C_ENGINE, 13, WITH_CUSTOM)
    roots = [made[40], made[3], made[len(made) // 4], root, made[len(made) // 2]]
    want, deepest = dfs([node(v) for v in roots])
    # The stack grows past what a test core keeps only below the fourth root.
    assert dfs([node(v) for v in roots[:3]])[1] < 4096 < deepest

    def attempt():
        rc, order = record_order(roots)
        if rc < 0:
            assert rc == lib.PG_E_NOMEM
            return False
        assert order == want
        return True

    def check(n, got_through):
        rc, order = record_order(roots)
        assert rc == 0 and order == want, f"after failing allocation {n}"
        assert backward_walk(root) == dfs_postorder([node(root)]), f"after failing allocation {n}"

    assert _fail_each_allocation(arm, attempt, check) >= 8


@pytest.mark.test_hooks
def test_failed_compile_then_the_same_graph_compiles_as_the_reference(arm):
    """pygrad.compile failed at each allocation (its walk's among them),
    then the same graph compiled and backpropagated as the reference."""
    kinds = {k: w for k, w in PLAIN.items() if k != "function"}   # compile refuses Functions
    c_root, c_made = deep_graph(C_ENGINE, 21, kinds)
    r_root, r_made = deep_graph(R_ENGINE, 21, kinds)
    r_root.backward()
    expected = [v.grad for v in r_made]
    want = dfs_postorder([node(c_root)])

    def attempt():
        try:
            pygrad.compile(c_root)
        except MemoryError:
            return False
        return True

    def check(n, got_through):
        # First the walk: compiling a graph whose walk skips a node would
        # not fail cleanly (the program would miss that node's slot).
        assert backward_walk(c_root) == want, f"after failing allocation {n}"
        for v in c_made:
            v.grad = 0.0
        pygrad.compile(c_root).backward()
        assert_same_doubles([v.grad for v in c_made], expected, f"after failing allocation {n}")

    assert _fail_each_allocation(arm, attempt, check) >= 8
