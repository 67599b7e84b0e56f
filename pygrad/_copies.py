"""What a copied or unpickled Value becomes, on both engines: a new leaf with
the same data, grad, label and attributes (a graph node's children and
closures stay behind).  Each engine's ``_leaf`` (the name its pickles
carry) calls this with its own Value class."""
from typing import Any, Optional


def new_leaf(base: Any, cls: Any, data: float, grad: float, label: str,
             state: Optional[dict] = None, made: bool = False) -> Any:
    """A ``cls`` (``base`` or a subclass of it) made as ``base(data,
    label=label)`` makes a leaf, without the subclass's ``__init__`` being
    called (as pickle does), then given ``grad`` and ``state``; with
    ``made``, ``cls`` is that leaf already."""
    if made:
        v = cls
    else:
        v = cls.__new__(cls)
        base.__init__(v, data, label=label)
    v.grad = grad
    if state is not None:
        apply_state(v, state)
    return v


def apply_state(v: Any, state: Any) -> None:
    """What pickle does with an object's state: its ``__setstate__``, or
    the instance dict updated and, for a ``(dict, slots)`` pair, the slots
    set."""
    setstate = getattr(v, "__setstate__", None)
    if setstate is not None:
        setstate(state)
        return
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state:
        v.__dict__.update(state)
    if slots:
        for name, x in slots.items():
            setattr(v, name, x)


def _own_getstate(cls: type, base: type) -> bool:
    """Whether a subclass of ``base`` (Value) below ``cls`` defines
    ``__getstate__``."""
    for c in cls.__mro__:
        if c is base:
            return False
        if "__getstate__" in c.__dict__:
            return True
    return False


# What a Value's instance dict keeps for its node, which a copy (a new
# leaf) leaves behind: a custom op's closure and name, and the
# pygrad.Function that made it, with its inputs (pygrad/function.py).
_NODE_KEYS = frozenset(("_backward", "_op", "_pg_function", "_pg_function_inputs"))


def state_of(v: Any, base: type) -> Any:
    """What a copy or pickle of ``v`` (a ``base``, pygrad.Value) carries
    besides its numbers: the
    subclass's ``__getstate__()`` if it has one, else its own attributes
    (less what they keep for the node: ``_NODE_KEYS``) and, as ``(dict, slots)`` the way
    pickle does, the slots its subclasses add; None when there are none."""
    if _own_getstate(type(v), base):
        return v.__getstate__()
    state = {k: x for k, x in v.__dict__.items() if k not in _NODE_KEYS}
    slots = {}
    for cls in type(v).__mro__:
        if cls is base:
            break
        names = cls.__dict__.get("__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{cls.__name__.lstrip('_')}{name}"
            try:
                slots[name] = getattr(v, name)
            except AttributeError:
                pass
    if slots:
        return state or None, slots
    return state or None
