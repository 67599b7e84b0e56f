"""pygrad: a scalar reverse-mode autograd engine with a C core.

``from pygrad import Value`` replaces ``from micrograd.engine import Value``;
``pygrad.nn`` replaces ``micrograd.nn``.  Submodules: ``nn``, ``optim``,
``losses``, ``data``, ``viz``, ``reference`` (the pure-Python engine).
"""
try:
    from . import _core  # noqa: F401  (the compiled C core, built by pip install)
except ImportError as e:
    raise ImportError(
        "pygrad's C core (pygrad._core) is not built in this copy of pygrad "
        f"({__path__[0]}). Build it with `pip install -e .` in the repository "
        "(or `python setup.py build_ext --inplace`), or install pygrad with pip and "
        "import it from outside the source tree.") from e

from typing import TYPE_CHECKING

from . import reference
from ._version import __version__
from .engine import Value
from .function import Context, Function
from .functional import dot, logsumexp, sum
from .gradcheck import GradcheckResult, gradcheck
from .replay import Inputs, Program, compile

_SUBMODULES = ("nn", "optim", "losses", "data", "viz")

if TYPE_CHECKING:
    # Loaded on first use at run time (__getattr__); a type checker sees them.
    from . import data, losses, nn, optim, viz


def __getattr__(name: str) -> object:
    """``pygrad.nn`` and the other submodules load on first use (PEP 562)."""
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Value", "dot", "sum", "logsumexp", "Function", "Context", "gradcheck",
           "GradcheckResult", "compile", "Program", "Inputs", "reference", "__version__"]
