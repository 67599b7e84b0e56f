"""The op table (csrc/ops.def, read back through pg_op_info) drives the
Value methods; every op in it has a C rule, a reference method, gradient
and IEEE test cases and a docs entry.  And the elementary functions
(sin ... erfc, abs): C and reference bit for bit on random inputs and in a
small training run, gradcheck, and replay.
"""
import importlib.util
import math
import pathlib
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pygrad
from pygrad import Value as C
from pygrad import _ops
from pygrad.reference import Value as R

from test_docs import documented
from test_gradients import IEEE_OP_CASES, NAN_OP_CASES, OP_CASES

ELEMENTARY = ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
              "atanh", "sqrt", "log2", "log10", "log1p", "expm1", "erf", "erfc", "abs")


def same_double(x: float, y: float) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return struct.pack("<d", x) == struct.pack("<d", y)


# ---------------------------------------------------------------------------
# the table


def _build_script():
    """The repository's csrc/cffi_build.py (the wheel does not
    ship it)."""
    path = pathlib.Path(__file__).resolve().parent.parent / "csrc" / "cffi_build.py"
    if not (path.parent.parent / "csrc" / "ops.def").exists():
        pytest.skip("no csrc/ beside the tests")
    spec = importlib.util.spec_from_file_location("pygrad_build_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_in_the_core_is_csrc_ops_def():
    # The compiled core's rows are ops.def's (codes, _op names, arities, in order).
    assert [(op.key.upper(), op.name, op.arity) for op in _ops.OPS] == _build_script().op_codes()


def test_only_tanh_relu_sigmoid_may_be_fused_activations():
    assert sorted(_ops.ACTIVATIONS) == ["relu", "sigmoid", "tanh"]
    assert set(pygrad.functional.ACTIVATIONS) == {None, "linear", "relu", "sigmoid", "tanh"}


def test_elementary_functions_are_in_the_table():
    methods = {m.name for op in _ops.METHOD_OPS for m in op.methods}
    assert set(ELEMENTARY) | {"__abs__"} <= methods
    for name in ELEMENTARY:
        assert _ops.BY_KEY[name].name == name        # _op is the method's name


@pytest.mark.parametrize("op", [pytest.param(op, id=op.key) for op in _ops.METHOD_OPS])
def test_op_is_complete(op):
    """A C rule, a reference method, gradient / IEEE / nan test cases and a
    docs heading for each method."""
    for m in op.methods:
        assert callable(getattr(C, m.name, None)), f"pygrad.Value.{m.name} missing"
        assert callable(getattr(R, m.name, None)), f"reference Value.{m.name} missing"
        if not m.name.startswith("_") or m.name.startswith("__"):
            assert documented(f"Value.{m.name}"), f"docs/api.md has no heading for Value.{m.name}"
    assert OP_CASES.get(op.key), f"tests/test_gradients.py OP_CASES has no case for {op.key}"
    assert IEEE_OP_CASES.get(op.key), f"tests/test_gradients.py IEEE_OP_CASES lacks {op.key}"
    assert NAN_OP_CASES.get(op.key), f"tests/test_gradients.py NAN_OP_CASES lacks {op.key}"
    # The C rule: forward and gradient equal the reference engine's at the
    # first gradient case (a missing or wrong rule gives other doubles).
    _, fv, _, points = OP_CASES[op.key][0]
    results = []
    for V in (C, R):
        leaves = [V(x) for x in points[0]]
        out = fv(*leaves)
        out.backward()
        results.append([out.data] + [v.grad for v in leaves] + [out._op])
    c, r = results
    assert all(same_double(x, y) for x, y in zip(c[:-1], r[:-1])), (c, r)
    assert c[-1] == r[-1]


# ---------------------------------------------------------------------------
# docs/api.md's table of unary methods, generated from ops.def and ops.c

API_DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "api.md"
_TABLE_START = ("<!-- generated from csrc/ops.def and csrc/ops.c by "
                "`PYTHONPATH=. python tests/test_typing.py --write`: edit those, not this -->\n")
_TABLE_END = "<!-- end of the generated table -->\n"
# How a unary dunder is called, for the method column.
_CALLED = {"__abs__": "abs(v)", "__neg__": "-v"}


def unary_rules() -> "dict[str, tuple[str, str]]":
    """pygrad/op_rules.py's unary rules (the one statement of each, which
    the C core and the reference engine are made from): key -> (FWD, BWD)."""
    from pygrad import op_rules
    return {code.lower(): rule for code, rule in op_rules.UNARY.items()}


def unary_method_ops(ops):
    """The ops a named method makes from one Value (exp, ..., abs)."""
    return [op for op in ops if op.arity == 1 and op.methods and not op.methods[0].name.startswith("__")]


def op_table_markdown(ops) -> str:
    """docs/api.md's generated block: a heading naming every unary method
    of the op table, and one row per op with its ``_op``, its docstring
    (ops.def) and its forward and gradient expressions as pygrad/op_rules.py
    states them."""
    rules = unary_rules()
    chosen = unary_method_ops(ops)
    names = [f"`Value.{m.name}()`" if not m.name.startswith("__")
             else f"`{_CALLED.get(m.name, m.name)}` (`Value.{m.name}`)"
             for op in chosen for m in op.methods]
    rows = []
    for op in chosen:
        fwd, bwd = rules[op.key]
        called = ", ".join(f"`v.{m.name}()`" if not m.name.startswith("__")
                           else f"`{_CALLED.get(m.name, m.name)}`" for m in op.methods)
        doc = op.methods[0].doc.replace("*", "\\*")      # Markdown: not emphasis
        rows.append(f"| {called} | `'{op.name}'` | {doc} | `{fwd}` | `{bwd}` |\n")
    return (_TABLE_START + "#### Unary methods: " + ", ".join(names) + "\n\n"
            + "| method | `_op` | value | `y =` | `x.grad +=` |\n| --- | --- | --- | --- | --- |\n"
            + "".join(rows) + _TABLE_END)


def api_doc_text(ops) -> str:
    """docs/api.md with its generated block made from ``ops`` and op_rules."""
    text = API_DOC.read_text(encoding="utf-8")
    head, rest = text.split(_TABLE_START)
    tail = rest.split(_TABLE_END, 1)[1]
    return head + op_table_markdown(ops) + tail


def test_the_docs_table_of_unary_methods_is_generated_from_the_op_table():
    assert API_DOC.read_text(encoding="utf-8") == api_doc_text(_ops.OPS), (
        "docs/api.md's op table is stale: run `PYTHONPATH=. python tests/test_typing.py --write`")
    # Every unary method op has its rule, and the table shows it.
    rules = unary_rules()
    for op in unary_method_ops(_ops.OPS):
        assert op.key in rules, f"pygrad/op_rules.py has no UNARY rule for {op.key}"


def test_every_table_made_method_has_its_own_docstring():
    # ops.def's doc field holds one docstring per method, split at |: a |
    # inside one would shift the rest (abs's once read "" and "self").
    from pygrad._core import ffi, lib
    for op in _ops.METHOD_OPS:
        raw = ffi.string(lib.pg_op_info(op.code).doc).decode()
        if not raw:
            continue                     # a method written by hand (__pow__)
        assert len(raw.split("|")) == len(op.methods), (op.key, raw)
        for m in op.methods:
            assert m.doc.strip() and getattr(C, m.name).__doc__ == m.doc, (op.key, m.name)


def test_every_plain_op_has_its_rules_stated_once():
    # op_rules.py states the rules of exactly ops.def's unary and binary ops.
    from pygrad import op_rules
    stated = set(op_rules.UNARY) | set(op_rules.BINARY) | {"POWK"}
    plain = {op.key.upper() for op in _ops.OPS if op.arity in (1, 2)}
    assert stated == plain


def test_generated_methods_keep_micrograd_operand_order():
    a, b = C(2.0), C(3.0)
    assert (5 - a).data == 3.0 and (a - 5).data == -3.0
    assert (1 / b).data == 1 / 3 and (2 ** a).data == 4.0
    assert (5 + a)._op == "+" and (5 * a)._op == "*"
    assert C.__rsub__.__name__ == "__rsub__" and C.sin.__doc__.startswith("Sine")


# ---------------------------------------------------------------------------
# the elementary functions

inputs = st.one_of(
    st.floats(min_value=-3.0, max_value=3.0),
    st.floats(min_value=-1.0, max_value=1.0),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 1e-300, 710.0, -745.0]),
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(ELEMENTARY + ("__abs__",)), inputs, st.floats(-4.0, 4.0))
def test_elementary_bit_identical_between_engines(method, x, w):
    # y = f(x) * w + f(x): two uses of the node, an incoming grad other than 1.
    outs = []
    for V in (C, R):
        a, b = V(x), V(w)
        fa = getattr(a, method)()
        y = fa * b + fa
        y.backward()
        outs.append((fa.data, y.data, a.grad, b.grad, fa.grad))
    assert all(same_double(p, q) for p, q in zip(*outs)), (method, x, w, outs)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(ELEMENTARY), min_size=1, max_size=8),
       st.floats(min_value=-2.0, max_value=2.0))
