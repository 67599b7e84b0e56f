"""Every script in examples/ runs in its --quick form and reaches its result;
they share one command line (--quick, --out DIR, --help) and write files
only into --out."""
import contextlib
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.glob("[0-9]*.py"))


@contextlib.contextmanager
def examples_on_path():
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield
    finally:
        sys.path.remove(str(EXAMPLES))


def load(name: str):
    """Import examples/<name>.py as a module (its helpers come from examples/)."""
    with examples_on_path():
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def imported(name: str):
    """examples/<name>.py imported under its own name, importable as such
    (in sys.modules, examples/ on sys.path) until the block ends: spawned
    worker processes find its functions by importing it."""
    with examples_on_path():
        module = load(name)
        sys.modules[name] = module
        try:
            yield module
        finally:
            del sys.modules[name]


def run(name: str, *argv: str) -> dict:
    with imported(name) as module:
        return module.main(["--quick", *argv])


def matplotlib_missing() -> bool:
    return importlib.util.find_spec("matplotlib") is None


def graphviz_draws() -> bool:
    return importlib.util.find_spec("graphviz") is not None and shutil.which("dot") is not None


# What each example writes into --out (given what is installed); the others write nothing.
WRITES = {
    "02_expression_graph": lambda: {"expression_graph.svg"} if graphviz_draws() else set(),
    "04_moons": lambda: set() if matplotlib_missing() else {"moons_boundary.png"},
    "05_spiral_softmax": lambda: set() if matplotlib_missing() else {"spiral_boundary.png"},
    "10_sweep_dask": lambda: set() if matplotlib_missing() else {"sweep_heatmap.png"},
    "11_higher_order": lambda: set() if matplotlib_missing() else {"tanh_derivatives.png"},
}
NEEDS = {"10_sweep_dask": "distributed"}


class Ran:
    """One --quick run of an example, with --out in a folder of its own,
    from another empty working directory."""

    def __init__(self, name: str, base: pathlib.Path) -> None:
        self.out, self.cwd = base / "out", base / "cwd"
        self.cwd.mkdir()
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(self.cwd)
            self.result = run(name, "--out", str(self.out))


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """ran(name): the example's --quick run (see Ran), once per module."""
    runs = {}

    def get(name: str) -> Ran:
        if name in NEEDS:
            pytest.importorskip(NEEDS[name])
        if name not in runs:
            runs[name] = Ran(name, tmp_path_factory.mktemp(name))
        return runs[name]
    return get


def fell(losses, factor: float) -> bool:
    return losses[-1] < factor * losses[0]


def test_every_example_is_tested_and_documented():
    tested = set(re.findall(r'"(\d\d_\w+)"', pathlib.Path(__file__).read_text()))
    assert {p.stem for p in SCRIPTS} == tested
    for p in SCRIPTS:
        assert load(p.stem).__doc__.strip(), f"{p.name} has no docstring"


def test_finite_differences_match_the_exact_derivative(ran):
    r = ran("01_finite_differences").result
    assert r["exact"] == 14.0
    assert r["errors"][1e-5] < 1e-6 < r["errors"][1e-12]
    assert all(abs(e - n) < 1e-8 for e, n in zip(r["exact3"], r["numeric3"]))


def test_backprop_by_hand_equals_backward(ran):
    r = ran("02_expression_graph").result
    assert r["by_hand"] == r["by_backward"]
    assert (r["by_hand"]["a"], r["by_hand"]["b"], r["by_hand"]["c"]) == (6.0, -4.0, -2.0)
    if r["drawing"] is not None:
        assert pathlib.Path(r["drawing"]).stat().st_size > 0


def test_toy_classifiers_learn_with_relu_and_tanh(ran):
    results = ran("03_toy_classifiers").result
    assert set(results) == {(t, k) for t in ("xor", "micrograd 4-sample") for k in ("relu", "tanh")}
    for r in results.values():
        assert fell(r["losses"], 0.1) and r["correct"] == 4


@pytest.mark.parametrize("name, accuracy", [("04_moons", 0.95), ("05_spiral_softmax", 0.8)])
def test_classifiers_reach_their_accuracy_and_plot(name, accuracy, ran):
    r = ran(name).result
    assert fell(r["losses"], 0.5) and r["accuracy"][-1] >= accuracy
    if matplotlib_missing():
        assert r["plot"] is None
    else:
        assert pathlib.Path(r["plot"]).read_bytes()[:4] == b"\x89PNG"


def test_gradcheck_passes_every_op_and_catches_a_wrong_one(ran):
    r = ran("06_gradcheck").result
    assert len(r["results"]) >= 18 and all(res.ok for res in r["results"].values())
    assert not r["wrong"].ok


@pytest.mark.slow     # seconds: the default run stays near 90 s
def test_timing_engines_agree_bit_for_bit(ran):
    r = ran("07_timing").result
    assert r["losses"]["eager"] == r["losses"]["reference"] == r["losses"]["replay"]
    assert fell(r["losses"]["replay"], 1.0)
    assert set(r["seconds"]) == {"reference", "eager", "replay"}


