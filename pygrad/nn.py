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

A model is plain Python objects to edit as in micrograd: put new Values
into ``neuron.w``, change ``nonlin``, add or replace neurons and layers,
subclass them.  The fused passes cache what they hand to C; any such edit
(an attribute set on a model object, a change to its ``w``, ``neurons`` or
``layers`` list) makes the caches be rebuilt on the next call.  A layer
whose neurons differ (in size, ``nonlin``, ``fused``, engine, or a
``__call__`` of their own) runs neuron by neuron, and an MLP with such a
layer, or a layer with a ``__call__`` of its own, layer by layer.
"""
import random
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._backend import Backend, backend_named, backend_of
from ._numbers import to_size

__all__ = ["Module", "Neuron", "Layer", "MLP"]

# Bumped by every edit of a model's structure: the fused caches hold the
# value they were built at and are rebuilt when it has moved.
_edits = 0


def _edited() -> None:
    global _edits
    _edits += 1


class _Tracked(list):
    """A model's own list (``w``, ``neurons``, ``layers``): a list that
    reports in-place changes, so the fused caches see them."""

    __slots__ = ()

    def __setitem__(self, i: Any, v: Any) -> None:
        super().__setitem__(i, v)
        _edited()

    def __delitem__(self, i: Any) -> None:
        super().__delitem__(i)
        _edited()

    def __iadd__(self, other: Any) -> "_Tracked":  # type: ignore[misc]
        super().__iadd__(other)
        _edited()
        return self

    def __imul__(self, n: Any) -> "_Tracked":  # type: ignore[misc]
        super().__imul__(n)
        _edited()
        return self

    def append(self, v: Any) -> None:
        super().append(v)
        _edited()

    def extend(self, vs: Any) -> None:
        super().extend(vs)
        _edited()

    def insert(self, i: Any, v: Any) -> None:
        super().insert(i, v)
        _edited()

    def pop(self, i: Any = -1) -> Any:
        v = super().pop(i)
        _edited()
        return v

    def remove(self, v: Any) -> None:
        super().remove(v)
        _edited()

    def clear(self) -> None:
        super().clear()
        _edited()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        super().sort(*args, **kwargs)
        _edited()

    def reverse(self) -> None:
        super().reverse()
        _edited()

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickled as a plain list: the model's __setstate__ tracks it again.
        return list, (list(self),)


def _tracked(v: Any) -> Any:
    """A model's list, tracked (other values as they are)."""
    return _Tracked(v) if type(v) is list else v


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

    # The attributes a model's fused caches keep: setting them is no edit.
    _caches: Tuple[str, ...] = ()
    _lists: Tuple[str, ...] = ()

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._caches:
            if name in self._lists:
                value = _tracked(value)
            _edited()
        object.__setattr__(self, name, value)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        # Copies, deep copies and pickles (also those of older versions)
        # get tracked lists and empty caches.
        for name, value in state.items():
            setattr(self, name, value)


class Neuron(Module):
    """``act(w·x + b)``; ReLU when ``nonlin`` (micrograd's only one)."""

    _lists = ("w",)

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

    _lists = ("neurons",)
    _caches = ("_fused",)
    # (_edits when built, the fused_layer arguments or None): see _fused_args.
    _fused: Any = None

    def __init__(self, nin: int, nout: int, *, nonlin: bool = True, fused: bool = True,
                 engine: str = "c") -> None:
        """``nout`` ``Neuron(nin, nonlin, fused=fused, engine=engine)``."""
        self.neurons = [Neuron(nin, nonlin, fused=fused, engine=engine)
                        for _ in range(to_size(nout, "nout"))]

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
        cache = self._fused
        if cache is None or cache[0] != _edits:
            edits = _edits          # before reading the model: an edit meanwhile rebuilds
            cache = self._fused = (edits, self._pack_fused())
        return cache[1]

    def _pack_fused(self) -> Optional[tuple]:
        neurons = self.neurons
        if not neurons or type(neurons) is not _Tracked:
            return None
        n0 = neurons[0]
        backend = getattr(n0, "_backend", None)
        if backend is None or not backend.fuses_layers(len(neurons)):
            return None
        nin, nonlin = len(n0.w), bool(n0.nonlin)
        for n in neurons:
            # One C call makes nout alike neurons of nin weights each: anything
            # else (or a list we'd not see change) runs neuron by neuron.
            if (type(n).__call__ is not Neuron.__call__ or n._backend is not backend
                    or not n.fused or bool(n.nonlin) != nonlin or len(n.w) != nin
                    or type(n.w) is not _Tracked):
                return None
        # The Values are kept with their packed form, so that the nodes stay
        # alive even if a neuron's list changes.
        params = [p for n in neurons for p in [n.b] + n.w]
        if not backend.holds(params):
            return None
        return (backend.pack(params), params, nin, len(neurons), nonlin)

    def parameters(self) -> List[Any]:
        return [p for n in self.neurons for p in n.parameters()]

    def __getstate__(self) -> Any:
        # The fused cache holds C handles: a copy makes its own.
        state = dict(self.__dict__)
        state.pop("_fused", None)
        return state

    def _structure(self) -> List[int]:
        return [len(self.neurons[0].w), len(self.neurons)]

    def __repr__(self) -> str:
        return f"Layer of [{', '.join(str(n) for n in self.neurons)}]"


class MLP(Module):
    """Layers of sizes ``[nin] + nouts``; ReLU on all but the last."""

    _lists = ("layers",)
    _caches = ("_fused",)
    # (_edits when built, packed, backend) of the fused pass: see __call__.
    # A class default, so that models pickled before it existed load and run.
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
        if cache is None or cache[0] != _edits:
            edits = _edits          # before reading the model: an edit meanwhile rebuilds
            cache = self._fused = (edits,) + self._pack_fused()
        if cache[1] is not None:
            # One pass in C: the hidden layers' outputs never become Values.
            out = cache[2].fused_layers(cache[1], x)
            return out[0] if len(out) == 1 else out
        for layer in self.layers:
            x = layer(x)
        return x

    def _pack_fused(self) -> Tuple[Any, Any]:
        """(the backend's packed layers, the backend), or (None, None) if a
        layer isn't fused, has a ``__call__`` of its own, or the layers are
        on different engines."""
        layers = self.layers
        if not layers or type(layers) is not _Tracked:
            return None, None
        fused = []
        backend: Optional[Backend] = None
        for layer in layers:
            if type(layer).__call__ is not Layer.__call__ or not isinstance(layer, Layer):
                return None, None
            args = layer._fused_args()
            if args is None:
                return None, None
            lb = layer.neurons[0]._backend
            if backend is not None and lb is not backend:
                return None, None
            backend = lb
            fused.append(args)
        assert backend is not None      # layers is not empty
        return backend.pack_layers(fused), backend

    def __getstate__(self) -> Any:
        # The fused cache holds C arrays: a copy makes its own.
        state = dict(self.__dict__)
        state.pop("_fused", None)
        return state

    def parameters(self) -> List[Any]:
        return [p for layer in self.layers for p in layer.parameters()]

    def _structure(self) -> List[int]:
        return [len(self.layers[0].neurons[0].w)] + [len(l.neurons) for l in self.layers]

    def __repr__(self) -> str:
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"
