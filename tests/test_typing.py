"""Static types: the declarations a type checker sees match what runs.

pygrad.Value's operator methods are made at import from the op table, so a
type checker reads them from pygrad/_value_ops.py; the C core is a cffi
extension, so it reads pygrad/_core.pyi, generated from the cdef by this
file (``PYTHONPATH=. python tests/test_typing.py --write`` rewrites it).
These tests keep both in step with the sources, and run mypy on a user's
snippet.
"""
import ast
import importlib.util
import keyword
import os
import pathlib
import random
import re
import subprocess
import sys
import sysconfig

import pytest

import pygrad
from pygrad import _ops
from pygrad._value_ops import TypedOps

REPO = pathlib.Path(__file__).resolve().parent.parent
STUB = REPO / "pygrad" / "_core.pyi"


# ---------------------------------------------------------------------------
# Value's operator methods


def _declared(cls: type) -> "set[str]":
    return {k for k, v in vars(cls).items() if callable(v)}


VALUE_OPS = REPO / "pygrad" / "_value_ops.py"

# pygrad/_value_ops.py is written by hand down to this line; the method
# declarations after it are generated from the op table.
_GENERATED_BELOW = "    # -- generated below, from the op table (tests/test_typing.py --write) --\n"


def value_ops_text(ops) -> str:
    """The text of pygrad/_value_ops.py for the op table ``ops``: its
    hand-written head, then a method taking an operand for each binary op's
    methods (and ``__pow__``, whose number form is the unary POWK), none for
    the rest."""
    def binary(op) -> bool:
        return op.arity == 2 or any(m.name == "__pow__" for m in op.methods)

    def lines(chosen) -> str:
        out = []
        for op in chosen:
            for m in op.methods:
                if not binary(op):
                    out.append(f"    def {m.name}(self) -> \"Value\": ...\n")
                else:
                    other = '"Value"' if m.name == "_pow_value" else "Operand"
                    out.append(f"    def {m.name}(self, other: {other}) -> \"Value\": ...\n")
        return "".join(out)

    def protocol_lines(chosen) -> str:
        # Either engine's Value: operands of any kind (the engines take
        # different ones), results of the protocol; private methods left out.
        out = []
        for op in chosen:
            for m in op.methods:
                if m.name.startswith("_") and not m.name.startswith("__"):
                    continue
                if not binary(op):
                    out.append(f"    def {m.name}(self) -> \"Scalar\": ...\n")
                else:
                    out.append(f"    def {m.name}(self, other: Any) -> \"Scalar\": ...\n")
        return "".join(out)

    two = [op for op in ops if binary(op)]
    one = [op for op in ops if not binary(op)]
    codes = ", ".join(dict.fromkeys(op.key.upper().replace("POWK", "POW") for op in two))
    def heading(title: str) -> str:        # 77 columns wide
        return f"\n    # -- {title} " + "-" * (77 - 10 - len(title)) + "\n\n"

    head = VALUE_OPS.read_text(encoding="utf-8").split(_GENERATED_BELOW)[0]
    return (head + _GENERATED_BELOW + heading(f"binary ({codes})") + lines(two)
            + heading("unary") + lines(one)
            + _SCALAR_HEAD + protocol_lines(two) + "\n" + protocol_lines(one) + _OUTPUT)


_SCALAR_HEAD = '''

class Scalar(Protocol):
    """A Value of either engine (``pygrad.Value`` or ``pygrad.reference.Value``):
    what ``nn``, ``losses`` and ``optim`` take and give.  Operands are
    typed loosely, since each engine takes its own Values and numbers."""

    data: float
    grad: float
    label: str
    _op: str

    @property
    def _prev(self) -> AbstractSet["Scalar"]: ...
    def backward(self) -> None: ...

'''

_OUTPUT = '''

class Output(Scalar, Protocol):
    """What a ``Layer`` or ``MLP`` returns: as in micrograd, one Value when
    its last layer has one neuron, else the list of them.  Both uses type
    check; which one is right is for the model's shape to say."""

    def __getitem__(self, i: int) -> Scalar: ...
    def __iter__(self) -> Iterator[Scalar]: ...
    def __len__(self) -> int: ...
'''


