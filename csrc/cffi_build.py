"""cffi build script (out-of-line API mode) for pygrad's C core.

setup.py names it in ``cffi_modules``; it compiles ``csrc/*.c`` into the
extension module ``pygrad._core``.  The cdef is read from the public header
``csrc/pygrad.h`` (between its cdef markers) and the op codes from
``csrc/ops.def``, so nothing is declared twice.  It lives beside the C
sources, not in ``pygrad/``, so that the wheel does not ship it.

The core carries a stamp of the sources it was built from
(``lib.pg_build_stamp()``): the tests refuse a core whose stamp differs
from ``source_stamp()`` of the tree they sit in (tests/conftest.py).
"""
import hashlib
import os
import re
import sys

from cffi import FFI

CSRC = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(CSRC)


def _read(name: str) -> str:
    with open(os.path.join(CSRC, name), encoding="utf-8") as f:
        return f.read()


def op_codes() -> "list[tuple[str, str, int]]":
    """(code, name, arity) for each op in csrc/ops.def, in code order (the
    rest of each row reaches Python through pg_op_info: pygrad/_ops.py)."""
    return [(m.group(1), m.group(2), int(m.group(3)))
            for m in re.finditer(r'^PG_OP\((\w+),\s*"([^"]*)",\s*(-?\d+),', _read("ops.def"), re.M)]


def source_stamp() -> str:
    """A hash of everything the core is built from: every file in csrc/
    (C sources, headers, ops.def and this script)."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(CSRC)):
        if name.endswith((".c", ".h", ".def", ".py")):
            digest.update(name.encode() + b"\0" + open(os.path.join(CSRC, name), "rb").read())
    return digest.hexdigest()[:16]


def entry_points() -> "list[str]":
    """The cdef of the per-op entry points (end of csrc/pygrad.h) that fit
    each op's arity: binary ops get three, unary ops one; x ** number has
    its own pair (POWK takes its exponent)."""
    lines = []
    for code, _, arity in op_codes():
        if arity == 2:
            lines += [f"int32_t pg_binary_{code}(uint32_t a, uint32_t b);",
                      f"int32_t pg_binary_k_{code}(uint32_t a, double k);",
                      f"int32_t pg_binary_rk_{code}(double k, uint32_t a);"]
        elif arity == 1 and code != "POWK":
            lines.append(f"int32_t pg_unary_{code}(uint32_t a);")
    lines += ["int32_t pg_powk_float(uint32_t a, double k);",
              "int32_t pg_powk_int(uint32_t a, double k);",
              "const char *pg_build_stamp(void);"]
    return lines


# PYGRAD_TEST_HOOKS=1 builds a test core: one with the fault-injection hooks
# of csrc/test_hooks.h (.ci/sanitize and .ci/valgrind build one).
TEST_HOOKS = os.environ.get("PYGRAD_TEST_HOOKS") == "1"


def _cdef_part(header: str) -> str:
    """What lies between a header's cdef-begin and cdef-end markers."""
    body = _read(header).split("/* cdef-begin", 1)[1].split("/* cdef-end */", 1)[0]
    return body.split("*/", 1)[1]


def test_hook_names() -> "list[str]":
    """The functions only a test core has (csrc/test_hooks.h)."""
    code = re.sub(r"/\*.*?\*/", "", _cdef_part("test_hooks.h"), flags=re.S)
    return re.findall(r"(\w+)\s*\(", code)


def cdef_source(test_hooks: bool = TEST_HOOKS) -> str:
    """The cdef of the core: pygrad.h's, the op codes and entry points, and
    with test_hooks, the hooks of test_hooks.h."""
    ops = op_codes()
    defines = [f"#define PG_OP_{code} {i}" for i, (code, _, _) in enumerate(ops)]
    defines.append(f"#define PG_OP_COUNT {len(ops)}")
    hooks = _cdef_part("test_hooks.h") if test_hooks else ""
    return ("\n".join(defines) + "\n" + _cdef_part("pygrad.h") + hooks
            + "\n".join(entry_points()) + "\n")


# The core compiles without a warning under these (.ci/warnings adds -Werror).
WARNINGS = ["-Wall", "-Wextra", "-Wshadow", "-Wmissing-prototypes", "-Wconversion"]


def compile_args() -> "list[str]":
    hooks = ["-DPG_TEST_HOOKS"] if TEST_HOOKS else []
    if sys.platform == "win32":
        return ["/O2", "/fp:precise", "/std:c11"] + [h.replace("-", "/", 1) for h in hooks]
    # No fused multiply-add and no fast-math: every double must round as
    # Python's float arithmetic does, so C and the reference engine agree.
    args = ["-std=c11", "-O3", "-fno-fast-math", "-ffp-contract=off"] + hooks + WARNINGS
    if sys.platform.startswith("linux"):
        args += ["-include", "glibc_versions.h"]   # the manylinux_2_17 tag: see that header
    if os.environ.get("PYGRAD_SANITIZE") == "1":
        # -O1 keeps stack traces readable; no recovery, so any report fails the run.
        args += ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                 "-fno-omit-frame-pointer", "-O1", "-g"]
    return args


def link_args() -> "list[str]":
    if sys.platform != "win32" and os.environ.get("PYGRAD_SANITIZE") == "1":
        return ["-fsanitize=address,undefined"]
    return []


ffibuilder = FFI()
ffibuilder.cdef(cdef_source())
ffibuilder.set_source(
    "pygrad._core",
    '#include "pygrad.h"\n#include "test_hooks.h"\n'
    # cffi defines the module's init function without a prototype
    'PyMODINIT_FUNC PyInit__core(void);\n'
    f'static const char *pg_build_stamp(void) {{ return "{source_stamp()}"; }}\n',
    sources=[os.path.relpath(os.path.join(CSRC, f), ROOT)
             for f in sorted(os.listdir(CSRC)) if f.endswith(".c")],
    # an edited header or ops.def rebuilds the core (every .c includes them)
    depends=[os.path.relpath(os.path.join(CSRC, f), ROOT)
             for f in sorted(os.listdir(CSRC)) if f.endswith((".h", ".def"))],
    include_dirs=[os.path.relpath(CSRC, ROOT)],
    extra_compile_args=compile_args(),
    extra_link_args=link_args(),
    libraries=[] if sys.platform == "win32" else ["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
