"""Node memory as a bytes object (commit 822ca12), attacked.

Every graph node lives in the bytes of a Python ``bytes`` object, and cffi
hands C that object's bytes for any ``void *`` node parameter.  Any bytes
object is therefore a node to C.  These tests try what ordinary or
adversarial-but-legal Python (no ctypes, no ``object.__setattr__`` on
``_pg_keep``, no calls into ``pygrad._core.lib``) can do to that: shared
or interned bytes, the bytes hash cache, copies and pickles, subclasses and
duck types, writes and deletes of every internal attribute, resurrection,
the collector, threads and fork, fused layers, replay and optimizers, and
micrograd 0.1.0's ``_op``.

No test depends on timing: another thread acts at a chosen point (inside a
custom op's ``_backward``), and anything that could crash or hang runs in
a subprocess with a bounded wait.  Numbers are compared exactly, against
the same work done plainly or on ``pygrad.reference``.
"""
import copy
import gc
import math
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import weakref

import numpy as np
import pytest

import pygrad
from pygrad import Value, nn, optim
from pygrad import reference as R
from pygrad.data import to_values

HERE = os.path.dirname(os.path.abspath(__file__))


def run(script: str, timeout: float = 30):
    """(returncode, stdout + stderr) of ``script`` in a new Python."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                         text=True, timeout=timeout, env=env, cwd=HERE)
    return out.returncode, out.stdout + out.stderr


# A node of its own bytes: an ADD whose children are wild pointers
# (kid[0], kid[1], mark, op=ADD, flags, variant, data, grad, aux).
FORGED_NODE = """
import struct
from pygrad import Value
NODE = struct.pack("<QQIBBHddd", 0x4141414141, 0x4141414141, 0, 1, 0, 0, 1.0, 0.0, 0.0) + bytes(16)
"""


# == bugs =======================================================================

def test_a_duck_that_says_it_is_a_value_gives_c_no_node_of_its_own():
    rc, out = run(FORGED_NODE + """
class Fake:                      # no pygrad class at all: it only claims to be a Value
    __class__ = property(lambda self: Value)
    _pg_keep = (NODE,)
try:
    y = Value(2.0) * Fake()
    y.backward()
except (TypeError, AttributeError):
    print("refused")
""")
    assert rc == 0 and "refused" in out, (rc, out)


def test_a_subclass_shadowing_the_keep_slot_gives_c_no_node_of_its_own():
    rc, out = run(FORGED_NODE + """
try:
    class Evil(Value):
        _pg_keep = (NODE,)
    e = Evil.__new__(Evil)
    e.backward()
except (TypeError, AttributeError):
    print("refused")
""")
    assert rc == 0 and "refused" in out, (rc, out)


def test_prev_after_rewriting_pg_a_reads_no_node_past_the_memory():
    # In a subprocess: the wrong answer reads past a bytes object.
    rc, out = run("""
