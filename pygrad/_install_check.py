"""What ``import pygrad`` checks before anything else: that this directory is
a whole, built pygrad (pygrad-autograd) and not mixed with another project.

The package index has another project named ``pygrad`` that installs a
``pygrad/`` package of its own, with an ``nn/`` subpackage.  Installed into the
same environment, its ``pygrad/nn/`` would silently take over ``pygrad.nn``,
and uninstalling it would delete our files.  One ``stat`` call detects it.
"""
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec


def _owners(directory: str) -> "list[str]":
    """The installed distributions whose files include ``directory``'s
    ``__init__.py`` or ``nn/__init__.py`` (read only on the error path)."""
    from importlib import metadata
    names = []
    for dist in metadata.distributions():
        for f in dist.files or ():
            parts = f.parts
            if parts[:1] == ("pygrad",) and parts[-1] == "__init__.py" and len(parts) <= 3:
                located = os.path.dirname(os.path.abspath(str(dist.locate_file(f))))
                if located in (directory, os.path.join(directory, "nn")):
                    names.append(f"{dist.metadata['Name']} {dist.version}")
                    break
    return names


def check_install(directory: str) -> None:
    """Raise ImportError with what to do if pygrad's C core is missing from
    ``directory`` (an unbuilt source tree) or another project's files are mixed in.
    An unbuilt source tree that shadows a built, installed pygrad (Python
    started in the checkout after ``pip install .``) loads the installed one."""
    if os.path.isdir(os.path.join(directory, "nn")):
        owners = ", ".join(_owners(directory)) or "unknown"
        raise ImportError(
            f"{directory} mixes pygrad-autograd with another project's files: its nn/ "
            f"package is not pygrad-autograd's (pygrad.nn is the module nn.py). Installed "
            f"distributions owning files there: {owners}. The package index's `pygrad` "
            f"project uses the same import name. Run `pip uninstall pygrad pygrad-autograd`, "
            f"then install pygrad-autograd again from your checkout or wheel: `pip install "
            f"/path/to/pygrad` (the checkout) or `pip install /path/to/pygrad_autograd-*.whl`. "
            f"It is not on the package index yet: there `pip install pygrad-autograd` finds "
            f"nothing and `pip install pygrad` is the other project.") from None
    try:
        from . import _core  # noqa: F401  (the compiled C core, built by pip install)
    except ImportError as e:
        failed = e
    else:
        return
    if any(n.startswith("_core") and n.endswith((".so", ".pyd")) for n in os.listdir(directory)):
        # built, but it did not load: say why (an isolated subinterpreter's
        # refusal of a single-phase module, on CPython 3.12+, is the known case)
        why = (": pygrad's C engine runs in one interpreter per process (use pygrad.reference "
               "in subinterpreters)" if "subinterpreter" in str(failed) else "")
        raise ImportError(f"pygrad's C core in {directory} did not load ({failed}){why}") from None
    checkout = os.path.dirname(directory)
    hint = "build it with `python -m pip install -e .` in the repository"
    if os.path.exists(os.path.join(checkout, "csrc", "cffi_build.py")):
        from importlib.machinery import PathFinder
        others = [p for p in sys.path if os.path.abspath(p or os.curdir) != checkout]
        spec = PathFinder.find_spec("pygrad", others)
        if spec is not None and spec.origin:
            installed = os.path.dirname(spec.origin)
            if _is_built(installed):
                _use_installed(spec, directory)
                return
            hint = (f"an installed pygrad is at {installed}, but Python "
                    f"was started in the source tree {checkout}, which shadows it: run from "
                    f"another directory (`pytest` works from here), or " + hint)
    raise ImportError(f"pygrad's C core (pygrad._core) is not built in this copy of pygrad "
                      f"({directory}): {hint}.") from None


def _is_built(directory: str) -> bool:
    """Whether ``directory`` is a whole, built pygrad-autograd: its own
    install check, a compiled core, and no other project's ``nn/``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    return ("_install_check.py" in names and "nn" not in names
            and any(n.startswith("_core") and n.endswith((".so", ".pyd")) for n in names))


def _use_installed(spec: "ModuleSpec", directory: str) -> None:
    """``python -m pygrad`` (or ``import pygrad``) started in a checkout that
    was installed with a plain ``pip install .``: the working directory's
    unbuilt ``pygrad/`` comes first on ``sys.path``, so the installed copy,
    the one the user built, is loaded in its place (``sys.modules``, which
    the import system returns), saying so on stderr, once."""
    import importlib.util
    installed = os.path.dirname(str(spec.origin))
    sys.stderr.write(f"pygrad: note: {directory} (this source tree) has no built C core; "
                     f"using the installed pygrad at {installed}. To run the tree's own code, "
                     f"build it: python -m pip install -e .\n")
    for name in [n for n in sys.modules if n.startswith("pygrad.")]:
        del sys.modules[name]          # the tree's _install_check: the installed one runs its own
    module = importlib.util.module_from_spec(spec)
    sys.modules["pygrad"] = module
    try:
        spec.loader.exec_module(module)         # type: ignore[union-attr]
    except BaseException:
        del sys.modules["pygrad"]
        raise
