"""The batched tier (issue 39) attacked: Program.train_step and the threaded
map (csrc/batch.c).  Adversarial cases: every thread count against one
thread and against the eager per-row loop, the fused step against the three
separate calls, bad input, allocation failure at every allocation of a
threaded step, fork and exit while detached threads may be alive."""
import os
import random
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import pygrad
from pygrad import Value, nn, optim
from pygrad._core import lib

from batched import bits, bits_per_thread_count, one_step, same_bits, step_both_ways

CHUNK = lib.PG_CHUNK_ROWS
ROWS = [0, 1, 255, 256, 257, 1000, 10001]

needs_hooks = pytest.mark.skipif(not hasattr(lib, "pg_fail_alloc"),
                                 reason="needs a test build (PYGRAD_TEST_HOOKS=1)")


def two_output_model(seed=0, H=9):
    """A model with whole layers (>= 4 neurons), a shared weight used twice
    and two outputs, over 3 per-row inputs."""
    random.seed(seed)
    model = nn.MLP(3, [H, 12, 2])
    shared = Value(0.75)
    x = [Value(0.0) for _ in range(3)]

    def build(v):
        o = model(v)
        return [o[0] * o[1] + (o[0] * shared).tanh(), (o[1] - shared).relu() + shared * v[2]]
    prog = pygrad.compile(build(x), inputs=x)
    return model, shared, build, prog


def params_of(model, shared):
    return model.parameters() + [shared]


def grads(ps):
    return np.array([p.grad for p in ps])


def set_grads(ps, value):
    for p in ps:
        p.grad = value


# --- every thread count, every awkward row count -------------------------

@pytest.mark.parametrize("n", ROWS)
def test_map_bits_for_threads_1_to_8(n):
    model, shared, _, prog = two_output_model(seed=n % 7)
    ps = params_of(model, shared)
    rng = np.random.default_rng(n)
    rows, w = rng.normal(size=(n, 3)), rng.normal(size=(n, 2))
    seen = set()
    for threads in range(1, 9):
        prog.threads = threads
        set_grads(ps, 0.5)                       # chunk 0 starts from the grads as they are
        out = prog.map(rows, grad=w)
        seen.add((bits(out).tobytes(), bits(grads(ps)).tobytes()))
        # forward only: the same outputs, no grad touched
        set_grads(ps, 0.5)
        assert same_bits(prog.map(rows), out)
        assert (grads(ps) == 0.5).all()
    assert len(seen) == 1


@pytest.mark.parametrize("n", [1, 255, 257, 1000])
def test_threaded_map_is_the_eager_loop_in_chunk_order(n):
    """w all ones: each row's backward() on its own eager graph, in chunks
    of 256 (chunk 0 from the grads as they were, others from -0.0), the
    chunks' sums added in order; outputs bit for bit."""
    model, shared, build, prog = two_output_model(seed=3)
    ps = params_of(model, shared)
    rows = np.random.default_rng(n + 1).normal(size=(n, 3))
    prog.threads = 5
    set_grads(ps, 0.25)
    out = prog.map(rows, grad=np.ones((n, 2)))
    got = grads(ps)

    set_grads(ps, 0.25)
    eager_out, total = [], None
    for c0 in range(0, n, CHUNK):
        if c0:
            set_grads(ps, -0.0)
        for row in rows[c0:c0 + CHUNK]:
            o = build([Value(float(v)) for v in row])
            eager_out.append([v.data for v in o])
            o[0].backward()
            build([Value(float(v)) for v in row])[1].backward()   # a fresh graph per output
        part = grads(ps)
        total = part if total is None else total + part
    assert same_bits(out, np.array(eager_out))
    # two outputs: map seeds both outputs' grads and sweeps once; eager here
    # runs one backward() per output, so compare to 1e-12 (the order differs)
    np.testing.assert_allclose(got, total, rtol=1e-12, atol=1e-12)


