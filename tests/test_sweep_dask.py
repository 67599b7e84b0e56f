"""examples/10_sweep_dask.py on a 2-worker dask LocalCluster: sweep runs
equal the same runs trained serially, bit for bit; a worker killed mid-sweep
is replaced and its run retried with the same result; a run that raises
comes back naming its (lr, width, seed) while the others complete.

Needs dask.distributed (``pip install ".[distributed]"``); skipped without."""
import functools
import importlib.util
import os
import pathlib
import signal
import sys

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"

# The workers are other processes, which can't import this test file nor the
# example script: cloudpickle sends the run functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _load_example():
    """examples/10_sweep_dask.py as a module (not entered in sys.modules, so
    cloudpickle ships its functions by value)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location("sweep_dask_example",
                                                      EXAMPLES / "10_sweep_dask.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


sweep = _load_example()
CONFIGS = sweep.grid([0.1, 1.0], [4, 8], [0, 1])
STEPS = 20


@pytest.fixture(scope="module")
def client():
    """One LocalCluster for the module: 2 worker processes, 1 thread each,
    the dashboard (where bokeh is installed) on a free port."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as c:
        yield c


@functools.lru_cache(maxsize=None)
def serial(lr, width, seed, steps=STEPS):
    """The same run trained here, in the test process."""
    return sweep.train_run(lr, width, seed, steps)


def assert_equals_serial(result):
    here = serial(result["lr"], result["width"], result["seed"], result["steps"])
    what = f"lr={result['lr']} width={result['width']} seed={result['seed']}"
    for key in ("losses", "final_loss", "params"):
        assert sweep.same_bits(result[key], here[key]), f"{what}: {key} differs from serial"
    assert (result["accuracy"], result["train_accuracy"]) == (here["accuracy"],
                                                              here["train_accuracy"])


# -- run functions for the workers (shipped by value) --------------------------

def fail_on(lr, width, seed, steps, bad, train):
    if (lr, width, seed) == bad:
        raise ValueError("boom: this run was told to fail")
    return train(lr, width, seed, steps)


def die_once(lr, width, seed, steps, victim, marker, train):
    """On its first attempt the victim run kills its own worker process
    (SIGKILL, as the OOM killer would); the marker file records the pid."""
    if (lr, width, seed) == victim and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return train(lr, width, seed, steps)


# -- tests ---------------------------------------------------------------------

def test_sweep_runs_on_workers_and_equals_serial_runs(client):
    results, failures = sweep.run_sweep(client, CONFIGS, STEPS, log=None)
    assert failures == []
    assert [(r["lr"], r["width"], r["seed"]) for r in results] == CONFIGS
    assert all(r["pid"] != os.getpid() for r in results)
    assert len({r["pid"] for r in results}) == 2  # both workers took runs
    for r in results:
        assert isinstance(r["params"], np.ndarray) and r["params"].shape == (
            len(sweep.nn.MLP(2, [r["width"], r["width"], 1]).parameters()),)
        assert len(r["losses"]) == STEPS and r["seconds"] > 0
        assert_equals_serial(r)


def test_same_bits_tells_apart_what_equality_would_not():
    assert sweep.same_bits([0.1, np.nan], [0.1, np.nan])
    assert not sweep.same_bits([0.0], [-0.0])
    assert not sweep.same_bits([1.0, 2.0], [1.0])


