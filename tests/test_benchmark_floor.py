"""The benchmarks' "floor + one cffi call" row calls the core's op entry
points directly, so a change of their signatures must show here, not only
when someone runs benchmarks/run.py."""
import importlib.util
import pathlib

import pytest

from pygrad._core import lib

import internals

BENCH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "bench_engine.py"


@pytest.fixture(scope="module")
def bench_engine():
    if not BENCH.exists():
        pytest.skip("no benchmarks/ beside the tests")
    spec = importlib.util.spec_from_file_location("bench_engine_for_tests", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cffi_floor_makes_its_calls_and_no_node(bench_engine):
    V = bench_engine.CffiFloorValue
    a, b = V.__new__(V), V.__new__(V)
    a.data, b.data = 2.0, -3.0
    live = internals.live_nodes()
    y = ((a * b + a * 0.5) ** 2).relu() + 1.0
    assert y.data == ((2.0 * -3.0 + 2.0 * 0.5) ** 2) + 1.0
    assert internals.live_nodes() == live
