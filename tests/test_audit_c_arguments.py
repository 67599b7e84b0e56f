"""A systematic audit of what pygrad's Python passes to C (every ``lib.pg_*``
call in pygrad/*.py): for each pointer, buffer, length or object passed by
``id()``, where it comes from and whether C checks it.  The arguments built
from the call's own data, or checked by C against its own record, are in
the audit's table (the report), not here; these tests are the rest: a size,
buffer or object taken from an attribute a user can rebind (legal Python:
no ctypes, no call of ``pygrad._core.lib``, no ``ffi``), and cdata structs
whose fields Python can write.

Each test marked "Found by the audit" failed on the code it was written
against (2fde7a3): its comment says what was wrong and what is right, and
it now passes.  The "held"
tests are rebinds that are already handled.  Everything that may crash,
hang or touch freed memory runs in a child interpreter
(helpers.run_python; under .ci/sanitize the child runs under ASan too); a
timeout only detects a hang.  Right behaviour, throughout: a clean
TypeError / ValueError / RuntimeError (AttributeError for a write to a field
that should not be writable), or the right numbers."""
import subprocess

import pytest

from helpers import run_python

CLEAN = "(TypeError, ValueError, RuntimeError, AttributeError)"


def child(src: str, timeout: float = 90) -> str:
    """src's stdout in a fresh interpreter; a crash, an abort or an ASan
    report fails the test (helpers.run_python), and so does a hang."""
    try:
        return run_python(src, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung (no exit within {timeout} s)")


# =====================================================================================
# Sizes taken from rebindable attributes
# =====================================================================================

def test_bulk_reads_never_return_numbers_c_did_not_write():
    # Found by the audit, fixed (uninitialised memory returned as numbers).  A bulk read
    # (Module.get_data / get_grad, Inputs.get) allocates np.empty(len(...))
    # where the length is Packed.n (a writable slot) or len(Inputs._values)
    # (a writable slot), and C's gather_data/gather_grad only refuse an array
    # SHORTER than the node list (nout < l->n): a longer one gets its first
    # l->n numbers written and the rest is whatever the allocator left there
    # (e.g. 2.0e-316, 7.0e-292, ... after `packed.n = 40` on a 13-parameter
    # MLP; after inp._packed = pack(vs[:2]) the last 3 of Inputs.get() are
    # garbage; under ASan, its 0xbe fill: -1.83e-06).  ASan reports nothing
    # (an uninitialised read is MSan's).  Right: the array's length comes
    # from the node list itself,
    # or C refuses any length but its own (nout != l->n: ValueError).
    out = child(f"""
        import numpy as np, pygrad
        from pygrad import Value, nn
        from pygrad._lifetime import pack
        m = nn.MLP(2, [3, 1])
        want = m.get_data().tolist()
        for v in m.parameters():
            v.grad = 0.25
        backend, packed = m._bulk()
        packed.n = 40
        for name, expect in (("get_data", want), ("get_grad", [0.25] * len(want))):
            try:
                got = getattr(m, name)().tolist()
            except {CLEAN} as e:
                print(name, "refused", type(e).__name__)
                continue
            print(name, "OK" if got == expect else "WRONG %r" % got[len(expect):][:4])
        vs = [Value(float(i)) for i in range(5)]
        inp = pygrad.Inputs(vs)
        inp._packed = pack(vs[:2])
        try:
            got = inp.get().tolist()
            print("Inputs.get", "OK" if got == [0.0, 1.0, 2.0, 3.0, 4.0] else "WRONG %r" % got)
        except {CLEAN} as e:
            print("Inputs.get refused", type(e).__name__)
    """)
    assert "WRONG" not in out, out


def test_a_fused_mlp_never_reads_activations_past_its_array():
    # Found by the audit, fixed (out-of-bounds read; a silently wrong output without ASan).
    # MLP's fused cache (model._fused, a NamedTuple the model keeps, rebound
    # here as any attribute may be) holds pg_mlp's arguments: an int[] of
    # activations, the node lists and the sizes.  make_mlp passes
    # len(sizes) - 1 layers and C checks every node list against the sizes,
    # but reads acts[l] for each layer with no length: activations of a
    # one-layer MLP in a two-layer MLP's cache make pg_mlp read acts[1], past
    # a 1-int array (ASan: heap-buffer-overflow in pg_mlp, csrc/nodes.c), and
    # the output is a silently different number (0.89 for 0.058 here).
    # Right: make_mlp checks len(acts) == len(sizes) - 1 (a cdata int[] knows
    # its length) and refuses anything else (ValueError), or the cache's
    # arguments are rebuilt rather than trusted.
    out = child(f"""
        import random, pygrad
        from pygrad import nn
        random.seed(3)
        a, b = nn.MLP(2, [3, 1]), nn.MLP(2, [1])
        want = a([1.0, 2.0]).data
        b([1.0, 2.0])
        a._fused = a._fused._replace(args=(b._fused.args[0],) + tuple(a._fused.args[1:]))
        try:
            got = a([1.0, 2.0]).data
            print("OK" if got == want else "WRONG %r for %r" % (got, want))
        except {CLEAN} as e:
            print("refused", type(e).__name__)
    """)
    assert "WRONG" not in out, out


def test_per_length_never_runs_a_program_with_fewer_tokens_than_it_was_traced_for():
    # Found by the audit, fixed (silently wrong loss).  _Compiled.set_tokens checks only that
    # len(ids) * vocab does not pass its array (len(ids) * vocab > size), so
    # a program traced for 3 tokens, put under length 2 in pl._programs (a
    # dict inside the PerLength), runs 2 ids with the third one-hot left all
    # zeros: pl.loss([1, 2]) = 2.6996 where the loss is 1.5554.  And
    # c.vocab = 2 on the 4-token-vocabulary program (a writable slot) passes
    # both checks for ids below 2, writing each one-hot 1.0 into the wrong
    # slot: 3.2520 where the loss is 2.4407.  Right: a length's program takes
    # exactly its own number of tokens at its own vocabulary: len(ids) *
    # vocab == len(data) and vocab checked against the program (kept with
    # it, or its inputs' count), else ValueError.
    out = child(f"""
        import random, pygrad
        from pygrad import Value
        random.seed(0)
        V = 4
        wte = [[Value(random.uniform(-1, 1)) for _ in range(3)] for _ in range(V)]
        wout = [[Value(random.uniform(-1, 1)) for _ in range(3)] for _ in range(V)]
        def loss_fn(tokens):
            total = Value(0.0)
            for i in range(len(tokens) - 1):
                x = pygrad.embed(wte, tokens[i])
                logits = [pygrad.dot(row, x) for row in wout]
                m = pygrad.detached_max(logits)
                lse = pygrad.logsumexp([l - m for l in logits]) + m
                total = total + lse - pygrad.pick(logits, tokens[i + 1])
            return total
        def check(what, pl, ids):
            want = loss_fn(ids).data
            try:
                got = pl.loss(ids)
                print(what, "OK" if got == want else "WRONG %r for %r" % (got, want))
            except {CLEAN} as e:
                print(what, "refused", type(e).__name__)
        pl = pygrad.per_length(loss_fn, V)
        pl.loss([1, 2]); pl.loss([1, 2, 3])
        pl._programs[2] = pl._programs[3]
        check("swapped length", pl, [1, 2])
        pl = pygrad.per_length(loss_fn, V)
        pl.loss([1, 2, 3])
        pl._programs[3].vocab = 2
        check("compiled vocab", pl, [1, 1, 0])
    """)
    assert "WRONG" not in out, out


# =====================================================================================
# cdata structs whose fields Python can write
# =====================================================================================

@pytest.mark.parametrize("case", ["program_from_program", "program_from_batch",
                                  "batch_from_batch", "per_length_program"])
def test_a_compiled_programs_impl_pointer_is_not_writable_from_python(case):
    # Found by the audit, fixed (use-after-free, double free, type confusion: a crash).  The
    # cdef shows pg_program's `impl` and `n` and pg_batch's `impl` to cffi,
    # so `prog._program.impl = other._program.impl` is a plain attribute
    # write on an object pygrad keeps (a slot of Program, a slot of
    # per_length's _Compiled).  Two programs then share one flat program:
    # the other's release (ffi.gc) frees it and this one's forward() reads
    # freed memory, then its own release frees it again ("free(): double
    # free detected in tcache 2", SIGABRT).  A batch's impl in a program's
    # slot is read as a flat program (SIGSEGV); a batch's impl copied from
    # another batch reads a freed batch (map saw 22049 inputs) and aborts at
    # exit.  replay.alive() checks only impl != NULL.  Right: these fields
    # are hidden from cffi as `hold` is (cffi_build.hide_holds: "hidden from
    # cffi"), alive() asks C (a pg_program_alive-style call), so the write
    # is an AttributeError; or C refuses an impl it did not make for that
    # struct.
    out = child(f"""
        import gc, numpy as np, pygrad
        from pygrad import Value
        w, x, x2, x3 = Value(0.5), Value(2.0), Value(0.0), Value(0.0)
        case = {case!r}
        try:
            if case == "program_from_program":
                a = pygrad.compile(w * x + 1.0)
                b = pygrad.compile((w + x) * (w - x) * x + w.tanh())
                a._program.impl = b._program.impl
                del b
                gc.collect()
                junk = [pygrad.compile(Value(1.0) * Value(2.0) + k) for k in range(50)]
                got = a.forward()
                print("OK" if got == 2.0 else "WRONG %r" % got)
            elif case == "program_from_batch":
                a = pygrad.compile(w * x + 1.0)
                c = pygrad.compile(w * x2, inputs=[x2])
                a._program.impl = c._batch.impl
                got = a.forward()
                print("OK" if got == 2.0 else "WRONG %r" % got)
            elif case == "batch_from_batch":
                c = pygrad.compile(w * x2, inputs=[x2])
                d = pygrad.compile([w * x3 + 1, w - x3, x3 * x3], inputs=[x3])
                c._batch.impl = d._batch.impl
                del d
                gc.collect()
                got = c.map(np.ones((3, 1))).tolist()
                print("OK" if got == [0.5] * 3 else "WRONG %r" % got)
            else:
                W = [Value(0.1 * i) for i in range(3)]
                pl = pygrad.per_length(lambda ts: pygrad.sum(pygrad.pick(W, t) for t in ts) ** 2, 3)
                pl.loss([2, 1]); pl.loss([2, 1, 0])
                pl._programs[2].program.impl = pl._programs[3].program.impl
                del pl._programs[3]
                gc.collect()
                got = pl.loss([2, 1])
                print("OK" if got == (0.2 + 0.1) ** 2 else "WRONG %r" % got)
        except {CLEAN} as e:
            print("refused", type(e).__name__)
        gc.collect()
        print("EXIT")
    """)
    assert "WRONG" not in out and "EXIT" in out, out


def test_a_closure_that_finds_its_sweep_can_not_make_c_walk_past_its_order():
    # Found by the audit, fixed (out-of-bounds read: SIGSEGV), reached through a frame, so
    # less likely than the others.  pg_sweep's fields (order, saved, n, pos,
    # done, started) are all shown to cffi, and the sweep of a backward()
    # with a Python closure below is a local of _custom_sweep.record_backward,
    # which the closure's caller frames hold (sys._getframe is legal Python).
    # `sweep.n += 100000` there makes pg_backward_resume walk order[] past
    # its end; `sweep.pos = 0` would rerun every rule (gradients counted
    # twice).  Right: only what Python reads of a sweep is shown (nothing:
    # it reads through pg_sweep_value / pg_sweep_node_addr), the rest
    # hidden as `hold` is, so the write is an AttributeError.
    out = child(f"""
        import sys, pygrad
        from pygrad import Value
        x = Value(2.0)
        y = x * 3.0
        out = Value(y.data ** 2, (y,), "sq")
        def _backward():
            f = sys._getframe(1)
            while "sweep" not in f.f_locals:
                f = f.f_back
            s = f.f_locals["sweep"]
            s.n = s.n + 100000
            y.grad += 2 * y.data * out.grad
        out._backward = _backward
        try:
            out.backward()
            print("OK" if x.grad == 36.0 else "WRONG %r" % x.grad)
        except {CLEAN} as e:
            print("refused", type(e).__name__)
    """)
    assert "WRONG" not in out, out


@pytest.mark.parametrize("how", ["short", "dangling"])
def test_train_step_does_not_take_its_c_optimizer_from_an_overridable_method(how):
    # Found by the audit, fixed (heap overflow write and a hang; a write through a dangling
    # pointer).  train_step takes the pg_optimizer struct C steps with from
    # getattr(optimizer, "_fill_fused"): an instance attribute (or a
    # subclass) may wrap it and write the struct's cffi-visible fields.
    # _fused_step checks the class's _step/step/zero_grad, never
    # _fill_fused, and pg_batch_step trusts ns1 as s1's length (it checks
    # only ns1 >= n).  f.s1 = opt._steps_view (one double, ns1 still 64):
    # the momentum step writes 64 doubles into a 1-double buffer, the count
    # is overwritten with a fraction, and the next train_step loops forever
    # (see the fractional-count test).  f.s1 = opt._backend.buffer(np.zeros(64))
    # (a view nothing holds: the struct field keeps no reference): C writes
    # the momentum through a pointer into a freed array, and opt.velocity
    # stays 0 (silently; numpy keeps freed small blocks in its own cache, so
    # ASan does not see the write).  Right: train_step builds
    # the struct itself from the optimizer's own checked views (the _own
    # check, views held for the call), or refuses an optimizer whose
    # _fill_fused is not its class's (TypeError, as for _step).
    out = child(f"""
        import numpy as np, pygrad
        from pygrad import Value, optim
        ws = [Value(0.1 * i) for i in range(64)]; x = Value(0.0)
        loss = pygrad.dot(ws, [x] * 64) ** 2
        prog = pygrad.compile(loss, inputs=[x])
        opt = optim.SGD(ws, lr=0.1, momentum=0.9)
        orig = opt._fill_fused
        def fill(lr):
            f, held = orig(lr)
            if {how!r} == "short":
                f.s1 = opt._steps_view
            else:
                f.s1 = opt._backend.buffer(np.zeros(64))
            return f, held
        opt._fill_fused = fill
        rows, g = np.ones((4, 1)), np.full(4, 0.25)
        try:
            for _ in range(3):
                prog.train_step(rows, g, opt)
            print("steps", opt.steps, "velocity", opt.velocity[:2].tolist())
            print("OK" if opt.steps == 3 and opt.velocity[1] != 0.0 else "WRONG")
        except {CLEAN} as e:
            print("refused", type(e).__name__)
    """, timeout=60)
    assert "WRONG" not in out, out


# =====================================================================================
# The optimizer's step count in train_step
# =====================================================================================

def test_train_step_counts_in_the_optimizers_own_step_count():
    # Found by the audit, fixed (silently wrong numbers; an out-of-bounds write under ASan).
    # The fused step counts in f.steps = opt._steps_view, a rebindable
    # attribute passed with no check (sgd_step/adam_step pass it through
    # _own, the fused path does not), and train_step, unlike
    # Optimizer._step_at, does not count a step C did not count.  With
    # opt._steps_view = opt._backend.buffer(np.zeros(1)) (another float64
    # view), three Adam train_steps leave opt.steps == 0 and every step uses
    # the bias correction of step 1: w = 0.1183, b = 0.2884 where
    # zero_grad/map/step (and train_step before the rebind) give 0.2049,
    # 0.1986.  With a zero-length view (np.zeros(0)) C adds to steps[0] past
    # a 1-byte numpy allocation (ASan: heap-buffer-overflow in
    # pg_adam_step).  Right: the count C adds to is made from opt._steps for
    # the call (or checked with _own and checked to be _steps' memory), and
    # train_step counts as _step_at does.
    out = child(f"""
        import numpy as np, pygrad
        from pygrad import Value, optim
        def setup():
            w, b, x = Value(0.5), Value(-0.1), Value(0.0)
            prog = pygrad.compile((w * x + b - 1.0) ** 2, inputs=[x])
            return w, b, prog
        rows, g = np.linspace(-1, 1, 8).reshape(-1, 1), np.full(8, 1 / 8)
        w, b, prog = setup()
        opt = optim.Adam([w, b], lr=0.1)
        for _ in range(3):
            prog.train_step(rows, g, opt)
        want = (w.data, b.data, opt.steps)
        for size in (1, 0):
            w, b, prog = setup()
            opt = optim.Adam([w, b], lr=0.1)
            opt._steps_view = opt._backend.buffer(np.zeros(size))
            try:
                for _ in range(3):
                    prog.train_step(rows, g, opt)
                got = (w.data, b.data, opt.steps)
                print(size, "OK" if got == want else "WRONG %r for %r" % (got, want))
            except {CLEAN} as e:
                print(size, "refused", type(e).__name__)
    """)
    assert "WRONG" not in out, out


def test_train_step_with_a_fractional_step_count_does_not_hang():
    # Found by the audit, fixed (a hang).  train_step reads steps = optimizer.steps, which is
    # int(opt._steps[0]), then under the Program's lock retries while
    # `count[0] != steps` with count = opt._steps, the float itself.  A
    # count that is no whole number (opt._steps[0] = 0.5: a write into the
    # optimizer's own internal array; or a count corrupted as in the
    # _fill_fused test) is never equal to its int, so train_step loops
    # forever, taking and releasing the lock.  PerLength.step compares
    # opt.steps with opt.steps (ints) and does not hang.  Right: compare
    # the float read before with the float read under the lock, or refuse a
    # count that is not a whole number (ValueError).
    out = child(f"""
        import numpy as np, pygrad
        from pygrad import Value, optim
        w, b, x = Value(0.5), Value(-0.1), Value(0.0)
        prog = pygrad.compile((w * x + b - 1.0) ** 2, inputs=[x])
        opt = optim.Adam([w, b], lr=0.1)
        opt._steps[0] = 0.5
        try:
            prog.train_step(np.ones((4, 1)), np.full(4, 0.25), opt)
            print("returned", opt.steps)
        except {CLEAN} as e:
            print("refused", type(e).__name__)
    """, timeout=30)
    assert "returned" in out or "refused" in out, out


# =====================================================================================
# Return codes and buffers C writes
# =====================================================================================

def test_zero_grad_over_a_rebound_node_list_is_not_silently_skipped():
    # Found by the audit, fixed (silently wrong numbers).  _CBackend.fill_grad passes
    # packed.nodes (a writable slot of Packed) to pg_fill_grad_l, which
    # refuses anything but a node list with PG_E_ARG, and fill_grad hands
    # the code to _lifetime.traced, which raises only for PG_E_TRACED: so
    # after opt._packed.nodes = None (or a model's _pg_bulk packed rebound
    # so), zero_grad() returns having zeroed nothing, and the next step
    # uses the accumulated grads.  (The step itself raises: _state_fits
    # turns PG_E_ARG into "a state array is shorter", a misleading message
    # but an error.)  Right: fill_grad raises on any nonzero code
    # (TypeError: not a node list), as bulk() does.
    out = child(f"""
        from pygrad import Value, optim
        ws = [Value(1.0), Value(2.0)]
        opt = optim.SGD(ws, lr=0.1)
        ws[0].grad = 5.0
        opt._packed.nodes = None
        try:
            opt.zero_grad()
            print("OK" if ws[0].grad == 0.0 else "WRONG grad %r after zero_grad()" % ws[0].grad)
        except {CLEAN} as e:
            print("refused", type(e).__name__)
    """)
    assert "WRONG" not in out, out


def test_an_optimizer_never_writes_its_state_into_a_read_only_buffer():
    # Found by the audit, fixed (a write into immutable memory).  Backend.buffer (pygrad's
    # own helper, opt._backend.buffer) is ffi.from_buffer("double[]", arr),
    # whose require_writable defaults to False, and _own checks only that a
    # view is a non-empty double[]: opt._views["m"] =
    # opt._backend.buffer(np.frombuffer(b)) over a bytes object b makes
    # every Adam step write its first moment into b, an immutable bytes
    # object (its hash, interning and every sharer see the change).
    # _check_state refuses a read-only array for opt.m = ..., but the views
    # are not checked again.  Right: buffer() passes require_writable=True
    # (a TypeError for a read-only buffer), or the step refuses it.
    out = child(f"""
        import numpy as np
        from pygrad import Value, optim
        ws = [Value(1.0), Value(2.0)]
        opt = optim.Adam(ws, lr=0.1)
        b = bytes(16)
        try:
            opt._views["m"] = opt._backend.buffer(np.frombuffer(b))
            for w in ws:
                w.grad = 1.0
            opt.step()
            print("OK" if b == bytes(16) else "WRONG: the bytes object is now %r" % b)
        except {CLEAN} as e:
            print("refused", type(e).__name__)
    """)
    assert "WRONG" not in out, out


# =====================================================================================
# The locks C's buffers rely on
# =====================================================================================

def test_a_program_rebound_lock_does_not_let_two_runs_share_its_buffers():
    # Found by the audit, fixed (silently wrong numbers; a data race on the batch's workers).
    # batch.c says "A program must not run in two threads at once (Python
    # holds a lock)", and that lock is Program._lock, a writable slot.
    # Rebinding it to a new CallLock while another thread's map() runs
    # lets a second map() into the same batch at once: both use worker 0's
    # row arrays (and race on b->nwork, b->partial), and both results are
    # wrong (np.array_equal(..., want) False for each).  Right: C refuses a
    # second run of a batch or program already running (an atomic busy
    # flag: PG_E_BUSY, RuntimeError), so the exclusion does not rest on a
    # rebindable attribute; or the results are the right numbers.
    out = child(f"""
        import random, threading, time, numpy as np, pygrad
        from pygrad import Value
        from pygrad.replay import CallLock
        random.seed(1)
        x = [Value(0.0) for _ in range(4)]
        ws = [Value(random.uniform(-1, 1)) for _ in range(4)]
        h = [pygrad.dot(ws, x).tanh() * (xi + 1.0) for xi in x]
        prog = pygrad.compile(pygrad.sum(hi * hi for hi in h), inputs=x)
        prog.threads = 1
        rows = np.random.default_rng(0).normal(size=(200000, 4))
        want = prog.map(rows)
        res, started = {{}}, threading.Event()
        def run():
            started.set()
            try:
                res["a"] = prog.map(rows)
            except {CLEAN} as e:
                res["a"] = type(e).__name__
        t = threading.Thread(target=run)
        t.start()
        started.wait()
        time.sleep(0.005)
        prog._lock = CallLock("rebound")       # the running map holds the old one
        try:
            res["b"] = prog.map(rows)
        except {CLEAN} as e:
            res["b"] = type(e).__name__
        t.join()
        for k in "ab":
            r = res[k]
            print(k, r if isinstance(r, str) else "OK" if np.array_equal(r, want) else "WRONG")
    """, timeout=120)
    assert "WRONG" not in out, out


def test_a_per_length_step_runs_no_code_of_a_rebound_backend_under_its_lock():
    # Found by the audit, fixed (csrc/lock.h rule 2 broken: user code under a CallLock).
    # PerLength.step runs SGD's or Adam's zero_grad and _step_at under its
    # lock when _steps_are_pygrads() says they run only pygrad's code; that
    # check looks at the instance's methods and settings, not at
    # opt._backend (nor _views, _packed, _steps), which those methods call:
    # opt._backend = a _CBackend subclass instance with its own fill_grad
    # or adam_step runs that code with the PerLength's lock held (a second
    # call from that code in the same thread is a RuntimeError; one that
    # waits for another thread's step of this PerLength never returns).
    # Right: _steps_are_pygrads also requires type(opt._backend) to be one
    # of pygrad's own backends (else the steps run outside the lock, as for
    # an optimizer of your own), or the step refuses.
    out = child(f"""
        import pygrad
        from pygrad import Value, optim
        from pygrad._backend import _CBackend, C
        import pygrad._backend as B
        W = [Value(0.1 * i) for i in range(3)]
        opt = optim.Adam(W, lr=0.1)
        pl = pygrad.per_length(lambda ts: pygrad.sum(pygrad.pick(W, t) for t in ts) ** 2, 3, opt)
        seen = []
        class Mine(_CBackend):
            __slots__ = ()
            def fill_grad(self, packed, x):
                seen.append(pl._lock._lock._is_owned())
                return super().fill_grad(packed, x)
        opt._backend = Mine("c", C.Value, C.dot, C.sum, C.logsumexp, C.graph)
        try:
            pl.step([2, 1])
            print("user code under the lock" if any(seen) else "OK", seen)
        except {CLEAN} as e:
            print("refused", type(e).__name__)
    """)
    assert "under the lock" not in out, out


# =====================================================================================
# Held: rebinds that are already handled
# =====================================================================================

def test_held_rebinds_that_cffi_or_c_already_refuse():
    # map's threads go through cffi's uint32_t conversion, which runs no
    # __index__ (so no user code under the Program's lock); a pg_optimizer
    # field refuses a list, an array or None; a per_length length's data
    # rebound to a list is refused by ffi.memmove; another program's
    # cdata in the wrong slot is a cffi TypeError.
    out = child(f"""
        import numpy as np, pygrad
        from pygrad import Value, optim
        w, x = Value(0.5), Value(0.0)
        prog = pygrad.compile(w * x, inputs=[x])
        class T:
            def __index__(self):
                print("USER CODE RAN")
                return 2
        prog._threads = T()
        try:
            prog.map(np.ones((3, 1)))
            print("WRONG: accepted")
        except TypeError:
            pass
        prog._threads = None
        ws = [Value(1.0), Value(2.0)]
        opt = optim.SGD(ws, lr=0.1, momentum=0.9)
        for bad in ([0.0, 0.0], np.zeros(2), None):
            opt._views["velocity"] = bad
            try:
                prog.train_step(np.ones((2, 1)), np.full(2, 0.5), opt)
                print("WRONG: stepped with", type(bad).__name__)
            except TypeError:
                pass
        W = [Value(0.1 * i) for i in range(3)]
        pl = pygrad.per_length(lambda ts: pygrad.sum(pygrad.pick(W, t) for t in ts) ** 2, 3)
        pl.loss([2, 1])
        try:
            pl._programs[2].inputs = [0.0] * 6     # (its numbers are C's own now: no .data)
            pl.loss([2, 1])
            print("WRONG: ran")
        except {CLEAN}:
            pass
        p2 = pygrad.compile(w * x + 1.0)
        p2._program = prog._batch
        try:
            p2.forward()
            print("WRONG: ran a batch as a program")
        except TypeError:
            pass
        print("DONE")
    """)
    assert "DONE" in out and "WRONG" not in out and "USER CODE" not in out, out