def test_nan_and_inf_rows_same_bits_for_every_thread_count():
    model, shared, _, prog = two_output_model(seed=4)
    ps = params_of(model, shared)
    rng = np.random.default_rng(4)
    rows = rng.normal(size=(3 * CHUNK + 9, 3))
    rows[3, 0], rows[300, 1], rows[600, 2], rows[601, 0] = np.nan, np.inf, -np.inf, np.inf
    rows[700, :] = [np.inf, -np.inf, np.nan]
    w = rng.normal(size=(len(rows), 2))
    seen = bits_per_thread_count(prog, ps, rows, w, (1, 2, 3, 8), 0.0)
    assert len(seen) == 1


def test_random_graphs_same_bits_for_every_thread_count():
    """Random graphs (shared leaves used several times, constants, several
    outputs, awkward row counts): threads 1, 2, 3 and 6 give the same bits."""
    for seed in range(60):
        rnd = random.Random(seed)
        ni = rnd.randint(1, 4)
        xs = [Value(0.0) for _ in range(ni)]
        ps = [Value(rnd.uniform(-1, 1)) for _ in range(rnd.randint(1, 6))]
        pool = xs + ps
        for _ in range(rnd.randint(3, 25)):
            a, b = rnd.choice(pool), rnd.choice(pool)
            pool.append([lambda: a + b, lambda: a * b, lambda: a - b, lambda: (a * 0.5).tanh(),
                         lambda: a.relu(), lambda: (a * 0.1).exp(), lambda: a * 2.0 + 1,
                         lambda: a + b + a, lambda: (a * a + 1).log()][rnd.randrange(9)]())
        outs = pool[-rnd.randint(1, 3):]
        prog = pygrad.compile(outs, inputs=xs)
        n = rnd.choice([1, 255, 256, 257, 600, 1300])
        rows = np.random.default_rng(seed).normal(size=(n, ni))
        w = np.random.default_rng(seed + 1).normal(size=(n, len(outs)))
        seen = bits_per_thread_count(prog, ps, rows, w, (1, 2, 3, 6), 0.3)
        assert len(seen) == 1, f"seed {seed}"


# --- train_step against the three calls ----------------------------------

def moons(seed, n, H=8):
    random.seed(seed)
    model = nn.MLP(2, [H, H, 1])
    rng = np.random.default_rng(seed)
    rows = np.column_stack([rng.normal(size=n), rng.normal(size=n),
                            rng.choice([-1.0, 1.0], size=n)])
    x, y = [Value(0.0), Value(0.0)], Value(0.0)
    prog = pygrad.compile((1 + -y * model(x)).relu() + 1e-3 * model(x) ** 2, inputs=x + [y])
    return model, prog, rows


OPTS = {
    "sgd_wd": lambda ps: optim.SGD(ps, lr=0.1, weight_decay=2e-3),
    "sgd_mom_wd_sched": lambda ps: optim.SGD(ps, lr=lambda t: 0.2 / (1 + t), momentum=0.9,
                                             weight_decay=1e-3),
    "adam": lambda ps: optim.Adam(ps, lr=0.01),
    "adam_wd": lambda ps: optim.Adam(ps, lr=0.02, betas=(0.8, 0.99), weight_decay=1e-2),
}


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
@pytest.mark.parametrize("kind", sorted(OPTS))
def test_train_step_is_three_calls_for_every_thread_count(kind, threads):
    n = 4 * CHUNK + 3
    model_a, prog_a, rows = moons(11, n)
    model_b, prog_b, _ = moons(11, n)
    prog_a.threads = 1                      # the separate calls, one thread
    prog_b.threads = threads
    opt_a, opt_b = OPTS[kind](model_a.parameters()), OPTS[kind](model_b.parameters())
    w = np.random.default_rng(5).uniform(size=n) / n
    for step in range(5):
        # a parameter edited between steps is read again
        if step == 2:
            model_a.parameters()[3].data = 0.125
            model_b.parameters()[3].data = 0.125
        step_both_ways(prog_a, opt_a, model_a, prog_b, opt_b, model_b, rows, w)
    for name in opt_a._STATE:
        assert same_bits(getattr(opt_a, name), getattr(opt_b, name))
    assert opt_a.steps == opt_b.steps == 5


