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
into ``neuron.w``, assign it a list of your own, change ``nonlin``, add or
replace neurons and layers, subclass them.  The fused passes cache what they
hand to C and see every such edit made through the model's attributes and
lists (an attribute set with ``object.__setattr__`` or in ``vars(model)``
bypasses that).  A layer whose neurons differ (in size, ``nonlin``,
``fused``, engine, or a ``__call__`` of their own) runs neuron by neuron,
and an MLP with such a layer, or a layer with a ``__call__`` of its own,
layer by layer.
"""
import itertools
import operator
import random
from typing import (Any, Dict, FrozenSet, Generic, List, NamedTuple, Optional, Sequence, Tuple,
                    TypeVar, Union)

import numpy as np

from ._backend import Backend, backend_named, backend_of
from ._numbers import real_array, to_size
from ._value_ops import Output, Scalar

# What a model takes: Values or numbers, or another model's output.
Inputs = Union[Sequence[Union[Scalar, float]], Output]
# A module's parameters' type: Scalar for pygrad's own; a subclass of a
# bare Module may say its own (List[pygrad.Value]).
P = TypeVar("P", bound=Scalar)

__all__ = ["Module", "Neuron", "Layer", "MLP", "Scalar", "Output"]

# The number of the latest edit of a model's shape.  A fused cache records
# the number it was built at and is rebuilt once it has moved.  Numbers come
# from a counter (next() is atomic), so edits in several threads never
# repeat one and a cache never mistakes a later edit for its own.
# (Kept by importlib.reload, which runs this again in the same namespace: a
# counter from 1 again would give a cache built before a number it had.)
_edit_numbers = globals().get("_edit_numbers") or itertools.count(1)
_edits = globals().get("_edits", 0)


def _edited() -> None:
    global _edits
    _edits = next(_edit_numbers)


def _tracked_method(name: str) -> Any:
    method = getattr(list, name)

    def edit(self: "_Tracked", *args: Any, **kwargs: Any) -> Any:
        # Recorded before the change too: a Ctrl-C landing after the change
        # but before the finally's record still leaves every cache stale.
        _edited()
        try:
            return method(self, *args, **kwargs)
        finally:        # also after a partial change (extend from a failing generator)
            _edited()
    edit.__name__ = edit.__qualname__ = name
    return edit


class _Tracked(list):
    """The lists a model makes (``w``, ``neurons``, ``layers``): lists that
    report in-place changes, so the fused caches see them.  Copies and
    pickles stay tracked, and a list shared by two neurons stays shared."""

    __slots__ = ()


# (__init__ too: `ws.__init__(items)` refills a list in place)
for _name in ("__init__", "__setitem__", "__delitem__", "__iadd__", "__imul__", "append",
              "extend", "insert", "pop", "remove", "clear", "sort", "reverse"):
    setattr(_Tracked, _name, _tracked_method(_name))
del _name


def _moved(watched: Sequence[Tuple[list, tuple]]) -> bool:
    """Whether a list of the user's own (which reports no changes) no longer
    holds what a cache was built from."""
    for lst, held in watched:
        if len(lst) != len(held) or not all(map(operator.is_, lst, held)):
            return True
    return False


class _FusedCache(NamedTuple):
    """What a Layer or MLP fuses, as read from the model at edit number
    ``edits``: the backend's arguments (None: the model runs part by part),
    the backend, and the lists of the user's own it was read from."""

    edits: int
    args: Any
    backend: Any
    watched: List[Tuple[list, tuple]]


def _stale(cache: Optional[_FusedCache]) -> bool:
    """Whether a fused cache must be rebuilt: never built, built before the
    latest edit, or a list of the user's own has changed since."""
    return (cache is None or cache.edits != _edits
            or bool(cache.watched and _moved(cache.watched)))


def _fused_cache(model: Any) -> _FusedCache:
    """``model._fused``, rebuilt by ``model._pack_fused`` if stale."""
    cache = model._fused
    if _stale(cache):
        edits = _edits          # before reading the model: an edit meanwhile rebuilds
        watched: List[Tuple[list, tuple]] = []
        args, backend = model._pack_fused(watched)
        cache = model._fused = _FusedCache(edits, args, backend, watched)
    return cache


def _watch(lst: Any, items: Sequence[Any], watched: List[Tuple[list, tuple]]) -> None:
    """Note ``lst`` (holding ``items``) for ``_moved`` unless it reports its
    own changes."""
    if type(lst) is not _Tracked:
        watched.append((lst, tuple(items)))


