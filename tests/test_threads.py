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

