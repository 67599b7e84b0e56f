"""What the batched tier's tests compare: bits, a step taken both ways, and
a map run on several thread counts."""
import numpy as np


def bits(a):
    return np.asarray(a, dtype=np.float64).view(np.int64)


def same_bits(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


def one_step(prog, opt, rows, w, fused):
    """train_step, or the three calls it fuses."""
    if fused:
        return prog.train_step(rows, w, opt)
    opt.zero_grad()
    out = prog.map(rows, grad=w)
    opt.step()
    return out


def step_both_ways(prog_a, opt_a, model_a, prog_b, opt_b, model_b, rows, w):
    """One step as zero_grad(), map(), step() on a and as train_step on b:
    the losses, data and grads are the same bits."""
    opt_a.zero_grad()
    la = prog_a.map(rows, grad=w)
    opt_a.step()
    lb = prog_b.train_step(rows, w, opt_b)
    assert same_bits(la, lb)
    assert same_bits(model_a.get_data(), model_b.get_data())
    assert same_bits(model_a.get_grad(), model_b.get_grad())


def bits_per_thread_count(prog, ps, rows, w, counts, start):
    """The set of (outputs, grads) bits of map(rows, grad=w) with each
    thread count in counts, every grad starting at start: one element when
    the thread count changes nothing."""
    seen = set()
    for threads in counts:
        prog.threads = threads
        for p in ps:
            p.grad = start
        out = prog.map(rows, grad=w)
        seen.add((bits(out).tobytes(), bits([p.grad for p in ps]).tobytes()))
    return seen
