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
nan, 0.0 is not -0.0), and its label the same string; at the end every C node
made is freed again.

The C side is also checked as the plain Python object it is to its user:

- attributes: any attribute set on a held C Value is modelled (the
  reference Value has ``__slots__`` and takes none), read back with
  ``getattr``/``hasattr``/``vars``, deleted, and seen on the object a
  parent's ``_prev`` hands out;
- identity: ``_prev`` hands out the very objects the fuzzer holds (and the
  same objects on every read), and a label set on a node is found again
  through its parent's ``_prev`` after the fuzzer let go of the node's
  Value (the object found is then held as a pair of its own);
- copies: ``copy``, ``deepcopy`` and ``pickle`` of a held Value are new
  leaves with the same data, grad, label and attributes;
- no pygrad Python code runs while Values die (drops, collections);
- interrupts: another rule runs with a ``KeyboardInterrupt`` raised by a
  trace function at the n-th Python event (call, line, return; bytecode
  too, if drawn) in pygrad's or these tests' code: where a real Ctrl-C
  lands, between bytecodes.  What the interrupted call made is discarded on
  both engines (a build is dropped; a cut backward or replay leaves the
  graph's grads zeroed on both sides and runs again; a cut write or
  optimizer step is undone from the reference), and the engines must go on
  agreeing bit for bit, with no C node leaked at the end.

The reference side models exactly what docs/api.md documents (Fused ops;
Replay) and nothing more:

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

The default run tries 3 examples of 30 steps (about 8 s); the slow run
(``pytest -m slow``, which .ci/run runs) 150.  For a long run::

    PYGRAD_FUZZ_EXAMPLES=20000 python -m pytest -m slow tests/test_fuzz.py