def _first_seen(params: List[P]) -> List[P]:
    """``params`` with each object once, in first-seen order: tied weights
    (one Value in two places) are one parameter.  The common case, nothing
    repeated, costs one C-level pass."""
    try:
        # A repeated object is always found (a set compares identity first);
        # a Value type with an equality of its own may only send more lists
        # down the exact path below.
        if len(set(params)) == len(params):
            return params
    except TypeError:           # a Value type made unhashable by its own __eq__
        pass
    return list({id(p): p for p in params}.values())


def _parameters_of(part: Any) -> List[Scalar]:
    """A part's parameters with repeats (deduplicated once, at the top): a
    part of the user's own may define only ``parameters()``."""
    every = getattr(part, "_all_parameters", None)
    return every() if every is not None and type(part).parameters is Module.parameters \
        else part.parameters()


class Module(Generic[P]):
    """Base class: ``parameters()`` and ``zero_grad()``, plus bulk numpy
    access and state dicts."""

    # (the parameters list as read, their backend, packed), for _bulk.
    _pg_bulk: Optional[Tuple[tuple, Backend, Any]] = None

    def parameters(self) -> List[P]:
        """Every parameter once, in first-seen order (micrograd's order when
        no weight is tied)."""
        return _first_seen(self._all_parameters())

    def _all_parameters(self) -> List[P]:
        """The parameters in micrograd's order, a tied one at each place."""
        return []

    def _bulk(self) -> Tuple[Backend, Any]:
        """The parameters' backend and their packed list, for its bulk
        operations (one C call each on the C engine).  Kept while
        ``parameters()`` returns the same objects: comparing the lists is
        a C loop over identities, packing them is not."""
        # pygrad's own parameters() is compared before its deduplication
        # (the same list then gives the same parameters): a set less a call.
        own = type(self).parameters is Module.parameters
        listed = self._all_parameters() if own else self.parameters()
        cached = self._pg_bulk
        # Compared by identity: a parameter whose class makes == an op of
        # its own (a node, or always True) must not pass for the one it
        # replaced.
        if cached is not None and not _moved(((listed, cached[0]),)):
            return cached[1], cached[2]
        params = _first_seen(listed) if own else listed
        backend = backend_of(params, allow_mixed=True)
        packed = backend.pack(params)
        try:
            # On the model, not in a weak dictionary beside it: a dictionary's
            # callback, run as the model is freed, was where a Ctrl-C got lost
            # ("Exception ignored").  Copies and pickles leave it out.
            object.__setattr__(self, "_pg_bulk", (tuple(listed), backend, packed))
        except AttributeError:      # a Module of the user's own without a __dict__
            pass
        return backend, packed

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
        self._set_data(values, "set_data")

    def _set_data(self, values: Any, what: str) -> None:
        backend, packed = self._bulk()
        arr = real_array(values, f"{what}'s values")
        if arr.shape != (len(packed),):
            raise ValueError(f"{what} needs shape ({len(packed)},), got {arr.shape}")
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
            raise ValueError(f"state dict is for a model of shape {np.asarray(state['structure']).tolist()}, "
                             f"this one is {self._structure()}")
        if "structure" in state:
            self._check_ties(state["parameters"])
        self._set_data(state["parameters"], "load_state_dict")

    def _check_ties(self, saved: Any) -> None:
        """With the shapes equal, a different parameter count means weights
        tied in one model and not in the other (a tied weight is one
        parameter in two places): a ValueError that says so, rather than
        a bare count."""
        got = np.shape(saved)
        n = len(self.parameters())
        if len(got) != 1 or got[0] == n:
            return                  # the usual checks in _set_data
        places = len(self._all_parameters()) if type(self).parameters is Module.parameters else n
        counts = (f"load_state_dict: the state dict holds {got[0]} parameters and this model "
                  f"{n}, with the same shape {self._structure()}")
        if got[0] < n:
            none = "; this one has none" if places == n else ""
            raise ValueError(f"{counts}: the model saved had {n - got[0]} more tied weight(s) "
                             f"than this one (a tied weight, one Value in several places, is "
                             f"saved once){none}. Tie the same weights in this model before "
                             f"loading (e.g. layer.neurons[1].w = layer.neurons[0].w)")
        fresh = ", e.g. a fresh one of this shape" if got[0] == places else ""
        raise ValueError(f"{counts}: this model has {got[0] - n} more tied weight(s) than the "
                         f"model saved (a tied weight, one Value in several places, is one "
                         f"parameter). Load into a model tied as the saved one was{fresh}")

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

    # The attributes that shape a model's fused pass: setting one is an edit.
    # (Others, such as a counter of your own, cost nothing.)
    _pg_shape: FrozenSet[str] = frozenset({"__class__"})

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self)._pg_shape:
            _edited()           # before, as well as after: see _tracked_method
            object.__setattr__(self, name, value)
            _edited()
        else:
            object.__setattr__(self, name, value)

    # Copies and pickles: a fused cache holds packed nodes, and its edit number
    # belongs to this process, so it is never carried; a copy makes its own.
    def __getstate__(self) -> Any:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_fused", "_pg_bulk")}
        state["_format"] = PICKLE_FORMAT
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        found = state.get("_format", 1 if "_backend" not in state and "w" in state else 2)
        if not 1 <= found <= PICKLE_FORMAT:
            from ._version import __version__
            raise ValueError(f"this {type(self).__name__} was pickled in format {found}, which "
                             f"pygrad {__version__} (format {PICKLE_FORMAT}) can't read: load "
                             f"it with the pygrad that wrote it")
        for name, value in state.items():
            if name not in _NOT_RESTORED:
                object.__setattr__(self, name, value)
        if "w" in state and "_backend" not in state:        # a format 1 neuron
            object.__setattr__(self, "_backend", backend_of([state["b"]], what="a neuron's bias"))


