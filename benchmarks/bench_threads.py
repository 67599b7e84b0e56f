"""The batched tier's training step on 1 thread against 2, side by side.

    python benchmarks/bench_threads.py

One ``Program.train_step`` of ``MLP(2, [H, H, 1])`` on N moons rows (hinge
loss, SGD with weight decay), ``Program.threads`` 1 and 2 alternating,
median of 9: the speedup the second core gives (the bits are the same;
tests/test_batched_step.py checks that).  Run it on an idle machine: a
second job on the cores takes the second thread's time.
"""
import time, statistics, random, numpy as np, pygrad
from pygrad import Value, nn, optim, data
res = {}
for N, H in [(1000, 16), (10000, 16), (1000, 64), (10000, 64)]:
    random.seed(0)
    model = nn.MLP(2, [H, H, 1])
    X, y = data.make_moons(N, noise=0.1, seed=0)
    XY = np.column_stack([X, data.signed_labels(y)])
    x0, x1, yi = Value(0.0), Value(0.0), Value(0.0)
    prog = pygrad.compile((1 + -yi * model([x0, x1])).relu(), inputs=[x0, x1, yi])
    opt = optim.SGD(model.parameters(), lr=0.01, weight_decay=1e-4)
    w = np.full(N, 1.0 / N)
    reps = max(3, 20000 // N)
    ts = {1: [], 2: []}
    for k in range(9):
        for t in (1, 2):
            prog.threads = t
            s = time.perf_counter()
            for _ in range(reps):
                prog.train_step(XY, w, opt)
            ts[t].append((time.perf_counter() - s) / reps)
    m1, m2 = statistics.median(ts[1]), statistics.median(ts[2])
    print(f"{N}x{H}: 1 thread {m1*1e3:.3f} ms, 2 threads {m2*1e3:.3f} ms, speedup {m1/m2:.2f}x", flush=True)