def test_train_step_with_an_optimizer_over_other_parameters():
    """Optimizer over a subset of the program's parameters plus a Value the
    program does not use: exactly the three calls."""
    n = 2 * CHUNK + 1
    runs = []
    for fused in (False, True):
        model, prog, rows = moons(12, n)
        prog.threads = 3
        outside = Value(2.0)
        ps = model.parameters()
        opt = optim.SGD(ps[::2] + [outside], lr=0.05, weight_decay=0.1)
        for p in ps:
            p.grad = 1.0
        outside.grad = 3.0
        w = np.full(n, 1.0 / n)
        for _ in range(3):
            one_step(prog, opt, rows, w, fused)
        runs.append((model.get_data(), model.get_grad(), outside.data, outside.grad))
    for a, b in zip(*runs):
        assert same_bits(a, b)


def test_train_step_honours_a_subclass_step():
    """A subclass that clips the grads in step() (not _step): train_step
    must either run it or refuse (TypeError), never silently skip it."""
    class ClippedSGD(optim.SGD):
        def step(self):
            for p in self.params:
                p.grad = max(-1e-3, min(1e-3, p.grad))
            super().step()

    n = CHUNK + 5
    model_a, prog_a, rows = moons(13, n)
    model_b, prog_b, _ = moons(13, n)
    opt_a, opt_b = ClippedSGD(model_a.parameters(), lr=1.0), ClippedSGD(model_b.parameters(), lr=1.0)
    w = np.ones(n)
    opt_a.zero_grad()
    prog_a.map(rows, grad=w)
    opt_a.step()
    try:
        prog_b.train_step(rows, w, opt_b)
    except TypeError:
        return
    assert same_bits(model_a.get_data(), model_b.get_data())


def test_train_step_honours_a_subclass_zero_grad():
    class NoZero(optim.SGD):          # gradient accumulation across steps
        def zero_grad(self):
            pass

    n = 300
    model_a, prog_a, rows = moons(14, n)
    model_b, prog_b, _ = moons(14, n)
    opt_a, opt_b = NoZero(model_a.parameters(), lr=0.1), NoZero(model_b.parameters(), lr=0.1)
    w = np.full(n, 1.0 / n)
    for _ in range(2):
        opt_a.zero_grad()
        prog_a.map(rows, grad=w)
        opt_a.step()
    try:
        for _ in range(2):
            prog_b.train_step(rows, w, opt_b)
    except TypeError:
        return
    assert same_bits(model_a.get_data(), model_b.get_data())


def test_train_step_follows_state_and_steps_replaced_between_steps():
    """Adam's m and v assigned anew, and steps reset, between fused steps:
    the next fused step uses them, as step() does."""
    n = CHUNK + 3
    runs = []
    for fused in (False, True):
        model, prog, rows = moons(19, n)
        prog.threads = 2
        opt = optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-3)
        w = np.full(n, 1.0 / n)
        for step in range(4):
            if step == 2:
                opt.m = np.full(len(opt.params), 1e-3)
                opt.v = np.full(len(opt.params), 1e-4)
                opt.steps = 0
            one_step(prog, opt, rows, w, fused)
        runs.append((model.get_data(), opt.m.copy(), opt.v.copy(), opt.steps))
    for a, b in zip(*runs):
        assert same_bits(a, b)


# --- bad input ------------------------------------------------------------

def test_threads_takes_a_numpy_int():
    _, prog, _ = moons(15, 4)
    prog.threads = np.int64(2)          # what range()/np.arange loops hand out
    assert prog.threads == 2


@pytest.mark.parametrize("bad", [0, -1, 65, 2 ** 40, 2 ** 64])
def test_threads_out_of_range(bad):
    _, prog, _ = moons(15, 4)
    with pytest.raises(ValueError, match="threads"):
        prog.threads = bad
    assert prog.threads is None


