"""Program.train_step (one C call per training step) and threaded map
(csrc/batch.c): the fused step is the three separate calls bit for bit,
every thread count gives the same bits, bad input is refused before
anything changes, and a fork while a threaded map runs is safe."""
import os
import random
import threading

import numpy as np
import pytest

import pygrad
from pygrad import Value, nn, optim
from pygrad._core import lib

from batched import same_bits, step_both_ways
from pygrad.reference import Value as RefValue

CHUNK = lib.PG_CHUNK_ROWS


def moons_program(H=16, n=700, seed=0, outputs=1):
    """A moons-style hinge-loss program over n rows (more than two chunks)."""
    random.seed(seed)
    model = nn.MLP(2, [H, H, outputs])
    rng = np.random.default_rng(seed)
    rows = np.column_stack([rng.normal(size=n), rng.normal(size=n),
                            rng.choice([-1.0, 1.0], size=n)])
    x = [Value(0.0), Value(0.0)]
    yi = Value(0.0)
    out = model(x)
    loss = (1 + -yi * (out if outputs == 1 else out[0])).relu()
    prog = pygrad.compile(loss, inputs=x + [yi])
    return model, prog, rows


def make_opt(kind, params):
    if kind == "sgd":
        return optim.SGD(params, lr=0.1, weight_decay=2e-4)
    if kind == "momentum":
        return optim.SGD(params, lr=lambda t: 0.1 / (1 + t), momentum=0.9)
    return optim.Adam(params, lr=0.01, weight_decay=1e-4)


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam"])
def test_train_step_is_the_three_calls_bit_for_bit(kind):
    model_a, prog_a, rows = moons_program(seed=1)
    model_b, prog_b, _ = moons_program(seed=1)
    opt_a, opt_b = make_opt(kind, model_a.parameters()), make_opt(kind, model_b.parameters())
    w = np.full(len(rows), 1.0 / len(rows))
    for _ in range(4):
        step_both_ways(prog_a, opt_a, model_a, prog_b, opt_b, model_b, rows, w)
    assert opt_b.steps == opt_a.steps == 4
    for name in opt_a._STATE:
        assert same_bits(getattr(opt_a, name), getattr(opt_b, name))


@pytest.mark.parametrize("n", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17])
def test_every_thread_count_gives_the_same_bits(n):
    model, prog, rows = moons_program(seed=2, n=max(n, 1))
    rows = rows[:n]
    w = np.random.default_rng(n).normal(size=n)
    results = []
    for threads in (1, 2, 3, 4):
        prog.threads = threads
        model.zero_grad()
        out = prog.map(rows, grad=w)
        results.append((out, model.get_grad()))
    for out, grads in results[1:]:
        assert same_bits(out, results[0][0])
        assert same_bits(grads, results[0][1])


def test_threaded_train_steps_give_the_same_bits():
    runs = []
    for threads in (1, 2, 4):
        model, prog, rows = moons_program(H=8, seed=3, n=2 * CHUNK + 5)
        prog.threads = threads
        opt = optim.Adam(model.parameters(), lr=0.01)
        w = np.full(len(rows), 1.0 / len(rows))
        losses = [prog.train_step(rows, w, opt) for _ in range(3)]
        runs.append((losses, model.get_data()))
    for losses, data in runs[1:]:
        assert all(same_bits(a, b) for a, b in zip(losses, runs[0][0]))
        assert same_bits(data, runs[0][1])


def test_chunk_order_is_the_documented_one():
    # One weight, one input, out = w * x: w's grad is sum_r x_r, in chunks.
    w, x = Value(0.5), Value(0.0)
    prog = pygrad.compile(w * x, inputs=[x])
    xs = np.random.default_rng(7).normal(size=2 * CHUNK + 3) * 1e3
    w.grad = 0.25
    prog.threads = 2
    prog.map(xs, grad=np.ones(len(xs)))
    acc = 0.25
    for r in range(CHUNK):
        acc = acc + xs[r]
    for c0 in range(CHUNK, len(xs), CHUNK):
        part = -0.0
        for r in range(c0, min(c0 + CHUNK, len(xs))):
            part = part + xs[r]
        acc = acc + part
    assert w.grad == acc


def test_threads_setting():
    _, prog, _ = moons_program(H=4, n=4)
    assert prog.threads is None
    assert pygrad.replay.default_threads() >= 1
    prog.threads = 3
    assert prog.threads == 3
    prog.threads = None
    for bad in (0, 65, -1):
        with pytest.raises(ValueError, match="threads"):
            prog.threads = bad
    for bad in (1.5, "2", True):
        with pytest.raises(TypeError, match="threads"):
            prog.threads = bad
    assert lib.pg_batch_run(prog._batch, pygrad._core.ffi.NULL, 0, pygrad._core.ffi.NULL,
                            pygrad._core.ffi.NULL, 0) == lib.PG_E_ARG


