"""Optimizers: each ``step()`` and ``zero_grad()`` is one C call over every
parameter (C Values), or the same update in Python (reference Values).

SGD:  g = grad + weight_decay * data;  with momentum  v = momentum * v + g,
      step with v;  data = data - lr * step.
Adam: g as above;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
      data = data - lr * (m / (1-b1**t)) / (sqrt(v / (1-b2**t)) + eps).

``lr`` is a number or a schedule: a callable of the step number (0 for the
first ``step()``) returning the learning rate.
"""
from typing import Any, Callable, Dict, Iterable, Tuple, Union

import numpy as np

from ._backend import backend_of
from ._numbers import is_value, to_setting

__all__ = ["Optimizer", "SGD", "Adam"]

LearningRate = Union[float, Callable[[int], float]]


class Optimizer:
    """Holds the parameters, their C handles and per-parameter state."""

    # The per-parameter state arrays (attribute names) the steps update.
    _STATE: Tuple[str, ...] = ()

    def __init__(self, params: Iterable[Any], lr: LearningRate) -> None:
        if hasattr(params, "parameters") and not hasattr(params, "__iter__"):
            raise TypeError(f"an optimizer takes the parameters: pass "
                            f"{type(params).__name__}.parameters(), not the "
                            f"{type(params).__name__} itself")
        # A tuple behind a read-only property: the C steps run over handles
        # made here, so the list must not grow or change afterwards.
        self._params: Tuple[Any, ...] = tuple(params)
        if not self._params:
            raise ValueError("optimizer got no parameters")
        if not callable(lr):
            lr = to_setting(lr, "lr")
        self.lr = lr
        self.steps = 0
        for p in self.params:
            if not is_value(p):
                raise TypeError(f"optimizer parameters must be Values, not {type(p).__name__}: {p!r}")
        self._backend = backend_of(self.params, what="optimizer parameters")
        self._packed = self._backend.pack(self._params)
        self._views: Dict[str, Any] = {}

    @property
    def params(self) -> Tuple[Any, ...]:
        """The parameters, fixed at construction."""
        return self._params

    def _view_state(self) -> None:
        """View the ``_STATE`` arrays as the backend's steps take them (made
        once: the steps write into these very arrays)."""
        self._views = {k: self._backend.buffer(getattr(self, k)) for k in self._STATE}

    def current_lr(self) -> float:
        """The learning rate the next ``step()`` uses."""
        return to_setting(self.lr(self.steps), "lr schedule's value") if callable(self.lr) else self.lr

    def zero_grad(self) -> None:
        """Set every parameter's grad to 0."""
        self._backend.fill_grad(self._packed, 0.0)

    def step(self) -> None:
        """Update every parameter from its grad."""
        self._step(self.current_lr())
        self.steps += 1

    def _step(self, lr: float) -> None:
        raise NotImplementedError

    def _settings(self) -> str:
        return ""

    def __repr__(self) -> str:
        lr = f"schedule {getattr(self.lr, '__name__', 'callable')}" if callable(self.lr) else self.lr
        return (f"{type(self).__name__}({len(self.params)} params, lr={lr}{self._settings()}, "
                f"steps={self.steps})")

    # Copies and pickles: the packed parameters and the state's views are
    # remade from the parameters and the numpy state.
    def __getstate__(self) -> Any:
        return {k: v for k, v in self.__dict__.items() if k not in ("_packed", "_views")}

    def __setstate__(self, state: Any) -> None:
        self.__dict__.update(state)
        self._packed = self._backend.pack(self._params)
        self._view_state()


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum and weight decay;
    with neither it is micrograd's ``p.data -= lr * p.grad``."""

    _STATE = ("velocity",)

    def __init__(self, params: Iterable[Any], lr: LearningRate = 0.01, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, lr)
        self.momentum = to_setting(momentum, "momentum")
        self.weight_decay = to_setting(weight_decay, "weight_decay")
        self.velocity = np.zeros(len(self.params), dtype=np.float64)
        self._view_state()

    def _settings(self) -> str:
        return f", momentum={self.momentum}, weight_decay={self.weight_decay}"

    def _step(self, lr: float) -> None:
        self._backend.sgd_step(self._packed, lr, self.momentum, self.weight_decay,
                               self._views["velocity"])


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015) with optional (L2) weight decay."""

    _STATE = ("m", "v")

    def __init__(self, params: Iterable[Any], lr: LearningRate = 0.001,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair of numbers, not {betas!r}")
        self.beta1, self.beta2 = (to_setting(b, "each of betas", 0.0, 1.0) for b in betas)
        self.eps = to_setting(eps, "eps")
        if self.eps == 0.0:
            raise ValueError("eps must be > 0")
        self.weight_decay = to_setting(weight_decay, "weight_decay")
        self.m = np.zeros(len(self.params), dtype=np.float64)
        self.v = np.zeros(len(self.params), dtype=np.float64)
        self._view_state()

    def _settings(self) -> str:
        return (f", betas=({self.beta1}, {self.beta2}), eps={self.eps}, "
                f"weight_decay={self.weight_decay}")

    def _step(self, lr: float) -> None:
        t = self.steps + 1
        bias1, bias2 = 1.0 - self.beta1 ** t, 1.0 - self.beta2 ** t
        self._backend.adam_step(self._packed, lr, self.beta1, self.beta2, self.eps,
                                self.weight_decay, bias1, bias2, self._views["m"], self._views["v"])
