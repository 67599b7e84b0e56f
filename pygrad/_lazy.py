"""numpy, imported on first use, so that ``import pygrad`` loads only the C
core (numpy costs about 100 ms and starts its BLAS threads)."""
import importlib
import sys
import threading
from typing import Any, List


def import_whole(name: str) -> Any:
    """``importlib.import_module(name)``, run to its end whatever signal
    arrives meanwhile.

    An import stopped part way (a Ctrl-C's KeyboardInterrupt, or another
    signal handler's exception, landing in one of numpy's modules) can't be
    undone: numpy's C core loads once per process, and the modules made
    so far stay half-made, so numpy would fail for the rest of the process
    ("module 'numpy' has no attribute ...", "cannot load module more than
    once per process").  Python runs signal handlers in the main thread
    only, so there the import runs in a thread of its own, which no handler
    interrupts, while the main thread waits: a Ctrl-C meanwhile still raises
    KeyboardInterrupt at once, and a later import waits for the one under
    way to finish."""
    if name in sys.modules or threading.current_thread() is not threading.main_thread():
        # Imported (or being imported by another thread, which this import
        # waits for), or no handler runs in this thread.
        return importlib.import_module(name)
    done: List[Any] = []

    def run() -> None:
        try:
            done.append(importlib.import_module(name))
        except BaseException as e:          # handed to the waiting thread
            done.append(e)
    importer = threading.Thread(target=run, name=f"pygrad: import {name}")
    importer.start()
    importer.join()
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


class _Lazy:
    """A module imported at its first attribute read; after that its names
    sit in this object's own dict, so reads cost what a module's do."""

    def __init__(self, name: str) -> None:
        self.__dict__["_lazy_name"] = name

    def __getattr__(self, attr: str) -> Any:
        module = import_whole(self.__dict__["_lazy_name"])
        self.__dict__.update(vars(module))
        return getattr(module, attr)


numpy: Any = _Lazy("numpy")