from pygrad import Value
a, b, c = Value(2.0), Value(3.0), Value(4.0)
y = (a * b) + c
y._pg_a = y            # an internal attribute rewritten (legal: not _pg_keep)
y._pg_kids = None      # _prev's cache let go
(k,) = [k for k in y._prev if k.data == 6.0]     # a wrapper of a*b's node
print(sorted(x.data for x in k._prev))
""")
    assert rc == 0, out
    assert out.strip() == "[2.0, 3.0]", out     # a*b's children; not y, not a stray node


@pytest.mark.parametrize("let_go", ["none", "del"])
def test_a_let_go_value_is_not_initialised_again_behind_an_optimizer(let_go):
    p = Value(1.0)
    opt = optim.SGD([p], lr=0.5)
    if let_go == "none":
        p._pg_keep = None
    else:
        del p._pg_keep
    try:
        Value.__init__(p, 10.0)
    except TypeError:
        return                   # refused: fine
    p.grad = 2.0
    opt.step()
    assert p.data == 9.0         # the step lands on the Value the user holds


# == what held: keeps written and deleted ======================================

@pytest.mark.parametrize("junk", [None, "", "abc", 0, 1.5, True, 2 ** 70])
def test_letting_the_keep_go_to_an_atomic_value_raises_and_leaves_the_graph(junk):
    a = Value(3.0)
    w = a * 2 + 1
    a._pg_keep = junk
    for f in (lambda: a.data, lambda: a.grad, lambda: setattr(a, "grad", 1.0),
              lambda: a._op, lambda: a._prev, lambda: a.backward(), lambda: a + 1,
              lambda: 1 - a, lambda: a * a, lambda: a ** 2, lambda: a ** a, lambda: a.exp(),
              lambda: repr(a), lambda: a._backward, lambda: pygrad.sum([a, a]),
              lambda: pygrad.dot([a], [a]), lambda: copy.copy(a), lambda: optim.SGD([a], 0.1),
              lambda: pygrad.compile(a)):
        with pytest.raises((TypeError, AttributeError, IndexError, ValueError)):
            f()
    w.backward()                  # the graph keeps a's node
    assert (w.data, w.grad) == (7.0, 1.0)
    kids = w._prev
    assert sorted(k.data for k in kids) == [1.0, 6.0]


@pytest.mark.parametrize("junk", [(), [1], bytearray(128), b"", bytes(128), (bytes(128),),
                                  "subclass-of-str", "another-keep"])
def test_replacing_the_keep_is_refused(junk):
    v = Value(3.0)
    if junk == "subclass-of-str":
        junk = type("S", (str,), {})("x")
    elif junk == "another-keep":
        junk = Value(5.0)._pg_keep
    with pytest.raises(TypeError):
        v._pg_keep = junk
    assert v.data == 3.0


@pytest.mark.parametrize("body", [{"__slots__": ("_pg_keep",)}, {"_pg_keep": None},
                                  {"_pg_a": property(lambda self: 1)}, {"__slots__": ("_pg_kids",)}])
def test_a_subclass_may_not_define_values_own_slots(body):
    # C takes any bytes as node memory: a keep comes only from Value's slot
    with pytest.raises(TypeError, match="pygrad.Value's own slots"):
        type("S", (Value,), dict(body))


@pytest.mark.parametrize("name", ["_pg_a", "_pg_b", "_pg_kids", "label", "_op", "_backward"])
@pytest.mark.parametrize("how", ["del", "none", "junk", "self"])
def test_internal_attributes_written_or_deleted_leave_numbers_right(name, how):
    def build(V):
        a, b = V(0.5), V(-1.5)
        h = (a * b + 2.0).tanh()
        out = (h * a - b / 3.0) ** 2
        return a, b, h, out
    a, b, h, out = build(Value)
    for v in (h, out):
        try:
            if how == "del":
                delattr(v, name)
            elif how == "none":
                setattr(v, name, None)
            elif how == "junk":
                setattr(v, name, ("junk", 1, [2]))
            else:
                setattr(v, name, v)
        except (AttributeError, TypeError):
            pass
        try:
            v._prev                   # reads what was written; must not crash
        except (AttributeError, TypeError):
            pass
    gc.collect()
    out.backward()
    ra, rb, rh, rout = build(R.Value)
    rout.backward()
    assert (out.data, a.grad, b.grad) == (rout.data, ra.grad, rb.grad)


# == what held: the bytes object itself =========================================

def test_node_memory_is_unique_and_copies_of_it_are_the_same_object():
    # in a new Python: this suite's tests/internals.py makes node memory a
    # bytes subclass, to count it
    rc, out = run("""
