"""cffi build script (out-of-line API mode) for pygrad's C core.

setup.py names it in ``cffi_modules``; it compiles ``csrc/*.c`` into the
extension module ``pygrad._core``.  The cdef is read from the public header
``csrc/pygrad.h`` (between its cdef markers) and the op codes from
``csrc/ops.def``, so nothing is declared twice.  The module's preamble
adds the C half of Value (``csrc/value_binding.h``, the only C that
touches Python objects), whose op functions each operator calls.  This
script lives beside the C sources, not in ``pygrad/``, so that the wheel
does not ship it.

The core carries a stamp of the sources it was built from
(``lib.pg_build_stamp()``): the tests refuse a core whose stamp differs
from ``source_stamp()`` of the tree they sit in (tests/conftest.py).
"""
import ast
import hashlib
import os
import re
import sys
import sysconfig

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


# The one statement of every plain op's rules (pygrad/op_rules.py: data
# only, read here without importing pygrad, whose core isn't built yet).
OP_RULES = os.path.join(ROOT, "pygrad", "op_rules.py")
GENERATED = os.path.join(ROOT, "build", "generated")


def source_stamp() -> str:
    """A hash of everything the core is built from: every file in csrc/
    (C sources, headers, ops.def and this script) and pygrad/op_rules.py."""
    digest = hashlib.sha256()
    paths = [os.path.join(CSRC, name) for name in sorted(os.listdir(CSRC))
             if name.endswith((".c", ".h", ".def", ".py"))] + [OP_RULES]
    for path in paths:
        digest.update(os.path.basename(path).encode() + b"\0" + open(path, "rb").read())
    return digest.hexdigest()[:16]


def op_rules() -> dict:
    """pygrad/op_rules.py's tables."""
    table: dict = {}
    with open(OP_RULES, encoding="utf-8") as f:
        exec(compile(f.read(), OP_RULES, "exec"), table)
    return table


# C's name for a function of the rules, where it is not the same: pow with
# an exponent of 1 is its base, without a call (the gradient of x ** 2).
C_FUNCTIONS = {"pow": "pg_pow"}
_C_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_C_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
              ast.GtE: ">="}


def c_expression(text: str) -> str:
    """A rule of pygrad/op_rules.py as C: the same tree, every operation
    in parentheses (so C evaluates exactly what Python parses)."""
    def emit(e: ast.AST) -> str:
        if isinstance(e, ast.BinOp) and type(e.op) in _C_BINOPS:
            return f"({emit(e.left)} {_C_BINOPS[type(e.op)]} {emit(e.right)})"
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.Not)):
            return f"({'-' if isinstance(e.op, ast.USub) else '!'}{emit(e.operand)})"
        if isinstance(e, ast.BoolOp):
            op = " && " if isinstance(e.op, ast.And) else " || "
            return "(" + op.join(emit(v) for v in e.values) + ")"
        if isinstance(e, ast.Compare) and len(e.ops) == 1 and type(e.ops[0]) in _C_COMPARE:
            return f"({emit(e.left)} {_C_COMPARE[type(e.ops[0])]} {emit(e.comparators[0])})"
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and not e.keywords:
            name = C_FUNCTIONS.get(e.func.id, e.func.id)
            return f"{name}({', '.join(emit(a) for a in e.args)})"
        if isinstance(e, ast.Name):
            return e.id
        if isinstance(e, ast.Constant) and type(e.value) in (int, float):
            return repr(float(e.value))
        raise ValueError(f"op_rules: {ast.dump(e)} in {text!r} is not in the rules' language")
    return emit(ast.parse(text, mode="eval").body)


def _c_add(target: str, rule) -> str:
    """``target += rule;`` in C, under the rule's guard if it has one."""
    if isinstance(rule, tuple):
        return f"if ({c_expression(rule[0])}) {target} += {c_expression(rule[1])};"
    return f"{target} += {c_expression(rule)};"