"""
import copy
import dis
import gc
import math
import os
import pickle
import random
import sys
import weakref
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

import pygrad
import pygrad.engine
from pygrad import nn, optim
from pygrad.reference import _ieee
from pygrad import reference as ref
from pygrad._core import lib
from pygrad import _ops

import internals
from helpers import micrograd_style_tanh, same_double, show

C, R = pygrad.Value, ref.Value

import collections

STATS = collections.Counter()
MAX_PAIRS = 16          # keep graphs small
EXAMPLES = 3           # the default run (about 8 s of its 90); the slow run takes SLOW_EXAMPLES
SLOW_EXAMPLES = int(os.environ.get("PYGRAD_FUZZ_EXAMPLES", "150"))   # CI's slow stage: about 3 min

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


def _calls(name):
    return lambda a: getattr(a, name)()


# Every unary method of the op table (exp ... abs), and neg: an op added to
# csrc/ops.def is fuzzed with nothing written here.  _op -> method name.
UNARY_METHODS = {op.name: op.methods[0].name for op in _ops.METHOD_OPS
                 if op.arity == 1 and not op.methods[0].name.startswith("_")}
UNARY = {"neg": lambda a: -a, **{name: _calls(name) for name in UNARY_METHODS.values()}}
ACTS = [None, "relu", "tanh", "sigmoid"]
LABELS = st.sampled_from(["", "w", "x", "loss"])

# Attributes a user sets on a Value (none shadows a method or a property).
ATTR_NAMES = st.sampled_from(["m", "v", "velocity", "tag", "name", "_cache", "__x", "prev_grad"])


class PairRef:
    """An attribute value drawn as "the C Value of the i-th pair" (itself,
    maybe: a cycle through the Value's own __dict__)."""

    def __init__(self, i):
        self.i = i

    def __repr__(self):
        return f"PairRef({self.i})"


ATTR_VALUES = st.one_of(st.integers(-3, 3), st.text(max_size=3), st.none(),
                        st.floats(allow_nan=False), st.lists(st.integers(0, 3), max_size=2),
                        st.tuples(st.integers(0, 3)), st.builds(PairRef, picks))
# Where an interrupt lands: the n-th event (an op's fast path has ~10 line
# events; a settle() hundreds).
INTERRUPT_AT = st.one_of(st.integers(1, 15), st.integers(1, 150), st.integers(1, 1500))
LIFETIME_ACTIONS = ["settle", "check_prev", "backward", "custom", "copy_pair", "set_label",
                    "leaf", "call_layer"]
COPIES = ["copy", "deepcopy", "deepcopy twice in one call", "pickle"]

# The arguments of the rules that the interrupt rule can run cut short.
ARGS = {
    "leaf": dict(x=numbers, label=st.sampled_from(["", "w"])),
    "binary": dict(op=st.sampled_from(sorted(BINARY)), i=picks, j=picks),
    "binary_number": dict(op=st.sampled_from(sorted(BINARY)), i=picks, k=numbers,
                          reflected=st.booleans()),
    "power": dict(i=picks, k=st.one_of(int_exponents, float_exponents)),
    "unary": dict(op=st.sampled_from(sorted(UNARY)), i=picks),
    "dot": dict(idx=st.lists(operand_specs, min_size=0, max_size=4),
                bias=st.none() | operand_specs, act=st.sampled_from(ACTS)),
    "reduce": dict(kind=st.sampled_from(["sum", "logsumexp"]),
                   idx=st.lists(operand_specs, min_size=0, max_size=4), start=st.none() | picks),
    "make_layer": dict(nin=st.integers(1, 3), nout=st.integers(1, 3), nonlin=st.booleans(),
                       seed=st.integers(0, 1000)),
    "call_layer": dict(which=picks, idx=st.lists(operand_specs, min_size=3, max_size=3)),
    "function": dict(fn=st.sampled_from(["Cube", "Lerp"]), i=picks, j=picks, t=numbers),
    "custom": dict(op=None, i=picks, j=picks),      # op: below, once CUSTOM is made
    "backward": dict(i=picks, twice=st.booleans()),
    "mutate": dict(i=picks, field=st.sampled_from(["data", "grad"]), x=numbers),
    "set_label": dict(i=picks, text=LABELS),
    "compile": dict(i=picks),
    "replay": dict(i=picks, step=st.sampled_from(["forward", "backward", "both"])),
    "make_optimizer": dict(kind=st.sampled_from(["SGD", "Adam"]),
                           idx=st.sets(picks, min_size=1, max_size=4),
                           lr=st.sampled_from([0.1, 1.0, 1e-3, 0.5]),
                           momentum=st.sampled_from([0.0, 0.9]),
                           weight_decay=st.sampled_from([0.0, 1e-2])),
    "optimizer_step": dict(i=picks, zero=st.booleans()),
    "copy_pair": dict(i=picks, how=st.sampled_from(COPIES),
                      protocol=st.integers(0, pickle.HIGHEST_PROTOCOL), attributed=st.booleans()),
    "check_prev": dict(i=picks),
    "settle": dict(),
}


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
ARGS["custom"]["op"] = st.sampled_from(sorted(CUSTOM))


# -- interrupts ------------------------------------------------------------------------

from interrupts import PYGRAD_CODE, TEST_CODE, Interrupter, _LINE_ERRORS_LOST, with_exit_offsets


class Cut(Exception):
    """The C side of an action was interrupted: what it made is discarded."""


class _Interrupts:
    armed = None        # the Interrupter the next C call runs under
    cut = None          # where the last C call run under one was cut


INTERRUPTS = _Interrupts()


def run_c(fn):
    """fn(), the C side of an action: under the armed Interrupter, if any
    (one call only).  A KeyboardInterrupt it raised becomes Cut; one it
    raised that does not come out of fn is a failure (swallowed)."""
    tracer, INTERRUPTS.armed = INTERRUPTS.armed, None
    if tracer is None:
        return fn()
    INTERRUPTS.cut = None
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        out = fn()
    except BaseException as e:      # noqa: BLE001
        sys.settrace(old)
        if tracer.fired is None:
            raise
        assert type(e) is KeyboardInterrupt, (
            f"the KeyboardInterrupt raised at {tracer.fired} came out as {e!r}")
        INTERRUPTS.cut = tracer.fired
        note(f"interrupted at {tracer.fired}")
        raise Cut(tracer.fired) from None
    finally:
        sys.settrace(old)
    assert tracer.fired is None, (
        f"the KeyboardInterrupt raised at {tracer.fired} was swallowed: the call returned {out!r}")
    return out


class no_pygrad_code:
    """Asserts that no pygrad Python code runs in the block (as Values die:
    their claims are released in C), but for the collection callback's."""

    def __init__(self, what):
        self.what = what

    def __enter__(self):
        self.counter = Interrupter(None, prefixes=(PYGRAD_CODE,))
        self.old = sys.gettrace()
        sys.settrace(self.counter)

    def __exit__(self, *exc):
        sys.settrace(self.old)
        assert self.counter.events == 0, (
            f"pygrad Python code ran while {self.what}: first at {self.counter.first}")


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
# a fused reference result -> (its operands' reference Values, how many of
# its operands were numbers): the C node's children, where the reference
# graph has hidden nodes in between.
_operands: "weakref.WeakKeyDictionary[R, tuple]" = weakref.WeakKeyDictionary()


def record_operands(r, operands):
    """Remember the operands (pairs, or numbers as (k, k, repr)) of the
    fused node whose reference result is r."""
    _operands[r] = (tuple(o[1] for o in operands if isinstance(o[1], R)),
                    sum(1 for o in operands if not isinstance(o[1], R)))


def children_of(r):
    """The reference Values standing for the C node's children, and how
    many more children it has (leaves made from numbers)."""
    return _operands.get(r, (r._children, 0))


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
    """docs/api.md, Fused ops: a fused node's backward works from its
    operands' current data.  For logsumexp that means its hidden exp terms
    are those of the operands now, not of when it was built: recompute them
    (not the fused node's own value, which C leaves as it is)."""
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
    if op in UNARY_METHODS:            # the reference engine's own forward rule
        return getattr(R(a), UNARY_METHODS[op])().data
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
    """csrc/replay.c's backward: as on a fresh graph, where - and / have no
    hidden grad from an earlier pass either."""
    refresh_lse_hidden()
    topo = _topo(root)
    for v in topo:
        if v._children:
            v.grad = 0.0
            zero_micrograd_hidden(v)
    root.grad = 1.0
    for v in reversed(topo):
        v._backward()


# -- comparison ------------------------------------------------------------------

def check_pair(c, r, what):
    assert same_double(c.data, r.data), f"{what}: data C {show(c.data)} != ref {show(r.data)}"
    assert same_double(c.grad, r.grad), f"{what}: grad C {show(c.grad)} != ref {show(r.grad)}"


def both(fn_c, fn_r):
    """Run the same action on both engines: same result, or the same
    exception type.  Returns (c_result, r_result), or None if both raised
    or the C side was interrupted (then the reference side is not run)."""
    try:
        out_c = run_c(fn_c)
    except Cut:
        return None
    except AssertionError:          # a check of run_c's
        raise
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


def both_cut(fn_c, fn_r):
    """both(); True if the C side was interrupted (and so nothing ran on
    the reference side)."""
    INTERRUPTS.cut = None
    both(fn_c, fn_r)
    return INTERRUPTS.cut is not None


def zero_micrograd_hidden(n):
    """The hidden inner grad of a reference - or / node (micrograd's b * -1
    or b ** -1, which a repeated backward accumulates into) as new."""
    fn = n._backward
    code = getattr(fn, "__code__", None)
    if code is not None and "hidden" in code.co_freevars:
        fn.__closure__[code.co_freevars.index("hidden")].cell_contents = -0.0


def zero_graph(c, r):
    """grad = 0 on every node below c and below r, and the hidden grads of
    - and / (micrograd's inner nodes, which micrograd's own walk would zero
    too) as new: what an interrupted backward left half done is then the
    same on both engines."""
    for n in _topo(r):
        n.grad = 0.0
        zero_micrograd_hidden(n)
    seen = {}
    stack = [c]
    while stack:
        v = stack.pop()
        if id(v) not in seen:
            seen[id(v)] = v
            v.grad = 0.0
            internals.zero_hidden_grad(v)
            stack.extend(v._prev)


class WeakAttr:
    """The model of an attribute whose value is a C Value: weakly, so that
    the model keeps nothing alive."""

    __slots__ = ("ref",)

    def __init__(self, v):
        self.ref = weakref.ref(v)

    def __repr__(self):
        return f"<attribute: {self.ref()!r}>"


def model_value(x):
    return WeakAttr(x) if isinstance(x, C) else x


def actual_value(m):
    return m.ref() if isinstance(m, WeakAttr) else m


def own_attributes(v):
    """A C Value's attributes, less a custom op's closure and name (kept in
    its __dict__ by pygrad, left behind by copies) and its label (kept
    there too once set, as the micrograd lecture's Value keeps it; checked
    on its own)."""
    return {k: x for k, x in vars(v).items() if k not in ("_backward", "_op", "label")}


def same_copied_attribute(got, expected, original, copied, shallow):
    """An attribute of a copy of ``original`` (``copied``): the same object
    for copy.copy; for deepcopy and pickle, an equal one (a C Value: a new
    leaf with its data, grad and label; the original itself: the copy)."""
    if shallow:
        return got is expected
    if isinstance(expected, C):
        if expected is original:
            return got is copied
        return (type(got) is C and got is not expected and not got._prev
                and same_double(got.data, expected.data) and same_double(got.grad, expected.grad)
                and got.label == expected.label)
    if isinstance(expected, list):
        return type(got) is list and got is not expected and got == expected
    if isinstance(expected, float):
        return type(got) is float and same_double(got, expected)
    return type(got) is type(expected) and got == expected


def make_copy(c, how, protocol):
    if how == "copy":
        return copy.copy(c)
    if how == "deepcopy":
        return copy.deepcopy(c)
    if how == "pickle":
        return pickle.loads(pickle.dumps(c, protocol))
    x, y = copy.deepcopy([c, c])
    assert x is y, "deepcopy copied one Value twice"
    return x


def check_copy(c, c2, what, shallow):
    """c2, a copy of c, is a new leaf with c's data, grad, label and
    attributes (the same objects if shallow, else copies)."""
    assert type(c2) is C and c2 is not c, f"{what}: {c2!r}"
    assert c2._prev == set() and c2._op == "", f"{what} is not a leaf: {c2._op!r}"
    assert c2.label == c.label, f"{what}.label: {c2.label!r} != {c.label!r}"
    assert same_double(c2.data, c.data) and same_double(c2.grad, c.grad), (
        f"{what}: {c2!r} != {c!r}")
    got, expected = own_attributes(c2), own_attributes(c)
    assert got.keys() == expected.keys() and all(
        same_copied_attribute(got[k], expected[k], c, c2, shallow) for k in got), (
        f"{what}: attributes {got!r}, the original's {expected!r}")


class EngineMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        gc.collect()
        pygrad.engine.settle()
        self.live_before = internals.live_nodes()
        self.pairs = []                     # [(C Value, reference Value, description)]
        self.layers = []                    # [(C Layer, reference Layer)]
        self.programs = []                  # [(Program, reference root, description)]
        self.optimizers = []                # [(C optimizer, reference optimizer)]
        # C Value -> {name: model of the attribute}: what vars() must show.
        self.attrs = weakref.WeakKeyDictionary()
        self.labels_made = 0

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

    def held_by_ref(self):
        """id(reference Value) -> the C Value held for the same node.  One
        Value per node: two pairs of one node hold the same C Value."""
        held = {}
        for c, r, what in self.pairs:
            if id(r) in held:
                assert held[id(r)] is c, f"two C Values held for the node of {what}"
            held[id(r)] = c
        return held

    def check_attrs(self, v, what):
        """vars(v) is what was set on v and not deleted, the very objects."""
        got = own_attributes(v)
        expected = {k: actual_value(m) for k, m in self.attrs.get(v, {}).items()}
        assert got.keys() == expected.keys() and all(got[k] is expected[k] for k in got), (
            f"{what}: attributes {got!r}, but {expected!r} were set")

    # -- leaves ---------------------------------------------------------------------

    @initialize(xs=st.lists(floats, min_size=1, max_size=3))
    def first_leaves(self, xs):
        for x in xs:
            self.add(C(x), R(x), f"leaf {x!r}")

    @rule(**ARGS["leaf"])
    def leaf(self, x, label):
        out = both(lambda: C(x, label=label), lambda: R(x, label=label))
        if out is not None:
            self.add(*out, f"leaf {x!r}")

    # -- ops --------------------------------------------------------------------------

    @precondition(has_pairs)
    @rule(**ARGS["binary"])
    def binary(self, op, i, j):
        a, b = self.pick(i), self.pick(j)
        self.apply(f"({a[2]}) {op} ({b[2]})", BINARY[op], a, b)

    @precondition(has_pairs)
    @rule(**ARGS["binary_number"])
    def binary_number(self, op, i, k, reflected):
        a = self.pick(i)
        if reflected:
            self.apply(f"{k!r} {op} ({a[2]})", lambda x: BINARY[op](k, x), a)
        else:
            self.apply(f"({a[2]}) {op} {k!r}", lambda x: BINARY[op](x, k), a)

    @precondition(has_pairs)
    @rule(**ARGS["power"])
    def power(self, i, k):
        a = self.pick(i)
        self.apply(f"({a[2]}) ** {k!r}", lambda x: x ** k, a)

    @precondition(has_pairs)
    @rule(**ARGS["unary"])
    def unary(self, op, i):
        a = self.pick(i)
        self.apply(f"{op}({a[2]})", UNARY[op], a)

    # -- fused ops --------------------------------------------------------------------

    def fused(self, kind, fn_c, fn_r, what, operands):
        """A fused op on C, its plain-op expression on the reference."""
        first = next(ref._creation_counter)
        out = both(fn_c, fn_r)
        if out is not None:
            r = out[1]
            if r._created < first or not r._children:
                r = identity(r)     # sum([v]), dot([], [], b=v): v itself on the reference
            register_fused(r, first, kind)
            record_operands(r, operands)
            self.add(out[0], r, what)

    def operand(self, spec):
        """(i, None) is the i-th pair, (i, k) the number k."""
        i, k = spec
        return self.pick(i) if k is None else (k, k, repr(k))

    def operands(self, specs):
        return [self.operand(s) for s in specs]

    @precondition(has_pairs)
    @rule(**ARGS["dot"])
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
                   f"b={None if bias is None else bias[2]}, act={act!r})",
                   terms + ([] if bias is None else [bias]))

    @precondition(has_pairs)
    @rule(**ARGS["reduce"])
    def reduce(self, kind, idx, start):
        vs = self.operands(idx)
        if kind == "sum":
            s = None if start is None else self.pick(start)
            self.fused("sum", lambda: pygrad.sum([v[0] for v in vs], None if s is None else s[0]),
                       lambda: ref.sum([v[1] for v in vs], None if s is None else s[1]),
                       f"sum([{', '.join(v[2] for v in vs)}], start={s and s[2]})",
                       vs + ([] if s is None else [s]))
        else:
            self.fused("logsumexp", lambda: pygrad.logsumexp([v[0] for v in vs]),
                       lambda: ref.logsumexp([v[1] for v in vs]),
                       f"logsumexp([{', '.join(v[2] for v in vs)}])", vs)

    @rule(**ARGS["make_layer"])
    def make_layer(self, nin, nout, nonlin, seed):
        random.seed(seed)
        try:
            lc = run_c(lambda: nn.Layer(nin, nout, nonlin=nonlin, engine="c"))
        except Cut:
            return
        random.seed(seed)
        lr = nn.Layer(nin, nout, nonlin=nonlin, engine="reference")
        self.layers.append((lc, lr))
        for k, (pc, pr) in enumerate(zip(lc.parameters(), lr.parameters())):
            self.add(pc, pr, f"layer{len(self.layers) - 1}.p{k}")

    @precondition(lambda self: self.layers and self.pairs)
    @rule(**ARGS["call_layer"])
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
            neuron = lr.neurons[k]
            record_operands(r, [(p, p) for p in neuron.parameters()] + xs)
            self.add(c, r, f"layer{which % len(self.layers)}([{', '.join(x[2] for x in xs)}])[{k}]")

    # -- Python-made nodes --------------------------------------------------------------

    @precondition(has_pairs)
    @rule(**ARGS["function"])
    def function(self, fn, i, j, t):
        a, b = self.pick(i), self.pick(j)
        if fn == "Cube":
            out = self.apply(f"Cube({a[2]})", Cube.apply, a)
        else:
            out = self.apply(f"Lerp({a[2]}, {b[2]}, {t!r})", Lerp.apply, a, b, t)
        if out is not None:
            _python_made.add(out[1])

    @precondition(has_pairs)
    @rule(**ARGS["custom"])
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
        with no_pygrad_code("dropping a pair"):
            del self.pairs[i % len(self.pairs)]
            if collect:
                gc.collect()

    @precondition(lambda self: self.layers or self.programs or self.optimizers)
    @rule(what=st.sampled_from(["layers", "programs", "optimizers"]), i=picks)
    def drop_other(self, what, i):
        held = getattr(self, what)
        if held:
            with no_pygrad_code(f"dropping one of {what}"):
                del held[i % len(held)]
                gc.collect()

    @rule(**ARGS["settle"])
    def settle(self):
        """pygrad.engine.settle() changes which claim holds each Value, and
        nothing a user sees: every _prev still hands out the held Values."""
        try:
            run_c(pygrad.engine.settle)
        except Cut:
            pass
        for c, r, what in self.pairs:
            self.check_prev_of(c, r, what)

    # -- backward and mutation -------------------------------------------------------

    @precondition(has_pairs)
    @rule(**ARGS["backward"])
    def backward(self, i, twice):
        c, r, _ = self.pick(i)
        for _ in range(2 if twice else 1):
            before_backward()
            if both_cut(c.backward, r.backward):
                # Cut half way: start the graph's grads afresh on both sides,
                # and the same backward must then agree again.
                zero_graph(c, r)
                before_backward()
                both(c.backward, r.backward)

    @precondition(has_pairs)
    @rule(**ARGS["mutate"])
    def mutate(self, i, field, x):
        c, r, _ = self.pick(i)
        # The C engine stores a double (docs/api.md, `pygrad.Value`: "stored
        # as a C double"); the reference Value's fields are plain attributes,
        # as micrograd's are, and would keep an np.float32 or a Fraction as is.
        if both_cut(lambda: setattr(c, field, x), lambda: setattr(r, field, float(x))):
            setattr(c, field, getattr(r, field))        # undone: as it was

    @precondition(has_pairs)
    @rule(**ARGS["set_label"])
    def set_label(self, i, text):
        c, r, _ = self.pick(i)
        if both_cut(lambda: setattr(c, "label", text), lambda: setattr(r, "label", text)):
            c.label = r.label                           # undone: as it was

    # -- attributes ---------------------------------------------------------------------
    # The reference Value has __slots__ (no attributes): attributes are set on
    # the C side only, against the model in self.attrs.

    @precondition(has_pairs)
    @rule(i=picks, attributes=st.lists(st.tuples(ATTR_NAMES, ATTR_VALUES), min_size=1, max_size=3))
    def set_attr(self, i, attributes):
        c, _, what = self.pick(i)
        for name, value in attributes:
            if isinstance(value, PairRef):
                value = self.pick(value.i)[0]
            setattr(c, name, value)
            self.attrs.setdefault(c, {})[name] = model_value(value)
            assert getattr(c, name) is value, f"{what}.{name}"
            assert vars(c)[name] is value, f"{what}.{name}"

    @precondition(has_pairs)
    @rule(i=picks, name=ATTR_NAMES)
    def del_attr(self, i, name):
        c, _, what = self.pick(i)
        model = self.attrs.get(c, {})
        if name in model:
            delattr(c, name)
            del model[name]
        else:
            with pytest.raises(AttributeError):
                delattr(c, name)
        assert not hasattr(c, name), f"{what}.{name} deleted"
        self.check_attrs(c, what)

    @precondition(has_pairs)
    @rule(i=picks, name=ATTR_NAMES)
    def get_attr(self, i, name):
        c, _, what = self.pick(i)
        model = self.attrs.get(c, {})
        missing = object()
        assert hasattr(c, name) == (name in model), f"hasattr({what}, {name!r})"
        expected = actual_value(model[name]) if name in model else missing
        assert getattr(c, name, missing) is expected, f"getattr({what}, {name!r}, default)"
        if name in model:
            assert getattr(c, name) is expected, f"{what}.{name}"
        else:
            with pytest.raises(AttributeError):
                getattr(c, name)
        self.check_attrs(c, what)

    # -- identity -------------------------------------------------------------------------

    @precondition(has_pairs)
    @rule(**ARGS["check_prev"])
    def check_prev(self, i):
        c, r, what = self.pick(i)
        try:
            first = run_c(lambda: c._prev)
        except Cut:
            first = None            # the read that was cut must not have hurt
        self.check_prev_of(c, r, what, first)

    def check_prev_of(self, c, r, what, first=None):
        """_prev is a set of the very Values the fuzzer holds for the
        children (the same ones on every read), as many as the node has
        children, each with its own attributes."""
        if first is None:
            first = c._prev
        second = c._prev
        assert isinstance(first, set) and all(type(x) is C for x in first), f"{what}._prev: {first!r}"
        assert {id(x) for x in first} == {id(x) for x in second}, (
            f"{what}._prev: two reads gave different objects")
        kids, numbers_ = children_of(r)
        assert len(first) == len({id(k) for k in kids}) + numbers_, (
            f"{what}._prev has {len(first)} Values for "
            f"{len({id(k) for k in kids}) + numbers_} children")
        held = self.held_by_ref()
        for k in kids:
            if id(k) in held:
                STATS["prev held kid"] += 1
                assert any(x is held[id(k)] for x in first), (
                    f"{what}._prev does not hand out the held Value of a child: "
                    f"{held[id(k)]!r} not in {first!r}")
        for x in first:
            STATS["prev kid with attrs"] += bool(own_attributes(x))
            self.check_attrs(x, f"a Value from {what}._prev")

    @precondition(has_pairs)
    @rule(i=picks, k=picks, text=st.sampled_from(["a", "hidden", "kid"]))
    def label_then_let_go(self, i, k, text):
        """Label a held child of a held node, let go of the child's pairs,
        and find the label again through the parent's _prev (the object
        found: the old Value if it still lives, else a new one with no
        attributes); then hold that one."""
        c, r, what = self.pick(i)
        held = self.held_by_ref()
        kids = [x for x in children_of(r)[0] if id(x) in held]
        if not kids:
            return
        rk = kids[k % len(kids)]
        self.labels_made += 1
        label = f"{text}#{self.labels_made}"
        held[id(rk)].label = label
        rk.label = label
        old = weakref.ref(held[id(rk)])
        del held
        self.pairs = [p for p in self.pairs if p[1] is not rk]
        gc.collect()
        found = [x for x in c._prev if x.label == label]
        assert len(found) == 1, f"{what}._prev: {len(found)} Values labelled {label!r}"
        x = found[0]
        STATS["let go: old alive" if old() is not None else "let go: old dead"] += 1
        if old() is not None:
            assert x is old(), f"{what}._prev: a new Value for a child whose Value is alive"
        self.check_attrs(x, f"the child labelled {label!r} of {what}")
        self.add(x, rk, f"{label} (a child of {what})")

    # -- copies ---------------------------------------------------------------------------

    @precondition(has_pairs)
    @rule(**ARGS["copy_pair"])
    def copy_pair(self, i, how, protocol, attributed):
        """A copy is a new leaf with the same data, grad, label and
        attributes; the graph below stays behind.  ``attributed``: copy a
        pair with attributes, if there is one.  The copy is held as a new
        pair; every other held Value with attributes is copied and checked
        too."""
        pairs = [p for p in self.pairs if attributed and self.attrs.get(p[0])] or self.pairs
        c, r, what = pairs[i % len(pairs)]
        try:
            c2 = run_c(lambda: make_copy(c, how, protocol))
        except Cut:
            return
        check_copy(c, c2, f"{how}({what})", how == "copy")
        for other, _, other_what in self.pairs:
            if other is not c and self.attrs.get(other):
                check_copy(other, make_copy(other, how, protocol), f"{how}({other_what})",
                           how == "copy")
        got = own_attributes(c2)
        STATS["copy " + how + (" attrs" if got else "")] += 1
        if got:
            self.attrs[c2] = {k: model_value(x) for k, x in got.items()}
        r2 = R(r.data, label=r.label)
        r2.grad = r.grad
        self.add(c2, r2, f"{how}({what})")

    # -- replay ------------------------------------------------------------------------

    @precondition(has_pairs)
    @rule(**ARGS["compile"])
    def compile(self, i):
        c, r, what = self.pick(i)
        refused = any(n in _python_made for n in _topo(r))
        try:
            program = run_c(lambda: pygrad.compile(c))
        except Cut:
            return
        except ValueError as e:
            assert refused and "cannot compile" in str(e), f"compile({what}): {e!r}"
            return
        assert not refused, f"compile({what}) took a graph with a Python-made node"
        self.programs.append((program, r, what))

    @precondition(lambda self: self.programs)
    @rule(**ARGS["replay"])
    def replay(self, i, step):
        program, r, what = self.programs[i % len(self.programs)]
        if step in ("forward", "both"):
            try:
                got = run_c(program.forward)
            except Cut:
                got = program.forward()     # recomputing is idempotent: run it again
            expected = ref_replay_forward(r)
            assert same_double(got, expected), f"replay of {what}: {show(got)} != {show(expected)}"
        if step in ("backward", "both"):
            try:
                run_c(program.backward)
            except Cut:
                zero_graph(program.output, r)
                program.backward()
            ref_replay_backward(r)

    # -- optimizers ---------------------------------------------------------------------

    @precondition(has_pairs)
    @rule(**ARGS["make_optimizer"])
    def make_optimizer(self, kind, idx, lr, momentum, weight_decay):
        chosen = {id(p[0]): p for p in (self.pick(i) for i in idx)}.values()
        pc, pr = [p[0] for p in chosen], [p[1] for p in chosen]
        if kind == "SGD":
            make = lambda ps: optim.SGD(ps, lr=lr, momentum=momentum, weight_decay=weight_decay)
        else:
            make = lambda ps: optim.Adam(ps, lr=lambda k: lr / (k + 1), weight_decay=weight_decay)
        try:
            oc = run_c(lambda: make(pc))
        except Cut:
            return
        self.optimizers.append((oc, make(pr)))

    @precondition(lambda self: self.optimizers)
    @rule(**ARGS["optimizer_step"])
    def optimizer_step(self, i, zero):
        k = i % len(self.optimizers)
        oc, orf = self.optimizers[k]
        try:
            run_c(oc.zero_grad if zero else oc.step)
        except Cut:
            # Undo the parameters from the reference (the optimizer's state
            # may be half updated: let go of the pair).
            for pc, pr in zip(oc.params, orf.params):
                pc.data, pc.grad = pr.data, pr.grad
            del self.optimizers[k]
            return
        if zero:
            orf.zero_grad()
        else:
            orf.step()

    # -- interrupts -----------------------------------------------------------------------

    NEEDS = {"call_layer": lambda self: self.layers, "replay": lambda self: self.programs,
             "optimizer_step": lambda self: self.optimizers}

    def run_interrupted(self, actions, data):
        """One to three of ``actions`` (rules), each with a KeyboardInterrupt
        at the n-th Python event of its C side in pygrad's code (and in
        these tests', if drawn)."""
        for _ in range(data.draw(st.integers(1, 3), label="how many")):
            if not self.pairs:
                return
            ready = [a for a in actions if self.NEEDS.get(a, EngineMachine.has_pairs)(self)]
            action = data.draw(st.sampled_from(ready), label="action")
            kwargs = {name: data.draw(s, label=name) for name, s in ARGS[action].items()}
            n = data.draw(INTERRUPT_AT, label="interrupt at event")
            opcodes = data.draw(st.booleans(), label="opcode events")
            tests_too = data.draw(st.booleans(), label="events in the tests too")
            INTERRUPTS.armed = Interrupter(n, opcodes, (PYGRAD_CODE, TEST_CODE) if tests_too
                                           else (PYGRAD_CODE,))
            try:
                getattr(self, action)(**kwargs)
            finally:
                INTERRUPTS.armed = None

    @precondition(has_pairs)
    @rule(data=st.data())
    def interrupted(self, data):
        self.run_interrupted(list(ARGS), data)

    @precondition(has_pairs)
    @rule(data=st.data())
    def interrupted_lifetime(self, data):
        """The same, among the rules that run most of pygrad's Python
        lifetime code (_lifetime.py, engine.py's slow paths)."""
        self.run_interrupted(LIFETIME_ACTIONS, data)

    # -- checks ---------------------------------------------------------------------------

    @invariant()
    def engines_agree(self):
        for c, r, what in self.pairs:
            check_pair(c, r, what)
            assert c.label == r.label, f"{what}: label C {c.label!r} != ref {r.label!r}"
            self.check_attrs(c, what)
        self.held_by_ref()
        for program, r, what in self.programs:
            check_pair(program.output, r, f"compiled root {what}")
        for lc, lr in self.layers:
            for k, (pc, pr) in enumerate(zip(lc.parameters(), lr.parameters())):
                check_pair(pc, pr, f"layer parameter {k}")

    def teardown(self):
        with no_pygrad_code("dropping everything"):
            self.pairs.clear()
            self.layers.clear()
            self.programs.clear()
            self.optimizers.clear()
            gc.collect()
        pygrad.engine.settle()              # Values that outlived their graph let go of it
        gc.collect()
        if sys.exc_info()[1] is not None:
            return      # a step failed: its traceback still holds that step's Values
        live = internals.live_nodes()
        assert live <= self.live_before, (        # settle() makes the count exact
            f"{live - self.live_before} C nodes still live after dropping everything")


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


