"""numpy, imported on first use, so that ``import pygrad`` loads only the C
core (numpy costs about 100 ms and starts its BLAS threads)."""
import importlib
from typing import Any


class _Lazy:
    """A module imported at its first attribute read; after that its names
    sit in this object's own dict, so reads cost what a module's do."""

    def __init__(self, name: str) -> None:
        self.__dict__["_lazy_name"] = name

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self.__dict__["_lazy_name"])
        self.__dict__.update(vars(module))
        return getattr(module, attr)


numpy: Any = _Lazy("numpy")