@pytest.mark.parametrize("bad", [2.0, "3", True, False, [2], None.__class__])
def test_threads_wrong_type(bad):
    _, prog, _ = moons(15, 4)
    with pytest.raises(TypeError, match="threads"):
        prog.threads = bad


def test_train_step_converts_odd_arrays_like_map():
    """float32, Fortran order, strided, big-endian, lists: train_step gives
    the bits of the contiguous float64 array."""
    n = CHUNK + 9
    model, prog, rows = moons(16, n)
    prog.threads = 2
    w = np.full(n, 1.0 / n)
    start = model.get_data()
    opt = optim.SGD(model.parameters(), lr=0.1)
    want = prog.train_step(rows, w, opt), model.get_data()
    variants = [
        (np.asfortranarray(rows), w),
        (np.repeat(rows, 2, axis=0)[::2], np.repeat(w, 2)[::2]),
        (rows.astype(">f8"), w.astype(">f8")),
        (rows.tolist(), w.tolist()),
        (rows, w.reshape(n, 1)),
    ]
    for r, g in variants:
        model.set_data(start)
        opt = optim.SGD(model.parameters(), lr=0.1)
        got = prog.train_step(r, g, opt)
        assert same_bits(got, want[0]) and same_bits(model.get_data(), want[1])
    with pytest.raises(TypeError):
        prog.train_step(rows.astype(complex), w, opt)
    with pytest.raises(ValueError):
        prog.train_step(rows, w[:-1], opt)
    with pytest.raises(ValueError):
        prog.train_step(rows[:, :2], w, opt)


def test_misaligned_float64_rows():
    """A C-contiguous float64 array at an odd address (np.frombuffer with
    an offset) takes the fast path to C as it is: C reads its doubles
    through double *, which must be aligned: under .ci/sanitize UBSan stops
    at csrc/batch.c run_block (load of misaligned address).  map had this
    before the branch (real_array keeps a misaligned array); the new fast
    path in Program._rows and train_step take it too.  The results must be
    the aligned copy's."""
    n = CHUNK + 5
    model, prog, rows = moons(24, n)
    prog.threads = 2
    buf = bytearray(rows.nbytes + 1)
    odd = np.frombuffer(buf, dtype=np.float64, offset=1, count=rows.size).reshape(rows.shape)
    odd[...] = rows
    assert not odd.flags.aligned and odd.flags.c_contiguous
    wbuf = bytearray(8 * n + 1)
    wodd = np.frombuffer(wbuf, dtype=np.float64, offset=1, count=n)
    wodd[...] = 1.0 / n
    start = model.get_data()
    want = prog.train_step(rows, wodd.copy(), optim.SGD(model.parameters(), lr=0.1)), model.get_data()
    model.set_data(start)
    got = prog.train_step(odd, wodd, optim.SGD(model.parameters(), lr=0.1))
    assert same_bits(got, want[0]) and same_bits(model.get_data(), want[1])
    assert same_bits(prog.map(odd), prog.map(rows))


def test_exit_while_a_daemon_thread_is_inside_a_threaded_train_step():
    code = """
        import random, threading, numpy as np, pygrad
        from pygrad import Value, nn, optim
        random.seed(2); model = nn.MLP(2, [32, 32, 1])
        x = [Value(0.0), Value(0.0)]
        prog = pygrad.compile(model(x), inputs=x); prog.threads = 4
        rows = np.random.default_rng(0).normal(size=(100 * 256, 2)); w = np.ones(len(rows))
        opt = optim.Adam(model.parameters(), lr=1e-3)
        started = threading.Event()
        def loop():
            while True:
                started.set()
                prog.train_step(rows, w, opt)
        threading.Thread(target=loop, daemon=True).start()
        started.wait()
        print("ok")
        """
    for _ in range(3):
        r = run_child(code)
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# --- allocation failure in a threaded step --------------------------------

