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
intermediate scores) show the replayed numbers (the interior nodes' go back
when something first reads or writes one: csrc/replay.c).  ``backward()`` does what
``backward()`` does on a freshly built graph, so a replayed training loop
gives bit-identical losses and parameters to rebuilding the graph each step.

Like every tracing compiler, replay freezes Python control flow: a branch
taken on ``v.data`` while building stays taken.  Nodes whose forward value
or gradient lives in Python (``Value(x, children, op)`` with a ``_backward``
closure, or a ``pygrad.Function``, whose partials were captured once) make
``compile`` fail with a ValueError.
"""
from __future__ import annotations

import gc
import operator
import os
import threading
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence, Tuple, Union


from ._core import ffi, lib
from ._numbers import not_a_number, real_array, refuse_unordered
from ._lifetime import bulk, pack
from ._value_ops import Scalar
from ._custom_sweep import find_below
from .engine import Value

if TYPE_CHECKING:
    import numpy as np
else:
    from ._lazy import numpy as np

__all__ = ["compile", "Program", "Inputs", "default_threads", "refresh_threads"]

# fork() copies a Program's lock that another thread held (inside map()) as
# held, and the child's first map() would wait for a thread that the child
# does not have.  So a Program's lock is tagged with the number of forks
# made when it was made, and a forked child (whose number moves on) makes
# the Program a new one at its first use.  No registry of the Programs: a
# weak set's callback ran as a Program was freed, and a Ctrl-C landing
# there was printed as "Exception ignored" and lost.
_forks = [0]
# Held while a Program's lock is remade in a child, so that two threads
# remake it once between them.
_remaking = threading.Lock()


def _cpus() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(64, n))


_default_threads = [_cpus()]
# Work per thread (rows x slots) below which threads=None starts no more.
_WORK_BITS = 20


def default_threads() -> int:
    """The threads a ``Program`` whose ``threads`` is None runs on: the CPUs
    this process may run on (``os.sched_getaffinity``, so ``taskset -c 0``
    gives 1; else ``os.cpu_count()``), at most 64.  Read when pygrad is
    imported and in a forked child; ``refresh_threads()`` reads it again
    (after changing the process's affinity)."""
    return _default_threads[0]


def refresh_threads() -> int:
    """Read the CPUs this process may run on again (see ``default_threads``)."""
    _default_threads[0] = _cpus()
    return _default_threads[0]


def _remake_locks_in_child() -> None:
    global _remaking
    refresh_threads()
    _remaking = threading.Lock()
    _forks[0] += 1
    if lib.pg_after_fork_in_child():
        # another thread's trace or create_graph had paused the collector:
        # in the child, no thread would turn it back on
        gc.enable()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_remake_locks_in_child)


class CallLock:
    """The lock held while a C call runs over an object's own buffers
    (a Program's, a PerLength's): made anew in a forked child (whose copy
    may be held by a thread it does not have), and a RuntimeError, not a
    wait, when the holding thread calls again (a signal handler, or a
    callback run during the call).  C keeps runs apart too, and mends a
    run a fork cut short (csrc/program.h: pg_run_begin)."""

    __slots__ = ("_lock", "_forks", "_busy")

    def __init__(self, busy: str) -> None:
        self._lock = threading.RLock()
        self._forks = _forks[0]
        self._busy = busy

    def free(self) -> Any:
        """The lock, to hold with ``with`` (see the class)."""
        if self._forks != _forks[0]:
            with _remaking:         # a forked child: a new lock, made once
                if self._forks != _forks[0]:
                    self._lock = threading.RLock()
                    self._forks = _forks[0]
        lock: Any = self._lock          # Any: the stubs' RLock has no _is_owned
        # Only this thread can make this true: a handler that runs after
        # the check and calls again takes the lock and frees it again.
        if lock._is_owned():
            raise RuntimeError(self._busy)
        return lock


