"""Running out of memory in C becomes a MemoryError, and the engine stays
usable.  ``pg_fail_alloc(n)`` makes the n-th heap allocation of the core
fail; each scenario is run with n = 1, 2, 3, ... until it no longer reaches
the failure, so every allocation it makes is failed once.

The hook exists only in a test core (PYGRAD_TEST_HOOKS=1 at build time;
.ci/sanitize and .ci/valgrind build one): elsewhere these tests skip."""
import gc
import random
from contextlib import contextmanager

import pytest

import pygrad
from pygrad import Value, losses, nn
from pygrad._core import lib

import internals
from helpers import assert_same_doubles, micrograd_style_tanh, square_function

pytestmark = pytest.mark.test_hooks


@contextmanager
def failing_allocation(n: int):
    lib.pg_fail_alloc(n)
    try:
        yield
    finally:
        lib.pg_fail_alloc(0)


def chain():
    """~12k nodes; one backward."""
    a, b = Value(0.3), Value(0.7)
    y = a
    for _ in range(3_000):
        y = (y * b + 0.5).tanh()
    y.backward()
    return [y.data, a.grad, b.grad]


def fused_mlp():
    """Fused layers, a loss, backward."""
    random.seed(1)
    model = nn.MLP(3, [8, 8, 1])
    rng = random.Random(2)
    xs = [[rng.uniform(-1, 1) for _ in range(3)] for _ in range(20)]
    loss = losses.mse([model(x) for x in xs], [rng.uniform(-1, 1) for _ in xs])
    loss.backward()
    return [loss.data, *model.get_grad().tolist()]


_py_tanh = micrograd_style_tanh(Value)


def python_backward():
    """micrograd-style custom ops: labels and Python closures."""
    w = Value(0.4, label="w")
    y = Value(0.1)
    for _ in range(300):
        y = _py_tanh(y * w + 0.2)
    y.label = "out"
    y.backward()
    return [y.data, w.grad]


Square = square_function()


def function_op():
    """pygrad.Function nodes."""
    x = Value(1.1)
    y = x
    for _ in range(50):
        y = Square.apply(y * 0.9)
    y.backward()
    return [y.data, x.grad]


def replay():
    """compile (the program and its order are heap buffers) and re-run."""
    random.seed(3)
    model = nn.MLP(2, [4, 1], fused=False)
    x = [Value(0.5), Value(-0.25)]
    loss = model(x) ** 2
    program = pygrad.compile(loss)
    x[0].data = 0.75
    program.forward()
    program.backward()
    return [loss.data, *model.get_grad().tolist()]


def batched():
    """compile with inputs (the shared layout, the batch's arrays and a fused
    layer's gathered weights) and map over rows with grads."""
    random.seed(4)
    model = nn.MLP(2, [8, 1])
    x = [Value(0.0), Value(0.0)]
    program = pygrad.compile(model(x), inputs=x)
    rows = [[0.5, -0.25], [0.1, 0.9], [-0.7, 0.3]]
    out = program.map(rows, grad=[1.0, 0.5, -2.0])
    return [*out.tolist(), *model.get_grad().tolist()]


def higher_order():
    """pygrad.grad over ~9k nodes: the numbers in one C call (its walk's
    scratch and saved grads), and a gradient graph differentiated again;
    the grads it leaves must be the ones it found."""
    a, b = Value(0.3), Value(0.7)
    a.grad, b.grad = 0.25, -0.5
    y = a
    for _ in range(3_000):
        y = (y * b + 0.5).tanh()
    numbers = [g.data for g in pygrad.grad(y, [a, b])]
    (ga, gb) = pygrad.grad(y * y, [a, b], create_graph=True)
    second = [g.data for g in pygrad.grad(ga + gb, [a, b])]
    return [*numbers, *second, a.grad, b.grad]