def rules_header() -> str:
    """csrc/ops.c's rules.h: each plain op's rules, in the forms ops.c's
    macros take, from pygrad/op_rules.py."""
    t = op_rules()
    out = ["/* Written by csrc/cffi_build.py from pygrad/op_rules.py, which states",
           " * each rule once: edit that, not this. */"]
    out += [f"#define {name} {value!r}" for name, value in t["CONSTANTS"].items()]
    for code, (fwd, grad) in t["UNARY"].items():
        out.append(f"UNARY_OP({code}, {c_expression(fwd)}, {c_expression(grad)})")
    for code, (fwd, ga, gb) in t["BINARY"].items():
        if isinstance(ga, tuple) or isinstance(gb, tuple):   # guarded: the adds, written out
            out += [f"static inline double fwd_{code}(double a, double b) {{ return {c_expression(fwd)}; }}",
                    f"static inline void grads_{code}(double a, double b, double y, double g,",
                    "                                 double *ga, double *gb) {",
                    f"    {_c_add('*ga', ga)}", f"    {_c_add('*gb', gb)}", "}"]
            continue
        macro = "BINARY_RULES" if code in t["HIDDEN_GRAD"] else "BINARY_OP"
        out.append(f"{macro}({code}, {c_expression(fwd)}, {c_expression(ga)}, {c_expression(gb)})")
    fwd, grad = t["POWK"]
    out += [f"static inline double fwd_POWK(double x, double k) {{ return {c_expression(fwd)}; }}",
            "static inline void grads_POWK(double x, double k, double g, double *gx) {",
            f"    {_c_add('*gx', grad)}", "}"]
    return "\n".join(out) + "\n"


# A gradient rule over duals (csrc/second_order.c's pg_dual: a number, its
# tangent, and whether it has one): each operation of the rule's tree, in
# the same order, as the dual of its op.  The dual of an op is the op's own
# rules read forward: its value, and as its tangent the sum of its gradient
# rules with g each input's tangent (a scalar op's gradient is linear in g).
_DUAL_BINOPS = {ast.Add: "ADD", ast.Sub: "SUB", ast.Mult: "MUL", ast.Div: "DIV"}


def dual_expression(text: str, numbers: "tuple[str, ...]" = ("k",)) -> str:
    """A gradient rule of pygrad/op_rules.py as C over duals: the same tree
    (names are duals, but ``numbers`` and the constants, which have no
    tangent; a constant helper's value is a number of its argument's)."""
    t = op_rules()
    functions = t["functions_with_rules"]()

    def emit(e: ast.AST) -> str:
        if isinstance(e, ast.BinOp) and type(e.op) in _DUAL_BINOPS:
            return f"dual_{_DUAL_BINOPS[type(e.op)]}({emit(e.left)}, {emit(e.right)})"
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            return f"dual_NEG({emit(e.operand)})"
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and not e.keywords:
            if e.func.id in t["CONSTANT_HELPERS"]:
                return f"dual_const({e.func.id}({', '.join(emit(a) + '.v' for a in e.args)}))"
            if e.func.id not in functions:
                raise ValueError(f"op_rules: {e.func.id} in {text!r} has no derivative")
            return f"dual_{functions[e.func.id]}({', '.join(emit(a) for a in e.args)})"
        if isinstance(e, ast.Name):
            return f"dual_const({e.id})" if e.id in numbers or e.id in t["CONSTANTS"] else e.id
        if isinstance(e, ast.Constant) and type(e.value) in (int, float):
            return f"dual_const({float(e.value)!r})"
        raise ValueError(f"op_rules: {ast.dump(e)} in {text!r} is not in the rules' language")
    return emit(ast.parse(text, mode="eval").body)


def _guard_and_rule(rule) -> "tuple[str, str]":
    """(guard as C, rule) of a gradient rule (no guard: always)."""
    return (c_expression(rule[0]), rule[1]) if isinstance(rule, tuple) else ("1", rule)


