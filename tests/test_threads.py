"""Threads building and backpropagating their own graphs at once.  The C
core guards its state with a lock of its own: its long calls (backward,
layers, replay) run without the GIL, and a short call that must wait for
the lock waits without the GIL too (csrc/cffi_build.py, pg_lock)."""
import random
import subprocess
import sys
import threading
import traceback

import internals
import gc

import pytest

from pygrad import Value
from pygrad._core import lib

from training import TIERS, moons_model, train_moons


def train(seed: int, steps: int = 15, width: int = 400):
    """A small random model trained by plain SGD; returns every loss and the
    final parameters."""
    rng = random.Random(seed)
    params = [Value(rng.uniform(-1, 1)) for _ in range(8)]
    losses = []
    for _ in range(steps):
        xs = [Value(rng.uniform(-1, 1)) for _ in range(8)]
        h = [sum((p * x for p, x in zip(params, xs)), Value(0.0)).tanh()]
        for i in range(width):
            a = h[rng.randrange(len(h))]
            b = params[i % 8] if i % 2 else h[-1]
            h.append((a * b + 0.1).relu() if i % 3 else (a - b).tanh())
        loss = sum(h[-20:], Value(0.0)) ** 2
        loss.backward()
        losses.append(loss.data)
        for p in params:
            p.data -= 0.01 * p.grad
            p.grad = 0.0
    return losses, [p.data for p in params]


def run_in_threads(fn, args_list):
    results = [None] * len(args_list)
    errors = []

    def worker(i, args):
        try:
            results[i] = fn(*args)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i, a)) for i, a in enumerate(args_list)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, "".join(traceback.format_exception(errors[0]))
    return results


def test_four_threads_match_the_same_runs_one_after_another():
    seeds = [11, 22, 33, 44]
    serial = [train(s) for s in seeds]
    parallel = run_in_threads(train, [(s,) for s in seeds])
    assert parallel == serial


def test_a_graph_built_in_one_thread_backprops_in_another():
    a, b = Value(1.5), Value(-2.0)
    built = run_in_threads(lambda: ((a * b).tanh() + a ** 2) * b, [()])[0]
    run_in_threads(built.backward, [()])
    expected_a, expected_b = Value(1.5), Value(-2.0)
    ref = ((expected_a * expected_b).tanh() + expected_a ** 2) * expected_b
    ref.backward()
    assert (a.grad, b.grad) == (expected_a.grad, expected_b.grad)
    assert built.data == ref.data


