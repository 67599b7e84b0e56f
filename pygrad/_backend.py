"""The one place that decides which engine a call runs on.

pygrad has two engines: the C core (``pygrad.Value``) and the pure-Python
reference (``pygrad.reference.Value``, the tests' oracle).  The modules built
on Values (nn, optim, losses, function, gradcheck, data) never test a
Value's class themselves: they ask ``backend_of(values)`` (or
``backend_named('c' | 'reference')``) for a ``Backend`` and call it.

A backend holds the engine's Value class and fused ops, the bulk operations
over a list of its Values (fill, gather and scatter of data and grads, the
optimizer steps), and the hooks that build fused layers and custom-op
nodes.  On the C engine each bulk operation is one C call over the Values'
nodes (a node list of pygrad's own, which holds them: pygrad/_lifetime.py);
the reference backend's are plain Python loops over ``.data`` and
``.grad``, written once here, so they also serve micrograd's Values.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, List, Optional, Sequence

from . import _graph_views, _node_factory, engine as _engine
from . import functional as _functional
from . import reference as _reference
from ._core import ffi, lib
from ._lifetime import Packed as _Packed, bulk as _bulk, pack as _pack, traced as _traced
from ._numbers import is_value

if TYPE_CHECKING:
    import numpy as np
else:
    from ._lazy import numpy as np

__all__ = ["Backend", "C", "REFERENCE", "DEFAULT", "backend_of", "backend_named"]


class Backend:
    """An engine: its ``Value`` class, its fused ``dot`` / ``sum`` /
    ``logsumexp``, and bulk operations over ``pack(values)``.

    This class is the reference engine: its bulk operations are Python loops
    that only read and write ``.data`` and ``.grad``, so they work on any
    micrograd-compatible Values.  The C engine overrides them with C calls.
    """

    __slots__ = ("name", "Value", "dot", "sum", "logsumexp", "graph")

    def __init__(self, name: str, value: type, dot: Any, sum_: Any, logsumexp: Any,
                 graph: Any) -> None:
        self.name = name
        self.Value = value
        self.dot = dot
        self.sum = sum_
        self.logsumexp = logsumexp
        #: how pygrad.grad reads this engine's graph (pygrad/_graph_views.py)
        self.graph = graph

    def __repr__(self) -> str:
        return f"<pygrad backend {self.name!r}>"

    # One object per engine, also through copies and pickles of the models
    # and optimizers that hold it.
    def __reduce__(self) -> Any:
        return (backend_named, (self.name,))

    # -- bulk operations over a packed list of Values -------------------------

    #: the type of what ``pack`` makes
    packed_type: type = tuple

    def pack(self, values: Iterable[Any]) -> Any:
        """``values`` in the form the bulk operations take (keep it to reuse)."""
        return tuple(values)

    def buffer(self, arr: np.ndarray) -> Any:
        """A float64 array as the bulk operations take per-parameter state
        (made once per array: it must stay the array it was made from)."""
        return arr

    def fused_optimizer(self, kind: str, packed: Any, steps: Any) -> "tuple[Any, tuple]":
        """The C description of an optimizer's step ('sgd' or 'adam') for
        Program.train_step, pointing to ``packed``'s nodes and ``steps``,
        and what holds what it points to (the caller holds it for the
        call); only the C engine has one."""
        raise TypeError("train_step needs an optimizer over pygrad.Values (C engine), "
                        "not reference Values")

    def fill_grad(self, packed: Any, x: float) -> None:
        """Set every Value's grad to ``x``."""
        for p in packed:
            p.grad = x

    def gather_data(self, packed: Any) -> np.ndarray:
        """Every Value's data, as a new float64 array."""
        out = np.empty(len(packed), dtype=np.float64)
        out[:] = [p.data for p in packed]
        return out

    def gather_grad(self, packed: Any) -> np.ndarray:
        """Every Value's grad, as a new float64 array."""
        out = np.empty(len(packed), dtype=np.float64)
        out[:] = [p.grad for p in packed]
        return out

    def scatter_data(self, packed: Any, arr: np.ndarray) -> None:
        """Set every Value's data from a float64 array of the same length."""
        for p, x in zip(packed, arr.tolist()):
            p.data = x

    def sgd_step(self, packed: Any, lr: float, momentum: float, weight_decay: float,
                 velocity: Any, steps: Any) -> None:
        """One SGD update (see ``pygrad.optim``), counted in ``steps[0]``;
        ``velocity`` and ``steps`` from ``buffer``."""
        for i, p in enumerate(packed):
            g = p.grad
            if weight_decay != 0.0:
                g = g + weight_decay * p.data
            if momentum != 0.0:
                velocity[i] = momentum * float(velocity[i]) + g
                g = float(velocity[i])
            p.data = p.data - lr * g
        steps[0] += 1.0

    def adam_step(self, packed: Any, lr: float, beta1: float, beta2: float, eps: float,
                  weight_decay: float, bias1: float, bias2: float, m: Any, v: Any,
                  steps: Any) -> None:
        """One Adam update (see ``pygrad.optim``), counted in ``steps[0]``;
        ``m``, ``v`` and ``steps`` from ``buffer``."""
        for i, p in enumerate(packed):
            g = p.grad
            if weight_decay != 0.0:
                g = g + weight_decay * p.data
            mi = beta1 * float(m[i]) + (1.0 - beta1) * g
            vi = beta2 * float(v[i]) + (1.0 - beta2) * (g * g)
            m[i], v[i] = mi, vi
            p.data = p.data - lr * (mi / bias1) / (math.sqrt(vi / bias2) + eps)
        steps[0] += 1.0

    # -- building nodes ---------------------------------------------------------

    def holds(self, values: Iterable[Any]) -> bool:
        """Whether every item of ``values`` is this engine's Value (what
        ``pack`` takes)."""
        V = self.Value
        return all(isinstance(v, V) for v in values)

    def fuses_layers(self, nout: int) -> bool:
        """Whether ``fused_layer`` can build a layer of ``nout`` neurons."""
        return False

    def fused_layer(self, packed_params: Any, params: Sequence[Any], x: Sequence[Any],
                    nin: int, nout: int, nonlin: bool) -> List[Any]:
        """``nout`` neurons over ``x`` in one call; ``params`` are each
        neuron's bias then weights, ``packed_params`` their ``pack``."""
        raise NotImplementedError(f"the {self.name} engine has no fused layers")

    def leaves(self, data: Sequence[float]) -> List[Any]:
        """A leaf Value for each number of ``data`` (floats)."""
        return [self.Value(x) for x in data]

    def pack_layers(self, layers: Sequence[tuple]) -> Any:
        """The fused layers of an MLP, ready for ``fused_layers``: ``layers``
        holds each one's ``fused_layer`` arguments ``(packed_params, params,
        nin, nout, nonlin)``.  ValueError if they don't chain."""
        width = layers[0][2]
        for packed_params, _, nin, nout, _ in layers:
            if nin != width:
                raise ValueError(f"layer expects {nin} inputs, got {width}")
            _check_layer_params(packed_params, nin, nout)
            width = nout
        return list(layers)

    def fused_layers(self, packed: Any, x: Sequence[Any]) -> List[Any]:
        """The last layer's outputs of fused layers run in turn over ``x``
        (``packed`` from ``pack_layers``)."""
        out: List[Any] = list(x)
        for packed_params, params, nin, nout, nonlin in packed:
            out = self.fused_layer(packed_params, params, out, nin, nout, nonlin)
        return out

    def make_function(self, name: str, data: float, values: Sequence[Any],
                      partials: Sequence[float]) -> Any:
        """A custom-op node (``pygrad.Function``) over ``values`` (of this
        engine) whose gradient to each is ``partial * grad``."""
        out = self.Value(data, tuple(values), name)

        def _backward() -> None:
            for v, p in zip(values, partials):
                v.grad += p * out.grad
        out._backward = _backward
        if hasattr(out, "_rule"):      # a reference Value: pygrad.grad reads these
            out._rule = ("FUNCTION", None, _backward)
            out._local_grads = tuple(partials)
        return out


