"""What one eager op costs, piece by piece, beside a microgpt-style Value
in pure Python and the interpreter's floor (issue 52).

    python benchmarks/bench_op_floor.py [--repeats 7]

Every row is ns per op, the median of --repeats timings of a loop of
200,000 ops, all in this one process, rows alternating:

  a * b             pygrad, the result dropped at once
  a.__mul__(b)      the same without the operator's dispatch (the dunder's
                    body: result class, operand kind, the op function)
  make(Value, a, b) the op function alone: one builtin call that allocates
                    the Value, makes its node object and node, and (dropped)
                    frees them
  object.__new__    a Value allocated and freed, no node (object creation)
  floor             a pure-Python __slots__ class whose __mul__ returns a
                    new object holding the float product: the least an
                    operator-overloaded op costs in this interpreter
  microgpt-style    a pure-Python Value written as microgpt writes its own
                    (slots data, grad, _children, _local_grads; two tuples)
  kept, GC on/off   a 200,000-op chain kept alive (x = x * b), with the
                    cyclic collector on and off: its walks over the kept,
                    tracked Values are the rest of the eager cost
  .data read, update  microgpt's Adam loop reads and writes each parameter:
                    ``v.data`` read, and ``p.data -= lr * p.grad; p.grad =
                    0``, on pygrad and on the microgpt-style Value (ns per
                    read, per parameter)
"""
import argparse
import gc
import statistics
import time
from typing import Callable, Dict, List

import pygrad
from pygrad import Value, engine
from pygrad._core import lib

N = 200_000


class Floor:
    __slots__ = ("data",)

    def __mul__(self, other: "Floor") -> "Floor":
        out = Floor.__new__(Floor)
        out.data = self.data * other.data
        return out


class MicrogptStyle:
    """Our own Value in microgpt's form: (data, children, local_grads)."""

    __slots__ = ("data", "grad", "_children", "_local_grads")

    def __init__(self, data: float, children: tuple = (), local_grads: tuple = ()) -> None:
        self.data = data
        self.grad = 0
        self._children = children
        self._local_grads = local_grads

    def __mul__(self, other: "MicrogptStyle") -> "MicrogptStyle":
        return MicrogptStyle(self.data * other.data, (self, other), (other.data, self.data))


def loops() -> Dict[str, Callable[[], None]]:
    a, b = Value(1.000001), Value(0.999999)
    make = engine._op_function(lib.PG_OP_MUL, lib.PG_FORM_VALUES)
    new = object.__new__
    f, g = Floor(), Floor()
    f.data, g.data = 1.000001, 0.999999
    m, n = MicrogptStyle(1.000001), MicrogptStyle(0.999999)

    def dropped() -> None:
        for _ in range(N):
            a * b

    def dunder() -> None:
        mul = a.__mul__
        for _ in range(N):
            mul(b)

    def op_function() -> None:
        for _ in range(N):
            make(Value, a, b)

    def creation() -> None:
        for _ in range(N):
            new(Value)

    def floor() -> None:
        for _ in range(N):
            f * g

    def microgpt_style() -> None:
        for _ in range(N):
            m * n

    def chain(x: object, y: object) -> Callable[[], None]:
        def run() -> None:
            z = x
            for _ in range(N):
                z = z * y
        return run

    def reads(v: object) -> Callable[[], None]:
        def run() -> None:
            for _ in range(N):
                v.data
        return run

    def updates(ps: list) -> Callable[[], None]:
        def run() -> None:
            for _ in range(N // len(ps)):
                for p in ps:
                    p.data -= 0.001 * p.grad
                    p.grad = 0
        return run

    params = [Value(0.5) for _ in range(100)]
    mparams = [MicrogptStyle(0.5) for _ in range(100)]
    return {".data read, pygrad": reads(a), ".data read, microgpt-style": reads(m),
            "update loop, pygrad": updates(params), "update loop, microgpt-style": updates(mparams),
            "a * b": dropped, "a.__mul__(b)": dunder, "make(Value, a, b)": op_function,
            "object.__new__(Value)": creation, "floor (slotted Python object)": floor,
            "microgpt-style Value": microgpt_style,
            "kept chain, pygrad": chain(a, b), "kept chain, microgpt-style": chain(m, n)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    runs = loops()
    times: Dict[str, List[float]] = {}
    for _ in range(args.repeats):
        for name, run in runs.items():
            for collector in ((True, False) if name.startswith("kept") else (True,)):
                gc.collect()
                if not collector:
                    gc.disable()
                t = time.perf_counter()
                run()
                dt = time.perf_counter() - t
                gc.enable()
                key = name + ("" if not name.startswith("kept") else
                              (", GC on" if collector else ", GC off"))
                times.setdefault(key, []).append(dt / N * 1e9)
    print(f"ns per op, median of {args.repeats} (pygrad {pygrad.__version__})")
    for key, ts in times.items():
        print(f"  {key:38s} {statistics.median(ts):7.0f}")


if __name__ == "__main__":
    main()
