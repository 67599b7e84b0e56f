"""User-defined differentiable ops, shaped like ``torch.autograd.Function``.

    class Cube(pygrad.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_values
            return (3 * x * x * grad,)

    y = Cube.apply(v)

``forward`` gets floats and returns a float; ``backward`` returns one grad
per input.  A scalar op's gradient is linear in the incoming grad, so
``apply`` calls ``backward(ctx, 1.0)`` once, at forward time, and the C
backward then adds ``partial * grad`` for each input without calling back
into Python.  (A backward that is not linear in ``grad`` is not supported.)
Those partials are the inputs' numbers at ``apply``: ``backward()`` and
``pygrad.grad`` use them even if an input's ``.data`` changes later, and
``pygrad.grad(..., create_graph=True)`` then raises ``ValueError`` (as
torch does for a tensor saved for backward and changed in place).
On reference Values, ``apply`` builds the same node with a Python backward.
"""
from typing import Any, List, Tuple

from ._backend import backend_of
from ._numbers import real_or_none, to_real

__all__ = ["Function", "Context"]


class Context:
    """What forward leaves for backward."""

    def __init__(self) -> None:
        self.saved_values: Tuple[float, ...] = ()

    def save_for_backward(self, *values: float) -> None:
        self.saved_values = values


class Function:
    """Subclass with ``forward(ctx, *inputs)`` and ``backward(ctx, grad)``.

    A subclass whose forward and backward are written with operations that
    Values have too (``+``, ``*``, ``**``, ``exp()``, ...) sets
    ``differentiable = True``: ``pygrad.grad(..., create_graph=True)`` then
    runs them again on Values, so its gradient can be differentiated again.
    """

    #: forward and backward work on Values as well as floats
    differentiable: bool = False

    @staticmethod
    def forward(ctx: Context, *inputs: float) -> float:
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Context, grad: float) -> Tuple[float, ...]:
        raise NotImplementedError

    @classmethod
    def apply(cls, *inputs: Any) -> Any:
        """Run the op on Values (numbers become constant leaves)."""
        if not inputs:
            raise ValueError(f"{cls.__name__}.apply needs at least one input")
        backend = backend_of(inputs, f"{cls.__name__}.apply inputs")
        V = backend.Value
        values: List[Any] = []
        for v in inputs:
            if not isinstance(v, V):
                if real_or_none(v) is None:
                    raise TypeError(f"{cls.__name__}.apply inputs must be Values or numbers, "
                                    f"not {type(v).__name__}")
                v = V(v)
            values.append(v)
        ctx = Context()
        xs = [v.data for v in values]
        data = to_real(cls.forward(ctx, *xs), f"{cls.__name__}.forward's result")
        partials = cls.backward(ctx, 1.0)
        grads = ([to_real(p, f"{cls.__name__}.backward's grads") for p in partials]
                 if isinstance(partials, (tuple, list)) else None)
        # (counted in the list made here: a subclass's __len__ may say otherwise)
        if grads is None or len(grads) != len(values):
            raise ValueError(f"{cls.__name__}.backward must return {len(values)} grads "
                             f"(one per input), got {partials!r}")
        out = backend.make_function(cls.__name__, data, values, grads)
        if getattr(cls, "differentiable", False):
            # pygrad.grad(create_graph=True) runs forward and backward
            # again, on Values: the class says they take Values.
            out.__dict__["_pg_function"] = cls
            # (the numbers its partials were taken at: create_graph refuses
            # to run it again on others, higher_order._function_grads)
            out.__dict__["_pg_function_inputs"] = tuple(xs)
        return out