@needs_hooks
@pytest.mark.parametrize("kind", ["sgd_mom_wd_sched", "adam"])
def test_out_of_memory_at_every_allocation_of_a_threaded_train_step(kind):
    """Each allocation of a fresh program's first 3-thread train_step fails
    in turn: a MemoryError changes no data, optimizer state or step count
    (the grads: test_a_failed_train_step_leaves_the_grads_alone), or the
    step is exact; the next step is exact either way."""
    n = 3 * CHUNK + 1
    model, prog, rows = moons(17, n)
    w = np.full(n, 1.0 / n)
    start = model.get_data()
    for p in model.parameters():
        p.grad = 0.5
    start_grad = model.get_grad()

    def reference(steps):
        model.set_data(start)
        ps = model.parameters()
        for p in ps:
            p.grad = 0.5
        opt = OPTS[kind](ps)
        prog.threads = 1
        for _ in range(steps):
            opt.zero_grad()
            prog.map(rows, grad=w)
            opt.step()
        return model.get_data(), model.get_grad()
    want1, want2 = reference(1), reference(2)

    failures = 0
    for k in range(1, 60):
        model.set_data(start)
        for p, g in zip(model.parameters(), start_grad):
            p.grad = g
        opt = OPTS[kind](model.parameters())
        p2 = pygrad.compile(prog.output, inputs=prog.inputs)
        p2.threads = 3
        lib.pg_fail_alloc(k)
        try:
            p2.train_step(rows, w, opt)
        except MemoryError:
            failures += 1
            assert lib.pg_fail_alloc_pending() == 0
            assert opt.steps == 0
            assert same_bits(model.get_data(), start)
            for name in opt._STATE:
                assert not getattr(opt, name).any()
            p2.train_step(rows, w, opt)
            assert same_bits(model.get_data(), want1[0]) and same_bits(model.get_grad(), want1[1])
        else:
            assert same_bits(model.get_data(), want1[0]) and same_bits(model.get_grad(), want1[1])
        finally:
            lib.pg_fail_alloc(0)
        p2.train_step(rows, w, opt)
        assert same_bits(model.get_data(), want2[0]) and same_bits(model.get_grad(), want2[1])
    assert failures > 0


@needs_hooks
def test_a_failed_train_step_leaves_the_grads_alone():
    """pg_batch_step zeroes the optimizer's grads before pg_batch_run
    allocates the chunk sums: a MemoryError there leaves the grads zeroed,
    though nothing else changed (the docs promise the grads hold this
    step's gradients after a step, and a failed step should change nothing)."""
    n = 3 * CHUNK + 1
    model, prog, rows = moons(18, n)
    prog.threads = 2
    opt = optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = 0.5
    lib.pg_fail_alloc(1)                # the first allocation: the chunk sums
    try:
        with pytest.raises(MemoryError):
            prog.train_step(rows, np.ones(n), opt)
    finally:
        lib.pg_fail_alloc(0)
    assert (model.get_grad() == 0.5).all()


# --- memory that grows with the rows ---------------------------------------

def rss_mb():
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_chunk_sums_do_not_grow_with_the_rows():
    """batch.c keeps one array of nshared sums per 256-row chunk
    (b->partial, (chunks - 1) x nshared doubles), kept by the program after
    the call: at 1M rows and MLP(2, [64, 64, 1]) that is 133 MB more than
    main's map (which summed in place), at 10M rows 1.3 GB, even with one
    thread.  Bounded by the threads, not the rows, it would stay small."""
    random.seed(0)
    model = nn.MLP(2, [64, 64, 1])
    x = [Value(0.0), Value(0.0)]
    prog = pygrad.compile(model(x), inputs=x)
    prog.threads = 1
    n = 1_000_000
    rows = np.random.default_rng(0).normal(size=(n, 2))
    w = np.ones(n)
    prog.map(rows[:CHUNK], grad=w[:CHUNK])        # the program's fixed arrays, touched
    before = rss_mb()
    prog.map(rows, grad=w)
    grown = rss_mb() - before
    assert grown < 40, f"map over {n} rows kept {grown:.0f} MB more (chunk sums per 256 rows)"