import numpy as np
from pygrad import Value
from pygrad.data import to_values
vs = [Value(float(i)) for i in range(50)] + [Value(1.0) + 2 for _ in range(50)]
mems = [v._pg_keep[0] for v in vs]
assert all(type(m) is bytes for m in mems)
assert len({id(m) for m in mems}) == len(mems)      # no node memory is shared
m = mems[0]
# CPython hands back the same object for these: a "snapshot" is live.
assert bytes(m) is m and m[:] is m and m + b"" is m
# pygrad never makes empty node memory (b"" is a shared singleton)
assert to_values(np.zeros((3, 0))) == [[], [], []]
print("ok")
""")
    assert rc == 0 and out.strip() == "ok", out


def test_hashing_or_viewing_node_memory_changes_no_number():
    a, b = Value(2.0), Value(3.0)
    y = a * b + a
    held = {}
    for v in (a, b, y):
        m = v._pg_keep[0]
        held[m] = hash(m)             # the hash is cached in the bytes object
        memoryview(m)
    a.data = 5.0
    y2 = a * b + a
    y2.backward()
    assert (y2.data, a.grad, b.grad) == (20.0, 4.0, 5.0)
    assert all(hash(m) == h for m, h in held.items())   # cached: stale, but pygrad never hashes


def test_the_backward_rule_and_keep_copied_deep_hold_the_graph():
    a, b = Value(2.0), Value(3.0)
    y = a * b
    rule = copy.deepcopy(y._backward)
    keep = copy.deepcopy(y._pg_keep)
    # immutable: deepcopy returns it (but for this suite's counted node
    # memory, a bytes subclass: tests/internals.py)
    assert keep is y._pg_keep or type(y._pg_keep[0]) is not bytes
    del y
    gc.collect()
    rule.keep[0]                        # still held
    with pytest.raises(Exception):
        pickle.dumps(rule)              # a cffi function does not pickle
    # the rule pushes d(y) into a and b (grad of y is 0 here)
    rule()
    assert (a.grad, b.grad) == (0.0, 0.0)


# == what held: copies, pickles, subclasses ======================================

class Tagged(Value):
    __slots__ = ("tag", "__x")

    def __init__(self, data, tag="t"):
        super().__init__(data)
        self.tag = tag
        self.__x = 7


class Odd(Value):
    def __eq__(self, other):
        return True

    def __hash__(self):
        return 1


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy,
                                 lambda v: pickle.loads(pickle.dumps(v))])
def test_copies_and_pickles_are_leaves_with_the_numbers(how):
    a = Tagged(2.0, "a")
    b = Value(3.0, label="b")
    b.note = [1, 2]
    y = a * b + 1
    y.backward()
    c = Value(y.data, (a, b), "mine")
    c.label = "c"
    m = nn.MLP(2, [3, 1])
    f = m([a, b])
    for v in (a, b, y, c, f):
        w = how(v)
        assert type(w) is type(v)
        assert (w.data, w.grad, w.label) == (v.data, v.grad, v.label)
        assert w._prev == set() and w._op == ""
        assert w._pg_keep[0] is not v._pg_keep[0]
        z = w * 2
        z.backward()
        assert (z.data, w.grad) == (2 * v.data, v.grad + 2)
    assert how(a).tag == "a" and how(a)._Tagged__x == 7 and how(b).note == [1, 2]


def test_subclasses_with_own_eq_hash_init_and_slots_compute_right():
    a, b = Odd(2.0), Odd(3.0)
    y = a * b + a
    assert type(y) is Odd and len(y._prev) == 1      # a set, as micrograd's
    y.backward()
    assert (y.data, a.grad, b.grad) == (8.0, 4.0, 2.0)
    t = Tagged(1.5)
    u = t * t
    assert type(u) is Value                 # own __init__: a plain Value
    u.backward()
    assert t.grad == 3.0


def test_a_value_resurrected_by_its_del_keeps_its_node():
    saved = []

    class Phoenix(Value):
        def __del__(self):
            saved.append(self)

    x = Phoenix(2.0)
    y = x * 3.0
    keep_mem = x._pg_keep[0]
    del x, y, keep_mem
    gc.collect()
    (y,) = saved                      # y (a Phoenix too) holds x: only y died
    (p,) = [k for k in y._prev if type(k) is Phoenix]      # and the number's leaf
    assert (y.data, p.data) == (6.0, 2.0)
    z = p * y + 1
    z.backward()
    assert (z.data, p.grad, y.grad) == (13.0, 6.0 + 3 * 2.0, 2.0)
    saved.clear()


def test_weakref_callbacks_listing_the_heap_during_collection_read_right_numbers():
    seen = []

    def callback(_):
        # mid-collection: every Value on the heap, read and used
        for o in gc.get_objects():
            if type(o) is Value and o.label.startswith("leaf"):
                z = o * 2.0 + 1
                z.backward()
                seen.append((o.label, z.data))

    leaves, refs = [], []
    gc.disable()          # every cycle goes in the one collection below
    try:
        for i in range(30):
            a = Value(float(i), label=f"leaf{i}")
            a.me = a                       # tracked, so gc.get_objects() lists it
            b = a * 2 + 1
            b.me = b                       # a cycle: garbage once b is dropped
            refs.append(weakref.ref(b, callback))
            leaves.append(a)
        del a, b
    finally:
        gc.enable()
    gc.collect()
    assert seen and all(z == 2.0 * int(lbl[4:]) + 1 for lbl, z in seen)
    for i, a in enumerate(leaves):
        assert (a.data, a.grad) == (float(i), 2.0 * len(refs))


def test_gc_freeze_then_graphs_built_and_dropped():
    gc.freeze()
    try:
        for i in range(5):
            a = Value(1.0 + i)
            b = (a * a).exp().log()
            b.me = b
            b.backward()
            ra = R.Value(1.0 + i)
            rb = (ra * ra).exp().log()
            rb.backward()
            assert (b.data, a.grad) == (rb.data, ra.grad)
        del a, b
        gc.collect()
    finally:
        gc.unfreeze()


# == what held: threads and fork ================================================

def test_a_closure_that_runs_backward_in_its_own_thread_and_waits_for_another():
    """A closure may run a backward() in its thread; another thread's
    backward() waits for the sweep (docs/lifetime.md) and lands after it."""
    a = Value(2.0)
    b = a * 3
    c = Value(b.data, (b,), "f")
    done = threading.Event()

    def other():
        (a * 7).backward()
        done.set()

    t = threading.Thread(target=other)

    def bw():
        b.grad += c.grad
        (a * 5).backward()            # nested, same thread
        t.start()
        assert not done.wait(0.2)     # documented: waits for this sweep (not a timing claim:
        # it can only finish after the sweep, whatever the wait)
    c._backward = bw
    c.backward()
    t.join(10)
    assert done.is_set() and a.grad == 3 + 5 + 7


def test_two_threads_backward_on_a_shared_graph_add_both_gradients():
    a, b = Value(0.5), Value(-2.0)
    shared = (a * b).tanh() + a
    roots = [shared * float(i) for i in range(1, 5)]
    go = threading.Barrier(2)

    def work(rs):
        go.wait()
        for r in rs:
            r.backward()

    ts = [threading.Thread(target=work, args=(roots[i::2],)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    # as micrograd, a second backward() over shared nodes adds their grads
    # again, so the result depends on the order: it must be one serial order's
    import itertools
    serial = set()
    for order in itertools.permutations(range(4)):
        ra, rb = R.Value(0.5), R.Value(-2.0)
        rshared = (ra * rb).tanh() + ra
        rroots = [rshared * float(i) for i in range(1, 5)]
        for j in order:
            rroots[j].backward()
        serial.add((ra.grad, rb.grad))
    assert (a.grad, b.grad) in serial


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_fork_mid_sweep_child_backpropagates_the_shared_graph():
    rc, out = run("""