def _check_layer_params(packed_params: Any, nin: int, nout: int) -> None:
    """ValueError unless a fused layer's packed parameters number
    ``nout * (nin + 1)``: C reads that many, never past the array."""
    if len(packed_params) != nout * (nin + 1):
        raise ValueError(f"fused layer of {nout} neurons of {nin} inputs needs "
                         f"{nout * (nin + 1)} parameters, got {len(packed_params)}")


def _state_fits(rc: int) -> None:
    """The C steps refuse a state array shorter than the parameters
    (pygrad.optim validates them first; this is the C side's own check)."""
    _traced(rc)
    if rc == lib.PG_E_ARG:
        raise ValueError("pygrad: an optimizer state array is shorter than its parameters")


_DOUBLES = ffi.typeof("double[]")


def _own(view: Any) -> Any:
    """``view`` if it is a float64 buffer (``buffer``'s): cffi would turn
    anything else, a list, into a temporary array that C writes to and
    drops (the step's state lost, or written past an empty one)."""
    if not (isinstance(view, ffi.CData) and ffi.typeof(view) is _DOUBLES and len(view)):
        raise TypeError(f"pygrad: an optimizer's state must be its own float64 arrays "
                        f"(assign them as opt.velocity = array, opt.m = array, ...), not "
                        f"{type(view).__name__}")
    return view


