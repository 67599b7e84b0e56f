"""Replay: build a graph once, then re-run it forward and backward in C.

    loss = ...                       # built once from Values
    step = pygrad.compile(loss)
    for k in range(100):
        step.forward()               # recompute every node from the leaves
        opt.zero_grad()
        step.backward()              # fill every grad
        opt.step()                   # change the leaves (parameters)

The leaves stay your own Values: change their ``.data`` (an optimizer, or
``Inputs.set`` for a new minibatch) and ``forward()`` recomputes every node
in C, with no Python code per node.  The graph's own Values (``loss``,
intermediate scores) show the replayed numbers.  ``backward()`` does what
``backward()`` does on a freshly built graph, so a replayed training loop
gives bit-identical losses and parameters to rebuilding the graph each step.

Like every tracing compiler, replay freezes Python control flow: a branch
taken on ``v.data`` while building stays taken.  Nodes whose forward value
or gradient lives in Python (``Value(x, children, op)`` with a ``_backward``
closure, or a ``pygrad.Function``, whose partials were captured once) make
``compile`` fail with a ValueError.
"""
from typing import Any, Iterable, Tuple

import numpy as np

from ._core import ffi, lib
from ._numbers import not_a_number
from ._lifetime import extras
from .engine import Value

__all__ = ["compile", "Program", "Inputs"]


class Program:
    """A compiled graph: ``forward()``, ``backward()``, ``output``."""

    __slots__ = ("_output", "_program", "_n")

    def __init__(self, root: Value) -> None:
        if not isinstance(root, Value):
            raise not_a_number(root, f"compile needs a pygrad.Value (C engine), not "
                                     f"{type(root).__name__}")
        # Made empty and released in C (ffi.gc) first: nothing is lost
        # whatever interrupts this.
        program = ffi.gc(ffi.new("pg_program *"), lib.pg_program_clear)
        bad = ffi.new("uint32_t *")
        rc = lib.pg_compile(root._h, program, bad)
        if rc == lib.PG_E_NOMEM:
            raise MemoryError("pygrad: out of memory compiling the graph")
        if rc < 0:
            raise ValueError(f"cannot compile: {_describe(bad[0])}")
        self._output = root         # keeps the graph alive
        self._program = program
        self._n = lib.pg_program_size(program)

    @property
    def output(self) -> Value:
        """The compiled root (read-only: it keeps the program's nodes alive)."""
        return self._output

    def forward(self) -> float:
        """Recompute every node from the leaves' current data; returns the
        output's value."""
        return lib.pg_program_forward(self._program)

    def backward(self) -> None:
        """Backpropagate as on a fresh graph: interior grads from 0, the
        output's at 1, leaves accumulate (``+=``)."""
        lib.pg_program_backward(self._program)

    def __len__(self) -> int:
        return self._n

    def __reduce__(self) -> Any:
        raise TypeError("a pygrad Program can't be copied or pickled: it is compiled for "
                        "one graph in this process; copy the model and compile again")

    def __repr__(self) -> str:
        return f"Program({self._n} nodes, output={self.output!r})"


def _describe(h: int) -> str:
    op = lib.pg_op(h)
    extra = extras.get(h)
    name = extra.op if extra is not None and extra.op else "?"
    if op == lib.PG_OP_FUNCTION:
        return (f"the graph has a pygrad.Function node ({name!r}); its gradients were "
                "captured when it was made, so it can't be replayed")
    return (f"the graph has a node made in Python ({name!r}, Value(x, children, op)); "
            "its value and backward are Python's, so it can't be replayed")


def compile(root: Value) -> Program:  # noqa: A001 - the natural name, as torch.compile
    """Compile the graph below ``root`` for replay (see the module doc)."""
    return Program(root)


class Inputs:
    """A fixed list of leaf Values whose data is swapped in bulk, e.g. the
    next minibatch, in one C call."""

    __slots__ = ("_values", "_handles")

    def __init__(self, values: Iterable[Value]) -> None:
        self._values: Tuple[Value, ...] = tuple(values)
        for v in self._values:
            if not isinstance(v, Value):
                raise not_a_number(v, f"Inputs takes pygrad.Values (C engine), not "
                                      f"{type(v).__name__}")
        self._handles = ffi.new("uint32_t[]", [v._h for v in self._values])

    @property
    def values(self) -> Tuple[Value, ...]:
        """The leaves (read-only: set() writes through handles made here)."""
        return self._values

    def set(self, data: Any) -> None:
        """Set the Values' data from an array of as many numbers (flattened)."""
        arr = np.ascontiguousarray(data, dtype=np.float64).reshape(-1)
        if arr.size != len(self.values):
            raise ValueError(f"Inputs.set needs {len(self.values)} numbers, got {arr.size}")
        lib.pg_scatter_data(self._handles, len(self.values), ffi.from_buffer("double[]", arr))

    def get(self) -> np.ndarray:
        """The Values' data as an array."""
        out = np.empty(len(self.values), dtype=np.float64)
        lib.pg_gather_data(self._handles, len(self.values), ffi.from_buffer("double[]", out))
        return out

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        shown = ", ".join(repr(x) for x in self.get()[:4].tolist())
        more = ", ..." if len(self) > 4 else ""
        return f"Inputs({len(self)} values: [{shown}{more}])"

    def __getstate__(self) -> Any:
        return self._values

    def __setstate__(self, values: Any) -> None:
        self.__init__(values)  # type: ignore[misc]

    def __deepcopy__(self, memo: Any) -> "Inputs":
        import copy
        return Inputs(copy.deepcopy(self._values, memo))
