"""Optimizers: each ``step()`` and ``zero_grad()`` is one C call over every
parameter (C Values), or the same update in Python (reference Values).

SGD:  g = grad + weight_decay * data;  with momentum  v = momentum * v + g,
      step with v;  data = data - lr * step.
Adam: g as above;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
      data = data - lr * (m / (1-b1**t)) / (sqrt(v / (1-b2**t)) + eps).

``lr`` is a number or a schedule: a callable of the step number (0 for the
first ``step()``) returning the learning rate.
"""
import functools
import warnings
from typing import Any, Callable, Dict, Iterable, Optional, Tuple, Union

import numpy as np

from ._backend import C as _C_BACKEND, REFERENCE as _REFERENCE_BACKEND, backend_of
from ._numbers import is_value, to_setting
from ._value_ops import Scalar

_INF = float("inf")

__all__ = ["Optimizer", "SGD", "Adam"]

LearningRate = Union[float, Callable[[int], float]]


class Optimizer:
    """Holds the parameters, their packed nodes and per-parameter state."""

    # The per-parameter state arrays (attribute names) the steps update.
    _STATE: Tuple[str, ...] = ()
    # The hyperparameters besides lr (_Setting attributes).
    _SETTINGS: Tuple[str, ...] = ()

    def __init__(self, params: Iterable[Scalar], lr: LearningRate) -> None:
        if hasattr(params, "parameters") and not hasattr(params, "__iter__"):
            raise TypeError(f"an optimizer takes the parameters: pass "
                            f"{type(params).__name__}.parameters(), not the "
                            f"{type(params).__name__} itself")
        # A tuple behind a read-only property: the C steps run over the nodes
        # made here, so the list must not grow or change afterwards.
        given = tuple(params)
        self._params: Tuple[Scalar, ...] = tuple({id(p): p for p in given}.values())
        if len(self._params) != len(given):
            # A tied weight listed twice would be stepped twice (and Adam
            # would keep two states for it): each is stepped once, as
            # torch.optim warns about the same.
            warnings.warn(f"{type(self).__name__} got {len(given) - len(self._params)} "
                          f"parameter(s) more than once (tied weights?): each is stepped "
                          f"once", UserWarning, stacklevel=3)
        if not self._params:
            raise ValueError("optimizer got no parameters")
        if not callable(lr):
            lr = to_setting(lr, "lr")
        self.lr = lr
        for p in self.params:
            if not is_value(p):
                raise TypeError(f"optimizer parameters must be Values, not {type(p).__name__}: {p!r}")
        self._backend = backend_of(self.params, what="optimizer parameters")
        self._packed = self._backend.pack(self._params)
        self._views: Dict[str, Any] = {}
        self._state: Dict[str, np.ndarray] = {}
        self._count_steps()

    def _count_steps(self) -> None:
        # The count (from 0) lives where the C step adds to it, in the same
        # call as the update: a Ctrl-C as the step returns can't leave it behind.
        self._steps = np.zeros(1)
        self._steps_view = self._backend.buffer(self._steps)

    def _fused_step(self, kind: str, own_step: Any, lr: float) -> Any:
        """The C description of this optimizer's step for
        ``Program.train_step`` at learning rate ``lr``, with what holds
        what it points to (the caller holds it for the call), or a
        TypeError if this optimizer can't step there.  Made anew each step,
        from the state as it is then.  The lr is read by the caller, before
        it takes the Program's lock: a schedule may run the Program."""
        cls = type(self)
        for name, own in (("_step", own_step), ("step", Optimizer.step),
                          ("zero_grad", Optimizer.zero_grad)):
            if getattr(cls, name) is not own:
                raise TypeError(f"train_step runs SGD's and Adam's own zero_grad and step in "
                                f"C; {cls.__name__} overrides {name}: call zero_grad(), "
                                f"map() and step() instead")
        f, keep = self._backend.fused_optimizer(kind, self._packed, self._steps_view)
        f.lr = lr
        return f, keep

    @property
    def steps(self) -> int:
        """How many ``step()`` calls have updated the parameters."""
        return int(self._steps[0])

    @steps.setter
    def steps(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"steps must be an int >= 0, not {n!r}")
        self._steps[0] = float(n)

    @property
    def params(self) -> Tuple[Scalar, ...]:
        """The parameters, fixed at construction."""
        return self._params

    def _check_state(self, name: str, arr: Any) -> np.ndarray:
        """``arr`` if it can be ``name``'s state array: the steps update it in
        place, in C, over exactly one float64 per parameter."""
        n, where = len(self._params), f"{type(self).__name__}.{name}"
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"{where} must be a numpy float64 array of {n} values, "
                            f"not {type(arr).__name__}")
        if arr.dtype != np.float64:
            raise TypeError(f"{where} must be a float64 array, not {arr.dtype} "
                            f"(np.asarray(x, dtype=np.float64) converts it)")
        if arr.shape != (n,):
            raise ValueError(f"{where} must have shape ({n},), one value per parameter, "
                             f"not {arr.shape}")
        if not arr.flags.c_contiguous:
            raise ValueError(f"{where} must be contiguous (np.ascontiguousarray(x) copies it)")
        if not arr.flags.writeable:
            raise ValueError(f"{where} must be writable: the steps update it in place (pass a copy)")
        return arr

    def _set_state(self, name: str, arr: Any) -> None:
        """Adopt ``arr`` as ``name``'s state: checked, then viewed as the
        backend's steps take it, so the next step uses this very array."""
        arr = self._check_state(name, arr)
        for other, held in self._state.items():
            # (a step reads and writes each state array element by element:
            # two that overlap would read each other's new numbers, and C's
            # order and the reference engine's differ)
            if other != name and np.may_share_memory(arr, held):
                raise ValueError(f"{type(self).__name__}.{name} shares memory with .{other}: "
                                 f"each state array must be its own (pass a copy)")
        view = self._backend.buffer(arr)
        self._state[name] = arr
        self._views[name] = view

    def current_lr(self) -> float:
        """The learning rate the next ``step()`` uses."""
        lr = self.lr
        if callable(lr):
            return to_setting(lr(self.steps), "lr schedule's value")
        if type(lr) is float and 0.0 <= lr < _INF:
            return lr
        return to_setting(lr, "lr")      # (assigned after construction, as a loop lowers it)

    def zero_grad(self) -> None:
        """Set every parameter's grad to 0."""
        self._backend.fill_grad(self._packed, 0.0)

    def step(self) -> None:
        """Update every parameter from its grad."""
        self._step_at(self.current_lr())

    def _step_at(self, lr: float) -> None:
        """``step()`` at learning rate ``lr`` (read by the caller: a
        schedule may call back into what holds a lock around this)."""
        before = self._steps[0]
        self._step(lr)
        if self._steps[0] == before:       # a subclass's own _step, which does not count
            self._steps[0] = before + 1.0

    def _steps_are_pygrads(self) -> bool:
        """Whether ``zero_grad()`` and ``step()`` run only pygrad's own code
        (SGD's or Adam's, not a subclass's), the lr schedule aside: a caller
        may run them under its lock, having read the lr first.  Not so for a
        subclass (its properties are code too), a method set on the
        instance, or a setting written into its ``__dict__`` past the check
        (C's call would convert it, running its ``__float__``)."""
        if type(self) not in (SGD, Adam):
            return False
        own = self.__dict__
        # (and what the step reads is pygrad's own: a rebound one is code)
        return (own.keys().isdisjoint(_STEP_METHODS)
                and all(type(own.get(name)) is float for name in self._SETTINGS)
                and own.get("_backend") in _OWN_BACKENDS and type(own.get("_views")) is dict
                and type(own.get("_steps")) is np.ndarray
                and type(own.get("_packed")) is self._backend.packed_type)

    def _step(self, lr: float) -> None:
        raise NotImplementedError

    def _settings(self) -> str:
        return ""

    def __repr__(self) -> str:
        lr = f"schedule {getattr(self.lr, '__name__', 'callable')}" if callable(self.lr) else self.lr
        return (f"{type(self).__name__}({len(self.params)} params, lr={lr}{self._settings()}, "
                f"steps={self.steps})")

    # Copies and pickles: the packed parameters, the backend and the state's
    # views are remade from the parameters and the numpy state, which is
    # checked as an assignment is (a pickle can't make C step out of bounds).
    def __getstate__(self) -> Any:
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("_packed", "_views", "_backend", "_state", "_steps", "_steps_view",
                              "_fused")}
        state["steps"] = self.steps
        state.update(self._state)
        state["_format"] = PICKLE_FORMAT
        return state

    def __setstate__(self, state: Any) -> None:
        state = _upgrade(dict(state), type(self).__name__)
        missing = [k for k in self._STATE if k not in state]
        if missing:
            raise ValueError(f"this {type(self).__name__} pickle has no {missing[0]!r} state")
        arrays = {k: state.pop(k) for k in self._STATE}
        steps = state.pop("steps", 0)
        self.__dict__.update(state)
        for name in self._SETTINGS:         # (checked as an assignment is)
            if name in state:
                setattr(self, name, state[name])
        self._backend = backend_of(self._params, what="optimizer parameters")
        self._packed = self._backend.pack(self._params)
        self._views, self._state = {}, {}
        for name, arr in arrays.items():
            if any(isinstance(arr, np.ndarray) and np.may_share_memory(arr, held)
                   for held in self._state.values()):
                arr = arr.copy()     # (an older main's pickle of one array for two)
            self._set_state(name, arr)
        self._count_steps()
        self.steps = steps