# The pickled form of a model: 1, neurons without their backend (an engine's
# dot function instead) and layers with packed parameters; 2, with the
# backend; 3, this one (format-tagged).
PICKLE_FORMAT = 3

# What a pickle of any format may hold but a model rebuilds for itself.
_NOT_RESTORED = frozenset({"_format", "_fused", "_pg_bulk", "_dot", "_param_values",
                           "_param_handles"})


class Neuron(Module[Scalar]):
    """``act(w·x + b)``; ReLU when ``nonlin`` (micrograd's only one)."""

    _pg_shape = frozenset({"__class__", "w", "b", "nonlin", "fused", "_backend"})

    def __init__(self, nin: int, nonlin: bool = True, *, fused: bool = True,
                 engine: str = "c") -> None:
        """``nin`` weights drawn with ``random.uniform(-1, 1)``, bias 0.

        ``nonlin``: ReLU (micrograd's); ``fused``: one fused node per call
        rather than micrograd's op-by-op graph; ``engine``: ``'c'`` or
        ``'reference'`` (ValueError otherwise)."""
        nin = to_size(nin, "nin")
        self._backend = backend_named(engine)
        # One allocation for the weights and the bias (the C engine's
        # leaves): a step over a model's parameters reads them side by side.
        params = self._backend.leaves([random.uniform(-1, 1) for _ in range(nin)] + [0.0])
        self.w = _Tracked(params[:nin])
        self.b = params[nin]
        self.nonlin = nonlin
        self.fused = fused

    def __call__(self, x: Inputs) -> Scalar:
        """``act(w·x + b)`` of ``nin`` Values or numbers."""
        if self.fused:
            return self._backend.dot(self.w, x, self.b, "relu" if self.nonlin else None)
        act = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)
        return act.relu() if self.nonlin else act

    def _all_parameters(self) -> List[Scalar]:
        return self.w + [self.b]

    def __repr__(self) -> str:
        return f"{'ReLU' if self.nonlin else 'Linear'}Neuron({len(self.w)})"


