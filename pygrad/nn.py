"""Neural networks: a drop-in for ``micrograd.nn``, on fused C ops.

``Neuron``, ``Layer`` and ``MLP`` take micrograd's arguments, draw their
weights with the same ``random.uniform(-1, 1)`` calls in the same order
(biases start at 0), and print the same ``repr``, so with the same
``random.seed`` a pygrad MLP starts from micrograd's exact weights.

Two keyword options go beyond micrograd:

- ``fused=True`` (default): a neuron is one C node (``pygrad.dot``), a layer
  one C call.  ``fused=False`` builds micrograd's op-by-op graph.  Both give
  the same numbers, bit for bit.
- ``engine='c'`` (default) or ``engine='reference'`` for the pure-Python
  engine, the oracle of the tests.

Parameters are the Value objects made at construction: change them through
``p.data`` (optimizers, ``load_state_dict``), not by putting new Values into
a neuron, since layers cache their parameters' handles.
"""
import random
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from . import engine as _engine
from . import functional as _functional
from . import reference as _reference
from ._core import ffi, lib
from ._numbers import to_size

__all__ = ["Module", "Neuron", "Layer", "MLP"]

_ENGINES = {"c": (_engine.Value, _functional.dot), "reference": (_reference.Value, _reference.dot)}


def _engine_of(name: str) -> Any:
    if name not in _ENGINES:
        raise ValueError(f"engine must be 'c' or 'reference', not {name!r}")
    return _ENGINES[name]


def _handles(values: Sequence[Any]) -> Any:
    return ffi.new("uint32_t[]", [v._h for v in values])


class Module:
    """Base class: ``parameters()`` and ``zero_grad()``, plus bulk numpy
    access and state dicts."""

    def parameters(self) -> List[Any]:
        return []

    def _c_params(self) -> Optional[Any]:
        """The parameters' C handles, if they are C Values."""
        params = self.parameters()
        if params and all(isinstance(p, _engine.Value) for p in params):
            return _handles(params)
        return None

    def zero_grad(self) -> None:
        """Set every parameter's grad to 0 (one C call on the C engine)."""
        params = self.parameters()
        handles = self._c_params()
        if handles is not None:
            lib.pg_fill_grad(handles, len(params), 0.0)
        else:
            for p in params:
                p.grad = 0.0

    def get_data(self) -> np.ndarray:
        """Every parameter's data, in ``parameters()`` order."""
        return self._gather(lib.pg_gather_data, "data")

    def get_grad(self) -> np.ndarray:
        """Every parameter's grad, in ``parameters()`` order."""
        return self._gather(lib.pg_gather_grad, "grad")

    def set_data(self, values: Any) -> None:
        """Set every parameter's data from a 1-d array (``get_data()`` order)."""
        params = self.parameters()
        arr = np.ascontiguousarray(values, dtype=np.float64)
        if arr.shape != (len(params),):
            raise ValueError(f"set_data needs shape ({len(params)},), got {arr.shape}")
        handles = self._c_params()
        if handles is not None:
            lib.pg_scatter_data(handles, len(params), ffi.from_buffer("double[]", arr))
        else:
            for p, x in zip(params, arr.tolist()):
                p.data = x

    def _gather(self, c_fn: Any, field: str) -> np.ndarray:
        params = self.parameters()
        out = np.empty(len(params), dtype=np.float64)
        handles = self._c_params()
        if handles is not None:
            c_fn(handles, len(params), ffi.from_buffer("double[]", out))
        else:
            out[:] = [getattr(p, field) for p in params]
        return out

    def state_dict(self) -> Dict[str, np.ndarray]:
        """``{'parameters': array}`` plus the shape of the model, for
        ``load_state_dict``; round-trips exactly."""
        return {"parameters": self.get_data(), "structure": np.array(self._structure())}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Load what ``state_dict()`` returned, for a model of the same shape."""
        if "parameters" not in state:
            raise ValueError("state dict has no 'parameters'")
        if "structure" in state and list(np.asarray(state["structure"]).tolist()) != self._structure():
            raise ValueError(f"state dict is for a model of shape {list(state['structure'])}, "
                             f"this one is {self._structure()}")
        self.set_data(state["parameters"])

    def save(self, path: str) -> None:
        """Write ``state_dict()`` to a ``.npz`` file."""
        np.savez(path, **self.state_dict())

    def load(self, path: str) -> None:
        """Read a ``.npz`` file written by ``save``."""
        with np.load(path) as f:
            self.load_state_dict({k: f[k] for k in f.files})

    def _structure(self) -> List[int]:
        return [len(self.parameters())]


class Neuron(Module):
    """``act(w·x + b)``; ReLU when ``nonlin`` (micrograd's only one)."""

    def __init__(self, nin: int, nonlin: bool = True, fused: bool = True,
                 engine: str = "c") -> None:
        nin = to_size(nin, "nin")
        Value, self._dot = _engine_of(engine)
        self.w = [Value(random.uniform(-1, 1)) for _ in range(nin)]
        self.b = Value(0)
        self.nonlin = nonlin
        self.fused = fused

    def __call__(self, x: Sequence[Any]) -> Any:
        if self.fused:
            return self._dot(self.w, x, self.b, "relu" if self.nonlin else None)
        act = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)
        return act.relu() if self.nonlin else act

    def parameters(self) -> List[Any]:
        return self.w + [self.b]

    def __repr__(self) -> str:
        return f"{'ReLU' if self.nonlin else 'Linear'}Neuron({len(self.w)})"


