"""What a copied or unpickled Value becomes, on both engines: a new leaf with
the same data, grad, label and attributes (a graph node's children and
closures stay behind).  Each engine's ``_leaf`` (the name its pickles
carry) calls this with its own Value class."""
from typing import Any, Optional


def new_leaf(base: Any, cls: Any, data: float, grad: float, label: str,
             state: Optional[dict] = None) -> Any:
    """A ``cls`` (``base`` or a subclass of it) made as ``base(data,
    label=label)`` makes a leaf, without the subclass's ``__init__`` being
    called (as pickle does), then given ``grad`` and ``state``."""
    v = cls.__new__(cls)
    base.__init__(v, data, label=label)
    v.grad = grad
    if state:
        v.__dict__.update(state)
    return v
