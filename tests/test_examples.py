"""Every script in examples/ runs in its --quick form and reaches its result."""
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.glob("[0-9]*.py"))


def load(name: str):
    """Import examples/<name>.py as a module (its helpers come from examples/)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


def run(name: str, *argv: str) -> dict:
    return load(name).main(["--quick", *argv])


def fell(losses, factor: float) -> bool:
    return losses[-1] < factor * losses[0]


def matplotlib_missing() -> bool:
    return importlib.util.find_spec("matplotlib") is None


def test_every_example_is_tested_and_documented():
    tested = set(re.findall(r'"(\d\d_\w+)"', pathlib.Path(__file__).read_text()))
    assert {p.stem for p in SCRIPTS} == tested
    for p in SCRIPTS:
        assert load(p.stem).__doc__.strip(), f"{p.name} has no docstring"


def test_finite_differences_match_the_exact_derivative():
    r = run("01_finite_differences")
    assert r["exact"] == 14.0
    assert r["errors"][1e-5] < 1e-6 < r["errors"][1e-12]
    assert all(abs(e - n) < 1e-8 for e, n in zip(r["exact3"], r["numeric3"]))


def test_backprop_by_hand_equals_backward(tmp_path):
    r = run("02_expression_graph", "--out", str(tmp_path))
    assert r["by_hand"] == r["by_backward"]
    assert (r["by_hand"]["a"], r["by_hand"]["b"], r["by_hand"]["c"]) == (6.0, -4.0, -2.0)
    if r["drawing"] is not None:
        assert pathlib.Path(r["drawing"]).stat().st_size > 0


def test_toy_classifiers_learn_with_relu_and_tanh():
    results = run("03_toy_classifiers")
    assert set(results) == {(t, k) for t in ("xor", "micrograd 4-sample") for k in ("relu", "tanh")}
    for r in results.values():
        assert fell(r["losses"], 0.1) and r["correct"] == 4


@pytest.mark.parametrize("name, accuracy", [("04_moons", 0.95), ("05_spiral_softmax", 0.8)])
def test_classifiers_reach_their_accuracy_and_plot(name, accuracy, tmp_path):
    r = run(name, "--out", str(tmp_path))
    assert fell(r["losses"], 0.5) and r["accuracy"][-1] >= accuracy
    if matplotlib_missing():
        assert r["plot"] is None
    else:
        assert pathlib.Path(r["plot"]).read_bytes()[:4] == b"\x89PNG"


def test_gradcheck_passes_every_op_and_catches_a_wrong_one():
    r = run("06_gradcheck")
    assert len(r["results"]) >= 18 and all(res.ok for res in r["results"].values())
    assert not r["wrong"].ok


def test_timing_engines_agree_bit_for_bit():
    r = run("07_timing")
    assert r["losses"]["eager"] == r["losses"]["reference"] == r["losses"]["replay"]
    assert fell(r["losses"]["replay"], 1.0)
    assert set(r["seconds"]) == {"reference", "eager", "replay"}


PORT = EXAMPLES / "08_micrograd_port.py"
PYGRAD_IMPORTS = "from pygrad.engine import Value\nfrom pygrad.nn import MLP\n"
MICROGRAD_IMPORTS = "from micrograd.engine import Value\nfrom micrograd.nn import MLP\n"


def test_micrograd_port_differs_from_micrograd_code_only_in_its_imports():
    text = PORT.read_text()
    assert text.count(PYGRAD_IMPORTS) == 1
    assert "#   " + MICROGRAD_IMPORTS.replace("\n", "\n#   ").rstrip("# ") in text
    ours = run("08_micrograd_port")
    assert fell(ours["losses"], 0.5)
    pytest.importorskip("micrograd")
    ns = {"__name__": "micrograd_port"}
    exec(compile(text.replace(PYGRAD_IMPORTS, MICROGRAD_IMPORTS), str(PORT), "exec"), ns)
    theirs = ns["main"](["--quick"])
    assert theirs["losses"] == pytest.approx(ours["losses"], rel=1e-9)
    assert theirs["predictions"] == pytest.approx(ours["predictions"], rel=1e-9)


def test_an_example_runs_as_a_script(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPTS[0]), "--quick"], capture_output=True,
                         text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "[ok] backward gives exactly 6x - 4" in out.stdout


def test_sweep_on_dask_equals_serial_runs(tmp_path):
    pytest.importorskip("distributed")
    r = run("10_sweep_dask", "--out", str(tmp_path))
    assert r["failures"] == [] and r["mismatches"] == []
    assert r["checked"] == len(r["results"]) == 8
    if matplotlib_missing():
        assert r["plot"] is None
    else:
        assert pathlib.Path(r["plot"]).read_bytes()[:4] == b"\x89PNG"