def test_typed_ops_is_generated_from_the_op_table():
    assert VALUE_OPS.read_text(encoding="utf-8") == value_ops_text(_ops.METHOD_OPS), (
        "pygrad/_value_ops.py is stale: run `PYTHONPATH=. python tests/test_typing.py --write`")
    table = {m.name for op in _ops.METHOD_OPS for m in op.methods}
    assert _declared(TypedOps) == table


def test_typed_ops_is_no_base_of_value_at_run_time():
    # Only a type checker sees TypedOps: at run time every op method is the
    # one made from the table (or written in the class), never a stub.
    # (its one base at run time is the C half that holds its node)
    assert pygrad.Value.__mro__ == (pygrad.Value, pygrad.engine._ValueCore, object)
    for name in _declared(TypedOps):
        assert getattr(pygrad.Value, name) is not getattr(TypedOps, name)


# ---------------------------------------------------------------------------
# pygrad/_core.pyi, from the cdef

_HEADER = '''\
# Generated from the cdef (csrc/cffi_build.py's cdef_source(): csrc/pygrad.h
# and csrc/ops.def) by tests/test_typing.py, which checks it is current:
# after changing the cdef, run `PYTHONPATH=. python tests/test_typing.py --write`.
"""Types of pygrad's C core, the cffi extension module ``pygrad._core``."""
from typing import Any, overload

from _cffi_backend import FFI as _FFI
from typing_extensions import Buffer

_CData = _FFI.CData


class _CoreFFI(_FFI):
    # The cdef has no wchar_t: a C string comes back as bytes.
    def string(self, cdata: _CData, maxlen: int = -1) -> bytes: ...
    # A numpy array has the buffer protocol, which numpy's stubs declare
    # only for Python >= 3.12 (PEP 688).
    @overload
    def from_buffer(self, cdecl: Buffer, require_writable: bool = ...) -> _CData: ...
    @overload
    def from_buffer(self, cdecl: str | _FFI.CType, python_buffer: Any,
                    require_writable: bool = ...) -> _CData: ...
'''


def _c_type(node, structs: "set[str]", result: bool) -> str:
    """The Python type of a C type node: numbers as int or float, a struct
    pointer returned as the struct (its fields are read through it), a
    ``void *`` parameter as CData or bytes (node memory), any other pointer
    as cffi's CData."""
    from pycparser import c_ast
    if isinstance(node, c_ast.PtrDecl):
        inner = node.type
        named = (isinstance(inner, c_ast.TypeDecl) and isinstance(inner.type, c_ast.IdentifierType)
                 and inner.type.names[-1])
        if result and named in structs:
            return inner.type.names[-1]
        if not result and named == "void":
            return "_CData | bytes"   # cffi passes a bytes object as the address of its bytes
        return "_CData"
    if isinstance(node, c_ast.TypeDecl) and isinstance(node.type, c_ast.IdentifierType):
        name = node.type.names[-1]
        if name == "void":
            return "None"
        if name in ("double", "float"):
            return "float"
        return "int"
    raise ValueError(f"no Python type for C declaration {node}")