def test_example_on_an_existing_cluster(client, tmp_path, capsys):
    r = sweep.main(["--quick", "--scheduler", client.scheduler.address, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "[8/8]" in out and "[ok] 8 runs equal the same run trained serially" in out
    assert r["failures"] == [] and r["mismatches"] == [] and r["checked"] == 8
    assert len(r["results"]) == 8 and r["best"]["accuracy"] >= 0.85
    assert r["mean_accuracy"].shape == (2, 2)
    if importlib.util.find_spec("matplotlib") is None:
        assert r["plot"] is None and "no heat map" in out
    else:
        assert pathlib.Path(r["plot"]).read_bytes()[:4] == b"\x89PNG"


def test_a_one_ulp_difference_fails_the_example(client, monkeypatch, capsys, tmp_path):
    r = serial(0.1, 4, 0)
    nudged = dict(r, params=r["params"].copy())
    nudged["params"][-1] = np.nextafter(nudged["params"][-1], np.inf)
    assert sweep.matches_serial(r) and not sweep.matches_serial(nudged)
    monkeypatch.setattr(sweep, "matches_serial", lambda result: result["seed"] != 1)
    with pytest.raises(SystemExit) as exit_:
        sweep.main(["--quick", "--scheduler", client.scheduler.address, "--out", str(tmp_path)])
    assert exit_.value.code == 1
    assert "[FAILED] 8 runs equal the same run trained serially" in capsys.readouterr().out


def test_a_run_that_raises_names_its_parameters_and_the_others_complete(client):
    run = functools.partial(fail_on, bad=(1.0, 4, 1), train=sweep.train_run)
    lines = []
    results, failures = sweep.run_sweep(client, CONFIGS, STEPS, run=run, log=lines.append)
    assert len(failures) == 1 and len(results) == len(CONFIGS) - 1
    (failure,) = failures
    assert isinstance(failure, sweep.RunFailed)
    assert "lr=1.0 width=4 seed=1" in str(failure) and "boom" in str(failure)
    assert (failure.lr, failure.width, failure.seed) == (1.0, 4, 1)
    assert isinstance(failure.__cause__, ValueError)
    assert len(lines) == len(CONFIGS) and any("lr=1.0 width=4 seed=1" in x for x in lines)
    for r in results:
        assert_equals_serial(r)


def test_example_starts_and_stops_its_own_cluster(tmp_path):
    """Without --scheduler the example runs a LocalCluster of its own (here
    of one worker process, to keep the test short) and leaves no process
    behind."""
    psutil = pytest.importorskip("psutil")
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    r = sweep.main(["--quick", "--workers", "1", "--out", str(tmp_path)])
    assert r["mismatches"] == [] and len(r["results"]) == 8
    assert len({x["pid"] for x in r["results"]}) == 1
    assert not {p.pid for p in me.children(recursive=True)} - before


def test_a_killed_worker_is_replaced_and_its_run_retried(client, tmp_path):
    """The victim kills its worker mid-sweep; the nanny restarts it, the
    scheduler reruns the task, and the result is still bit-identical."""
    victim = (0.1, 8, 0)
    marker = tmp_path / "killed"
    run = functools.partial(die_once, victim=victim, marker=str(marker), train=sweep.train_run)
    results, failures = sweep.run_sweep(client, CONFIGS, STEPS, run=run, log=None)
    assert marker.exists(), "the victim never ran"
    killed_pid = int(marker.read_text())
    assert failures == []
    assert [(r["lr"], r["width"], r["seed"]) for r in results] == CONFIGS
    (retried,) = [r for r in results if (r["lr"], r["width"], r["seed"]) == victim]
    assert retried["pid"] != killed_pid
    for r in results:
        assert_equals_serial(r)
    client.wait_for_workers(2, timeout=30)  # the nanny brought the worker back
    assert killed_pid not in client.run(os.getpid).values()


def test_a_wrong_scheduler_address_fails_at_once_with_one_line_naming_it(tmp_path):
    """Not dask's 30 s wait ending in an uncaught OSError: a SystemExit whose
    message names the address, after --connect-timeout."""
    import socket
    import time
    with socket.socket() as s:          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as info:
        sweep.main(["--quick", "--scheduler", address, "--connect-timeout", "1",
                    "--out", str(tmp_path)])
    assert time.perf_counter() - t0 < 20
    message = str(info.value)
    assert f"no dask scheduler answered at {address} within 1 s" in message
    assert "\n" not in message