class Program:
    """A compiled graph: ``forward()``, ``backward()``, ``output``, and
    ``map()`` over rows of inputs (see ``compile``)."""

    __slots__ = ("_output", "_outputs", "_inputs", "_program", "_batch", "_lock",
                 "_n", "_threads", "_memory", "__weakref__")

    def __init__(self, output: Union[Scalar, Iterable[Scalar]],
                 inputs: Optional[Union[Scalar, Iterable[Scalar]]] = None) -> None:
        single: Optional[Value] = output if isinstance(output, Value) else None
        outputs = (single,) if single is not None else _values(output, "compile's outputs")
        if not outputs:
            raise ValueError("compile needs at least one output Value")
        for v in outputs:
            d = lib.pg_describe_v(id(v))
            if d < 0:
                raise TypeError(f"compile's output (a {type(v).__name__}) has no node: its __init__ never ran "
                                "(make Values with Value(data), or from other Values' operators)")
            # (a node over a traced input is traced too: the outputs tell)
            if d >> 8 & lib.PG_F_TRACED:
                from ._graph_views import traced_error   # (imports this module's)
                raise traced_error("pygrad.compile")
        # (the C program and batch hold their nodes themselves:
        # csrc/value_binding.h)
        self._outputs: Tuple[Value, ...] = outputs
        self._output = single
        self._program: Any = None
        self._batch: Any = None
        self._inputs: Optional[Tuple[Value, ...]] = None
        self._lock = CallLock(
            "Program is busy in this thread: a signal handler or callback called it while it "
            "runs (forward, backward, map or train_step), which would wait for itself "
            "forever. Call it after the running call returns (e.g. have the handler set a "
            "flag), or use another Program compiled from the same graph")
        self._threads: Optional[int] = None
        if single is not None:
            # Made empty and released in C (ffi.gc) first: nothing is lost
            # whatever interrupts this.
            program = ffi.gc(self._held(ffi.new("pg_program *")), lib.pg_program_release)
            bad = ffi.new("uintptr_t[2]")
            rc = lib.pg_compile_v(id(single), program, bad)
            while rc == lib.PG_E_BUSY:  # another thread walks: signals run between tries
                rc = lib.pg_compile_v(id(single), program, bad)
            check_compile(rc, bad, self._outputs)
            self._program = program
            self._n = lib.pg_program_size(program)
        if inputs is not None:
            # One leaf may be given as itself, as a single output is.
            one = (inputs,) if isinstance(inputs, Value) else inputs
            self._compile_batch(_values(one, "compile's inputs"))
        if single is None:
            self._n = lib.pg_batch_slots(self._batch) if self._batch is not None else 0

    def _compile_batch(self, inputs: Tuple[Value, ...]) -> None:
        seen = set()
        for v in inputs:
            d = lib.pg_describe_v(id(v))
            if d < 0:
                raise TypeError(f"compile's input (a {type(v).__name__}) has no node: its __init__ never ran "
                                "(make Values with Value(data))")
            if d & 0xFF != lib.PG_OP_LEAF:
                raise ValueError(f"compile's inputs must be leaves (Values made by Value(x)), "
                                 f"not the result of an op: {v!r}")
            if id(v) in seen:
                raise ValueError(f"compile's inputs name the same Value twice: {v!r}")
            seen.add(id(v))
        batch = ffi.gc(self._held(ffi.new("pg_batch *")), lib.pg_batch_release)
        bad = ffi.new("uintptr_t[2]")
        out_nodes, in_nodes = pack(self._outputs).nodes, pack(inputs).nodes
        rc = lib.pg_batch_compile_v(id(out_nodes), id(in_nodes), batch, bad)
        while rc == lib.PG_E_BUSY:      # another thread walks: signals run between tries
            rc = lib.pg_batch_compile_v(id(out_nodes), id(in_nodes), batch, bad)
        check_compile(rc, bad, self._outputs)
        if _ndarray is None:
            _numpy_types()
        self._inputs = inputs
        self._batch = batch

    @property
    def output(self) -> Any:
        """The compiled output: the Value, or the tuple of Values (read-only:
        it keeps the program's nodes alive)."""
        return self._output if self._output is not None else self._outputs

    @property
    def inputs(self) -> Optional[Tuple[Value, ...]]:
        """The leaves that ``map`` sets from each row, or None."""
        return self._inputs

    def _held(self, memory: Any) -> Any:
        # The struct's memory, held by the Program too: the collector may
        # finalize the ffi.gc object (releasing it) before a __del__ in the
        # same garbage runs the Program, which then reads the released
        # struct (alive: refused), never freed memory.
        self._memory = getattr(self, "_memory", ()) + (memory,)
        return memory

    def _single(self, what: str) -> Any:
        if self._program is None:
            raise TypeError(f"{what} replays one output; this program has "
                            f"{len(self._outputs)}: use map()")
        return alive(self._program)

    def forward(self) -> float:
        """Recompute every node from the leaves' current data; returns the
        output's value."""
        program = self._single("forward()")
        with self._lock.free():        # (its arrays are the backward's too)
            out: float = lib.pg_program_forward(program)
        if out != out and lib.pg_program_refused():
            _run_failed(lib.PG_E_BUSY, "forward()")
        return out

    def backward(self) -> None:
        """Backpropagate as on a fresh graph: interior grads from 0, the
        output's at 1, leaves accumulate (``+=``)."""
        program = self._single("backward()")
        with self._lock.free():
            rc = lib.pg_program_backward(program)
        if rc:
            _run_failed(rc, "backward()")

    @property
    def threads(self) -> Optional[int]:
        """How many threads ``map`` and ``train_step`` may split the rows
        between (chunks of 256 rows; fewer rows, fewer threads); None (the
        default) means ``pygrad.replay.default_threads()``, but only as
        many as get about 2**20 slot-rows (rows x ``len(program)``) of
        work each.  The results are the same bits for any number."""
        return self._threads

    @threads.setter
    def threads(self, n: Optional[int]) -> None:
        if n is not None:
            if isinstance(n, bool):
                raise TypeError("Program.threads must be an int >= 1 or None, not bool")
            try:
                n = operator.index(n)          # numpy ints too
            except TypeError:
                raise TypeError(f"Program.threads must be an int >= 1 or None, "
                                f"not {type(n).__name__}") from None
        if n is not None and not 1 <= n <= 64:
            raise ValueError(f"Program.threads must be between 1 and 64 (or None), not {n}")
        self._threads = n

    def _auto_threads(self, n: int) -> int:
        """threads None: default_threads(), but no more than give each
        thread about 2**20 slot-rows of work (rows x the program's slots),
        so that a small step is not slowed by starting a thread."""
        cpus = _default_threads[0]
        if cpus == 1:
            return 1
        return max(1, min(cpus, (n * self._n) >> _WORK_BITS))

    def _rows(self, rows: Any, grad: Any, what: str) -> Tuple[Any, Any, int]:
        """rows and grad as contiguous float64 arrays of the right shapes."""
        if self._batch is None:
            raise TypeError(f"{what} needs the leaves that vary per row: "
                            "compile(output, inputs=[x0, x1, ...])")
        # The widths are the batch's own, never this object's attributes
        # (which a user may rebind): C reads and writes as many.
        batch = alive(self._batch)
        k, ninputs = lib.pg_batch_width(batch, 1), lib.pg_batch_width(batch, 0)
        if _ndarray is None:
            _numpy_types()          # (this module reloaded since the compile)
        # The common case first: arrays that are already what C takes.
        if (type(rows) is _ndarray and rows.dtype is _F64 and rows.ndim == 2
                and rows.shape[1] == ninputs and rows.flags.c_contiguous and rows.flags.aligned):
            data = rows
        else:
            data = real_array(rows, f"{what}'s rows")
            if data.ndim == 1 and ninputs == 1:
                data = data.reshape(-1, 1)
            if data.ndim != 2 or data.shape[1] != ninputs:
                raise ValueError(f"{what} needs rows of shape (n, {ninputs}) (one column per "
                                 f"input), got shape {data.shape}")
        n = data.shape[0]
        w = None
        if grad is not None:
            if (type(grad) is _ndarray and grad.dtype is _F64 and grad.flags.c_contiguous
                    and grad.flags.aligned):
                w = grad
            else:
                w = real_array(grad, f"{what}'s grad")
            shape = w.shape
            if w.ndim == 1 and not isinstance(grad, (list, tuple, _ndarray)) and np.ndim(grad) == 0:
                shape = ()      # (a lone number: numpy's contiguous copy is 1-d)
            if not (shape == (n,) and k == 1 or shape == (n, k)):
                want = f"({n},)" if k == 1 else f"({n}, {k})"
                per = "row and output" if k > 1 else "row"
                raise ValueError(f"{what}'s grad needs shape {want}: one weight per {per}, "
                                 f"got shape {shape}")
        return data, w, n

    def map(self, rows: Any, grad: Any = None) -> np.ndarray:
        """Run the program once per row of ``rows`` (n x len(inputs)), each
        row's numbers going to the ``inputs`` leaves; returns the outputs,
        shape (n,) for one output or (n, k) for k.  With ``grad=w`` (shape
        (n,), or (n, k)), the other leaves' grads also accumulate
        ``sum_r w[r] * d out_r / d leaf``, summed in row order within chunks
        of 256 rows, then chunk by chunk.  Each row's output equals the
        eager forward bit for bit; the graph's own nodes and the inputs'
        grads are not changed.  The rows are split between up to
        ``threads`` threads, with the same bits for any number."""
        data, w, n = self._rows(rows, grad, "map")
        batch = alive(self._batch)
        k = lib.pg_batch_width(batch, 1)
        out = np.empty((n, k), dtype=np.float64)
        threads = self._threads or self._auto_threads(n)
        with self._lock.free():
            rc = lib.pg_batch_run(batch, ffi.from_buffer("double[]", data), n,
                                  ffi.from_buffer("double[]", out),
                                  ffi.NULL if w is None else ffi.from_buffer("double[]", w),
                                  threads)
        _run_failed(rc, "map()")
        return out.reshape(n) if k == 1 and self._output is not None else out

    def train_step(self, rows: Any, grad: Any, optimizer: Any) -> np.ndarray:
        """One training step in one C call: ``optimizer.zero_grad()``,
        ``map(rows, grad)``, ``optimizer.step()``, with the same bits as
        those three calls.  ``optimizer`` is a ``pygrad.optim.SGD`` or
        ``Adam`` over C Values; returns what ``map`` returns (each row's
        outputs, e.g. its loss)."""
        from .optim import fused_fill
        fill = fused_fill(optimizer)
        if fill is None:
            stale = any(c.__module__ == "pygrad.optim" and c.__name__ in ("SGD", "Adam")
                        for c in type(optimizer).__mro__)
            raise TypeError(f"train_step's optimizer must be a pygrad.optim.SGD or Adam, "
                            f"not {type(optimizer).__name__}"
                            + (" of a pygrad.optim from before importlib.reload: make the "
                               "optimizer again" if stale else ""))
        if grad is None:
            raise TypeError("train_step needs grad: the loss weight of each row (e.g. 1/n each)")
        data, w, n = self._rows(rows, grad, "train_step")
        batch = alive(self._batch)
        k = lib.pg_batch_width(batch, 1)
        out = np.empty((n, k), dtype=np.float64)
        threads = self._threads or self._auto_threads(n)
        while True:
            # The count of steps, the array the C step adds to: a float64
            # array of one whole number (read under the lock again, it
            # tells whether another thread stepped meanwhile).
            count = optimizer._steps
            if not (type(count) is _ndarray and count.dtype is _F64 and count.shape == (1,)):
                raise TypeError("train_step: the optimizer's step count (_steps) is no longer "
                                "its own array: set opt.steps instead")
            before = count[0]
            if not (0.0 <= before < 9007199254740992.0 and before == int(before)):
                raise ValueError(f"train_step: the optimizer's step count is {before!r}, not "
                                 f"a whole number: set opt.steps")
            # The lr is read before the lock is taken: a schedule may
            # evaluate the model with this very program (a plateau rule).
            lr = optimizer.current_lr()
            # The optimizer is read before the lock too (a subclass's
            # settings and attributes may be properties that run the
            # model). fused points into what `held` holds: the state as it
            # is now, whatever another thread sets meanwhile.
            fused, held = fill(lr)
            nodes = optimizer._packed.nodes        # its parameters (held by a name)
            with self._lock.free():
                # Inside the lock, no attribute of the optimizer's is read
                # (a subclass's code would run there): only the count, to
                # see whether another thread stepped since it was read.
                if count[0] != before:
                    continue
                rc = lib.pg_batch_step_l(batch, ffi.from_buffer("double[]", data), n,
                                         ffi.from_buffer("double[]", out),
                                         ffi.from_buffer("double[]", w), threads, fused,
                                         id(nodes))
                if rc >= 0 and count[0] == before:
                    # (its steps view counts elsewhere: counted here, as
                    # Optimizer._step_at does)
                    count[0] = before + 1.0
                del held
            break
        if rc < 0:
            _run_failed(rc, "train_step()")
        return out.reshape(n) if k == 1 and self._output is not None else out

    def __len__(self) -> int:
        return self._n

    def __reduce__(self) -> Any:
        raise TypeError("a pygrad Program can't be copied or pickled: it is compiled for "
                        "one graph in this process; copy the model and compile again")

    def __repr__(self) -> str:
        shown = repr(self.output)
        if self._inputs is not None:
            shown += f", inputs={len(self._inputs)}"
        return f"Program({self._n} nodes, output={shown})"