def second_order():
    """pygrad.hvp, hessian and jvp over ~4.5k nodes (past the 4,096 walk
    entries a test core keeps): forward-over-reverse in one C call each
    (its walk's scratch and its arrays)."""
    def f(a, b):
        y = a
        for _ in range(1_500):
            y = (y * b + 0.5).tanh()
        return y * a
    hv = pygrad.hvp(f, [0.3, 0.7], [1.0, -0.5]).tolist()
    h = pygrad.hessian(f, [0.3, 0.7]).ravel().tolist()
    return [*hv, *h, *pygrad.jvp(f, [0.3, 0.7], [1.0, -0.5])]


SCENARIOS = [chain, fused_mlp, python_backward, function_op, replay, batched, higher_order,
             second_order]


def live_nodes() -> int:
    gc.collect()
    return internals.live_nodes()


# The scenarios whose C calls allocate on every run: a sweep's order and
# saved grads, a program's arrays, and the walk's scratch over the chain's
# 12k nodes (a test core keeps no more than 4,096 entries of it between
# walks: csrc/backward.c).  Node memory is Python's, so a failed ffi.new is
# Python's own MemoryError, not tested here.
ALLOCATING = {"chain", "python_backward", "replay", "batched", "higher_order", "second_order"}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_every_allocation_failure_is_a_memory_error_and_recoverable(scenario):
    expected = scenario()
    before = live_nodes()
    failures = 0
    for n in range(1, 200):
        with failing_allocation(n):
            try:
                got = scenario()
            except MemoryError as e:
                assert "out of memory" in str(e)
                assert lib.pg_fail_alloc_pending() == 0
                failures += 1
            else:
                # A run that got past its n-th allocation must have raised.
                assert lib.pg_fail_alloc_pending() > 0, f"allocation {n} failed silently"
                assert_same_doubles(got, expected, f"{scenario.__name__} with {n} armed")
                break
        # The next run, with memory back, gives the exact same numbers.
        assert_same_doubles(scenario(), expected, f"{scenario.__name__} after failing #{n}")
    else:
        pytest.fail("the scenario never ran past the armed failure")
    assert failures >= (2 if scenario.__name__ in ALLOCATING else 0)
    assert live_nodes() == before


def test_a_failed_backward_leaves_every_grad_untouched():
    """While Python backwards exist, backward() reserves its whole order
    before it changes any grad."""
    def build():
        w = Value(0.5)
        return w, _py_tanh(w * 3.0) * w
    w, y = build()
    w_ctl, y_ctl = build()
    y.backward()
    y_ctl.backward()
    # backward() copies its order into the sweep (allocation 1), then saves
    # the grads it will touch (allocation 2); the walk's scratch has grown.
    for n in (1, 2):
        with failing_allocation(n):
            with pytest.raises(MemoryError):
                y.backward()
        assert w.grad == w_ctl.grad
    y.backward()
    y_ctl.backward()
    assert w.grad == w_ctl.grad



def test_a_walk_that_fails_midway_leaves_the_same_graph_as_it_was():
    """The walk marks each node it enters: a walk that runs out of memory
    while it grows its scratch takes every mark off again, so the next
    backward() over the very same graph reaches every node."""
    a, b = Value(0.3), Value(0.7)
    made = [a, b]
    y = a
    for _ in range(3_000):           # ~12k nodes: the scratch grows (csrc/backward.c)
        y = y * b
        made.append(y)
        y = y + 0.5
        made.append(y)
        y = y.tanh()
        made.append(y)

    def backward():
        for v in made:
            v.grad = 0.0
        y.backward()
        return [v.grad for v in made]

    expected = backward()
    failures = 0
    for n in range(1, 200):
        for v in made:
            v.grad = 0.0
        with failing_allocation(n):
            try:
                y.backward()
            except MemoryError:
                failures += 1
                assert [v.grad for v in made] == [0.0] * len(made)
                reached = False
            else:
                reached = True
        assert_same_doubles(backward(), expected, f"backward after failing allocation {n}")
        if reached:
            break
    assert failures >= 5