@pytest.mark.skipif(not hasattr(lib, "pg_hold_workers"), reason="needs a test build")
def test_two_threads_train_step_one_program_one_optimizer_is_two_steps():
    """The program's lock makes two train_steps from two threads run one
    after the other, as two serial steps would: the optimizer's C
    description (its lr for this step) is filled inside the lock, so the
    second thread reads the lr and state the first step left.  The first
    step's threads are held (test hook) while the second thread starts and
    waits at the lock; both then finish, and the parameters are two serial
    steps' bits."""
    n = 2 * CHUNK
    calls = []

    def lr(t):
        calls.append(t)
        return 0.1 / (1 + t)

    model_a, prog_a, rows = moons(23, n)
    opt_a = optim.SGD(model_a.parameters(), lr=lambda t: 0.1 / (1 + t))
    w = np.full(n, 1.0 / n)
    prog_a.threads = 2
    for _ in range(2):
        prog_a.train_step(rows, w, opt_a)

    model_b, prog_b, _ = moons(23, n)
    opt_b = optim.SGD(model_b.parameters(), lr=lr)
    prog_b.threads = 2
    lib.pg_hold_workers(1)
    try:
        first = threading.Thread(target=prog_b.train_step, args=(rows, w, opt_b))
        first.start()
        while lib.pg_held_workers() < 1:
            threading.Event().wait(0.001)
        second = threading.Thread(target=prog_b.train_step, args=(rows, w, opt_b))
        second.start()
    finally:
        lib.pg_hold_workers(0)
    first.join()
    second.join()
    assert opt_b.steps == 2
    assert same_bits(model_b.get_data(), model_a.get_data()), f"lr schedule called with {calls}"


# --- fork, exit, back-to-back runs -------------------------------------------

def run_child(code, timeout=60, env=None):
    # cwd: the tests' folder, where no source tree without a core (a
    # checkout's or an sdist's) shadows the pygrad under test
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          env=env, cwd=os.path.dirname(os.path.abspath(__file__)),
                          text=True, timeout=timeout)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="this libasan's allocator is not fork-safe: a child forked while "
                           "another thread allocates can hang inside ASan itself")