def stub_text(cdef: str) -> str:
    """The text of pygrad/_core.pyi for the given cdef."""
    from pycparser import CParser, c_ast
    constants = re.findall(r"^#define\s+(\w+)\s+(-?\d+)\s*$", cdef, re.M)
    code = re.sub(r"/\*.*?\*/", "", cdef, flags=re.S)
    code = re.sub(r"^\s*#.*$", "", code, flags=re.M)
    code = code.replace("...;", "")      # a struct whose other fields are C's
    # pycparser knows no <stdint.h>: only the name matters here (all int).
    prelude = "".join(f"typedef int {t};\n" for t in
                      ("int32_t", "uint32_t", "int64_t", "uint64_t", "size_t", "uintptr_t", "intptr_t"))
    tree = CParser().parse(prelude + code)
    structs, functions = [], []
    for node in tree.ext:
        if isinstance(node, c_ast.Typedef) and isinstance(node.type.type, c_ast.Struct):
            structs.append((node.name, node.type.type.decls))
        elif isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
            functions.append(node)
    struct_names = {name for name, _ in structs}
    out = [_HEADER]
    for name, fields in structs:
        out.append(f"\n\nclass {name}:\n")
        out.append(f'    """struct {name}, read through a pointer."""\n\n')
        for f in fields:
            out.append(f"    {f.name}: {_c_type(f.type, struct_names, False)}\n")
    out.append("\n\nclass _Lib:\n")
    out.append('    """The functions and constants of the cdef."""\n\n')
    for name, _ in constants:
        out.append(f"    {name}: int\n")
    out.append("\n")
    for fn in functions:
        params = []
        for p in (fn.type.args.params if fn.type.args else []):
            if isinstance(p, c_ast.Typename):       # f(void)
                continue
            name = p.name + "_" if keyword.iskeyword(p.name) else p.name
            params.append(f"{name}: {_c_type(p.type, struct_names, False)}")
        # cffi's functions take their arguments by position only.
        params = ["self"] + params + (["/"] if params else [])
        result = _c_type(fn.type.type, struct_names, True)
        line = f"    def {fn.name}({', '.join(params)}) -> {result}: ...\n"
        if len(line) > 100:
            rows = [" " * 7]
            for param in params:                 # greedy, whole parameters
                if len(rows[-1]) + len(param) + 2 > 100:
                    rows.append(" " * 7)
                rows[-1] += f" {param},"
            args = "\n".join(rows)[:-1]
            line = f"    def {fn.name}(\n{args}\n    ) -> {result}: ...\n"
        out.append(line)
    out.append("\n\nffi: _CoreFFI\nlib: _Lib\n")
    return "".join(out)


