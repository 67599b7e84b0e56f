"""pygrad: a scalar reverse-mode autograd engine with a C core.

``from pygrad import Value`` replaces ``from micrograd.engine import Value``;
``pygrad.nn`` replaces ``micrograd.nn``.  Submodules: ``nn``, ``optim``,
``losses``, ``data``, ``viz``, ``reference`` (the pure-Python engine).
``grad``, ``hvp``, ``hessian`` and ``jvp`` take derivatives of derivatives
(pygrad/higher_order.py).
"""
from ._install_check import check_install as _check_install

_check_install(__path__[0])

from typing import TYPE_CHECKING

from . import reference
from ._version import __version__
from .engine import Value
from .function import Context, Function
from .functional import detached_max, dot, logsumexp, sum
from .gradcheck import GradcheckResult, gradcheck
from .higher_order import grad, hessian, hvp, jvp
from .token_programs import PerLength, Token, embed, per_length, pick
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


# ``sum`` and ``compile`` stay out of ``__all__``: ``from pygrad import *`` must
# not shadow the builtins.  Import them by name (``from pygrad import sum``).
__all__ = ["Value", "dot", "logsumexp", "detached_max", "Function", "Context", "gradcheck",
           "GradcheckResult", "grad", "hvp", "hessian", "jvp", "Program", "Inputs", "per_length", "PerLength", "Token", "embed",
           "pick", "reference", "__version__"]