class Layer(Module):
    """``nout`` neurons over the same inputs; on the C engine, fused, the
    whole layer is one C call."""

    def __init__(self, nin: int, nout: int, **kwargs: Any) -> None:
        self.neurons = [Neuron(nin, **kwargs) for _ in range(to_size(nout, "nout"))]
        self._param_handles: Any = None
        self._param_values: List[Any] = []

    def __call__(self, x: Sequence[Any]) -> Any:
        n0 = self.neurons[0]
        if n0.fused and isinstance(n0.b, _engine.Value) and len(self.neurons) <= lib.PG_SEG_NODES:
            out = self._fused_c(x)
        else:
            out = [n(x) for n in self.neurons]
        return out[0] if len(out) == 1 else out

    def _fused_c(self, x: Sequence[Any]) -> List[Any]:
        if self._param_handles is None:
            # The Values are kept with their handles, so that the nodes stay
            # alive even if a neuron's list is changed behind the cache.
            self._param_values = [p for n in self.neurons for p in [n.b] + n.w]
            self._param_handles = _handles(self._param_values)
        xs = [v if isinstance(v, _engine.Value) else _engine.Value(v) for v in x]
        nin = len(self.neurons[0].w)
        if len(xs) != nin:
            raise ValueError(f"layer expects {nin} inputs, got {len(xs)}")
        act = lib.PG_ACT_RELU if self.neurons[0].nonlin else lib.PG_ACT_NONE
        return _engine._make_layer(act, self._param_handles, _handles(xs), nin, len(self.neurons),
                                  self._param_values, xs)

    def parameters(self) -> List[Any]:
        return [p for n in self.neurons for p in n.parameters()]

    def __getstate__(self) -> Any:
        # The fused cache holds C handles: a copy makes its own.
        return dict(self.__dict__, _param_handles=None, _param_values=[])

    def _structure(self) -> List[int]:
        return [len(self.neurons[0].w), len(self.neurons)]

    def __repr__(self) -> str:
        return f"Layer of [{', '.join(str(n) for n in self.neurons)}]"


class MLP(Module):
    """Layers of sizes ``[nin] + nouts``; ReLU on all but the last."""

    def __init__(self, nin: int, nouts: Sequence[int], **kwargs: Any) -> None:
        if isinstance(nouts, (str, bytes)) or not hasattr(nouts, "__iter__"):
            raise TypeError(f"MLP nouts must be a list of layer sizes, not {nouts!r}")
        sz = [to_size(nin, "nin")] + [to_size(n, "each of nouts") for n in nouts]
        if len(sz) < 2:
            raise ValueError("MLP nouts must name at least one layer")
        self.layers = [Layer(sz[i], sz[i + 1], nonlin=i != len(nouts) - 1, **kwargs)
                       for i in range(len(nouts))]
        # New graph nodes start in a fresh segment, so that these long-lived
        # parameters don't share (and pin) a segment with training graphs.
        if kwargs.get("engine", "c") == "c":
            _engine._end_segment()

    def __call__(self, x: Sequence[Any]) -> Any:
        for layer in self.layers:
            x = layer(x)
        return x

    def parameters(self) -> List[Any]:
        return [p for layer in self.layers for p in layer.parameters()]

    def _structure(self) -> List[int]:
        return [len(self.layers[0].neurons[0].w)] + [len(l.neurons) for l in self.layers]

    def __repr__(self) -> str:
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"