def _build_script():
    """The repository's csrc/cffi_build.py (the wheel does not ship it)."""
    path = REPO / "csrc" / "cffi_build.py"
    if not (REPO / "csrc" / "pygrad.h").exists():
        pytest.skip("no csrc/ beside the tests")
    pytest.importorskip("pycparser")
    spec = importlib.util.spec_from_file_location("pygrad_build_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cdef_source() -> str:
    """The cdef the stub describes: a test core's, which has the test hooks
    too (the tests that call them are type-checked like the rest)."""
    return _build_script().cdef_source(test_hooks=True)


def test_core_stub_is_generated_from_the_current_cdef():
    assert STUB.read_text(encoding="utf-8") == stub_text(_cdef_source()), (
        "pygrad/_core.pyi is stale: run `PYTHONPATH=. python tests/test_typing.py --write`")


def test_core_stub_names_what_the_compiled_core_has():
    # The stub's names are the extension's, so the build is the stub's cdef;
    # a production core lacks exactly the test hooks.
    from pygrad._core import lib
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    lib_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_Lib")
    names = {n.name if isinstance(n, ast.FunctionDef) else n.target.id
             for n in lib_class.body if isinstance(n, (ast.FunctionDef, ast.AnnAssign))}
    hooks = set(_build_script().test_hook_names())
    assert hooks == {"pg_fail_alloc", "pg_fail_alloc_pending",
                     "pg_hold_workers", "pg_held_workers",
                     "pg_test_hold_sweep_lock", "pg_sweep_lock_waits",
                     "pg_hold_runs", "pg_held_runs"}
    assert names == set(dir(lib)) | hooks
    assert hooks <= set(dir(lib)) or not hooks & set(dir(lib))


def test_installed_package_ships_its_type_information():
    here = pathlib.Path(pygrad.__file__).parent
    assert (here / "py.typed").is_file()
    assert (here / "_core.pyi").is_file()
    assert (here / "_value_ops.py").is_file()


# ---------------------------------------------------------------------------
# mypy on a user's code

SNIPPET = '''\
from __future__ import annotations  # list[Value] on 3.9 too: the snippet also runs
from fractions import Fraction
from pygrad import Value
from pygrad import reference

v = Value(1.0)
ok: list[Value] = [v + 2, 2 * v, v + v, 1.5 - v, v / 3, 2 ** v, v ** 2, v ** v, -v,
                   abs(v), v.exp(), v.sin(), v.tanh(), v.relu(), v + True, v * Fraction(1, 3)]
reveal_type(v.data)
reveal_type(v.grad)
reveal_type(v + 2)
reveal_type(2 * v)
v.grad = 0.5
r = reference.Value(1.0)
ok_ref: list[reference.Value] = [r + 2, 2 * r, abs(r), -r, r.exp(), r ** 2]
reveal_type(r.data)

v + "s"  # error: operator
"s" * v  # error: operator
v.data = "s"  # error: assignment
r + "s"  # error: operator

# nn, losses, optim and compile, used as micrograd code uses them
import pygrad
from pygrad import losses, nn, optim
model = nn.MLP(2, [16, 16, 1])
xs = [[2.0, 3.0], [1.0, -1.0]]
ys = [1.0, -1.0]
ypred = [model(x) for x in xs]
loss = losses.mse(ypred, ys) + losses.svm_hinge(ypred, ys, model.parameters())
loss.backward()
for p in model.parameters():
    p.data += -0.1 * p.grad
    p.grad = 0
reveal_type(model.parameters())
reveal_type(loss)
out = model([Value(1.0), 2.0])
print(out.data, (out - 1.0) ** 2, out.relu(), out.sin())
scores = nn.MLP(2, [3])([1.0, 2.0])
first = scores[0] + scores[1]
ce = losses.softmax_cross_entropy(scores, 1) + losses.softmax_cross_entropy([scores, scores], [0, 2])
hidden = nn.Layer(2, 4)([1.0, 2.0])
top = nn.Layer(4, 1)(hidden)
pygrad.compile(model(xs[0]))
pygrad.compile([top, ce], inputs=[v])
pygrad.dot(model.parameters()[:2], [1.0, 2.0], act="tanh")
optim.SGD(model.parameters(), lr=0.1).step()
optim.Adam(nn.Neuron(3).parameters()).step()
reference_model = nn.MLP(2, [1], engine="reference")
print(reference_model([1.0, 2.0]).grad)
class Net(nn.Module):
    def __init__(self) -> None:
        self.w = [Value(0.5)]
    def parameters(self) -> list[Value]:
        return self.w
optim.SGD(Net().parameters()).step()

model(xs).data  # error: arg-type
model([1.0, 2.0]).bogus  # error: attr-defined
losses.mse(model, ys)  # error: arg-type
losses.mse(ypred, ["a"])  # error: list-item
model.parameters()[0].data = "s"  # error: assignment
optim.SGD([1.0])  # error: list-item
'''


def _mypy_path_env() -> "dict[str, str]":
    """The environment under which mypy finds the pygrad these tests import:
    a source tree through MYPYPATH (mypy reads no PYTHONPATH); an installed
    one is found as an installed package (mypy refuses site-packages on its
    MYPYPATH)."""
    env = dict(os.environ)
    parent = str(pathlib.Path(pygrad.__file__).resolve().parent.parent)
    installed = {str(pathlib.Path(p).resolve()) for p in
                 (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])}
    if parent not in installed:
        env["MYPYPATH"] = parent
    return env


@pytest.fixture(scope="module")
def mypy_on_snippet(tmp_path_factory) -> "tuple[dict[int, str], dict[int, str], str]":
    """mypy's notes and errors on SNIPPET, by line (one message per line)."""
    pytest.importorskip("mypy")
    tmp = tmp_path_factory.mktemp("mypy")
    (tmp / "snippet.py").write_text(SNIPPET, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--hide-error-context",
         "--cache-dir", str(tmp / "cache"), "--show-error-codes", "snippet.py"],
        cwd=tmp, env=_mypy_path_env(), capture_output=True, text=True, timeout=600)
    notes: "dict[int, str]" = {}
    errors: "dict[int, str]" = {}
    # Only the snippet's lines: mypy follows the import into pygrad.
    for ln in proc.stdout.splitlines():
        if not ln.startswith("snippet.py:"):
            continue
        _, num, rest = ln.split(":", 2)
        # Older mypys name builtins in full ("builtins.float").
        rest = rest.strip().replace("builtins.", "")
        kind = notes if rest.startswith("note:") else errors
        assert int(num) not in kind, ln
        kind[int(num)] = rest
    assert notes, proc.stdout + proc.stderr
    return notes, errors, proc.stdout