def second_order_header() -> str:
    """csrc/second_order.c's second_order_rules.h, from pygrad/op_rules.py.
    For each plain op: its forward rule, guards and gradient rules over
    doubles (fwd_, guard_, grad_); its tangent from its inputs' (tangent_:
    the gradient rules read forward, at output y); its dual (dual_: the
    same at the forward rule's output), which the rules over duals call
    for their operations and functions; and its gradient rules over duals
    (dual_grad_).  Then the lists of the ops by kind."""
    t = op_rules()
    out = ["/* Written by csrc/cffi_build.py from pygrad/op_rules.py, which states",
           " * each rule once: edit that, not this. */"]
    out += [f"#define {name} {value!r}" for name, value in t["CONSTANTS"].items()]
    tangents, duals = [], []
    for code, (fwd, grad) in t["UNARY"].items():
        guard, rule = _guard_and_rule(grad)
        out += [f"static inline double fwd_{code}(double x) {{ return {c_expression(fwd)}; }}",
                f"static inline double grad_{code}(double x, double y, double g) {{",
                f"    (void)x; (void)y; return {c_expression(rule)}; }}"]
        tangents += [f"static inline pg_dual tangent_{code}(pg_dual x, double y) {{",
                     f"    return (pg_dual){{y, x.has ? grad_{code}(x.v, y, x.t) : 0.0, x.has}}; }}",
                     f"static inline pg_dual dual_{code}(pg_dual x) {{ return tangent_{code}(x, fwd_{code}(x.v)); }}"]
        duals += [f"static inline pg_dual dual_grad_{code}(pg_dual x, pg_dual y, pg_dual g) {{",
                  f"    (void)x; (void)y; return {dual_expression(rule)}; }}"]
    for code, (fwd, *grads) in t["BINARY"].items():
        out.append(f"static inline double fwd_{code}(double a, double b) {{ return {c_expression(fwd)}; }}")
        for side, grad in zip("ab", grads):
            guard, rule = _guard_and_rule(grad)
            out += [f"static inline int guard_{side}_{code}(double a, double b, double y) {{",
                    f"    (void)a; (void)b; (void)y; return {guard}; }}",
                    f"static inline double grad_{side}_{code}(double a, double b, double y, double g) {{",
                    f"    (void)a; (void)b; (void)y; return {c_expression(rule)}; }}"]
            duals += [f"static inline pg_dual dual_grad_{side}_{code}(pg_dual a, pg_dual b, pg_dual y, "
                      "pg_dual g) {",
                      f"    (void)a; (void)b; (void)y; return {dual_expression(rule)}; }}"]
        tangents += [f"static inline pg_dual tangent_{code}(pg_dual a, pg_dual b, double y) {{",
                     "    pg_dual r = {y, 0.0, 0};",
                     f"    if (a.has && guard_a_{code}(a.v, b.v, y)) add_tangent(&r, grad_a_{code}(a.v, b.v, y, a.t));",
                     f"    if (b.has && guard_b_{code}(a.v, b.v, y)) add_tangent(&r, grad_b_{code}(a.v, b.v, y, b.t));",
                     "    r.has = a.has | b.has;",
                     "    return r;", "}",
                     f"static inline pg_dual dual_{code}(pg_dual a, pg_dual b) {{",
                     f"    return tangent_{code}(a, b, fwd_{code}(a.v, b.v)); }}"]
    fwd, grad = t["POWK"]
    guard, rule = _guard_and_rule(grad)
    out += [f"static inline double fwd_POWK(double x, double k) {{ return {c_expression(fwd)}; }}",
            "static inline int guard_POWK(double x, double k, double y) {",
            f"    (void)x; (void)k; (void)y; return {guard}; }}",
            "static inline double grad_POWK(double x, double k, double y, double g) {",
            f"    (void)x; (void)y; return {c_expression(rule)}; }}"]
    tangents += ["static inline pg_dual tangent_POWK(pg_dual x, double k, double y) {",
                 "    pg_dual r = {y, 0.0, x.has};",
                 "    if (x.has && guard_POWK(x.v, k, y)) r.t = grad_POWK(x.v, k, y, x.t);",
                 "    return r;", "}"]
    duals += ["static inline pg_dual dual_grad_POWK(pg_dual x, double k, pg_dual y, pg_dual g) {",
              f"    (void)x; (void)y; return {dual_expression(rule)}; }}"]
    out += tangents + duals
    out.append("#define PG_UNARY_RULES(X) " + " ".join(f"X({code})" for code in t["UNARY"]))
    out.append("#define PG_BINARY_RULES(X) " + " ".join(f"X({code})" for code in t["BINARY"]))
    return "\n".join(out) + "\n"


def _write_generated(name: str, text: str) -> None:
    """Write build/generated/<name> only if it changed (so make-like tools
    see no new file)."""
    os.makedirs(GENERATED, exist_ok=True)
    path = os.path.join(GENERATED, name)
    try:
        with open(path, encoding="utf-8") as f:
            same = f.read() == text
    except OSError:
        same = False
    if not same:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def write_rules_header() -> str:
    """Write rules.h and second_order_rules.h into build/generated and
    return its directory."""
    _write_generated("rules.h", rules_header())
    _write_generated("second_order_rules.h", second_order_header())
    return GENERATED