class TestEnginesAgreeUnderRandomApiSequences(EngineMachine.TestCase):  # type: ignore[misc]
    settings = _settings(EXAMPLES)


@pytest.mark.slow
class TestEnginesAgreeUnderManyRandomApiSequences(EngineMachine.TestCase):  # type: ignore[misc]
    settings = _settings(SLOW_EXAMPLES)


def _plain(x):
    y = x + 1
    return y * 2


def test_py39_loses_a_line_event_error_with_opcodes():
    """Why the Interrupter skips line events on 3.9 when it traces opcodes:
    plain Python code, no pygrad, gives a SystemError there."""
    def tracer(frame, event, arg):
        if frame.f_code is not _plain.__code__:
            return None
        frame.f_trace_opcodes = True
        return local

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == _plain.__code__.co_firstlineno + 2:
            raise KeyboardInterrupt("at the return line")
        return local

    sys.settrace(tracer)
    try:
        _plain(1)
    except BaseException as e:      # noqa: BLE001
        caught = e
    finally:
        sys.settrace(None)
    expected = SystemError if _LINE_ERRORS_LOST else KeyboardInterrupt
    assert type(caught) is expected, repr(caught)


def test_the_interrupter_lands_its_interrupt_on_every_python():
    """The point that gave 3.9's SystemError in the fuzzer (a stale fused
    layer's cache check) interrupted at each event in turn, opcodes on: a
    KeyboardInterrupt comes out every time, and a later call is exact."""
    from pygrad import Value, nn
    layer = nn.Layer(3, 1, nonlin=True)
    x = [Value(1.0), Value(2.0), Value(3.0)]
    counter = Interrupter(None, opcodes=True, prefixes=(PYGRAD_CODE,))
    layer.neurons[0].w[0] = Value(5.0)
    sys.settrace(counter)
    try:
        expected = layer(x).data
    finally:
        sys.settrace(None)
    assert counter.events > 20
    for n in range(1, counter.events + 1):
        layer.neurons[0].w[0] = Value(5.0)          # stale again
        tracer = Interrupter(n, opcodes=True, prefixes=(PYGRAD_CODE,))
        sys.settrace(tracer)
        try:
            layer(x)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        if tracer.fired is None:        # a call that needed fewer events: all covered
            break
        assert layer(x).data == expected, (n, tracer.fired)
    assert n > counter.events * 0.9, (n, counter.events)


def _with_block(lock):
    with lock:
        x = 1
    return x


def test_with_exit_offsets_finds_the_exit_call_on_every_python():
    """The bytecodes between leaving a with block and its __exit__ call are
    found on this Python's bytecode, whatever its version."""
    offsets = with_exit_offsets(_with_block.__code__)
    ins = {i.offset: i for i in dis.get_instructions(_with_block.__code__)}
    assert offsets, "no with exit found"
    last = ins[max(offsets)]
    assert last.opname.startswith("CALL"), last
    assert all(ins[o].opname != "STORE_FAST" for o in offsets)