def test_elementary_chains_bit_identical_between_engines(methods, x):
    outs = []
    for V in (C, R):
        a = V(x)
        y = a
        for m in methods:
            y = getattr(y, m)()
        y.backward()
        outs.append((y.data, a.grad))
    assert all(same_double(p, q) for p, q in zip(*outs)), (methods, x, outs)


GRADCHECK_POINTS = {
    "sin": 0.7, "cos": -1.1, "tan": 0.4, "asin": 0.3, "acos": -0.6, "atan": 2.0,
    "sinh": 1.3, "cosh": -0.8, "asinh": -2.5, "acosh": 1.7, "atanh": 0.45, "sqrt": 2.2,
    "log2": 3.1, "log10": 0.2, "log1p": -0.3, "expm1": 0.9, "erf": 0.6, "erfc": -0.4,
    "abs": -1.9,
}


@pytest.mark.parametrize("V", [C, R], ids=["C", "ref"])
@pytest.mark.parametrize("method", ELEMENTARY)
def test_elementary_gradcheck(V, method):
    x = GRADCHECK_POINTS[method]
    result = pygrad.gradcheck(lambda a: getattr(a * 1.0, method)() * 3.0, [x], value_type=V)
    assert result, str(result)


def _model(V, params, x):
    w1, w2, b = params
    h = (w1 * x + b).sin() + (w2 * x).abs().sqrt().erf() + (w1 * w2).atan()
    return h + (w1 * x * x + 1.0).log1p().cosh() * w2.tanh().asinh() + (b * 0.5).expm1()