_ndarray: Any = None
_F64: Any = None


def _numpy_types() -> None:
    global _ndarray, _F64
    _ndarray, _F64 = np.ndarray, np.dtype(np.float64)


def _values(values: Any, what: str) -> Tuple[Value, ...]:
    """A tuple of pygrad Values, or a TypeError saying what was given."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise not_a_number(values, f"{what} must be a pygrad.Value (C engine) or a list of "
                                   f"them, not {type(values).__name__}")
    refuse_unordered(values, what)
    out = tuple(values)
    for v in out:
        if not isinstance(v, Value):
            raise not_a_number(v, f"{what} must be pygrad.Values (C engine), not "
                                  f"{type(v).__name__}")
    return out


_BATCH_T = ffi.typeof("pg_batch *")


def alive(program: Any) -> Any:
    """``program`` (a compiled ``pg_program`` or ``pg_batch``), or a
    RuntimeError if it was freed: the collector frees a Program in a reference cycle, and a
    ``__del__`` in the same garbage may run it after."""
    if not (lib.pg_batch_alive(program) if ffi.typeof(program) is _BATCH_T
            else lib.pg_program_alive(program)):
        raise RuntimeError("pygrad: this Program was freed by the collector (it was in a "
                           "reference cycle, and a __del__ in the same garbage ran it "
                           "afterwards): keep the Program reachable while you use it")
    return program


def _run_failed(rc: int, what: str) -> None:
    if rc == lib.PG_E_BUSY:
        # (the Program's lock keeps runs apart; C found another run anyway:
        # its _lock was rebound)
        raise RuntimeError(f"pygrad: {what} while another thread runs this Program "
                           f"(its _lock was replaced): call it after that run returns")
    if rc == lib.PG_E_SWEEP:
        raise ValueError(rule_set_after_compile(what))
    if rc == lib.PG_E_NOMEM:
        raise MemoryError(f"pygrad: out of memory in {what}")
    if rc < 0:
        raise ValueError(f"pygrad: {what} on a program that was not compiled, or with an "
                         f"optimizer whose state does not fit its parameters")


def rule_set_after_compile(what: str) -> str:
    """The error of a run whose graph got a Python _backward after it was
    compiled (csrc/program.h, pg_rule_watch)."""
    return (f"pygrad: {what}: a node of this program got a _backward set in Python after "
            "the program was compiled; a program runs only C's gradient rules, so its grads "
            "would skip that closure. Call backward() on the graph itself, or set the "
            "_backward before compiling (compile refuses it then, and says why)")


def check_compile(rc: int, bad: Any, outputs: Tuple[Value, ...]) -> None:
    """The error a compile's rc means; ``bad`` is the refused node's
    address (a number, for identity) and op, or 0, 0."""
    if rc == lib.PG_E_NOMEM:
        raise MemoryError("pygrad: out of memory compiling the graph")
    if rc < 0:
        if bad[0]:
            raise ValueError(f"cannot compile: {_describe(bad[0], bad[1], outputs)}")
        raise ValueError("cannot compile: an input is not a node")


def _describe(node: int, op: int, outputs: Tuple[Value, ...]) -> str:
    v = None
    for out in outputs:
        v = find_below(out, node)
        if v is not None:
            break
    name = _node_name(v)
    if op not in (lib.PG_OP_FUNCTION, lib.PG_OP_CUSTOM):
        return (f"the graph has a node whose _backward was set in Python ({name}); a "
                "program runs only C's gradient rules, so it can't be replayed. Rebuild the "
                "graph each step and call backward() on it, or do what the hook does "
                "between backward() and the optimizer's step")
    if op == lib.PG_OP_FUNCTION:
        return (f"the graph has a node whose local gradients were captured when it was "
                f"made ({name}): a pygrad.Function, or a Value made as Value(data, children, "
                "local_grads), microgpt's way; it can't be replayed. Rebuild the graph each "
                "step and call backward() on it, or write the op with pygrad's ops (+, *, "
                "exp, ...), which compile")
    return (f"the graph has a node made in Python ({name}, made by Value(x, children, op)); "
            "its value and backward are Python's, so it can't be replayed. Rebuild the "
            "graph each step and call backward() on it, or write the op with pygrad's ops "
            "(+, *, exp, pygrad.dot, ...), which compile")


def _node_name(v: Any) -> str:
    """How the user named a node made in Python: its op and label, as given
    to Value(x, children, op, label=...), so they can find it in their code."""
    if v is None:
        return "a node whose Value is gone"
    named = [f"{what} {text!r}" for what, text in (("op", v._op), ("label", v.label)) if text]
    if named:
        return ", ".join(named)
    try:
        return f"no op or label, data {v.data!r}"
    except ValueError:          # made from a traced program's input
        return "no op or label, made from a traced input"


def compile(output: Union[Scalar, Iterable[Scalar]],  # noqa: A001 - as torch.compile
            inputs: Optional[Union[Scalar, Iterable[Scalar]]] = None) -> Program:
    """Compile the graph below ``output`` (a Value, or a list of Values) for
    replay (see the module doc).  ``inputs``: the leaves that vary per row
    (a Value, or a list of Values), for ``Program.map``; every other leaf is
    shared by all rows."""
    return Program(output, inputs)


class Inputs:
    """A fixed list of leaf Values whose data is swapped in bulk, e.g. the
    next minibatch, in one C call."""

    __slots__ = ("_values", "_packed")

    def __init__(self, values: Iterable[Value]) -> None:
        refuse_unordered(values, "Inputs' values")
        self._values: Tuple[Value, ...] = tuple(values)
        for v in self._values:
            if not isinstance(v, Value):
                raise not_a_number(v, f"Inputs takes pygrad.Values (C engine), not "
                                      f"{type(v).__name__}")
        self._packed = pack(self._values)

    @property
    def values(self) -> Tuple[Value, ...]:
        """The leaves (read-only: set() writes to the nodes packed here)."""
        return self._values

    def set(self, data: Any) -> None:
        """Set the Values' data from an array of as many numbers (flattened)."""
        arr = real_array(data, "Inputs.set's data").reshape(-1)
        if arr.size != len(self.values):
            raise ValueError(f"Inputs.set needs {len(self.values)} numbers, got {arr.size}")
        bulk(lib.pg_scatter_data_l, self._packed, arr)

    def get(self) -> np.ndarray:
        """The Values' data as an array."""
        out = np.empty(len(self.values), dtype=np.float64)
        bulk(lib.pg_gather_data_l, self._packed, out)
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

    def __deepcopy__(self, memo: Any) -> Inputs:
        import copy
        return Inputs(copy.deepcopy(self._values, memo))
