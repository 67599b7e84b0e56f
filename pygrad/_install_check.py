"""What ``import pygrad`` checks before anything else: that this directory is
a whole, built pygrad (pygrad-autograd) and not mixed with another project.

The package index has another project named ``pygrad`` that installs a
``pygrad/`` package of its own, with an ``nn/`` subpackage.  Installed into the
same environment, its ``pygrad/nn/`` would silently take over ``pygrad.nn``,
and uninstalling it would delete our files.  One ``stat`` call detects it.
"""
import os
import sys


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
    ``directory`` (an unbuilt source tree) or another project's files are mixed in."""
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
    except ImportError:
        pass
    else:
        return
    checkout = os.path.dirname(directory)
    hint = "build it with `python -m pip install -e .` in the repository"
    if os.path.exists(os.path.join(checkout, "csrc", "cffi_build.py")):
        from importlib.machinery import PathFinder
        others = [p for p in sys.path if os.path.abspath(p or os.curdir) != checkout]
        spec = PathFinder.find_spec("pygrad", others)
        if spec is not None and spec.origin:
            hint = (f"an installed pygrad is at {os.path.dirname(spec.origin)}, but Python "
                    f"was started in the source tree {checkout}, which shadows it: run from "
                    f"another directory (`pytest` works from here), or " + hint)
    raise ImportError(f"pygrad's C core (pygrad._core) is not built in this copy of pygrad "
                      f"({directory}): {hint}.") from None