def test_fork_from_a_thread_while_the_main_thread_maps():
    """No hooks: a thread forks 20 times while the main thread runs 4-thread
    maps back to back; each child runs a 4-thread map at once and must get
    the right bits (a hang is caught by the timeout)."""
    r = run_child("""
        import os, random, threading, warnings, numpy as np, pygrad
        from pygrad import Value, nn
        random.seed(1); model = nn.MLP(2, [16, 16, 1])
        x = [Value(0.0), Value(0.0)]
        prog = pygrad.compile(model(x), inputs=x)
        rows = np.random.default_rng(0).normal(size=(8 * 256, 2))
        prog.threads = 1; want = prog.map(rows, grad=np.ones(len(rows)))
        prog.threads = 4
        stop = False; bad = []
        def forker():
            warnings.simplefilter("ignore", DeprecationWarning)
            for _ in range(20):
                pid = os.fork()
                if pid == 0:
                    code = 3
                    try:
                        import signal; signal.alarm(20)
                        code = 0 if (prog.map(rows) == want).all() else 2
                    finally:
                        os._exit(code)
                import time
                for _ in range(3000):                  # a hung child is killed, not waited for
                    done, st = os.waitpid(pid, os.WNOHANG)
                    if done: break
                    time.sleep(0.01)
                else:
                    os.kill(pid, 9); os.waitpid(pid, 0); bad.append("hung"); continue
                if not (os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0): bad.append(st)
        t = threading.Thread(target=forker); t.start()
        n = 0
        while t.is_alive():
            assert (prog.map(rows, grad=np.ones(len(rows))) == want).all(); n += 1
        t.join()
        print("maps", n, "bad", bad)
        raise SystemExit(1 if bad else 0)
        """, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_exit_while_detached_threads_may_be_alive():
    """Each child ends right after a burst of threaded maps on programs it
    drops at once: it must exit cleanly (no crash, no hang)."""
    code = """
        import random, numpy as np, pygrad
        from pygrad import Value, nn
        random.seed(2); model = nn.MLP(2, [8, 8, 1])
        x = [Value(0.0), Value(0.0)]
        rows = np.random.default_rng(0).normal(size=(3 * 256 + 1, 2))
        for i in range(30):
            prog = pygrad.compile(model(x), inputs=x)
            prog.threads = 8
            prog.map(rows, grad=np.ones(len(rows)))
            del prog
        print("ok")
        """
    for _ in range(8):
        r = run_child(code)
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_many_back_to_back_threaded_calls_on_dropped_programs():
    """A thread that outlives its call must touch only its job: programs are
    compiled, run with 8 threads and freed at once, hundreds of times (the
    sanitizer build reports any use after free)."""
    random.seed(3)
    model = nn.MLP(2, [8, 8, 1])
    x = [Value(0.0), Value(0.0)]
    out = model(x)
    rows = np.random.default_rng(1).normal(size=(2 * CHUNK + 1, 2))
    ref = pygrad.compile(out, inputs=x)
    ref.threads = 1
    model.zero_grad()
    want = ref.map(rows, grad=np.ones(len(rows))), model.get_grad()
    for _ in range(200):
        prog = pygrad.compile(out, inputs=x)
        prog.threads = 8
        model.zero_grad()
        got = prog.map(rows, grad=np.ones(len(rows)))
        del prog
        assert same_bits(got, want[0]) and same_bits(model.get_grad(), want[1])


def test_two_python_threads_two_programs_threaded():
    """Two Python threads, each with its own program over its own model,
    run 3-thread train_steps at once: each gets its one-thread bits."""
    results = {}

    def worker(seed):
        model, prog, rows = moons(seed, 3 * CHUNK)
        prog.threads = 3
        opt = optim.Adam(model.parameters(), lr=0.01)
        w = np.full(len(rows), 1.0 / len(rows))
        for _ in range(10):
            prog.train_step(rows, w, opt)
        results[seed] = model.get_data()

    ts = [threading.Thread(target=worker, args=(s,)) for s in (21, 22)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for seed in (21, 22):
        model, prog, rows = moons(seed, 3 * CHUNK)
        prog.threads = 1
        opt = optim.Adam(model.parameters(), lr=0.01)
        w = np.full(len(rows), 1.0 / len(rows))
        for _ in range(10):
            opt.zero_grad()
            prog.map(rows, grad=w)
            opt.step()
        assert same_bits(results[seed], model.get_data())


def test_four_and_eight_wide_layer_kernels_give_the_same_bits_threaded_with_nan():
    """PYGRAD_NO_AVX512 makes the core pick the four-wide layer kernels even
    on an AVX-512 CPU: a child Python computes the same threaded map, NaN
    and inf rows included, both ways."""
    code = """
        import random, numpy as np, pygrad, hashlib
        from pygrad import Value, nn
        random.seed(5); model = nn.MLP(3, [13, 17, 2])
        x = [Value(0.0) for _ in range(3)]
        o = model(x); prog = pygrad.compile([o[0] * o[1], o[1].tanh()], inputs=x)
        rows = np.random.default_rng(3).normal(size=(777, 3))
        rows[5, 0] = np.nan; rows[400, 1] = np.inf
        prog.threads = 3
        out = prog.map(rows, grad=np.ones((777, 2)))
        print(hashlib.sha1(out.tobytes() + np.array(model.get_grad()).tobytes()).hexdigest())
        """
    outs = set()
    for flag in (None, "1"):
        env = dict(os.environ)
        env.pop("PYGRAD_NO_AVX512", None)
        if flag:
            env["PYGRAD_NO_AVX512"] = flag
        r = run_child(code, env=env)
        assert r.returncode == 0, r.stderr
        outs.add(r.stdout)
    assert len(outs) == 1
