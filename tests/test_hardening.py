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
from pygrad._core import lib

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
    # the core, but a SIGUSR1 as each run of a program returns from C
    RUNS = ("pg_batch_run", "pg_batch_step_l", "pg_program_forward", "pg_program_backward")
    def __init__(self, lib):
        self._lib = lib
    def __getattr__(self, name):
        call = getattr(self._lib, name)
        if name not in self.RUNS:
            return call
        def then_signal(*args):
            rc = call(*args)
            signal.raise_signal(signal.SIGUSR1)
            return rc
        return then_signal

x, w = Value(0.0), Value(0.5)
prog = pygrad.compile((x * w).tanh(), inputs=[x])
rows = np.linspace(-1, 1, 40).reshape(-1, 1)
want = prog.map(rows)
"""


# --- 1. a signal handler that uses the Program it interrupted ----------------

@needs_signals
@pytest.mark.parametrize("outer", ["map", "train_step", "forward", "backward"])
def test_a_signal_handler_calling_the_busy_program_raises_instead_of_hanging(outer):
    """The handler runs in the thread that holds the Program's lock: it gets
    a RuntimeError saying so (it used to wait for itself forever), and the
    Program is usable once the interrupted call is over."""
    out = run_python(f"""
        seen = []
        def handler(signum, frame):
            try:
                prog.map(rows[:2])
            except RuntimeError as e:
                seen.append(str(e))
        signal.signal(signal.SIGUSR1, handler)
        replay.lib = SignalAsCReturns(replay.lib)
        opt = optim.SGD([w], lr=0.1)
        if {outer!r} == "map":
            got = prog.map(rows)
            assert (got == want).all()
        elif {outer!r} == "forward":
            assert prog.forward() == (x * w).tanh().data
        elif {outer!r} == "backward":
            prog.backward()
        else:
            prog.train_step(rows, np.full(len(rows), 1 / len(rows)), opt)
        replay.lib = replay.lib._lib
        assert len(seen) == 1, seen
        assert "Program is busy in this thread" in seen[0], seen[0]
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        prog.map(rows)                                 # the lock was released
        print("ok")
    """, prelude=SIGNAL_AS_C_RETURNS, timeout=60)
    assert out.strip() == "ok"


@needs_signals
def test_the_busy_error_reaches_the_interrupted_call_if_the_handler_lets_it():
    """A handler that does not catch the RuntimeError: it propagates out of
    the interrupted map (as any exception a handler raises), not a hang."""
    out = run_python("""
        signal.signal(signal.SIGUSR1, lambda s, f: print(prog.map(rows[:2])))
        replay.lib = SignalAsCReturns(replay.lib)
        try:
            prog.map(rows)
        except RuntimeError as e:
            print("raised", "busy in this thread" in str(e))
        replay.lib = replay.lib._lib
        print((prog.map(rows) == want).all())
    """, prelude=SIGNAL_AS_C_RETURNS, timeout=60)
    assert out.split() == ["raised", "True", "True"]


def test_another_thread_still_waits_for_the_lock():
    """The same-thread check does not turn a second thread's wait into an
    error: a thread calling map while another holds the lock waits."""
    import threading
    x = Value(0.0)
    prog = pygrad.compile((x * 2).tanh(), inputs=[x])
    rows = np.linspace(-1, 1, 10).reshape(-1, 1)
    want = prog.map(rows)
    got = []
    with prog._lock.free():                     # as a map running in this thread
        t = threading.Thread(target=lambda: got.append(prog.map(rows)))
        t.start()
        t.join(0.05)
        assert not got                          # waiting, not refused
    t.join(60)
    assert len(got) == 1 and (got[0] == want).all()


# --- 2. an lr schedule that uses the Program ---------------------------------

def _plateau_run(three_calls):
    """A few steps with a schedule that evaluates the model with the same
    Program: train_step, or the documented three calls."""
    import random
    random.seed(3)
    model = nn.MLP(2, [4, 1])
    x0, x1 = Value(0.0), Value(0.0)
    prog = pygrad.compile(model([x0, x1]).tanh(), inputs=[x0, x1])
    rows = np.random.default_rng(5).uniform(-1, 1, (64, 2))
    w = np.full(len(rows), 1 / len(rows))
    opt = optim.Adam(model.parameters(),
                     lr=lambda k: 0.1 if prog.map(rows).mean() > 0 else 0.01)
    outs = []
    for _ in range(6):
        if three_calls:
            opt.zero_grad()
            outs.append(prog.map(rows, grad=w))
            opt.step()
        else:
            outs.append(prog.train_step(rows, w, opt))
    return outs, model.get_data()


def test_a_schedule_that_maps_with_the_same_program_gives_the_three_calls_numbers():
    """train_step reads the lr before it takes the Program's lock: a
    plateau-style schedule evaluating with the same Program used to hang."""
    out = run_python("""
        import sys
        sys.path.insert(0, ".")
        import test_hardening as t
        (a, pa), (b, pb) = t._plateau_run(False), t._plateau_run(True)
        assert all((x.view(np.int64) == y.view(np.int64)).all() for x, y in zip(a, b))
        assert (pa.view(np.int64) == pb.view(np.int64)).all()
        print("ok")
    """, prelude="import numpy as np\n", timeout=60)
    assert out.strip() == "ok"


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


# --- 9. no weak-container callback where a Ctrl-C could be lost --------------

def _python_calls_while(action):
    """The Python functions called while ``action()`` runs (a profile hook):
    a weakref callback is one, and a Ctrl-C landing in it was printed as
    'Exception ignored' and lost."""
    calls = []

    def hook(frame, event, arg):
        if event == "call":
            calls.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
    sys.setprofile(hook)
    try:
        action()
    finally:
        sys.setprofile(None)
    return calls


def test_freeing_a_program_runs_no_python_code():
    x = Value(0.0)
    progs = [pygrad.compile((x * 2).tanh(), inputs=[x]), pygrad.compile((x * 3).exp())]
    progs[0].map([[0.5]])
    calls = _python_calls_while(progs.clear)
    assert calls == []


def test_freeing_a_module_after_bulk_operations_runs_no_python_code():
    models = [nn.MLP(2, [3, 1]), nn.Neuron(2)]
    for m in models:
        m.zero_grad()
        m.set_data(m.get_data())
    calls = _python_calls_while(models.clear)
    assert calls == []


def test_a_program_is_not_weakly_referenced_by_pygrad():
    import weakref
    x = Value(0.0)
    prog = pygrad.compile((x * 2).tanh(), inputs=[x])
    prog.map([[0.5]])
    assert weakref.getweakrefcount(prog) == 0
    model = nn.MLP(2, [3, 1])
    model.zero_grad()
    assert weakref.getweakrefcount(model) == 0


def test_the_bulk_cache_is_not_copied_or_pickled():
    import copy
    import pickle
    m = nn.MLP(2, [3, 1])
    m.zero_grad()
    for twin in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        twin.set_data(np.arange(len(twin.parameters()), dtype=float))
        assert list(twin.get_data()) == list(range(len(twin.parameters())))
        assert not any(p.data == q.data for p, q in zip(m.parameters(), twin.parameters())
                       if p.data != 0)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork()")
def test_a_forked_child_can_use_a_program_whose_lock_was_held():
    """fork() while this thread holds a Program's lock (as a map running in
    another thread would): the child's map does not wait for it."""
    out = run_python("""
        import os
        import numpy as np
        import pygrad
        from pygrad import Value
        x = Value(0.0)
        prog = pygrad.compile((x * 2).tanh(), inputs=[x])
        want = prog.map([[0.5]])[0]
        with prog._lock.free():
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = 0 if prog.map([[0.5]])[0] == want else 2
                finally:
                    os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.WEXITSTATUS(status))
    """, timeout=60)
    assert out.strip() == "0"