import os
from pygrad import Value
a = Value(2.0)
b = a * a
c = Value(b.data, (b,), "f")
def bw():
    b.grad += c.grad
    pid = os.fork()
    if pid == 0:
        y = (a * 3) + b       # shares b's node
        y.backward()
        print("child", a.grad, flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
c._backward = bw
c.backward()
print("parent", a.grad)
""")
    assert rc == 0, out
    # the same nested backward on the reference engine, without fork
    a = R.Value(2.0)
    b = a * a
    c = R.Value(b.data, (b,), "f")
    child = []

    def bw():
        b.grad += c.grad
        before = (a.grad, b.grad)
        y = (a * 3) + b
        y.backward()
        child.append(a.grad)
        a.grad, b.grad = before       # the parent's sweep goes on without the child's work
    c._backward = bw
    c.backward()
    assert out.split() == ["child", repr(child[0]), "parent", repr(a.grad)], out


# == what held: fused layers, data, replay, optimizers ===========================

def _manual_backward(root):
    topo, seen = [], set()
    stack = [(root, False)]
    while stack:
        v, done = stack.pop()
        if done:
            topo.append(v)
            continue
        if v in seen:
            continue
        seen.add(v)
        stack.append((v, True))
        stack.extend((k, False) for k in v._prev)
    root.grad = 1.0
    for v in reversed(topo):
        v._backward()


def test_micrograd_style_manual_backward_over_every_node_kind_matches_the_reference():
    def graph(V, mod):
        xs = [V(0.3), V(-1.2), V(0.7)]
        w = [V(0.5), V(-0.25), V(1.5)]
        d = mod.dot(w, xs, V(0.1))
        s = mod.sum([d.tanh(), xs[0] * xs[1], 2.0 - xs[2], xs[1] ** 2, 3.0 / xs[0]])
        lse = mod.logsumexp([s, d, xs[0] / 3.0])
        c = V(lse.data * 2, (lse,), "twice")

        def bw():
            lse.grad += 2 * c.grad
        c._backward = bw
        return xs + w, c.sigmoid() + 1
    leaves, root = graph(Value, pygrad)
    _manual_backward(root)
    rleaves, rroot = graph(R.Value, R)
    rroot.backward()
    assert root.data == rroot.data
    # summed in the hand-made order (set iteration): close, not bit-equal
    assert all(math.isclose(x.grad, y.grad, rel_tol=1e-12, abs_tol=1e-300)
               for x, y in zip(leaves, rleaves))
    # backward() itself is bit-equal to the reference
    leaves, root = graph(Value, pygrad)
    root.backward()
    assert [p.grad for p in leaves] == [p.grad for p in rleaves]


def test_a_fused_mlp_and_its_hidden_nodes_backpropagate_by_hand_as_in_c():
    import random
    random.seed(3)
    m = nn.MLP(3, [6, 5, 1])
    x = to_values(np.array([[0.1, -0.2, 0.3]]))[0]
    out = m(x)
    _manual_backward(out)
    by_hand = [p.grad for p in m.parameters()]
    m.zero_grad()
    out = m(x)
    out.backward()
    # a hidden node's grad is summed over its parents in the walk's order,
    # which a hand-made topological order need not share: close, not equal
    assert all(math.isclose(h, c, rel_tol=1e-12, abs_tol=1e-300)
               for h, c in zip(by_hand, [p.grad for p in m.parameters()]))
    hidden = [k for k in out._prev if k._op.startswith("linear")]
    assert hidden and all(k._prev for k in hidden)


def test_a_wide_fused_layer_over_leaves_from_data_matches_the_reference():
    import random
    random.seed(5)
    nin, nout = 400, 64
    layer = nn.Layer(nin, nout, nonlin=True)
    rows = np.linspace(-1, 1, 2 * nin).reshape(2, nin)
    xs = to_values(rows)
    outs = layer(xs[1])
    loss = pygrad.sum(outs)
    loss.backward()
    params = layer.parameters()
    rparams = [R.Value(p.data) for p in params]
    # the reference layer, neuron by neuron, in pygrad's parameter order (w..., b per neuron)
    rx = [R.Value(float(v)) for v in rows[1]]
    routs, i = [], 0
    for n in layer.neurons:
        w = rparams[i:i + nin]
        bb = rparams[i + nin]
        i += nin + 1
        routs.append(R.dot(w, rx, bb).relu())
    rloss = R.sum(routs)
    rloss.backward()
    assert loss.data == rloss.data
    assert [p.grad for p in params] == [p.grad for p in rparams]
    del outs, loss, xs
    gc.collect()
    assert layer.parameters()[0].data == rparams[0].data


def test_replay_map_and_train_step_after_the_graph_is_let_go():
    x1, x2 = Value(0.0), Value(0.0)
    w = Value(0.5)
    out = ((x1 * w + x2) ** 2).tanh()
    prog = pygrad.compile(out, [x1, x2])
    opt = optim.SGD([w], lr=0.1)
    rows = np.array([[0.1, 0.2], [0.3, -0.4]])
    expect = prog.map(rows)
    del out
    x1._pg_keep = None                # the program holds its keeps
    gc.collect()
    assert np.array_equal(prog.map(rows), expect)
    losses = prog.train_step(rows, np.ones(2), opt)
    assert np.array_equal(losses, expect)
    # the same step by hand
    w2 = Value(0.5)
    g = 0.0
    for r in rows:
        y = ((Value(r[0]) * w2 + r[1]) ** 2).tanh()
        y.backward()
    assert w.data == 0.5 - 0.1 * w2.grad


# == what held: micrograd 0.1.0's _op, repr and vars ==============================

micrograd = pytest.importorskip("micrograd.engine")


@pytest.mark.parametrize("make", [
    lambda V, a, b: a + b, lambda V, a, b: a * b, lambda V, a, b: a ** 2,
    lambda V, a, b: a ** 2.5, lambda V, a, b: a ** -1, lambda V, a, b: a.relu(),
    lambda V, a, b: 2 + a, lambda V, a, b: a * 2, lambda V, a, b: V(1.0),
    lambda V, a, b: V(5.0, (a, b), "+"), lambda V, a, b: V(5.0, (a,)),
    lambda V, a, b: V(5.0, (), "named"),
])
def test_op_names_and_custom_op_attributes_as_micrograd(make):
    M = micrograd.Value
    m = make(M, M(2.0), M(3.0))
    p = make(Value, Value(2.0), Value(3.0))
    assert p._op == m._op
    assert repr(p) == repr(m).replace("grad=0)", "grad=0.0)")
    if "_op" in vars(p):              # a custom op: micrograd's names in the instance dict
        assert set(vars(p)) <= set(vars(m)) and vars(p)["_op"] == vars(m)["_op"]
    # a name set later lives in the instance dict, as micrograd's, and comes first
    p._op = "renamed"
    m._op = "renamed"
    assert p._op == m._op == "renamed" and vars(p)["_op"] == "renamed"
    with pytest.raises(TypeError):
        p._op = 5                     # pygrad: _op must be a str (documented)
    from pygrad import viz
    q = p * p.exp() + Value(1.0, label="one")
    nodes, edges = viz.trace(q)
    assert p in nodes and "renamed" in viz.format_tree(q)
    vars(p)["_op"] = 5                # around __setattr__: read as written, as micrograd's
    assert p._op == 5


def test_op_names_pygrad_keeps_its_own_for_fused_ops():
    a, b = Value(2.0), Value(3.0)
    # documented (coming-from-micrograd.md): micrograd's a-b, -a, a/b are '+', '*', '*'
    assert [(a - b)._op, (-a)._op, (a / b)._op] == ["-", "neg", "/"]
    e = a + b
    e._op = "plus"
    del e._op                         # the C name again (micrograd: AttributeError)
    assert e._op == "+"


def test_a_duck_in_a_bulk_path_or_an_nary_node_is_refused():
    # the bulk paths and n-ary nodes take their pointers from C's own read
    # of each Value's slot (pg_pack_keeps), not from what the item answers
    rc, out = run(FORGED_NODE + """
import pygrad
from pygrad import optim
class Fake:
    __class__ = property(lambda self: Value)
    _pg_keep = (NODE,)
tries = [lambda: optim.SGD([Value(1.0), Fake()], lr=0.1).step(),
         lambda: pygrad.dot([Fake(), Value(2.0)], [Value(1.0), Value(3.0)]).backward(),
         lambda: Value(1.0, (Fake(),), "custom").backward(),
         lambda: pygrad.compile(Value(2.0) * 3.0, inputs=[Fake()])]
for t in tries:
    try:
        t()
        print("ran")
    except (TypeError, AttributeError, ValueError):
        print("refused")
""")
    assert rc == 0 and out.split() == ["refused"] * 4, (rc, out)