def _line(text: str) -> int:
    return next(i for i, s in enumerate(SNIPPET.splitlines(), 1) if s.startswith(text))


@pytest.mark.slow
def test_mypy_types_value_operators(mypy_on_snippet):
    notes, errors, out = mypy_on_snippet
    assert notes[_line("reveal_type(v + 2)")] == 'note: Revealed type is "pygrad.engine.Value"'
    assert notes[_line("reveal_type(2 * v)")] == 'note: Revealed type is "pygrad.engine.Value"'
    assert notes[_line("reveal_type(r.data)")] == 'note: Revealed type is "float"'
    for bad in ('v + "s"', '"s" * v', 'r + "s"'):
        assert "[operator]" in errors[_line(bad)], out


@pytest.mark.slow
def test_mypy_passes_every_valid_use_and_flags_each_misuse(mypy_on_snippet):
    # A line marked "# error: CODE" gets that error code; no other line errs
    # (so micrograd-style training code with nn, losses and optim type checks).
    notes, errors, out = mypy_on_snippet
    marked = {i: s.rsplit("# error: ", 1)[1] for i, s in enumerate(SNIPPET.splitlines(), 1)
              if "# error: " in s}
    assert sorted(errors) == sorted(marked), out
    for i, code in marked.items():
        assert f"[{code}]" in errors[i], (i, code, out)


def test_what_the_snippet_calls_valid_runs():
    # The uses mypy must pass are real: they run (the marked misuses and the
    # reveal_type lines left out).
    valid = "\n".join(line for line in SNIPPET.splitlines()
                      if "# error: " not in line and not line.startswith("reveal_type"))
    random_state = random.getstate()
    try:
        exec(compile(valid, "snippet.py", "exec"), {"__name__": "snippet"})
    finally:
        random.setstate(random_state)


@pytest.mark.slow
def test_mypy_types_models_parameters_and_losses(mypy_on_snippet):
    notes, errors, out = mypy_on_snippet
    assert notes[_line("reveal_type(model.parameters())")].endswith(
        'Revealed type is "list[pygrad._value_ops.Scalar]"'), out
    assert notes[_line("reveal_type(loss)")] == 'note: Revealed type is "pygrad._value_ops.Scalar"', out


@pytest.mark.slow
def test_mypy_types_value_data_and_grad_as_float(mypy_on_snippet):
    notes, errors, out = mypy_on_snippet
    assert notes[_line("reveal_type(v.data)")] == 'note: Revealed type is "float"', out
    assert notes[_line("reveal_type(v.grad)")] == 'note: Revealed type is "float"', out
    assert "[assignment]" in errors.get(_line('v.data = "s"'), ""), out


if __name__ == "__main__":
    # Regenerate pygrad/_core.pyi, pygrad/_value_ops.py and docs/api.md's
    # table of unary methods after a change to the cdef or the op table (the
    # op table is read from the built core).
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_typing.py --write")
    sys.path.insert(0, str(REPO / "csrc"))
    import cffi_build  # the build script alone: no compiled core needed
    STUB.write_text(stub_text(cffi_build.cdef_source(test_hooks=True)), encoding="utf-8")
    print(f"wrote {STUB}")
    VALUE_OPS.write_text(value_ops_text(_ops.METHOD_OPS), encoding="utf-8")
    print(f"wrote {VALUE_OPS}")
    import test_op_table  # noqa: E402 (its table generator; tests/ is sys.path[0])
    test_op_table.API_DOC.write_text(test_op_table.api_doc_text(_ops.OPS), encoding="utf-8")
    print(f"wrote {test_op_table.API_DOC}")
