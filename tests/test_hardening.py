"""Hangs and lost interrupts (issue 45): a Program called again from a
signal handler or an lr schedule while it runs, bulk caches that compared
parameters with ``==``, weak containers whose callbacks swallowed a Ctrl-C,
and a Ctrl-C during numpy's lazy import.

No test depends on timing: a would-be hang runs in a subprocess with a
bounded wait, and signals are raised by the code itself at a chosen point."""
import sys

import numpy as np
import pytest

import pygrad
from pygrad import Value, nn, optim

from helpers import run_python

needs_signals = pytest.mark.skipif(not hasattr(__import__("signal"), "SIGUSR1"),
                                   reason="needs SIGUSR1")

# A subprocess prelude: a stand-in for the C library in pygrad.replay whose
# run functions raise a signal as their C call returns, while the Program's
# lock is still held: where a real signal that arrived during the C call is
# handled (Python runs handlers only between bytecodes).
SIGNAL_AS_C_RETURNS = """
import signal, sys
import numpy as np
import pygrad
from pygrad import Value, optim
import pygrad.replay as replay

class SignalAsCReturns:
    def __init__(self, lib):
        self._lib = lib
    def __getattr__(self, name):
        return getattr(self._lib, name)
    def pg_batch_run(self, *args):
        rc = self._lib.pg_batch_run(*args)
        signal.raise_signal(signal.SIGUSR1)
        return rc
    def pg_batch_step(self, *args):
        rc = self._lib.pg_batch_step(*args)
        signal.raise_signal(signal.SIGUSR1)
        return rc

x, w = Value(0.0), Value(0.5)
prog = pygrad.compile((x * w).tanh(), inputs=[x])
rows = np.linspace(-1, 1, 40).reshape(-1, 1)
want = prog.map(rows)
"""


# --- 5. a replaced parameter whose class has an __eq__ of its own ------------

class SymV(Value):
    """A Value whose == builds a node, as a symbolic library's would."""

    def __eq__(self, other):
        return self - other

    __hash__ = Value.__hash__


class Truthy(Value):
    def __eq__(self, other):
        return True

    __hash__ = Value.__hash__


@pytest.mark.parametrize("cls", [SymV, Truthy])
def test_bulk_paths_act_on_a_replaced_parameter(cls):
    n = nn.Neuron(3)
    n.get_data()                                # the bulk cache is built
    new = cls(7.0)
    n.w[0] = new
    n.set_data(np.arange(4.0))
    assert new.data == 0.0
    new.grad = 5.0
    n.zero_grad()
    assert new.grad == 0.0
    assert n.get_data()[0] == 0.0


@pytest.mark.parametrize("cls", [SymV, Truthy])
def test_bulk_paths_of_a_module_of_my_own_see_a_replaced_parameter(cls):
    class Mine(nn.Module):
        def __init__(self):
            self.ps = [Value(1.0), Value(2.0)]

        def parameters(self):
            return list(self.ps)

    m = Mine()
    m.zero_grad()
    new = cls(3.0)
    m.ps[1] = new
    m.set_data([10.0, 20.0])
    assert new.data == 20.0


