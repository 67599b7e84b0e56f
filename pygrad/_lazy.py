"""numpy, imported on first use, so that ``import pygrad`` loads only the C
core (numpy costs about 100 ms and starts its BLAS threads)."""
import importlib
import signal
import sys
import threading
from typing import Any, List


def import_whole(name: str) -> Any:
    """``importlib.import_module(name)``, with a Ctrl-C that arrives
    meanwhile held back until the import is over.

    An import stopped part way by a KeyboardInterrupt can't be undone:
    numpy's C core loads once per process, and the modules made so far stay
    half-made, so numpy would fail for the rest of the process ("module
    'numpy' has no attribute ...", "cannot load module more than once per
    process").  Python runs signal handlers in the main thread only, so
    there SIGINT's handler is swapped, for the import, for one that notes
    the signal; the handler is put back after it and, if a Ctrl-C came,
    called (raising KeyboardInterrupt, for the default one).  The import
    starts no thread (batch.c starts its workers only inside a run)."""
    if name in sys.modules or threading.current_thread() is not threading.main_thread():
        # Imported (or being imported by another thread, which this import
        # waits for), or no handler runs in this thread.
        return importlib.import_module(name)
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):           # SIG_DFL, SIG_IGN: no Python code runs
        return importlib.import_module(name)
    frames: List[Any] = []
    try:
        # Inside the try: an exception as the swap returns still puts the
        # handler back.
        signal.signal(signal.SIGINT, lambda signum, frame: frames.append(frame))
        return importlib.import_module(name)
    finally:
        signal.signal(signal.SIGINT, handler)
        if frames:
            handler(signal.SIGINT, frames[0])


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