class _CBackend(Backend):
    """The C engine: bulk operations are one C call over the Values' nodes
    (a ``Packed``: a node list, which holds them)."""

    __slots__ = ()

    packed_type = _Packed

    def pack(self, values: Iterable[Any]) -> Any:
        return _pack(values)

    def fused_optimizer(self, kind: str, packed: Any, steps: Any) -> "tuple[Any, tuple]":
        f: Any = ffi.new("pg_optimizer *")   # Any: the stub's cdata has no fields
        f.kind = lib.PG_OPT_SGD if kind == "sgd" else lib.PG_OPT_ADAM
        f.steps = _own(steps)
        # (its parameters: packed's node list, which pg_batch_step_l reads)
        return f, (packed.nodes, steps)

    def buffer(self, arr: np.ndarray) -> Any:
        # (writable: the steps write it; a read-only array is refused here)
        return ffi.from_buffer("double[]", arr, require_writable=True)

    def fill_grad(self, packed: Any, x: float) -> None:
        nodes = packed.nodes     # (held by a name for the call)
        rc = lib.pg_fill_grad_l(id(nodes), x)
        if rc:
            _traced(rc)
            raise TypeError("pygrad: the parameters' node list was replaced by something "
                            "else (an optimizer's _packed): make the optimizer again")

    def gather_data(self, packed: Any) -> np.ndarray:
        out = np.empty(len(packed), dtype=np.float64)
        _bulk(lib.pg_gather_data_l, packed, out)
        return out

    def gather_grad(self, packed: Any) -> np.ndarray:
        out = np.empty(len(packed), dtype=np.float64)
        _bulk(lib.pg_gather_grad_l, packed, out)
        return out

    def scatter_data(self, packed: Any, arr: np.ndarray) -> None:
        _bulk(lib.pg_scatter_data_l, packed, arr)

    def sgd_step(self, packed: Any, lr: float, momentum: float, weight_decay: float,
                 velocity: Any, steps: Any) -> None:
        nodes = packed.nodes     # (held by a name for the call)
        _state_fits(lib.pg_sgd_step_l(id(nodes), lr, momentum, weight_decay,
                                      _own(velocity), len(velocity), _own(steps)))

    def adam_step(self, packed: Any, lr: float, beta1: float, beta2: float, eps: float,
                  weight_decay: float, bias1: float, bias2: float, m: Any, v: Any,
                  steps: Any) -> None:
        nodes = packed.nodes     # (held by a name for the call)
        _state_fits(lib.pg_adam_step_l(id(nodes), lr, beta1, beta2, eps, weight_decay,
                                       bias1, bias2, _own(m), len(m), _own(v), len(v),
                                       _own(steps)))

    def fuses_layers(self, nout: int) -> bool:
        return True

    def fused_layer(self, packed_params: Any, params: Sequence[Any], x: Sequence[Any],
                    nin: int, nout: int, nonlin: bool) -> List[Any]:
        _check_layer_params(packed_params, nin, nout)
        V = self.Value
        xs: List[Any] = [v if isinstance(v, V) else V(v) for v in x]
        if len(xs) != nin:
            raise ValueError(f"layer expects {nin} inputs, got {len(xs)}")
        act = lib.PG_ACT_RELU if nonlin else lib.PG_ACT_NONE
        return _node_factory.make_layer(act, packed_params, tuple(params), tuple(xs), nin, nout)

    def leaves(self, data: Sequence[float]) -> List[Any]:
        # Made in bulk, one C call
        return _node_factory.make_leaves(list(data)) if data else []

    def pack_layers(self, layers: Sequence[tuple]) -> Any:
        layers = super().pack_layers(layers)
        sizes = [layers[0][2]] + [nout for _, _, _, nout, _ in layers]
        acts = [lib.PG_ACT_RELU if nonlin else lib.PG_ACT_NONE for *_, nonlin in layers]
        params = [packed_params for packed_params, *_ in layers]
        # pg_mlp's arguments, and the parameters' Values (which the
        # outputs' Values hold).
        param_values = tuple(v for layer in layers for v in layer[1])
        return (ffi.new("int[]", acts), params, sizes, param_values, layers)

    def fused_layers(self, packed: Any, x: Sequence[Any]) -> List[Any]:
        if isinstance(packed, list):
            return super().fused_layers(packed, x)
        acts, params, sizes, param_values, _ = packed
        V = self.Value
        xs: List[Any] = [v if isinstance(v, V) else V(v) for v in x]
        if len(xs) != sizes[0]:
            raise ValueError(f"layer expects {sizes[0]} inputs, got {len(xs)}")
        return _node_factory.make_mlp(acts, params, sizes, param_values, tuple(xs))

    def make_function(self, name: str, data: float, values: Sequence[Any],
                      partials: Sequence[float]) -> Any:
        return _node_factory.make_function(data, tuple(values), list(partials), name)