PORT = EXAMPLES / "08_micrograd_port.py"
PYGRAD_IMPORTS = "from pygrad.engine import Value\nfrom pygrad.nn import MLP\n"
MICROGRAD_IMPORTS = "from micrograd.engine import Value\nfrom micrograd.nn import MLP\n"


def test_micrograd_port_differs_from_micrograd_code_only_in_its_imports(ran):
    text = PORT.read_text()
    assert text.count(PYGRAD_IMPORTS) == 1
    assert "#   " + MICROGRAD_IMPORTS.replace("\n", "\n#   ").rstrip("# ") in text
    ours = ran("08_micrograd_port").result
    assert fell(ours["losses"], 0.5)
    pytest.importorskip("micrograd")
    ns = {"__name__": "micrograd_port"}
    with examples_on_path():
        exec(compile(text.replace(PYGRAD_IMPORTS, MICROGRAD_IMPORTS), str(PORT), "exec"), ns)
    theirs = ns["main"](["--quick"])
    assert theirs["losses"] == pytest.approx(ours["losses"], rel=1e-9)
    assert theirs["predictions"] == pytest.approx(ours["predictions"], rel=1e-9)


def test_higher_order_example_runs_newton_and_six_derivatives(ran):
    r = ran("11_higher_order").result
    x, y = r["newton"][-1]
    assert abs(x - 1.0) < 1e-3 and abs(y - 0.5) < 1e-3
    # at 0: tanh 0, then 1, 0, -2, 0, 16 (its Taylor series: x - x^3/3 + 2x^5/15)
    at_zero = r["derivatives"][r["xs"].index(0.0)]
    assert at_zero[:4] == [0.0, 1.0, 0.0, -2.0] and abs(at_zero[5] - 16.0) < 1e-12


def test_an_example_runs_as_a_script(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPTS[0]), "--quick"], capture_output=True,
                         text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "[ok] backward gives exactly 6x - 4" in out.stdout


def test_sweep_on_dask_equals_serial_runs(ran):
    r = ran("10_sweep_dask").result
    assert r["failures"] == [] and r["mismatches"] == []
    assert r["checked"] == len(r["results"]) == 8
    if matplotlib_missing():
        assert r["plot"] is None
    else:
        assert pathlib.Path(r["plot"]).read_bytes()[:4] == b"\x89PNG"


def test_seeds_in_worker_processes_equal_serial_training(ran):
    r = ran("09_seeds_in_processes").result
    assert r["seeds"] == [0, 1, 2] and r["steps"] == 20 and r["start_method"] == "spawn"
    assert r["equal"] == {0: True, 1: True, 2: True}
    assert os.getpid() not in r["pids"] and 1 <= len(r["pids"]) <= r["workers"] == 2
    for seed, w in r["results"].items():
        assert len(w["losses"]) == r["steps"] + 1 and fell(w["losses"], 0.5)
        assert w["losses"] == r["serial"][seed]["losses"]
        model = w["model"]  # the trained model object, pickled back from the worker
        assert type(model) is type(r["serial"][seed]["model"])
        assert model.get_data().tobytes() == r["serial"][seed]["model"].get_data().tobytes()
    assert len({tuple(w["losses"]) for w in r["results"].values()}) == 3  # the seeds differ


def test_seeds_in_worker_processes_catch_a_one_ulp_difference(capsys):
    """The workers import the example afresh; only this process's serial
    training is nudged, by one ulp in its last loss."""
    with imported("09_seeds_in_processes") as example:
        train = example.train

        def nudged(model, steps):
            history = train(model, steps)
            return history[:-1] + [float(np.nextafter(history[-1], np.inf))]
        example.train = nudged
        with pytest.raises(SystemExit) as exit_:
            example.main(["--quick"])
    assert exit_.value.code == 1
    assert "[FAILED] all 3 seeds' losses" in capsys.readouterr().out


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_help_shows_the_shared_command_line_and_trains_nothing(script, tmp_path):
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: {script.name} ")
    assert "--quick" in out.stdout and "--out DIR" in out.stdout
    # files never land straight in the working directory: --out defaults to a folder
    default = re.search(r"\(default: ([^)]*)\)", " ".join(out.stdout.split())).group(1)
    assert default.startswith("pygrad-"), default
    with examples_on_path():
        import _common
    description = _common.summary(load(script.stem).__doc__)
    text = " ".join(out.stdout.split())
    assert description in text and not re.search(r"``|:\w+:`|`_", text)
    assert "[ok]" not in out.stdout  # every example's run ends in [ok] checks
    assert list(tmp_path.iterdir()) == []


def test_timings_help_says_a_full_run_takes_minutes():
    """07_timing.py without --quick ran 201 s in a newcomer's hands: --help warns."""
    script = next(p for p in SCRIPTS if p.stem == "07_timing")
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                         text=True, timeout=60)
    text = " ".join(out.stdout.split())
    assert "Without --quick this takes a few minutes" in text and "--quick takes seconds" in text


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_files_go_into_out_and_nowhere_else(script, ran):
    r = ran(script.stem)
    written = {p.name for p in r.out.iterdir()} if r.out.exists() else set()
    assert written == WRITES.get(script.stem, set)()
    assert list(r.cwd.iterdir()) == []