def fused_fill(opt: Any) -> Optional[Callable[[float], Any]]:
    """``opt``'s C description of its step for ``Program.train_step``, by
    SGD's or Adam's own ``_fill_fused`` (a subclass's too), never one an
    instance or a subclass defines: what it makes goes to C.  None for any
    other optimizer."""
    if isinstance(opt, SGD):
        return functools.partial(SGD._fill_fused, opt)
    if isinstance(opt, Adam):
        return functools.partial(Adam._fill_fused, opt)
    return None


_OWN_BACKENDS = (_C_BACKEND, _REFERENCE_BACKEND)
# What a step under a caller's lock calls on the optimizer.
_STEP_METHODS = frozenset(("zero_grad", "step", "_step", "_step_at", "current_lr", "steps"))


class _Setting:
    """A hyperparameter of an optimizer (``momentum``, ``beta1``, ``eps``,
    ``weight_decay``, ...): a float, converted when it is set.  So a step,
    which may run under a Program's lock, runs no code of yours to read it
    (an object's ``__float__`` runs at the assignment instead)."""

    def __init__(self, below: Optional[float] = None, positive: bool = False) -> None:
        self.below, self.positive = below, positive

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, opt: Optional["Optimizer"], owner: type) -> Any:
        if opt is None:
            return self
        try:
            return opt.__dict__[self.name]
        except KeyError:        # (an optimizer whose __init__ never ran)
            raise AttributeError(f"{type(opt).__name__} has no {self.name} yet") from None

    def __set__(self, opt: "Optimizer", value: Any) -> None:
        x = to_setting(value, self.name, 0.0, self.below)
        if self.positive and x == 0.0:
            raise ValueError(f"{self.name} must be > 0")
        opt.__dict__[self.name] = x