@pytest.fixture
def frequent_thread_switches():
    """Switch threads as often as CPython allows, to interleave more."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def train_new_model(seed: int, tier: str):
    return train_moons(moons_model(seed, tier), seed, tier, steps=30)


@pytest.mark.slow      # 7 s; test_four_threads_match_the_same_runs_one_after_another stays
def test_four_threads_train_their_own_models_bit_identically(frequent_thread_switches):
    jobs = list(enumerate(["eager", "fused", "replay", "fused"]))
    serial = [train_new_model(seed, tier) for seed, tier in jobs]
    parallel = run_in_threads(train_new_model, jobs)
    assert parallel == serial
    assert all(sum(h[-5:]) < sum(h[:5]) for h, _ in serial)     # they really trained


@pytest.mark.parametrize("tier", [pytest.param(t, marks=pytest.mark.slow) if t == "eager" else t
                                  for t in TIERS])     # eager: 7 s, the other tiers stay
def test_a_model_built_in_one_thread_trains_in_another(tier):
    expected = train_new_model(7, tier)
    model = run_in_threads(moons_model, [(7, tier)])[0]
    assert run_in_threads(train_moons, [(model, 7, tier, 30)])[0] == expected


def test_threads_making_leaves_while_the_registry_purges(frequent_thread_switches):
    """Leaves register themselves without a lock; the purge of dead entries
    runs in whichever thread makes the table double.  No thread may see the
    table change under it, and every kept Value stays the one its node
    hands back (its parent's _prev)."""
    def work(seed):
        kept = []
        for i in range(16000):
            v = Value(float(i))
            if i % 2 == seed % 2:       # a big table: purges take long
                kept.append(v)
        return [(v, (v * 1.0)._prev) for v in kept[::200]]
    for kept in run_in_threads(work, [(k,) for k in range(4)]):
        assert kept and all(any(p is v for p in prev) for v, prev in kept)


def deep_chain(n: int):
    x, w = Value(0.5), Value(0.999999)
    y = x
    for _ in range(n):
        y = y * w + 0.000001
    return x, w, y


def test_short_calls_wait_for_a_long_backward_in_another_thread(frequent_thread_switches):
    """Ops, reads and writes (calls that keep the GIL) keep meeting the lock
    held by long backward() calls (that run without it): nothing deadlocks,
    and every number is the one a run alone gives."""
    def backprop(rounds):
        x, w, y = deep_chain(60000)
        grads = []
        for _ in range(rounds):
            y.backward()
            grads.append((x.grad, w.grad))
        return grads

    def small_ops(seed):
        return train(seed, steps=6, width=150)

    serial = [backprop(30), backprop(30), small_ops(5), small_ops(6)]
    together = run_in_threads(lambda job, arg: job(arg), [(backprop, 30), (backprop, 30),
                                                          (small_ops, 5), (small_ops, 6)])
    assert together == serial


def test_the_interpreter_exits_while_daemon_threads_are_in_the_core(tmp_path):
    """A daemon thread stopped at exit as it retakes the GIL holds no lock of
    the core's, so the main thread's last calls (Values freed at exit) and
    the exit itself go through."""
    code = """
import threading, time
from pygrad import Value
def busy():
    w = Value(0.5)
    while True:
        y = w
        for _ in range(3000):
            y = y * 1.0001 + 0.001
        y.backward()
        w.grad = 0.0
for _ in range(3):
    threading.Thread(target=busy, daemon=True).start()
time.sleep(0.3)
kept = [Value(float(i)) * 2.0 for i in range(5000)]
print("done", sum(v.data for v in kept))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)     # not the uncompiled source tree
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["done", repr(float(sum(2.0 * i for i in range(5000))))]


def test_threads_making_custom_op_values_while_the_registry_purges(frequent_thread_switches):
    """A custom op's Value registers itself as it is made, and the purge of
    dead entries runs in whichever thread makes the registry double: no
    purge may meet another, nor drop an entry written meanwhile.  Every kept
    custom Value stays the one its node hands back."""
    def work(seed):
        base = Value(1.0)
        kept = []
        for i in range(20000):
            v = Value(float(i), (base,), "mine")
            if i % 500 == seed:
                kept.append(v)
        return [(v, (v * 1.0)._prev) for v in kept]
    for kept in run_in_threads(work, [(k,) for k in range(4)]):
        assert len(kept) == 40 and all(any(p is v for p in prev) for v, prev in kept)


def test_a_big_graph_dies_while_another_thread_builds(frequent_thread_switches):
    """Dropping a graph of 300k nodes while another thread trains: the other
    thread's numbers are those of a run alone, and once both are done every
    node either made is freed (live nodes back where they were)."""
    def drop_big():
        x, w, y = deep_chain(100000)
        y.backward()
        grads = (x.grad, w.grad)
        del x, w, y
        return grads

    gc.collect()
    before = internals.live_nodes()
    alone = train(9, steps=4, width=150)
    dropped, together = run_in_threads(lambda job: job(), [(drop_big,),
                                                          (lambda: train(9, steps=4, width=150),)])
    assert together == alone
    gc.collect()
    assert internals.live_nodes() == before



# -- a wait for the sweep lock is one Ctrl-C can end -------------------------

def _calls_that_walk():
    import numpy as np
    import pygrad

    def graph():
        x = Value(0.5)
        return x, (x * 2.0).tanh()

    def backward():
        x, y = graph()
        y.backward()
        return x.grad

    def grad():
        x, y = graph()
        return pygrad.grad(y, [x])[0].data

    def hvp():
        x, _ = graph()
        return pygrad.hvp(lambda v: (v * 2.0).tanh(), [x], [1.0])[0]

    def compile_one():
        _, y = graph()
        return pygrad.compile(y).forward()

    def compile_rows():
        x, y = graph()
        return float(pygrad.compile(y, inputs=[x]).map(np.array([[0.5]]))[0])

    def per_length():
        w = [Value(0.5), Value(1.5)]
        return pygrad.per_length(lambda toks: pygrad.pick(w, toks[0]) * 2.0, 2).loss([1])

    return {f.__name__: f for f in (backward, grad, hvp, compile_one, compile_rows, per_length)}


@pytest.mark.skipif(not hasattr(lib, "pg_test_hold_sweep_lock"),
                    reason="needs a test build's hooks (PYGRAD_TEST_HOOKS=1: .ci/sanitize)")
@pytest.mark.parametrize("name", sorted(_calls_that_walk()))
def test_a_ctrl_c_ends_a_wait_for_the_sweep_lock(name):
    """Another thread holds the sweep lock (as a long walk would).  This
    thread's call waits for it in tries, between which Python runs signals:
    a SIGINT sent once a try found the lock taken ends the call with
    KeyboardInterrupt, and the same call works once the lock is free."""
    import signal
    import time
    call = _calls_that_walk()[name]
    want = call()
    main, held, release, waited = threading.get_ident(), threading.Event(), threading.Event(), []

    def holder():
        lib.pg_test_hold_sweep_lock(1)          # (taken and freed by this thread)
        held.set()
        for _ in range(120_000):                # until the call has found it taken
            if lib.pg_sweep_lock_waits() or release.is_set():
                break
            time.sleep(0.001)
        if lib.pg_sweep_lock_waits():
            waited.append(True)
            signal.pthread_kill(main, signal.SIGINT)
        release.wait(120)
        lib.pg_test_hold_sweep_lock(0)

    t = threading.Thread(target=holder)
    t.start()
    try:
        held.wait(60)
        with pytest.raises(KeyboardInterrupt):
            call()
            time.sleep(5)        # (not reached: a call that did not wait fails the check below)
    finally:
        release.set()
        t.join(60)
    assert waited, f"{name} never tried the sweep lock while another thread held it"
    assert call() == want
