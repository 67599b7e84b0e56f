"""pygrad: a scalar reverse-mode autograd engine with a C core.

``from pygrad import Value`` replaces ``from micrograd.engine import Value``.
"""
from ._version import __version__
from .engine import Value

__all__ = ["Value", "__version__"]
