"""How pygrad is found at import: a source tree without its core, another
project's files mixed into the package, a star import, and a production core
without the test hooks."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import pygrad

INSTALLED = pathlib.Path(pygrad.__file__).resolve().parent


def _copy_package(to: pathlib.Path, with_core: bool) -> pathlib.Path:
    ignore = ["__pycache__"] + ([] if with_core else ["_core*.so", "_core*.pyd"])
    shutil.copytree(INSTALLED, to / "pygrad", ignore=shutil.ignore_patterns(*ignore))
    return to / "pygrad"


def _unbuilt_checkout_and_installed_copy(tmp_path: pathlib.Path, installed_core: bool = True):
    checkout = tmp_path / "checkout"
    _copy_package(checkout, with_core=False)
    (checkout / "csrc").mkdir()
    (checkout / "csrc" / "cffi_build.py").write_text("")
    site = tmp_path / "site"
    _copy_package(site, with_core=installed_core)
    return checkout, site


def _dependencies() -> str:
    """Where cffi's backend and numpy are, for a `python -S` that loads the
    built copy (after that copy: a wheel-installed pygrad may be there too)."""
    import _cffi_backend
    import numpy
    return os.pathsep.join(sorted({os.path.dirname(_cffi_backend.__file__),
                                   os.path.dirname(os.path.dirname(numpy.__file__))}))


def test_python_m_pygrad_in_an_unbuilt_checkout_runs_the_installed_copy(tmp_path):
    """The README's Quick start (`pip install .` in a checkout) leaves the
    user in the checkout, whose unbuilt pygrad/ comes first on sys.path for
    `python -m pygrad`: the installed copy runs instead, saying so once."""
    checkout, site = _unbuilt_checkout_and_installed_copy(tmp_path)
    env = {"PYTHONPATH": f"{site}{os.pathsep}{_dependencies()}"}
    out = subprocess.run([sys.executable, "-S", "-m", "pygrad", "--version"], cwd=checkout,
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"pygrad {pygrad.__version__}\n"
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"pygrad: note: {checkout / 'pygrad'} (this source tree) has "
                                 f"no built C core; using the installed pygrad at "
                                 f"{site / 'pygrad'}."), out.stderr
    assert "python -m pip install -e ." in out.stderr
    code = ("import sys, pygrad, pygrad.nn\n"
            "from pygrad import Value\n"
            "assert sys.modules['pygrad'] is pygrad and pygrad.nn.MLP(2, [3, 1])\n"
            "print(pygrad.__file__, pygrad.engine.__file__, pygrad._install_check.__file__)\n"
            "v = Value(3.0) * Value(2.0); v.backward(); print(v.data)\n")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=checkout,
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    files, data = out.stdout.splitlines()
    assert all(f.startswith(str(site / "pygrad") + "/") for f in files.split()), files
    assert data == "6.0"


def test_an_unbuilt_checkout_over_an_unbuilt_copy_says_so_once(tmp_path):
    """What shadows the checkout is not a built pygrad-autograd: one
    ImportError naming both copies, no chained 'circular import' error."""
    checkout, site = _unbuilt_checkout_and_installed_copy(tmp_path, installed_core=False)
    out = subprocess.run([sys.executable, "-S", "-c", "import pygrad"], cwd=checkout,
                         capture_output=True, text=True, env={"PYTHONPATH": str(site)})
    assert out.returncode == 1
    assert out.stderr.count("Traceback") == 1, out.stderr
    assert "circular import" not in out.stderr and "During handling" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pygrad's C core"), last
    assert f"an installed pygrad is at {site / 'pygrad'}" in last, last
    assert str(checkout) in last and "pip install -e ." in last


def test_an_unbuilt_checkout_alone_says_how_to_build_it(tmp_path):
    checkout, _ = _unbuilt_checkout_and_installed_copy(tmp_path)
    out = subprocess.run([sys.executable, "-S", "-m", "pygrad", "--version"], cwd=checkout,
                         capture_output=True, text=True, env={})
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: pygrad's C core (pygrad._core) is not built in this copy of "
                    f"pygrad ({checkout / 'pygrad'}): build it with `python -m pip install -e .` "
                    f"in the repository."), last


def test_another_projects_pygrad_nn_in_the_package_is_refused_by_name(tmp_path):
    """The index's `pygrad` project (a pygrad/ package with an nn/ subpackage)
    installed over ours: import names both and says what to do, instead of
    `pygrad.nn` silently being the other project's."""
    site = tmp_path / "site"
    package = _copy_package(site, with_core=True)
    (package / "nn").mkdir()
    (package / "nn" / "__init__.py").write_text("from .module import Module\n")
    dist = site / "pygrad-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pygrad\nVersion: 0.1.0\n")
    (dist / "RECORD").write_text("pygrad/__init__.py,,\npygrad/nn/__init__.py,,\n")
    out = subprocess.run([sys.executable, "-S", "-c", "import pygrad.nn"], cwd=tmp_path,
                         capture_output=True, text=True, env={"PYTHONPATH": str(site)})
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and "another project's files" in last, last
    assert "pygrad 0.1.0" in last and "pip uninstall pygrad pygrad-autograd" in last, last
    # pygrad-autograd is not on the index: the reinstall is from a checkout or wheel
    assert "from your checkout or wheel" in last and "`pip install /path/to/pygrad`" in last, last
    assert "then `pip install pygrad-autograd`" not in last, last