def test_train_step_bad_input_changes_nothing():
    model, prog, rows = moons_program(H=4, n=10, seed=4)
    opt = optim.SGD(model.parameters(), lr=0.1)
    w = np.full(len(rows), 0.1)
    before = model.get_data()
    with pytest.raises(TypeError, match="SGD or Adam"):
        prog.train_step(rows, w, object())
    with pytest.raises(TypeError, match="grad"):
        prog.train_step(rows, None, opt)
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        prog.train_step(rows[:, :2], w, opt)
    with pytest.raises(ValueError, match=r"shape \(10,\)"):
        prog.train_step(rows, w[:5], opt)
    with pytest.raises(TypeError, match="numbers"):
        prog.train_step([["a", "b", "c"]], [1.0], opt)
    with pytest.raises(TypeError, match="inputs="):
        pygrad.compile(model([Value(1.0), Value(2.0)])).train_step(rows, w, opt)

    class Mine(optim.SGD):
        def _step(self, lr):
            pass
    with pytest.raises(TypeError, match="overrides _step"):
        prog.train_step(rows, w, Mine(model.parameters()))
    ref = optim.SGD([RefValue(1.0)])
    with pytest.raises(TypeError, match="reference"):
        prog.train_step(rows, w, ref)
    # A state array that was made too short behind the optimizer's back.
    opt._state["velocity"] = np.zeros(1)
    opt._views["velocity"] = pygrad._core.ffi.from_buffer("double[]", opt._state["velocity"])
    with pytest.raises(ValueError, match="state"):
        prog.train_step(rows, w, opt)
    assert same_bits(model.get_data(), before)
    assert opt.steps == 0
    opt.velocity = np.zeros(len(opt.params))
    prog.train_step(rows, w, opt)
    assert opt.steps == 1 and not same_bits(model.get_data(), before)


def test_train_step_on_a_pickled_optimizer():
    import pickle
    model, prog, rows = moons_program(H=4, n=10, seed=5)
    opt = optim.Adam(model.parameters(), lr=0.01)
    w = np.full(len(rows), 0.1)
    prog.train_step(rows, w, opt)
    again = pickle.loads(pickle.dumps(opt))
    assert again.steps == 1 and not any("fused" in k for k in vars(again))
    assert again.m.tolist() == opt.m.tolist() and again.v.tolist() == opt.v.tolist()


needs_hooks = pytest.mark.skipif(not hasattr(lib, "pg_hold_workers"),
                                 reason="needs a test build (PYGRAD_TEST_HOOKS=1)")


@needs_hooks
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
def test_fork_while_a_threaded_map_runs():
    """A thread runs a 4-thread map; its three extra threads are held (test
    hook) while the main thread forks.  The child runs a threaded map of its
    own on the same program and gets the right bits; the parent's map then
    finishes with the right bits too.  No timing: the hook says when the
    workers are held."""
    import warnings
    model, prog, rows = moons_program(H=8, seed=6, n=4 * CHUNK)
    prog.threads = 1
    want = prog.map(rows)
    prog.threads = 4
    got = []
    lib.pg_hold_workers(1)
    try:
        runner = threading.Thread(target=lambda: got.append(prog.map(rows)))
        runner.start()
        while lib.pg_held_workers() < 3:
            threading.Event().wait(0.001)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)   # 3.12: fork with threads
            pid = os.fork()
        if pid == 0:                                  # pragma: no cover - the child
            code = 1
            try:
                lib.pg_hold_workers(0)
                code = 0 if same_bits(prog.map(rows), want) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        lib.pg_hold_workers(0)
    runner.join()
    assert same_bits(got[0], want)


@needs_hooks
def test_out_of_memory_in_a_threaded_run():
    model, prog, rows = moons_program(H=8, seed=8, n=3 * CHUNK)
    prog.threads = 1
    w = np.ones(len(rows))
    model.zero_grad()
    want = prog.map(rows, grad=w), model.get_grad()
    for k in range(1, 40):
        prog2 = pygrad.compile(prog.output, inputs=prog.inputs)
        prog2.threads = 3
        model.zero_grad()
        lib.pg_fail_alloc(k)
        try:
            out = prog2.map(rows, grad=w)
        except MemoryError:
            assert not model.get_grad().any()         # nothing was summed
            continue
        finally:
            lib.pg_fail_alloc(0)
        # Fewer workers than asked (or none failed): the same bits.
        assert same_bits(out, want[0]) and same_bits(model.get_grad(), want[1])