C: Backend = _CBackend("c", _engine.Value, _functional.dot, _functional.sum,
                       _functional.logsumexp, _graph_views.CGraph)
REFERENCE: Backend = Backend("reference", _reference.Value, _reference.dot, _reference.sum,
                             _reference.logsumexp, _graph_views.ReferenceGraph)
#: The engine of Values made from plain numbers.
DEFAULT: Backend = C

_BY_NAME = {"c": C, "reference": REFERENCE}


def backend_named(name: str) -> Backend:
    """The backend for ``engine='c'`` or ``engine='reference'``; ValueError
    for any other name."""
    if not isinstance(name, str) or name not in _BY_NAME:
        raise ValueError(f"engine must be 'c' or 'reference', not {name!r}")
    return _BY_NAME[name]


def backend_of(values: Iterable[Any], what: str = "Values", allow_mixed: bool = False) -> Backend:
    """The backend of the Values among ``values`` (anything else, such as
    numbers, is left for the caller to check).

    pygrad.Values give the C backend; other Values (reference or
    micrograd-compatible) the reference backend, whose loops work on any of
    them; no Values at all give ``DEFAULT``.  pygrad.Values together with
    another engine's are a TypeError naming ``what`` or, with
    ``allow_mixed``, the reference backend.
    """
    c = other = False
    for v in values:
        if isinstance(v, _engine.Value):
            c = True
        elif is_value(v):
            other = True
        else:
            continue
        if c and other:
            if allow_mixed:
                return REFERENCE
            raise TypeError(f"{what} must all come from the same engine: cannot mix "
                            f"pygrad.Values (C engine) with Values of another engine")
    if c:
        return C
    return REFERENCE if other else DEFAULT