def _train(V, steps=25):
    rng = random.Random(7)
    params = [V(0.3), V(-0.8), V(0.1)]
    data = [(rng.uniform(-2, 2), rng.uniform(-1, 1)) for _ in range(8)]
    trace = []
    for _ in range(steps):
        loss = V(0.0)
        for x, y in data:
            d = _model(V, params, x) - y
            loss = loss + d * d
        for p in params:
            p.grad = 0.0
        loss.backward()
        for p in params:
            p.data -= 0.01 * p.grad
        trace.append([loss.data] + [p.data for p in params] + [p.grad for p in params])
    return trace


def test_training_run_with_elementary_ops_bit_identical_between_engines():
    c, r = _train(C), _train(R)
    assert c[-1][0] < c[0][0]            # it trains
    for step, (cs, rs) in enumerate(zip(c, r)):
        assert all(same_double(p, q) for p, q in zip(cs, rs)), (step, cs, rs)


def test_replay_of_elementary_ops_equals_eager():
    leaves = [C(0.3), C(-0.8), C(0.1)]
    x = C(0.7)
    out = _model(C, leaves, x)
    program = pygrad.compile(out)
    rng = random.Random(3)
    for _ in range(5):
        values = [rng.uniform(-1, 1) for _ in range(4)]
        for v, d in zip(leaves + [x], values):
            v.data = d
            v.grad = 0.0
        fwd = program.forward()
        program.backward()
        fresh = [C(d) for d in values]
        expected = _model(C, fresh[:3], fresh[3])
        expected.backward()
        got = [fwd] + [v.grad for v in leaves + [x]]
        want = [expected.data] + [v.grad for v in fresh]
        assert all(same_double(p, q) for p, q in zip(got, want)), (got, want)