class _State:
    """A per-parameter state array of an optimizer (``SGD.velocity``,
    ``Adam.m``, ``Adam.v``): assigning one checks it and makes the next
    ``step()`` use it."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, opt: Optional[Optimizer], owner: type) -> Any:
        if opt is None:
            return self
        return opt._state[self.name]

    def __set__(self, opt: Optimizer, arr: Any) -> None:
        opt._set_state(self.name, arr)


# The pickled form of an optimizer: 1, the first (state views named
# "_X_c"); 2, with its backend pickled; 3, this one (format-tagged, the
# backend found again from the parameters).
PICKLE_FORMAT = 3


def _upgrade(state: Dict[str, Any], what: str) -> Dict[str, Any]:
    """A pickled optimizer's state in this format, from the formats before."""
    found = state.pop("_format", None)
    if found is None:
        found = 1 if isinstance(state.get("_views"), list) else 2
    if found > PICKLE_FORMAT or found < 1:
        from ._version import __version__
        raise ValueError(f"this {what} was pickled in format {found}, which pygrad "
                         f"{__version__} (format {PICKLE_FORMAT}) can't read: load it with "
                         f"the pygrad that wrote it")
    for key in ("_views", "_handles", "_backend", "_packed"):
        state.pop(key, None)
    return {k: v for k, v in state.items() if not (k.startswith("_") and k.endswith("_c"))}


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum and weight decay;
    with neither it is micrograd's ``p.data -= lr * p.grad``."""

    _STATE = ("velocity",)
    velocity = _State()
    _SETTINGS = ("momentum", "weight_decay")
    momentum = _Setting()
    weight_decay = _Setting()

    def __init__(self, params: Iterable[Scalar], lr: LearningRate = 0.01, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, lr)
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.velocity = np.zeros(len(self.params), dtype=np.float64)

    def _settings(self) -> str:
        return f", momentum={self.momentum}, weight_decay={self.weight_decay}"

    def _fill_fused(self, lr: float) -> Any:
        f, keep = self._fused_step("sgd", SGD._step, lr)
        f.momentum, f.weight_decay = self.momentum, self.weight_decay
        velocity = self._views["velocity"]
        f.s1, f.ns1 = velocity, len(velocity)
        return f, (keep, velocity)

    def _step(self, lr: float) -> None:
        self._backend.sgd_step(self._packed, lr, self.momentum, self.weight_decay,
                               self._views["velocity"], self._steps_view)


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015) with optional (L2) weight decay."""

    _STATE = ("m", "v")
    m = _State()
    v = _State()
    _SETTINGS = ("beta1", "beta2", "eps", "weight_decay")
    beta1 = _Setting(below=1.0)
    beta2 = _Setting(below=1.0)
    eps = _Setting(positive=True)
    weight_decay = _Setting()

    def __init__(self, params: Iterable[Scalar], lr: LearningRate = 0.001,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair of numbers, not {betas!r}")
        self.beta1, self.beta2 = (to_setting(b, "each of betas", 0.0, 1.0) for b in betas)
        self.eps = eps
        self.weight_decay = weight_decay
        self.m = np.zeros(len(self.params), dtype=np.float64)
        self.v = np.zeros(len(self.params), dtype=np.float64)

    def _settings(self) -> str:
        return (f", betas=({self.beta1}, {self.beta2}), eps={self.eps}, "
                f"weight_decay={self.weight_decay}")

    def _fill_fused(self, lr: float) -> Any:
        f, keep = self._fused_step("adam", Adam._step, lr)
        t = self.steps + 1
        f.beta1, f.beta2, f.eps, f.weight_decay = self.beta1, self.beta2, self.eps, self.weight_decay
        f.bias1, f.bias2 = 1.0 - self.beta1 ** t, 1.0 - self.beta2 ** t
        m, v = self._views["m"], self._views["v"]
        f.s1, f.ns1 = m, len(m)
        f.s2, f.ns2 = v, len(v)
        return f, (keep, m, v)

    def _step(self, lr: float) -> None:
        t = self.steps + 1
        bias1, bias2 = 1.0 - self.beta1 ** t, 1.0 - self.beta2 ** t
        self._backend.adam_step(self._packed, lr, self.beta1, self.beta2, self.eps,
                                self.weight_decay, bias1, bias2, self._views["m"], self._views["v"],
                                self._steps_view)