def test_star_import_leaves_the_builtins_sum_and_compile_alone():
    namespace: dict = {}
    exec("from pygrad import *", namespace)
    assert "sum" not in namespace and "compile" not in namespace
    assert "Value" in namespace and "Program" in namespace
    from pygrad import compile, sum      # still importable by name
    assert sum([pygrad.Value(1.0), pygrad.Value(2.0)]).data == 3.0
    assert callable(compile)


def test_the_version_is_the_changelogs_newest_release():
    """pygrad.__version__ is the first released (dated) version in CHANGELOG.md."""
    import re
    changelog = pathlib.Path(__file__).resolve().parent.parent / "CHANGELOG.md"
    if not changelog.exists():
        import pytest
        pytest.skip("no CHANGELOG.md beside the tests")
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d\d-\d\d)", changelog.read_text(), re.M)
    assert released, "no dated release in CHANGELOG.md"
    assert released[0][0] == pygrad.__version__, (released[0], pygrad.__version__)


def test_a_production_core_carries_no_fault_injection():
    # The hooks and their lock exist only in a test core (csrc/test_hooks.h):
    # a production core's allocator is malloc with no countdown to check.
    # dlsym sees the core's exported C symbols, not only the cdef's.
    import ctypes
    from pygrad import _core
    if hasattr(_core.lib, "pg_fail_alloc"):
        pytest.skip("a test core (built with PYGRAD_TEST_HOOKS=1)")
    if sys.platform == "win32":
        pytest.skip("a DLL exports only its module init")
    core = ctypes.CDLL(_core.__file__)
    assert hasattr(core, "pg_malloc")      # the lookup finds what is there
    for symbol in ("pg_fail_alloc", "pg_fail_unmap", "pg_limit_segments",
                   "pg_alloc_fails", "pg_unmap_fails", "pg_test_hooks_lock"):
        assert not hasattr(core, symbol), symbol