def entry_points() -> "list[str]":
    """The cdef of the per-op entry points (end of csrc/pygrad.h) that fit
    each op's arity: binary ops get three, unary ops one; x ** number has
    its own pair (POWK takes its exponent)."""
    lines = []
    for code, _, arity in op_codes():
        if arity == 2:
            lines += [f"int32_t pg_binary_{code}(pg_node *out, pg_node *a, pg_node *b);",
                      f"int32_t pg_binary_k_{code}(pg_node *out, pg_node *a, double k);",
                      f"int32_t pg_binary_rk_{code}(pg_node *out, double k, pg_node *a);"]
        elif arity == 1 and code != "POWK":
            lines.append(f"int32_t pg_unary_{code}(pg_node *out, pg_node *a);")
    lines += ["int32_t pg_powk_float(pg_node *out, pg_node *a, double k);",
              "int32_t pg_powk_int(pg_node *out, pg_node *a, double k);",
              "const char *pg_build_stamp(void);"]
    return lines


# The C half of Value (csrc/value_binding.h says how it works): node
# objects, Value's C base, the calls that take Values by id(), and the
# makers of the builtins the operators call (op functions, call_tracing).
BINDING_CDEF = """
#define PG_E_NUMBER -6
#define PG_E_NOT_A_NUMBER -7
int pg_binding_init(uintptr_t out, uintptr_t converter);
int pg_binding_prev(uintptr_t children, uintptr_t slow, uintptr_t cls);
int pg_binding_op_name(uintptr_t out, uintptr_t names, uintptr_t slow);
int pg_after_fork_in_child(void);
int32_t pg_leaf_v(uintptr_t value, double data);
int pg_op_function(uintptr_t out, int op, int form, int fastcall);
int pg_call_tracing_function(uintptr_t out);
int pg_call_collector_paused_function(uintptr_t out);
int64_t pg_program_foreign_inputs_l(pg_program *p, uintptr_t inputs);
#define PG_FORM_VALUES 0
#define PG_FORM_K 1
#define PG_FORM_RK 2
#define PG_FORM_UNARY 3
#define PG_FORM_POWK_FLOAT 4
#define PG_FORM_POWK_INT 5
int32_t pg_custom_v(uintptr_t value, double data, uintptr_t kids);
int32_t pg_nary_v(uintptr_t value, int op, int variant, uintptr_t values);
int32_t pg_function_v(uintptr_t value, double data, uintptr_t values, const double *partials,
                      size_t npartials);
int32_t pg_leaves_v(uintptr_t out, uintptr_t cls, const double *data, uint32_t n);
int32_t pg_layer_v(uintptr_t out, uintptr_t cls, int act, uintptr_t params, uintptr_t xs,
                   uint32_t nin, uint32_t nout, uintptr_t holds);
int32_t pg_mlp_v(uintptr_t out, uintptr_t cls, uint32_t nlayers, const int *acts,
                 uintptr_t params, const uint32_t *sizes, uintptr_t xs, uintptr_t holds,
                 uintptr_t table);
int32_t pg_view_v(uintptr_t out, uintptr_t parent, uint32_t i, uintptr_t a, uintptr_t b);
int32_t pg_pack_v(uintptr_t values, uintptr_t out);
uintptr_t pg_node_addr(uintptr_t value);
int64_t pg_describe_v(uintptr_t value);
double pg_exponent_v(uintptr_t value);
int pg_variant_v(uintptr_t value);
uint32_t pg_nkids_v(uintptr_t value);
uintptr_t pg_kid_addr(uintptr_t value, uint32_t i);
int32_t pg_local_grads_v(uintptr_t value, double *out, uint32_t cap);
int32_t pg_walk_l(uintptr_t roots, uintptr_t order, uintptr_t kids_of, uintptr_t key_of,
                  uintptr_t slow_kids);
int32_t pg_add_pairs_l(uintptr_t kids, uint32_t first, uintptr_t g, uintptr_t terms);
int32_t pg_sum_of_products_l(uintptr_t out, uintptr_t terms, uintptr_t one);
int32_t pg_set_py_backward_v(uintptr_t value);
int32_t pg_set_traced_v(uintptr_t value);
int32_t pg_node_backward_v(uintptr_t value);
int64_t pg_live_nodes(void);
int pg_sweep_value(pg_sweep *s, uintptr_t out);
uintptr_t pg_sweep_node_addr(const pg_sweep *s);
void pg_zero_hidden_v(uintptr_t value);
int32_t pg_backward_v(uintptr_t root, pg_sweep *sweep);
int32_t pg_backward_resume_s(pg_sweep *s);
void pg_sweep_restore_s(pg_sweep *s);
int32_t pg_compile_v(uintptr_t root, pg_program *p, uintptr_t *bad);
int32_t pg_batch_compile_v(uintptr_t outputs, uintptr_t inputs, pg_batch *b, uintptr_t *bad);
int32_t pg_batch_step_l(pg_batch *b, const double *rows, size_t n, double *out, const double *w,
                        uint32_t threads, const pg_optimizer *opt, uintptr_t params);
void pg_sweep_release(pg_sweep *s);
void pg_program_release(pg_program *p);
void pg_batch_release(pg_batch *b);
int32_t pg_gather_data_l(uintptr_t list, double *out, size_t nout);
int32_t pg_gather_grad_l(uintptr_t list, double *out, size_t nout);
int32_t pg_scatter_data_l(uintptr_t list, const double *in, size_t nin);
int32_t pg_fill_grad_l(uintptr_t list, double x);
int32_t pg_program_onehot_l(pg_program *p, uintptr_t list, const uint32_t *ids, size_t nids,
                            uint32_t vocab, int backward, double *loss);
int32_t pg_grad_numbers_l(uintptr_t outs, const double *seeds, size_t nseeds, uintptr_t ins,
                          double *result, size_t nresult);
int32_t pg_hvp_numbers_l(uintptr_t root, uintptr_t ins, const double *tangents, size_t ntangents,
                         uint32_t ntan, double *result, size_t nresult, double *root_tangents,
                         size_t nroot, int reverse);
int32_t pg_sgd_step_l(uintptr_t list, double lr, double momentum, double weight_decay,
                      double *velocity, size_t nvelocity, double *steps);
int32_t pg_adam_step_l(uintptr_t list, double lr, double beta1, double beta2, double eps,
                       double weight_decay, double bias1, double bias2, double *m, size_t nm,
                       double *v, size_t nv, double *steps);
"""


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


