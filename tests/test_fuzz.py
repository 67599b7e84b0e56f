"""Stateful fuzzing: random sequences of public-API actions, mirrored on the
C engine and on the pure-Python reference engine, checked bit for bit after
every step.

A Hypothesis ``RuleBasedStateMachine`` holds *pairs*: a ``pygrad.Value`` and
the reference ``Value`` built by the same calls.  Its rules make leaves and
constants (awkward numbers included), apply every op (binary with Values or
numbers on either side, powers, unary ops, the fused ``dot``/``sum``/
``logsumexp``, ``nn.Layer``, a ``pygrad.Function`` and micrograd-style custom
ops), drop pairs and collect garbage (so C nodes are freed under the graph
still held), run ``backward()`` (twice in a row too), write ``.data`` and
``.grad``, compile and replay graphs, and step optimizers.  After every step
each pair's data and grad must be the same double on both engines (nan equals
nan, 0.0 is not -0.0); at the end every C node made is freed again.

The reference side models exactly what the README documents and nothing
more:

- a fused node (``dot``, ``sum``, ``logsumexp``, a fused layer's neuron) is
  one node: a second ``backward()`` accumulates through it as through any
  node.  The reference builds the same expression from plain ops, whose
  hidden intermediate nodes would accumulate too; before each ``backward()``
  their grads are set back to 0, which is what "one node" means;
- a fused node's backward works from its operands' current data, like
  ``*``'s: before each ``backward()`` the hidden exp terms of a reference
  ``logsumexp`` are recomputed from its operands (the fused node's own
  value stays as it was);
- replay is emulated as csrc/replay.c runs it: every node of the graph is
  recomputed from its children in topological order (a fused node from its
  operands, so the plain ``logsumexp``'s shift ``m`` is taken afresh), and
  backward is that of a fresh graph: interior grads 0, the root's 1, leaves
  accumulate.

CI runs 200 examples of 30 steps (about a minute).  For a long run::

    PYGRAD_FUZZ_EXAMPLES=20000 python -m pytest tests/test_fuzz.py
"""
import gc
import math
import os
import random
import weakref
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

import pygrad
from pygrad import _ieee, nn, optim
from pygrad import reference as ref
from pygrad._core import lib

from helpers import micrograd_style_tanh, same_double, show

C, R = pygrad.Value, ref.Value

MAX_PAIRS = 16          # keep graphs small
EXAMPLES = int(os.environ.get("PYGRAD_FUZZ_EXAMPLES", "200"))

# -- numbers -------------------------------------------------------------------

AWKWARD = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -3.0, 5e-324, -5e-324, 2.2250738585072014e-308,
           1e-300, 1e300, -1e300, 1.7976931348623157e308, math.inf, -math.inf, math.nan,
           709.0, 710.0, -745.0, 36.0, -20.0]
floats = st.one_of(st.sampled_from(AWKWARD),
                   st.floats(min_value=-4.0, max_value=4.0),
                   st.floats(allow_nan=True, allow_infinity=True))
numbers = st.one_of(floats,
                    st.integers(min_value=-5, max_value=5),
                    st.booleans(),
                    st.sampled_from([Fraction(1, 3), np.float64(0.25), np.int64(-2),
                                     np.float32(1.5)]))
int_exponents = st.one_of(st.sampled_from([0, 1, 2, -1, 3, -2, True]),
                          st.integers(min_value=-6, max_value=6))
float_exponents = st.one_of(st.sampled_from([0.0, 1.0, 2.0, -1.0, 0.5, -0.5, 1.5, 3.0,
                                             1.0 / 3.0, -0.0, math.inf, math.nan]),
                            st.floats(min_value=-4.0, max_value=4.0))
picks = st.integers(min_value=0, max_value=2**16)
operand_specs = st.tuples(picks, st.none() | st.none() | numbers)   # a pair, or a number

BINARY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b,
          "*": lambda a, b: a * b, "/": lambda a, b: a / b, "**": lambda a, b: a ** b}
