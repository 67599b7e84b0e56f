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
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._backend import Backend, backend_named, backend_of
from ._numbers import to_size

__all__ = ["Module", "Neuron", "Layer", "MLP"]


class Module:
    """Base class: ``parameters()`` and ``zero_grad()``, plus bulk numpy
    access and state dicts."""

    def parameters(self) -> List[Any]:
        return []

    def _bulk(self) -> Tuple[Backend, Any]:
        """The parameters' backend and their packed list, for its bulk
        operations (one C call each on the C engine)."""
        params = self.parameters()
        backend = backend_of(params, allow_mixed=True)
        return backend, backend.pack(params)

    def zero_grad(self) -> None:
        """Set every parameter's grad to 0 (one C call on the C engine)."""
        backend, packed = self._bulk()
        backend.fill_grad(packed, 0.0)

    def get_data(self) -> np.ndarray:
        """Every parameter's data, in ``parameters()`` order."""
        backend, packed = self._bulk()
        return backend.gather_data(packed)

    def get_grad(self) -> np.ndarray:
        """Every parameter's grad, in ``parameters()`` order."""
        backend, packed = self._bulk()
        return backend.gather_grad(packed)

    def set_data(self, values: Any) -> None:
        """Set every parameter's data from a 1-d array (``get_data()`` order)."""
        backend, packed = self._bulk()
        arr = np.ascontiguousarray(values, dtype=np.float64)
        if arr.shape != (len(packed),):
            raise ValueError(f"set_data needs shape ({len(packed)},), got {arr.shape}")
        backend.scatter_data(packed, arr)

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
        arrays: Dict[str, Any] = self.state_dict()
        np.savez(path, **arrays)

    def load(self, path: str) -> None:
        """Read a ``.npz`` file written by ``save``."""
        with np.load(path) as f:
            self.load_state_dict({k: f[k] for k in f.files})

    def _structure(self) -> List[int]:
        return [len(self.parameters())]


class Neuron(Module):
    """``act(w·x + b)``; ReLU when ``nonlin`` (micrograd's only one)."""

    def __init__(self, nin: int, nonlin: bool = True, *, fused: bool = True,
                 engine: str = "c") -> None:
        """``nin`` weights drawn with ``random.uniform(-1, 1)``, bias 0.

        ``nonlin``: ReLU (micrograd's); ``fused``: one fused node per call
        rather than micrograd's op-by-op graph; ``engine``: ``'c'`` or
        ``'reference'`` (ValueError otherwise)."""
        nin = to_size(nin, "nin")
        self._backend = backend_named(engine)
        Value = self._backend.Value
        self.w = [Value(random.uniform(-1, 1)) for _ in range(nin)]
        self.b = Value(0)
        self.nonlin = nonlin
        self.fused = fused

    def __call__(self, x: Sequence[Any]) -> Any:
        if self.fused:
            return self._backend.dot(self.w, x, self.b, "relu" if self.nonlin else None)
        act = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)
        return act.relu() if self.nonlin else act

    def parameters(self) -> List[Any]:
        return self.w + [self.b]

    def __repr__(self) -> str:
        return f"{'ReLU' if self.nonlin else 'Linear'}Neuron({len(self.w)})"


class Layer(Module):
    """``nout`` neurons over the same inputs; on the C engine, fused, the
    whole layer is one C call."""

    def __init__(self, nin: int, nout: int, *, nonlin: bool = True, fused: bool = True,
                 engine: str = "c") -> None:
        """``nout`` ``Neuron(nin, nonlin, fused=fused, engine=engine)``."""
        self.neurons = [Neuron(nin, nonlin, fused=fused, engine=engine)
                        for _ in range(to_size(nout, "nout"))]
        self._param_handles: Any = None
        self._param_values: List[Any] = []

    def __call__(self, x: Sequence[Any]) -> Any:
        fused = self._fused_args()
        if fused is not None:
            packed, params, nin, nout, nonlin = fused
            out = self.neurons[0]._backend.fused_layer(packed, params, x, nin, nout, nonlin)
        else:
            out = [n(x) for n in self.neurons]
        return out[0] if len(out) == 1 else out

    def _fused_args(self) -> Optional[tuple]:
        """``(packed_params, params, nin, nout, nonlin)`` for the backend's
        fused_layer, or None if this layer runs neuron by neuron."""
        n0 = self.neurons[0]
        backend = n0._backend
        if not (n0.fused and backend.fuses_layers(len(self.neurons))):
            return None
        if self._param_handles is None:
            # The Values are kept with their packed form, so that the nodes
            # stay alive even if a neuron's list is changed behind the cache.
            self._param_values = [p for n in self.neurons for p in [n.b] + n.w]
            self._param_handles = backend.pack(self._param_values)
        return (self._param_handles, self._param_values, len(n0.w), len(self.neurons),
                n0.nonlin)

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

    # (layers, packed, backend) of the fused pass: see __call__.  A class
    # default, so that models pickled before it existed load and run.
    _fused: Any = None

    def __init__(self, nin: int, nouts: Sequence[int], *, fused: bool = True,
                 engine: str = "c") -> None:
        """``Layer``s of sizes ``[nin] + list(nouts)``, each with ``fused``
        and ``engine``; ``nonlin`` on every layer but the last."""
        if isinstance(nouts, (str, bytes)) or not hasattr(nouts, "__iter__"):
            raise TypeError(f"MLP nouts must be a list of layer sizes, not {nouts!r}")
        sz = [to_size(nin, "nin")] + [to_size(n, "each of nouts") for n in nouts]
        if len(sz) < 2:
            raise ValueError("MLP nouts must name at least one layer")
        self.layers = [Layer(sz[i], sz[i + 1], nonlin=i != len(nouts) - 1, fused=fused,
                             engine=engine)
                       for i in range(len(nouts))]
        backend_named(engine).parameters_made()

    def __call__(self, x: Sequence[Any]) -> Any:
        cache = self._fused
        if cache is None or cache[0] != self.layers:
            cache = self._fused = (list(self.layers),) + self._pack_fused()
        if cache[1] is not None:
            # One pass in C: the hidden layers' outputs never become Values.
            out = cache[2].fused_layers(cache[1], x)
            return out[0] if len(out) == 1 else out
        for layer in self.layers:
            x = layer(x)
        return x

    def _pack_fused(self) -> Tuple[Any, Any]:
        """(the backend's packed layers, the backend), or (None, None) if a
        layer isn't fused or the layers are on different engines."""
        backend = self.layers[0].neurons[0]._backend
        fused = []
        for layer in self.layers:
            args = layer._fused_args()
            if args is None or layer.neurons[0]._backend is not backend:
                return None, None
            fused.append(args)
        return backend.pack_layers(fused), backend

    def __getstate__(self) -> Any:
        # The fused cache holds C arrays: a copy makes its own.
        return dict(self.__dict__, _fused=None)

    def parameters(self) -> List[Any]:
        return [p for layer in self.layers for p in layer.parameters()]

    def _structure(self) -> List[int]:
        return [len(self.layers[0].neurons[0].w)] + [len(l.neurons) for l in self.layers]

    def __repr__(self) -> str:
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"