def test_a_failed_compile_says_what_to_do_then_fails_as_before(capsys):
    """`pip install .` without a C compiler: setup.py's build_ext prints how
    to do without one (the wheel route) and re-raises the compiler's error,
    so that pip still fails."""
    import runpy
    setup_py = pathlib.Path(__file__).resolve().parent.parent / "setup.py"
    if not setup_py.exists():
        pytest.skip("no setup.py beside the tests")
    errors = pytest.importorskip("setuptools.errors")
    if not hasattr(errors, "CompileError"):     # before setuptools 59; pip builds with >= 77
        pytest.skip(f"setuptools {pytest.importorskip('setuptools').__version__} is older than "
                    f"pyproject.toml's build requirement")
    wrap = runpy.run_path(str(setup_py), run_name="not_main")["build_ext_saying_what_to_do"]
    failure = errors.CompileError("command '/nonexistent/cc' failed: No such file or directory")

    class NoCompiler:
        def run(self):
            raise failure

    class Compiles:
        def run(self):
            print("built")

    with pytest.raises(errors.CompileError) as exc:
        wrap(NoCompiler)().run()
    assert exc.value is failure
    err = capsys.readouterr().err
    assert err.startswith("\npygrad: compiling the C core failed (command '/nonexistent/cc' "
                          "failed: No such file or directory).\n"), err
    flat = " ".join(err.split())
    assert "needs a C compiler" in flat and "`bash .ci/wheel` builds one into dist/" in flat
    assert "`pip install dist/*.whl`" in flat and "needs no compiler" in flat
    wrap(Compiles)().run()
    assert capsys.readouterr() == ("built\n", "")


def test_cffis_wrappers_keep_the_gil_for_the_calls_that_touch_python_objects(tmp_path):
    """csrc/value_binding.h's functions use the C API, which needs the GIL.
    cffi's wrapper of a C function lets the GIL go through the
    Py_BEGIN_ALLOW_THREADS macro, which csrc/cffi_build.py's preamble
    redefines to keep it (but for its RELEASES_GIL list): a cffi whose
    wrappers let it go another way would break that, so check the module
    source this cffi writes."""
    import importlib.util
    import re
    build = pathlib.Path(__file__).resolve().parent.parent / "csrc" / "cffi_build.py"
    if not build.exists():
        pytest.skip("no csrc/ beside the tests")
    spec = importlib.util.spec_from_file_location("pygrad_cffi_build_check", build)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "core.c"
    module.ffibuilder.emit_c_code(str(out))
    source = out.read_text()
    preamble = source.index("#undef Py_BEGIN_ALLOW_THREADS")
    for name in ("pg_binding_init", "pg_pack_v", "pg_custom_v", "pg_leaf_v", "pg_backward_v",
                 "pg_nary_v", "pg_op_function", "pg_call_tracing_function"):
        found = re.search(r"_cffi_f_%s\(PyObject \*self, PyObject \*\w+\)\n\{(.*?)\n\}" % name,
                          source, re.S)
        assert found and found.start() > preamble, name
        body = found.group(1)
        assert "Py_BEGIN_ALLOW_THREADS" in body, name
        assert "PyEval_SaveThread" not in body and "PyGILState" not in body, name


def test_a_second_interpreter_is_refused_and_the_first_goes_on():
    # The core's types and state are per process: a subinterpreter's import
    # is refused with a message, and the main interpreter's Values still work.
    import pygrad as main
    try:
        import _xxsubinterpreters as interpreters        # CPython 3.9 to 3.12
    except ImportError:
        interpreters = pytest.importorskip("_interpreters")     # 3.13
    sub = interpreters.create()
    try:
        try:        # (3.13 returns the exception's description; older ones raise it)
            message = str(interpreters.run_string(sub, "import pygrad"))
        except Exception as e:
            message = str(e)
    finally:
        interpreters.destroy(sub)
    # pygrad's refusal, or (an isolated interpreter, 3.12+) CPython's own
    # for a module of single-phase init, which pygrad explains the same way
    assert "ImportError" in message and "one interpreter per process" in message, message
    a = main.Value(2.0)
    (a * a).backward()
    assert a.grad == 4.0


@pytest.mark.parametrize("what", ["pypy", "no_gil"])
def test_interpreters_pygrad_cannot_run_on_are_refused_at_import(monkeypatch, what):
    import types
    import pygrad.engine as engine
    if what == "pypy":
        monkeypatch.setattr(sys, "implementation", types.SimpleNamespace(name="pypy"))
        match = "CPython only"
    else:
        monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
        match = "needs the GIL"
    with pytest.raises(ImportError, match=match):
        engine._bind()
