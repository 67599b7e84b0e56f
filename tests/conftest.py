"""Which pygrad the tests run against, and a refusal to run against a stale one.

- ``python -m pytest`` puts the working directory first on ``sys.path``.  Run
  from a checkout whose ``pygrad/`` has no built core (after a plain
  ``pip install .``), that directory would shadow the installed pygrad and
  every test module would fail to import.  Here the checkout is taken off
  ``sys.path`` instead, so ``python -m pytest`` tests the installed copy, as
  ``pytest`` does.
- Under CI (``CI`` set in the environment) hypothesis does not shrink: a
  failing example is reported as found, at once, instead of after minutes of
  shrinking on a shared 2-core machine.  Rerun locally to get it shrunk.
- A core built in the checkout (``pip install -e .``) carries a stamp of the
  C sources it was built from.  If ``csrc/`` has changed since, the run stops
  with the command that rebuilds it, rather than testing an old core.
- The fault-injection tests need a test core (built with
  ``PYGRAD_TEST_HOOKS=1``; csrc/test_hooks.h) and skip on a production one.
  With ``PYGRAD_TEST_HOOKS=1`` set while testing, as ``.ci/sanitize`` and
  ``.ci/valgrind`` do, a core without the hooks stops the run instead, so
  those tests can't be skipped where they are meant to run.
"""
import importlib.util
import os
import pathlib
import sys

import pytest
from hypothesis import Phase, settings

REPO = pathlib.Path(__file__).resolve().parent.parent
SOURCE_PACKAGE = REPO / "pygrad"


def _has_core(package: pathlib.Path) -> bool:
    return any(p.name.startswith("_core.") and p.suffix in (".so", ".pyd")
               for p in package.glob("_core.*"))


if SOURCE_PACKAGE.is_dir() and not _has_core(SOURCE_PACKAGE):
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or os.curdir).resolve() != REPO]

import pygrad  # noqa: E402  (after the sys.path fix above)

UNDER_TEST = pathlib.Path(pygrad.__file__).resolve().parent


def _source_stamp() -> str:
    spec = importlib.util.spec_from_file_location("pygrad_cffi_build", REPO / "csrc" / "cffi_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.source_stamp()


settings.register_profile("ci", phases=[p for p in Phase if p is not Phase.shrink],
                          print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_configure(config: pytest.Config) -> None:
    from pygrad._core import lib
    if os.environ.get("PYGRAD_TEST_HOOKS") == "1" and not hasattr(lib, "pg_fail_alloc"):
        pytest.exit(f"PYGRAD_TEST_HOOKS=1, but the core in {UNDER_TEST} has no test hooks: "
                    "build it with PYGRAD_TEST_HOOKS=1 in the environment.", returncode=4)
    if UNDER_TEST != SOURCE_PACKAGE or not (REPO / "csrc" / "cffi_build.py").exists():
        return      # an installed pygrad: its wheel was built from its own sources
    from pygrad._core import ffi, lib
    built, now = ffi.string(lib.pg_build_stamp()).decode(), _source_stamp()
    if built != now:
        pytest.exit(f"pygrad's C core in {UNDER_TEST} was built from older sources than "
                    f"csrc/ (stamp {built}, sources {now}): rebuild it with "
                    f"`python -m pip install -e \".[test]\"`, then run the tests again.",
                    returncode=4)


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    from pygrad._core import lib
    if hasattr(lib, "pg_fail_alloc"):
        return
    skip = pytest.mark.skip(reason="needs a test core (PYGRAD_TEST_HOOKS=1 at build time; "
                                   ".ci/sanitize and .ci/valgrind build one)")
    for item in items:
        if "test_hooks" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> str:
    from pygrad._core import lib
    where = "this checkout" if UNDER_TEST == SOURCE_PACKAGE else "an installed copy"
    core = "a test core, with fault injection" if hasattr(lib, "pg_fail_alloc") else "a production core"
    return f"pygrad {pygrad.__version__} under test: {UNDER_TEST} ({where}, {core})"