needs_run_hook = pytest.mark.skipif(not hasattr(lib, "pg_hold_runs"),
                                    reason="needs a test build (PYGRAD_TEST_HOOKS=1)")

# A subprocess prelude: a program whose backward() another thread runs and
# is held in C (test hook) right after it marked its run begun.
HELD_RUN = """
import os, threading
import pygrad
from pygrad import Value
from pygrad._core import lib
from pygrad.replay import CallLock

def fresh_grads():
    fa, fb = Value(0.5), Value(-1.5)
    ((fa * fb + fa).tanh() * fb).backward()
    return fa.grad, fb.grad

a, b = Value(0.5), Value(-1.5)
y = (a * b + a).tanh() * b
prog = pygrad.compile(y)
lib.pg_hold_runs(1)
runner = threading.Thread(target=prog.backward)
runner.start()
while lib.pg_held_runs() < 1:
    threading.Event().wait(0.001)
"""


@needs_run_hook
@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork()")
def test_a_forked_child_takes_over_a_run_another_thread_was_in():
    """fork() while another thread's backward() is inside C (held by a test
    hook): in the child that thread is gone, its run mark left set and its
    grads half made.  The child's first run takes the mark over, sets the
    grads back to 0 and replays as a fresh graph; the parent's run then
    finishes as one backward()."""
    out = run_python("""
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                lib.pg_hold_runs(0)
                a.grad = b.grad = 0.0
                prog.forward()
                prog.backward()
                code = 0 if (a.grad, b.grad) == fresh_grads() else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        lib.pg_hold_runs(0)
        runner.join()
        print(os.WEXITSTATUS(status), (a.grad, b.grad) == fresh_grads())
    """, timeout=60, prelude=HELD_RUN)
    assert out.split() == ["0", "True"]