def hide_holds(cdef: str) -> str:
    """cdef with each struct field marked "hidden from cffi" left out (a
    partial struct, ``...;``): what holds a sweep's or program's nodes is
    the binding's alone (csrc/value_binding.h), out of Python's reach."""
    return re.sub(r"^[^\n]*hidden from cffi[^\n]*$", "    ...;", cdef, flags=re.M)


def cdef_source(test_hooks: bool = TEST_HOOKS) -> str:
    """The cdef of the core: pygrad.h's, the op codes and entry points, and
    with test_hooks, the hooks of test_hooks.h."""
    ops = op_codes()
    defines = [f"#define PG_OP_{code} {i}" for i, (code, _, _) in enumerate(ops)]
    defines.append(f"#define PG_OP_COUNT {len(ops)}")
    hooks = _cdef_part("test_hooks.h") if test_hooks else ""
    # The node's size and its two number fields (the rest is C's: "...").
    node = "typedef struct pg_node { double data; double grad; ...; } pg_node;\n"
    return ("\n".join(defines) + "\n" + node + hide_holds(_cdef_part("pygrad.h")) + hooks
            + "\n".join(entry_points()) + "\n" + BINDING_CDEF)


# The core compiles without a warning under these (.ci/warnings adds -Werror).
WARNINGS = ["-Wall", "-Wextra", "-Wshadow", "-Wmissing-prototypes", "-Wconversion"]


def compile_args() -> "list[str]":
    hooks = ["-DPG_TEST_HOOKS"] if TEST_HOOKS else []
    if sys.platform == "win32":
        return ["/O2", "/fp:precise", "/std:c11"] + [h.replace("-", "/", 1) for h in hooks]
    # No fused multiply-add and no fast-math: every double must round as
    # Python's float arithmetic does, so C and the reference engine agree.
    args = ["-std=c11", "-O2", "-fno-fast-math", "-ffp-contract=off"] + hooks + WARNINGS
    if sys.platform.startswith("linux"):
        args += ["-include", "glibc_versions.h"]   # the manylinux_2_17 tag: see that header
        # GCC's -O2 vectorizes a loop only when it needs no remainder loop,
        # which the batched tier's row loops (ops.c) always do: this cost
        # model vectorizes them as -O3 would (without reordering any sum:
        # no fast-math, so every row's number is the same).  Clang, which
        # vectorizes them at -O2, has no such flag.
        cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or ""
        if "clang" not in cc:
            args += ["-fvect-cost-model=dynamic"]
    if os.environ.get("PYGRAD_SANITIZE") == "1":
        # -O1 keeps stack traces readable; no recovery, so any report fails the run.
        args += ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                 "-fno-omit-frame-pointer", "-O1", "-g"]
    return args


