"""Memory: a 10,000,000-node graph, and resident memory over long training.

    python benchmarks/bench_memory.py            # both parts
    python benchmarks/bench_memory.py --quick    # 1,000,000 nodes, 500 steps

Part 1 builds y <- y * w + c (two C nodes a round) until the graph has
10,000,000 nodes, backpropagates, and drops it: wall time of each phase,
live C nodes, resident memory (RSS) before, at the peak, and after.  The
peak is the process's high-water mark (getrusage), read in a fresh process
where this graph is the only big thing.

Part 2 trains micrograd's moons MLP for 2,000 SGD steps on minibatches of
10 (tests/training.py, eager and replay tiers) and prints RSS and live C
nodes at steps 200 and 2,000 (tests/test_memory.py asserts < 5% apart).
"""
import argparse
import gc
import os
import resource
import sys
import time

from pygrad import Value
from pygrad._core import lib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


def big_graph(nodes: int) -> None:
    w, c = Value(0.5), Value(1.0)
    Value(0.0).backward()
    gc.collect()
    base_nodes, base_rss = lib.pg_live_nodes(), rss_mib()
    t0 = time.perf_counter()
    y = Value(0.0)
    for _ in range(nodes // 2):
        y = y * w + c
    t1 = time.perf_counter()
    y.backward()
    t2 = time.perf_counter()
    built, built_rss = lib.pg_live_nodes() - base_nodes, rss_mib()
    del y
    gc.collect()
    t3 = time.perf_counter()
    print(f"graph of {built:,} C nodes ({lib.pg_node_size()} B each = "
          f"{built * lib.pg_node_size() / 2**20:,.0f} MiB of nodes)")
    print(f"  build    {t1 - t0:7.2f} s  ({(t1 - t0) / built * 1e9:5.0f} ns/node, Python loop)")
    print(f"  backward {t2 - t1:7.3f} s  ({(t2 - t1) / built * 1e9:5.1f} ns/node)")
    print(f"  free     {t3 - t2:7.3f} s  ({(t3 - t2) / built * 1e9:5.1f} ns/node)")
    print(f"  RSS: {base_rss:,.0f} MiB before, {built_rss:,.0f} MiB built, "
          f"peak {peak_rss_mib():,.0f} MiB, {rss_mib():,.0f} MiB after the drop; "
          f"live nodes after: {lib.pg_live_nodes() - base_nodes:+,}")


def training(steps: int) -> None:
    from training import moons_model, train_moons
    for tier in ("eager", "replay"):
        samples = {}

        def sample(k: int) -> None:
            if k in (steps // 10, steps):
                gc.collect()
                samples[k] = (lib.pg_live_nodes(), rss_mib())
        train_moons(moons_model(0, tier), 0, tier, steps=steps, batch=10, after_step=sample)
        (n0, r0), (n1, r1) = samples[steps // 10], samples[steps]
        print(f"{tier:>6}: step {steps // 10}: {r0:6.1f} MiB RSS, {n0:,} live nodes; "
              f"step {steps}: {r1:6.1f} MiB, {n1:,} nodes ({(r1 - r0) / r0:+.2%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    big_graph(1_000_000 if args.quick else 10_000_000)
    training(500 if args.quick else 2_000)


if __name__ == "__main__":
    main()