UNARY = {"neg": lambda a: -a, "exp": lambda a: a.exp(), "log": lambda a: a.log(),
         "tanh": lambda a: a.tanh(), "relu": lambda a: a.relu(),
         "sigmoid": lambda a: a.sigmoid()}
ACTS = [None, "relu", "tanh", "sigmoid"]


# -- user ops --------------------------------------------------------------------

class Cube(pygrad.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_values
        return (3.0 * x * x * grad,)


class Lerp(pygrad.Function):
    @staticmethod
    def forward(ctx, a, b, t):
        ctx.save_for_backward(a, b, t)
        return a + t * (b - a)

    @staticmethod
    def backward(ctx, grad):
        a, b, t = ctx.saved_values
        return (1.0 - t) * grad, t * grad, (b - a) * grad


def micrograd_style_mul(V):
    """A binary op written as a micrograd user writes one."""
    def mul(a, b):
        out = V(a.data * b.data, (a, b), "mymul")

        def _backward():
            a.grad += b.data * out.grad
            b.grad += a.data * out.grad
        out._backward = _backward
        return out
    return mul


CUSTOM = {"mytanh": (micrograd_style_tanh(C), micrograd_style_tanh(R)),
          "mymul": (micrograd_style_mul(C), micrograd_style_mul(R))}


# -- the reference side's model of fused nodes and replay --------------------------

# fused reference result -> its hidden interior nodes (weakly: they live as
# long as the result's graph does).
_hidden: "weakref.WeakKeyDictionary[R, list]" = weakref.WeakKeyDictionary()
# a logsumexp's "- m" node -> (its operands, every leaf holding m), weakly.
_lse_shift: "weakref.WeakKeyDictionary[R, tuple]" = weakref.WeakKeyDictionary()
# a fused logsumexp's reference result -> (operands, m leaves, hidden nodes).
_lse_hidden: "weakref.WeakKeyDictionary[R, tuple]" = weakref.WeakKeyDictionary()
# reference nodes whose value or gradient is Python's (compile refuses them).
_python_made: "weakref.WeakSet[R]" = weakref.WeakSet()


def _topo(v):
    return v._topo()


def register_fused(top, first_created, kind):
    """Remember the hidden nodes of a plain-op expression standing for one
    fused C node: the interior nodes made by the call (created after
    ``first_created``)."""
    hidden = [n for n in _topo(top) if n is not top and n._created > first_created and n._children]
    _hidden[top] = [weakref.ref(n) for n in hidden]
    if kind == "logsumexp":
        # log(sum(exp(v - m))) + m: the "+ m" leaf and each "v - m" node's m leaf.
        subs = [n for n in hidden if n._op == "-"]
        mleaves = [weakref.ref(top._children[1])] + [weakref.ref(s._children[1]) for s in subs]
        operands = [weakref.ref(s._children[0]) for s in subs]
        for s in subs:
            _lse_shift[s] = (operands, mleaves)
        _lse_hidden[top] = (operands, mleaves, _hidden[top])


def set_fresh_shift(operands, mleaves):
    """m = the largest operand (0 if infinite), into every leaf holding m."""
    xs = [r().data for r in operands]
    m = xs[0]
    for x in xs[1:]:
        if x > m:
            m = x
    if math.isinf(m):
        m = 0.0
    for r in mleaves:
        r().data = m


def refresh_lse_hidden():
    """The README: a fused node's backward works from its operands' current
    data.  For logsumexp that means its hidden exp terms are those of the
    operands now, not of when it was built: recompute them (not the fused
    node's own value, which C leaves as it is)."""
    for operands, mleaves, refs in list(_lse_hidden.values()):
        set_fresh_shift(operands, mleaves)
        for r in refs:
            n = r()
            if n is not None:
                n.data = ref_forward(n)


def before_backward():
    refresh_lse_hidden()
    reset_hidden_grads()


def identity(v):
    """A node passing v through: what C's one-operand SUM (or bias-only
    LINEAR) node is, where the plain expression is v itself."""
    out = R(v.data, (v,), "identity")

    def _backward():
        v.grad += out.grad
    out._backward = _backward
    return out


def reset_hidden_grads():
    """A fused node is one node: nothing below it keeps a grad between passes."""
    for refs in list(_hidden.values()):
        for r in refs:
            n = r()
            if n is not None:
                n.grad = 0.0


def _pow_k(op):
    return float(op[2:])


def ref_forward(v):
    """The data of a reference node from its children's data: csrc/ops.c's
    forward rule of the same op."""
    kids = v._children
    a = kids[0].data
    op = v._op
    if op == "+":
        return a + kids[1].data
    if op == "-":
        return a - kids[1].data
    if op == "*":
        return a * kids[1].data
    if op == "/":
        return _ieee.div(a, kids[1].data)
    if op == "neg":
        return -a
    if op == "identity":
        return a
    if op == "**":
        return _ieee.pow(a, kids[1].data)
    if op.startswith("**"):
        k = _pow_k(op)
        return a * a if k == 2.0 else _ieee.pow(a, k)
    if op == "exp":
        return _ieee.exp(a)
    if op == "log":
        return _ieee.log(a)
    if op == "tanh":
        return _ieee.tanh(a)
    if op == "ReLU":
        return 0.0 if a < 0.0 else a
    if op == "sigmoid":
        return R(a).sigmoid().data
    raise AssertionError(f"no forward rule for reference op {op!r}")


def ref_replay_forward(root):
    """csrc/replay.c's forward on the reference graph."""
    for v in _topo(root):
        if not v._children:
            continue
        shift = _lse_shift.get(v)
        if shift is not None:          # a fused logsumexp takes its shift afresh
            set_fresh_shift(*shift)
        v.data = ref_forward(v)
    return root.data


def ref_replay_backward(root):
    """csrc/replay.c's backward: as on a fresh graph."""
    refresh_lse_hidden()
    topo = _topo(root)
    for v in topo:
        if v._children:
            v.grad = 0.0
    root.grad = 1.0
    for v in reversed(topo):
        v._backward()


# -- comparison ------------------------------------------------------------------

def check_pair(c, r, what):
    assert same_double(c.data, r.data), f"{what}: data C {show(c.data)} != ref {show(r.data)}"
    assert same_double(c.grad, r.grad), f"{what}: grad C {show(c.grad)} != ref {show(r.grad)}"


def both(fn_c, fn_r):
    """Run the same action on both engines: same result, or the same
    exception type.  Returns (c_result, r_result), or None if both raised."""
    try:
        out_c = fn_c()
    except Exception as e:          # noqa: BLE001 - compared with the reference
        err_c = e
    else:
        err_c = None
    try:
        out_r = fn_r()
    except Exception as e:          # noqa: BLE001
        err_r = e
    else:
        err_r = None
    if err_c is not None or err_r is not None:
        assert type(err_c) is type(err_r), f"C raised {err_c!r}, reference raised {err_r!r}"
        return None
    return out_c, out_r


class EngineMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        pygrad.Value(0.0).backward()        # start a fresh segment
        gc.collect()
        self.live_before = lib.pg_live_nodes()
        self.pairs = []                     # [(C Value, reference Value, description)]
        self.layers = []                    # [(C Layer, reference Layer)]
        self.programs = []                  # [(Program, reference root, description)]
        self.optimizers = []                # [(C optimizer, reference optimizer)]

    # -- helpers ------------------------------------------------------------------

    def pick(self, i):
        return self.pairs[i % len(self.pairs)]

    def add(self, c, r, what):
        self.pairs.append((c, r, what))
        check_pair(c, r, what)
        if len(self.pairs) > MAX_PAIRS:
            del self.pairs[0]

    def apply(self, what, fn, *operands):
        """fn over the C operands and over the reference operands; a pair
        operand (C, R, _) stands for its C Value or its reference Value."""
        def args(side):
            return [o[side] if isinstance(o, tuple) else o for o in operands]
        out = both(lambda: fn(*args(0)), lambda: fn(*args(1)))
        if out is not None:
            self.add(out[0], out[1], what)
        return out

    def has_pairs(self):
        return bool(self.pairs)

    # -- leaves ---------------------------------------------------------------------

    @initialize(xs=st.lists(floats, min_size=1, max_size=3))
    def first_leaves(self, xs):
        for x in xs:
            self.add(C(x), R(x), f"leaf {x!r}")

    @rule(x=numbers, label=st.sampled_from(["", "w"]))
    def leaf(self, x, label):
        self.add(C(x, label=label), R(x, label=label), f"leaf {x!r}")

    # -- ops --------------------------------------------------------------------------

    @precondition(has_pairs)
    @rule(op=st.sampled_from(sorted(BINARY)), i=picks, j=picks)
    def binary(self, op, i, j):
        a, b = self.pick(i), self.pick(j)
        self.apply(f"({a[2]}) {op} ({b[2]})", BINARY[op], a, b)

    @precondition(has_pairs)
    @rule(op=st.sampled_from(sorted(BINARY)), i=picks, k=numbers, reflected=st.booleans())
    def binary_number(self, op, i, k, reflected):
        a = self.pick(i)
        if reflected:
            self.apply(f"{k!r} {op} ({a[2]})", lambda x: BINARY[op](k, x), a)
        else:
            self.apply(f"({a[2]}) {op} {k!r}", lambda x: BINARY[op](x, k), a)

    @precondition(has_pairs)
    @rule(i=picks, k=st.one_of(int_exponents, float_exponents))
    def power(self, i, k):
        a = self.pick(i)
        self.apply(f"({a[2]}) ** {k!r}", lambda x: x ** k, a)

    @precondition(has_pairs)
    @rule(op=st.sampled_from(sorted(UNARY)), i=picks)
    def unary(self, op, i):
        a = self.pick(i)
        self.apply(f"{op}({a[2]})", UNARY[op], a)

    # -- fused ops --------------------------------------------------------------------

    def fused(self, kind, fn_c, fn_r, what):
        """A fused op on C, its plain-op expression on the reference."""
        first = next(ref._creation_counter)
        out = both(fn_c, fn_r)
        if out is not None:
            r = out[1]
            if r._created < first or not r._children:
                r = identity(r)     # sum([v]), dot([], [], b=v): v itself on the reference
            register_fused(r, first, kind)
            self.add(out[0], r, what)

    def operand(self, spec):
        """(i, None) is the i-th pair, (i, k) the number k."""
        i, k = spec
        return self.pick(i) if k is None else (k, k, repr(k))

    def operands(self, specs):
        return [self.operand(s) for s in specs]

    @precondition(has_pairs)
    @rule(idx=st.lists(operand_specs, min_size=0, max_size=4),
          bias=st.none() | operand_specs, act=st.sampled_from(ACTS))
    def dot(self, idx, bias, act):
        terms = self.operands(idx)
        bias = None if bias is None else self.operand(bias)
        if len(terms) % 2:
            terms = terms[:-1]
        w, x = terms[0::2], terms[1::2]

        def side(s):
            return [t[s] for t in w], [t[s] for t in x], None if bias is None else bias[s]
        self.fused("dot", lambda: pygrad.dot(*side(0), act=act),
                   lambda: ref.dot(*side(1), act=act),
                   f"dot([{', '.join(t[2] for t in w)}], [{', '.join(t[2] for t in x)}], "
                   f"b={None if bias is None else bias[2]}, act={act!r})")

    @precondition(has_pairs)
    @rule(kind=st.sampled_from(["sum", "logsumexp"]),
          idx=st.lists(operand_specs, min_size=0, max_size=4),
          start=st.none() | picks)
    def reduce(self, kind, idx, start):
        vs = self.operands(idx)
        if kind == "sum":
            s = None if start is None else self.pick(start)
            self.fused("sum", lambda: pygrad.sum([v[0] for v in vs], None if s is None else s[0]),
                       lambda: ref.sum([v[1] for v in vs], None if s is None else s[1]),
                       f"sum([{', '.join(v[2] for v in vs)}], start={s and s[2]})")
        else:
            self.fused("logsumexp", lambda: pygrad.logsumexp([v[0] for v in vs]),
                       lambda: ref.logsumexp([v[1] for v in vs]),
                       f"logsumexp([{', '.join(v[2] for v in vs)}])")

    @rule(nin=st.integers(1, 3), nout=st.integers(1, 3), nonlin=st.booleans(),
          seed=st.integers(0, 1000))
    def make_layer(self, nin, nout, nonlin, seed):
        random.seed(seed)
        lc = nn.Layer(nin, nout, nonlin=nonlin, engine="c")
        random.seed(seed)
        lr = nn.Layer(nin, nout, nonlin=nonlin, engine="reference")
        self.layers.append((lc, lr))
        for k, (pc, pr) in enumerate(zip(lc.parameters(), lr.parameters())):
            self.add(pc, pr, f"layer{len(self.layers) - 1}.p{k}")

    @precondition(lambda self: self.layers and self.pairs)
    @rule(which=picks, idx=st.lists(operand_specs, min_size=3, max_size=3))
    def call_layer(self, which, idx):
        lc, lr = self.layers[which % len(self.layers)]
        xs = self.operands(idx)[:len(lc.neurons[0].w)]
        first = next(ref._creation_counter)
        out = both(lambda: lc([x[0] for x in xs]), lambda: lr([x[1] for x in xs]))
        if out is None:
            return
        oc, orf = out
        if not isinstance(oc, list):
            oc, orf = [oc], [orf]
        for k, (c, r) in enumerate(zip(oc, orf)):
            register_fused(r, first, "dot")
            self.add(c, r, f"layer{which % len(self.layers)}([{', '.join(x[2] for x in xs)}])[{k}]")

    # -- Python-made nodes --------------------------------------------------------------

    @precondition(has_pairs)
    @rule(fn=st.sampled_from(["Cube", "Lerp"]), i=picks, j=picks, t=numbers)
    def function(self, fn, i, j, t):
        a, b = self.pick(i), self.pick(j)
        if fn == "Cube":
            out = self.apply(f"Cube({a[2]})", Cube.apply, a)
        else:
            out = self.apply(f"Lerp({a[2]}, {b[2]}, {t!r})", Lerp.apply, a, b, t)
        if out is not None:
            _python_made.add(out[1])

    @precondition(has_pairs)
    @rule(op=st.sampled_from(sorted(CUSTOM)), i=picks, j=picks)
    def custom(self, op, i, j):
        a, b = self.pick(i), self.pick(j)
        fc, fr = CUSTOM[op]
        operands = (a,) if op == "mytanh" else (a, b)
        out = both(lambda: fc(*[o[0] for o in operands]), lambda: fr(*[o[1] for o in operands]))
        if out is not None:
            _python_made.add(out[1])
            self.add(out[0], out[1], f"{op}({', '.join(o[2] for o in operands)})")

    # -- lifetime -------------------------------------------------------------------

    @precondition(has_pairs)
    @rule(i=picks, collect=st.booleans())
    def drop(self, i, collect):
        del self.pairs[i % len(self.pairs)]
        if collect:
            gc.collect()

    @precondition(lambda self: self.layers or self.programs or self.optimizers)
    @rule(what=st.sampled_from(["layers", "programs", "optimizers"]), i=picks)
    def drop_other(self, what, i):
        held = getattr(self, what)
        if held:
            del held[i % len(held)]

    # -- backward and mutation -------------------------------------------------------

    @precondition(has_pairs)
    @rule(i=picks, twice=st.booleans())
    def backward(self, i, twice):
        c, r, _ = self.pick(i)
        for _ in range(2 if twice else 1):
            before_backward()
            both(c.backward, r.backward)

    @precondition(has_pairs)
    @rule(i=picks, field=st.sampled_from(["data", "grad"]), x=numbers)
    def mutate(self, i, field, x):
        c, r, _ = self.pick(i)
        # The C engine stores a double (README: "data is stored as a C
        # double"); the reference Value's fields are plain attributes, as
        # micrograd's are, and would keep an np.float32 or a Fraction as is.
        both(lambda: setattr(c, field, x), lambda: setattr(r, field, float(x)))

    # -- replay ------------------------------------------------------------------------

    @precondition(has_pairs)
    @rule(i=picks)
    def compile(self, i):
        c, r, what = self.pick(i)
        refused = any(n in _python_made for n in _topo(r))
        if refused:
            with pytest.raises(ValueError, match="cannot compile"):
                pygrad.compile(c)
        else:
            self.programs.append((pygrad.compile(c), r, what))

    @precondition(lambda self: self.programs)
    @rule(i=picks, step=st.sampled_from(["forward", "backward", "both"]))
    def replay(self, i, step):
        program, r, what = self.programs[i % len(self.programs)]
        if step in ("forward", "both"):
            got, expected = program.forward(), ref_replay_forward(r)
            assert same_double(got, expected), f"replay of {what}: {show(got)} != {show(expected)}"
        if step in ("backward", "both"):
            program.backward()
            ref_replay_backward(r)

    # -- optimizers ---------------------------------------------------------------------

    @precondition(has_pairs)
    @rule(kind=st.sampled_from(["SGD", "Adam"]), idx=st.sets(picks, min_size=1, max_size=4),
          lr=st.sampled_from([0.1, 1.0, 1e-3, 0.5]), momentum=st.sampled_from([0.0, 0.9]),
          weight_decay=st.sampled_from([0.0, 1e-2]))
    def make_optimizer(self, kind, idx, lr, momentum, weight_decay):
        chosen = {id(p[0]): p for p in (self.pick(i) for i in idx)}.values()
        pc, pr = [p[0] for p in chosen], [p[1] for p in chosen]
        if kind == "SGD":
            make = lambda ps: optim.SGD(ps, lr=lr, momentum=momentum, weight_decay=weight_decay)
        else:
            make = lambda ps: optim.Adam(ps, lr=lambda k: lr / (k + 1), weight_decay=weight_decay)
        self.optimizers.append((make(pc), make(pr)))

    @precondition(lambda self: self.optimizers)
    @rule(i=picks, zero=st.booleans())
    def optimizer_step(self, i, zero):
        oc, orf = self.optimizers[i % len(self.optimizers)]
        if zero:
            oc.zero_grad()
            orf.zero_grad()
        else:
            oc.step()
            orf.step()

    # -- checks ---------------------------------------------------------------------------

    @invariant()
    def engines_agree(self):
        for c, r, what in self.pairs:
            check_pair(c, r, what)
        for program, r, what in self.programs:
            check_pair(program.output, r, f"compiled root {what}")
        for lc, lr in self.layers:
            for k, (pc, pr) in enumerate(zip(lc.parameters(), lr.parameters())):
                check_pair(pc, pr, f"layer parameter {k}")

    def teardown(self):
        self.pairs.clear()
        self.layers.clear()
        self.programs.clear()
        self.optimizers.clear()
        gc.collect()
        pygrad.Value(0.0).backward()        # let the allocator leave the last segment
        gc.collect()
        live = lib.pg_live_nodes()
        assert live <= self.live_before + 1, (
            f"{live - self.live_before} C nodes still live after dropping everything")


EngineMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large])
test_engines_agree_under_random_api_sequences = EngineMachine.TestCase