def link_args() -> "list[str]":
    if sys.platform != "win32" and os.environ.get("PYGRAD_SANITIZE") == "1":
        return ["-fsanitize=address,undefined"]
    return []


# The calls whose work grows with a graph, a model or a batch: cffi's
# wrappers of these let Python's GIL go, so that other threads go on
# meanwhile.  pygrad's Python calls three of them through cffi (a program's
# forward and backward, a batch's run); the rest are the raw calls behind
# the binding's own wrappers (value_binding.h's _v/_l/_s calls, which let
# the GIL go themselves), listed so that a tool or test calling one
# directly lets it go too.  Every other call does a small, fixed amount of
# work, less than it takes to let the GIL go and take it back, so it keeps
# the GIL (and cffi's errno bookkeeping, which ffi.errno alone reads, is
# skipped).
RELEASES_GIL = ("pg_backward", "pg_backward_resume", "pg_sweep_restore", "pg_sweep_clear",
                "pg_linear_layer", "pg_mlp", "pg_gather_data", "pg_gather_grad",
                "pg_scatter_data", "pg_fill_grad", "pg_sgd_step", "pg_adam_step",
                "pg_compile", "pg_program_forward", "pg_program_backward", "pg_program_run_onehot",
                "pg_batch_compile", "pg_batch_run", "pg_batch_clear")


def gil_source(cdef: str) -> str:
    """C for the module's preamble: cffi's wrappers keep the GIL, but those
    of RELEASES_GIL, which call a twin that lets it go."""
    lines = ["#undef Py_BEGIN_ALLOW_THREADS", "#undef Py_END_ALLOW_THREADS",
             "#define Py_BEGIN_ALLOW_THREADS {", "#define Py_END_ALLOW_THREADS }",
             "#undef _cffi_restore_errno", "#undef _cffi_save_errno",
             "#define _cffi_restore_errno() ((void)0)", "#define _cffi_save_errno() ((void)0)",
             ]
    flat = re.sub(r"\s+", " ", re.sub(r"/\*.*?\*/", "", cdef, flags=re.S))
    for name in RELEASES_GIL:
        found = re.search(r"([\w ]+?\**) ?\b" + name + r"\(([^)]*)\);", flat)
        if found is None:
            raise ValueError(f"cffi_build: no declaration of {name} in the cdef")
        ret, params = found.group(1).strip(), found.group(2).strip()
        args = ", ".join(re.findall(r"(\w+)\s*(?:,|$)", params)) if params != "void" else ""
        result = "" if ret == "void" else f"{ret} r = "
        lines += [f"static {ret} {name}__without_gil({params}) {{",
                  "    PyThreadState *save = PyEval_SaveThread();",
                  f"    {result}{name}({args});",
                  "    PyEval_RestoreThread(save);"]
        lines += ([] if ret == "void" else ["    return r;"]) + ["}", f"#define {name} {name}__without_gil"]
    return "\n".join(lines) + "\n"


ffibuilder = FFI()
ffibuilder.cdef(cdef_source())
ffibuilder.set_source(
    "pygrad._core",
    '#include <string.h>\n#include "pygrad.h"\n#include "test_hooks.h"\n'
    # cffi defines the module's init function without a prototype
    'PyMODINIT_FUNC PyInit__core(void);\n'
    f'static const char *pg_build_stamp(void) {{ return "{source_stamp()}"; }}\n'
    # the binding calls the core's functions themselves; cffi's wrappers of
    # those in RELEASES_GIL call twins that let the GIL go (after it)
    + '#include "value_binding.h"\n' + gil_source(cdef_source()),
    sources=[os.path.relpath(os.path.join(CSRC, f), ROOT)
             for f in sorted(os.listdir(CSRC)) if f.endswith(".c")],
    # an edited header or ops.def rebuilds the core (every .c includes them)
    depends=[os.path.relpath(os.path.join(CSRC, f), ROOT)
             for f in sorted(os.listdir(CSRC)) if f.endswith((".h", ".def"))]
    + [os.path.relpath(OP_RULES, ROOT)],
    include_dirs=[os.path.relpath(CSRC, ROOT), os.path.relpath(write_rules_header(), ROOT)],
    extra_compile_args=compile_args(),
    extra_link_args=link_args(),
    libraries=[] if sys.platform == "win32" else ["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