class Layer(Module[Scalar]):
    """``nout`` neurons over the same inputs; on the C engine, fused, the
    whole layer is one C call."""

    _pg_shape = frozenset({"__class__", "neurons"})
    _fused: "Optional[_FusedCache]" = None

    def __init__(self, nin: int, nout: int, *, nonlin: bool = True, fused: bool = True,
                 engine: str = "c") -> None:
        """``nout`` ``Neuron(nin, nonlin, fused=fused, engine=engine)``."""
        self.neurons = _Tracked([Neuron(nin, nonlin, fused=fused, engine=engine)
                                 for _ in range(to_size(nout, "nout"))])

    def __call__(self, x: Inputs) -> Output:
        """Each neuron's output: a Value for one neuron, else their list."""
        cache = _fused_cache(self)
        out: Any
        if cache.args is not None:
            packed, params, nin, nout, nonlin = cache.args
            out = cache.backend.fused_layer(packed, params, x, nin, nout, nonlin)
        else:
            out = [n(x) for n in self.neurons]
        return out[0] if len(out) == 1 else out

    def _pack_fused(self, watched: List[Tuple[list, tuple]]) -> Tuple[Optional[tuple], Any]:
        """The backend's fused_layer arguments ``(packed_params, params, nin,
        nout, nonlin)`` without ``x`` (None if this layer runs neuron by
        neuron), and the backend; lists of the user's own that they were
        read from go to ``watched``."""
        # Each list is read once, into a tuple: another thread changing the
        # model meanwhile can't make the weights disagree with nin and nout.
        neurons = tuple(self.neurons)
        _watch(self.neurons, neurons, watched)
        if not neurons:
            return None, None
        n0 = neurons[0]
        backend = getattr(n0, "_backend", None)
        if backend is None or not backend.fuses_layers(len(neurons)):
            return None, None
        nin, nonlin = len(n0.w), bool(n0.nonlin)
        params: List[Any] = []
        for n in neurons:
            # One C call makes nout alike neurons of nin weights each:
            # anything else runs neuron by neuron.
            w = tuple(n.w)
            if (type(n).__call__ is not Neuron.__call__ or n._backend is not backend
                    or not n.fused or bool(n.nonlin) != nonlin or len(w) != nin):
                return None, None
            _watch(n.w, w, watched)
            params.append(n.b)
            params.extend(w)
        if not backend.holds(params):
            return None, None
        # The Values are kept with their packed form, so that the nodes stay
        # alive even if a neuron's list changes.
        return (backend.pack(params), params, nin, len(neurons), nonlin), backend

    def _all_parameters(self) -> List[Scalar]:
        out: List[Scalar] = []
        for n in self.neurons:
            if type(n) is Neuron:       # the usual part, without a call per neuron
                out += n.w
                out.append(n.b)
            else:
                out += _parameters_of(n)
        return out

    def _structure(self) -> List[int]:
        return [len(self.neurons[0].w), len(self.neurons)]

    def __repr__(self) -> str:
        return f"Layer of [{', '.join(str(n) for n in self.neurons)}]"


class MLP(Module[Scalar]):
    """Layers of sizes ``[nin] + nouts``; ReLU on all but the last."""

    _pg_shape = frozenset({"__class__", "layers"})
    # A class default, so that models pickled before it existed load and run.
    _fused: "Optional[_FusedCache]" = None

    def __init__(self, nin: int, nouts: Sequence[int], *, fused: bool = True,
                 engine: str = "c") -> None:
        """``Layer``s of sizes ``[nin] + list(nouts)``, each with ``fused``
        and ``engine``; ``nonlin`` on every layer but the last."""
        if isinstance(nouts, (str, bytes)) or not hasattr(nouts, "__iter__"):
            raise TypeError(f"MLP nouts must be a list of layer sizes, not {nouts!r}")
        sz = [to_size(nin, "nin")] + [to_size(n, "each of nouts") for n in nouts]
        if len(sz) < 2:
            raise ValueError("MLP nouts must name at least one layer")
        self.layers = _Tracked([Layer(sz[i], sz[i + 1], nonlin=i != len(nouts) - 1,
                                      fused=fused, engine=engine)
                                for i in range(len(nouts))])

    def __call__(self, x: Inputs) -> Output:
        """The last layer's output: a Value for one neuron, else their list."""
        cache = _fused_cache(self)
        out: Any
        if cache.args is not None:
            # One pass in C: the hidden layers' outputs never become Values.
            out = cache.backend.fused_layers(cache.args, x)
            return out[0] if len(out) == 1 else out
        out = x
        for layer in self.layers:
            out = layer(out)
        return out

    def _pack_fused(self, watched: List[Tuple[list, tuple]]) -> Tuple[Any, Any]:
        """(the backend's packed layers, the backend), or (None, None) if a
        layer isn't fused, has a ``__call__`` of its own, or the layers are
        on different engines.  Lists of the user's own go to ``watched``."""
        layers = tuple(self.layers)
        _watch(self.layers, layers, watched)
        if not layers:
            return None, None
        fused = []
        backend: Optional[Backend] = None
        for layer in layers:
            if type(layer).__call__ is not Layer.__call__ or not isinstance(layer, Layer):
                return None, None
            part = _fused_cache(layer)
            if part.args is None:
                return None, None
            watched.extend(part.watched)
            if backend is not None and part.backend is not backend:
                return None, None
            backend = part.backend
            fused.append(part.args)
        assert backend is not None      # layers is not empty
        return backend.pack_layers(fused), backend

    def _all_parameters(self) -> List[Scalar]:
        return [p for layer in self.layers for p in _parameters_of(layer)]

    def _structure(self) -> List[int]:
        return [len(self.layers[0].neurons[0].w)] + [len(l.neurons) for l in self.layers]

    def __repr__(self) -> str:
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"