@needs_run_hook
def test_a_program_refuses_a_second_run_even_with_its_lock_replaced():
    """Another thread's backward() is inside C; this thread replaces the
    Program's lock (so the Python lock no longer keeps them apart) and calls
    forward() and backward(): C's run mark refuses each with a
    RuntimeError, nothing done; the held run then finishes as one
    backward() would, and the program runs on."""
    out = run_python("""
        prog._lock = CallLock("busy")
        said = []
        for call in (prog.forward, prog.backward):
            try:
                call()
            except RuntimeError as e:
                said.append("another thread runs this Program" in str(e))
        lib.pg_hold_runs(0)
        runner.join()
        once = (a.grad, b.grad) == fresh_grads()
        a.grad = b.grad = 0.0
        prog.backward()
        print(said == [True, True], once, (a.grad, b.grad) == fresh_grads(),
              prog.forward() == y.data)
    """, timeout=60, prelude=HELD_RUN)
    assert out.split() == ["True"] * 4


@needs_run_hook
def test_a_per_length_refuses_a_second_run_of_a_length_even_with_its_lock_replaced():
    """Another thread's loss() of a length is inside C (its one-hot inputs
    set and its program run are one C call, held by a test hook); this
    thread replaces the PerLength's lock and asks for the same length's
    loss of other tokens: a RuntimeError, nothing done; the held call's
    loss is its own tokens', and the next calls are each their own."""
    out = run_python("""
        import threading
        import pygrad
        from pygrad import Value
        from pygrad._core import lib
        from pygrad.replay import CallLock
        W = [Value(10.0 ** i) for i in range(4)]
        train = pygrad.per_length(lambda toks: pygrad.sum(pygrad.pick(W, t) for t in toks), 4)
        la, lb = train.loss([1, 2]), train.loss([3, 0])
        got = {}
        lib.pg_hold_runs(1)
        runner = threading.Thread(target=lambda: got.setdefault("a", train.loss([1, 2])))
        runner.start()
        while lib.pg_held_runs() < 1:
            threading.Event().wait(0.001)
        train._lock = CallLock("busy")
        try:
            train.loss([3, 0])
        except RuntimeError as e:
            got["b"] = "another thread runs" in str(e)
        lib.pg_hold_runs(0)
        runner.join()
        print(got == {"a": la, "b": True}, train.loss([3, 0]) == lb, train.loss([1, 2]) == la)
    """, timeout=60)
    assert out.split() == ["True"] * 3


# --- 10. a Ctrl-C during the lazy numpy import -------------------------------

# Each point broke numpy differently: "cannot load module more than once per
# process", "module 'numpy' has no attribute 'maximum'", a RecursionError.
@pytest.mark.parametrize("where", ["numpy.dtypes", "numpy._core.arrayprint",
                                   "numpy.lib._function_base_impl"])
def test_a_ctrl_c_during_the_lazy_numpy_import_leaves_numpy_usable(where):
    """SIGINT is raised (by an import hook) as numpy starts importing
    ``where``: the first compile(inputs=...) gets the KeyboardInterrupt, and
    the next map works with a whole numpy (it used to keep a half-imported
    one: "module 'numpy' has no attribute 'maximum'")."""
    out = run_python(f"""
        import os, signal, sys
        import pygrad
        from pygrad import Value
        assert "numpy" not in sys.modules

        class CtrlC:
            def find_spec(self, name, path=None, target=None):
                if name == {where!r}:
                    sys.meta_path.remove(self)
                    # raise() signals this thread, so the handler runs at
                    # its next bytecode; os.kill may land on a thread numpy
                    # started, and then the main thread runs on for a while.
                    signal.raise_signal(signal.SIGINT)
                return None
        sys.meta_path.insert(0, CtrlC())
        x = Value(0.0)
        try:
            pygrad.compile((x * 2).tanh(), inputs=[x])
            print("no interrupt")
        except KeyboardInterrupt:
            print("interrupted")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        prog = pygrad.compile((x * 2).tanh(), inputs=[x])
        got = prog.map([[0.25], [0.5]])
        import numpy as np
        assert got.tolist() == [(Value(v) * 2).tanh().data for v in (0.25, 0.5)]
        print(repr(np.max(got)), np.linalg.norm(got) > 0)
    """, timeout=60)
    lines = out.split("\n")
    assert lines[0] == "interrupted", out
    assert lines[1].endswith("True"), out
