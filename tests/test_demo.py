"""The demo (python -m pygrad): it trains, and its command line works."""
import io
import os
import sys

import numpy as np
import pytest

from pygrad import demo


@pytest.fixture(scope="module")
def moons():
    return demo.train_moons()


def test_moons_reaches_full_accuracy_in_100_steps(moons):
    assert len(moons["losses"]) == len(moons["accuracy"]) == 100
    assert moons["accuracy"][-1] == 1.0


def test_moons_loss_falls(moons):
    losses = moons["losses"]
    assert losses[-1] < 0.1 * losses[0]
    assert sum(losses[-10:]) < sum(losses[:10])


def test_moons_is_deterministic(moons):
    again = demo.train_moons(steps=10)
    assert again["losses"] == moons["losses"][:10]


@pytest.mark.slow     # seconds: the default run stays near 90 s
def test_moons_reference_engine_gives_the_same_losses(moons):
    ref = demo.train_moons(steps=2, engine="reference")
    assert ref["losses"] == moons["losses"][:2]


def test_spiral_reaches_95_percent_accuracy():
    result = demo.train_spiral(steps=200)
    assert len(result["losses"]) == 200
    assert result["accuracy"][-1] >= 0.95
    assert result["losses"][-1] < result["losses"][0]


@pytest.fixture
def no_micrograd(monkeypatch):
    """As if micrograd were not installed (its timing costs seconds); its
    submodules too, which an earlier test (docs/ blocks) may have imported
    and import_module would then return from sys.modules."""
    for name in ("micrograd", "micrograd.engine", "micrograd.nn"):
        monkeypatch.setitem(sys.modules, name, None)


def _lines_fit(out: str) -> None:
    """No line wraps on an 100-column terminal."""
    assert max(len(line) for line in out.splitlines()) <= 100, out


def test_cli_runs_moons_and_checks_the_reference(capsys, tmp_path, monkeypatch, no_micrograd):
    monkeypatch.chdir(tmp_path)
    rc = demo.main(["--dataset", "moons", "--steps", "5", "--no-plot",
                    "--reference-seconds", "0.001"])
    assert rc == 0
    out = capsys.readouterr().out
    # Up front: what it does, how long, and what "x faster" means.
    plan = " ".join(out.split("\n== ")[0].split())
    assert plan.startswith("pygrad demo: moons on the replay tier; then times the slow engines "
                           "(--reference-seconds 0.001 each) for the speedups; about 1 s in all "
                           "(x faster: the slow engine's seconds per full-batch step / the tier's"
                           ", which are its whole run"), plan
    assert "== moons: 5 steps" in out
    # The speedup line says what it compares: not micrograd, pygrad's own slow engine.
    assert "replay tier vs pygrad's pure-Python reference engine (pygrad.reference" in out
    # Not even one full step fits the budget: a probe on a quarter of the rows,
    # a lower bound, and the C engine checked on the same rows.
    assert "x faster; reference >= ~" in out
    assert "ms/step, a lower bound (1 step on 25 of 100 rows, x4)\n" in out
    assert "     >= ~" in out
    assert "the C engine's loss on those rows bit for bit: True" in out
    assert "pip install micrograd to also time micrograd's own code" in out
    assert "spiral" not in out
    assert os.listdir(tmp_path) == []        # --no-plot writes nothing
    _lines_fit(out)


@pytest.mark.slow     # seconds: the default run stays near 90 s
def test_cli_times_whole_steps_when_the_budget_allows(capsys, no_micrograd):
    """A budget no step can overrun: the reference runs full steps, as many
    as the tier trained (here 1), and its losses are the tier's bit for bit."""
    assert demo.main(["--dataset", "moons", "--steps", "1", "--no-plot",
                      "--reference-seconds", "1e9"]) == 0
    out = capsys.readouterr().out
    assert "x faster; reference ~" in out and "ms/step, the mean of 1 step\n" in out
    assert "     same losses bit for bit: True\n" in out
    assert "lower bound" not in out
    _lines_fit(out)


def _instant(rows_seen):
    """A slow engine's stand-in: steps that cost nothing, recording their rows."""
    def make(m):
        rows_seen.append(m)
        while True:
            yield float(m)
    return make


def test_the_slow_engines_timing_stops_within_its_budget_or_probes():
    seen = []
    losses, per_step, used = demo._timed_steps("x", _instant(seen), 100, 0.0, io.StringIO())
    assert (losses, used, seen) == ([25.0], 25, [25])     # the probe alone
    seen = []
    losses, per_step, used = demo._timed_steps("x", _instant(seen), 100, 1e9, io.StringIO(),
                                               most=3)
    assert (losses, used, seen) == ([100.0] * 3, 100, [25, 100])   # probe, then 3 full steps
    assert per_step >= 0.0
    assert demo._measured(10.0, 1, 25, 100) == (
        ">= ~40 ms/step, a lower bound (1 step on 25 of 100 rows, x4)", ">= ~")
    assert demo._measured(10.0, 3, 100, 100) == ("~10 ms/step, the mean of 3 steps", "~")
    assert demo._measured(10.0, 1, 37, 150)[0].endswith("(1 step on 37 of 150 rows, x4.05)")


def test_cli_times_micrograds_own_loop_against_the_same_loop_on_pygrad(capsys):
    pytest.importorskip("micrograd")
    assert demo.main(["--dataset", "moons", "--steps", "2", "--no-plot",
                      "--reference-seconds", "0.001"]) == 0
    out = capsys.readouterr().out
    assert "; about 1 s in all" in " ".join(out.split())      # three timings of 0.001 s
    lines = out.splitlines()
    at = [i for i, ln in enumerate(lines) if "micrograd's own demo loop" in ln]
    assert len(at) == 1, out
    head, ratio, same = lines[at[0]:at[0] + 3]
    assert head.endswith("on micrograd.engine.Value vs unchanged on pygrad.Value:")
    # pygrad did the same work as micrograd: one step on the probe's rows
    assert ratio.startswith("     pygrad ~") and "x faster (micrograd ~" in ratio, ratio
    assert ratio.endswith("ms/step, 1 step on 25 of the 100 rows)"), ratio
    assert same == "     same losses to 1e-12 (micrograd sums grads in another order): True"
    _lines_fit(out)


def test_micrograds_loop_on_pygrad_gives_micrograds_losses():
    """The loop the demo times, on both engines: the same numbers up to the
    order micrograd sums grads in."""
    pytest.importorskip("micrograd")
    import micrograd.engine
    import micrograd.nn

    import pygrad
    import pygrad.nn
    from pygrad import data
    X, y = data.make_moons(30, noise=0.1, seed=3)
    rows, labels = X.tolist(), data.signed_labels(y).tolist()
    theirs = demo._micrograd_demo_loop(micrograd.engine.Value, micrograd.nn.MLP, rows, labels, 3)
    ours = demo._micrograd_demo_loop(pygrad.Value, pygrad.nn.MLP, rows, labels, 3)
    a, b = [next(theirs) for _ in range(3)], [next(ours) for _ in range(3)]
    np.testing.assert_allclose(b, a, rtol=1e-12)
    assert b[2] != b[0]


# -- Ctrl-C and --out: one line and an exit status, not a traceback --------------

@pytest.mark.parametrize("where", ["train", "_reference_steps", "_plot"])
def test_ctrl_c_prints_one_line_and_exits_130(capsys, tmp_path, monkeypatch, no_micrograd, where):
    """The interrupt is raised by a patched step of the run, at a chosen
    point: in training, while timing the reference engine, while plotting."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(demo, where, interrupted)
    monkeypatch.setattr(demo, "_will_plot", lambda args: not args.no_plot)
    rc = demo.main(["--dataset", "moons", "--steps", "2", "--reference-seconds", "0.001",
                    "--out", str(tmp_path / "png")])
    assert rc == 130
    out, err = capsys.readouterr()
    assert err == "interrupted\n"
    assert out.startswith("pygrad demo: moons") and "\n== moons: 2 steps" in out
    assert ("final loss" in out) == (where != "train")


def test_python_m_pygrad_exits_130_after_ctrl_c(tmp_path):
    """The same through ``python -m pygrad`` (its sys.exit): status 130 and
    the one line, with the interrupt raised from inside training."""
    import subprocess
    code = ("import sys, runpy\n"
            "import pygrad.demo as demo\n"
            "def train(*args, **kwargs):\n"
            "    raise KeyboardInterrupt\n"
            "demo.train = train\n"
            "sys.argv = ['pygrad', '--no-plot']\n"
            "runpy.run_module('pygrad', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "interrupted\n"


def test_a_reader_that_goes_away_ends_the_run_quietly(capsys, monkeypatch):
    """``pygrad | head``: the pipe's end is raised by a patched step."""
    def closed(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(demo, "train", closed)
    assert demo.main(["--dataset", "moons", "--no-plot"]) == 141
    assert capsys.readouterr().err == ""


def test_ctrl_c_while_the_demo_loads_exits_130_too(capsys, monkeypatch):
    """``pygrad``'s entry point imports the demo (a tenth of a second)
    before main's handler exists; the interrupt is raised by that import."""
    import pygrad.__main__ as entry

    class Loading:
        def __getattr__(self, name):
            raise KeyboardInterrupt
    monkeypatch.setitem(sys.modules, "pygrad.demo", Loading())
    with pytest.raises(SystemExit) as exc:
        entry.run()
    assert exc.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"


def _bad_out_cases(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    cases = {"an existing file": (str(afile), "is a file, not a folder"),
             "a folder below a file": (str(afile / "sub"), "Not a directory")}
    if os.path.isdir("/proc"):
        cases["/proc/x"] = ("/proc/x", "can't write PNGs there")
        cases["/proc"] = ("/proc", "can't write PNGs there")
    return cases


@pytest.mark.parametrize("case", ["an existing file", "a folder below a file", "/proc/x", "/proc"])
def test_a_bad_out_is_one_line_and_exit_2_before_any_training(capsys, tmp_path, monkeypatch,
                                                               case):
    cases = _bad_out_cases(tmp_path)
    if case not in cases:
        pytest.skip("no /proc here")
    out_dir, says = cases[case]

    def train(*args, **kwargs):
        raise AssertionError("trained before checking --out")
    monkeypatch.setattr(demo, "train", train)
    monkeypatch.setattr(demo, "_will_plot", lambda args: not args.no_plot)
    assert demo.main(["--dataset", "moons", "--out", out_dir]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"pygrad: error: --out {out_dir!r}") and says in err
    assert err.count("\n") == 1
    assert (tmp_path / "afile").read_text() == "mine"      # the file is left alone


@pytest.mark.parametrize("case", ["a file", "unwritable"])
def test_a_bad_default_out_is_named_as_the_default(capsys, tmp_path, monkeypatch, case):
    """No --out given: the message names the default folder, not an --out
    the user never passed."""
    if case == "a file":
        monkeypatch.chdir(tmp_path)
        (tmp_path / "pygrad-demo").write_text("mine")
        says = "the default output folder ./pygrad-demo/ is a file, not a folder; pass --out DIR"
    else:
        if not os.path.isdir("/proc/self"):
            pytest.skip("no /proc here")
        monkeypatch.chdir("/proc/self")      # not writable, even as root
        says = "the default output folder ./pygrad-demo/ is not writable ("
    monkeypatch.setattr(demo, "_will_plot", lambda args: not args.no_plot)
    assert demo.main(["--dataset", "moons"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"pygrad: error: {says}"), err
    assert "--out 'pygrad-demo'" not in err and err.endswith("pass --out DIR, or --no-plot\n")


def test_out_is_not_checked_when_no_png_is_written(capsys, tmp_path, no_micrograd):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert demo.main(["--dataset", "moons", "--steps", "2", "--no-plot", "--reference-seconds",
                      "0", "--out", str(afile)]) == 0


def test_without_matplotlib_nothing_is_plotted_and_out_not_made(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out_dir = tmp_path / "png"
    assert demo.main(["--dataset", "moons", "--steps", "2", "--reference-seconds", "0",
                      "--out", str(out_dir)]) == 0
    assert "install matplotlib" in capsys.readouterr().out
    assert not out_dir.exists()


def test_a_good_out_is_made_before_training(capsys, tmp_path, monkeypatch):
    out_dir = tmp_path / "new" / "png"
    made = []

    def train(*args, **kwargs):
        made.append(out_dir.is_dir())
        raise KeyboardInterrupt          # stops the run here: only the order is tested
    monkeypatch.setattr(demo, "train", train)
    monkeypatch.setattr(demo, "_will_plot", lambda args: not args.no_plot)
    assert demo.main(["--dataset", "moons", "--out", str(out_dir)]) == 130
    assert made == [True] and os.listdir(out_dir) == []


def test_a_png_that_cant_be_written_after_training_is_one_line_and_exit_1(capsys, tmp_path,
                                                                        monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(demo, "_plot", full)
    monkeypatch.setattr(demo, "_will_plot", lambda args: not args.no_plot)
    assert demo.main(["--dataset", "moons", "--steps", "2", "--reference-seconds", "0",
                      "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == f"pygrad: error: can't write the PNGs into {str(tmp_path)!r}: No space left on device\n"


def test_cli_reference_seconds_zero_skips_the_comparison(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert demo.main(["--dataset", "moons", "--steps", "2", "--no-plot",
                      "--reference-seconds", "0"]) == 0
    out = capsys.readouterr().out
    assert "final loss" in out and "bit for bit" not in out


def test_cli_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as exc:
        demo.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--dataset" in out and "--steps" in out
    assert "`" not in out                       # no raw reST markup


def test_cli_version(capsys):
    import pygrad
    with pytest.raises(SystemExit) as exc:
        demo.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"pygrad {pygrad.__version__}"


@pytest.mark.slow     # seconds: the default run stays near 90 s
def test_cli_batched_tier_says_how_close_it_is(capsys, tmp_path, monkeypatch, no_micrograd):
    monkeypatch.chdir(tmp_path)
    assert demo.main(["--dataset", "moons", "--steps", "1", "--no-plot", "--tier", "batched",
                      "--reference-seconds", "1e9"]) == 0
    out = capsys.readouterr().out
    assert "same losses to 1e-12 (batched: sums over rows in row order): True" in out
    assert "bit for bit" not in out


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--steps", "-3"], ["--dataset", "mnist"],
                                  ["--steps", "many"]])
def test_cli_bad_arguments_are_errors(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        demo.main(argv + ["--no-plot"])
    assert exc.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "error" in err
    if argv[:2] == ["--steps", "0"]:
        assert "--steps must be at least 1" in err


@pytest.mark.parametrize("task", ["moons", "spiral"])
def test_batched_tier_trains_like_the_replay_tier(task):
    """One sample's graph over the rows (Program.map): the sums over rows
    run in another order than the full graph's, so the losses agree to
    rounding, not bit for bit; the accuracies are the same."""
    a = demo.train(task, 40, tier="replay")
    b = demo.train(task, 40, tier="batched")
    np.testing.assert_allclose(b["losses"], a["losses"], rtol=1e-12)
    assert b["accuracy"] == a["accuracy"]
    assert b["tier"] == "batched"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_piped_prints_every_tenth_step():
    out = io.StringIO()
    bar = demo.Progress("moons", 20, out)
    for k in range(20):
        bar.update(k, 1.0 / (k + 1), 0.5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[-1].startswith("moons step   20/20  loss 0.0500")


def test_progress_on_a_terminal_uses_tqdm_when_installed(monkeypatch):
    pytest.importorskip("tqdm")
    out = _Terminal()
    bar = demo.Progress("spiral", 5, out)
    for k in range(5):
        bar.update(k, 0.25, 1.0)
    text = out.getvalue()
    assert "spiral" in text and "5/5" in text and "loss 0.2500, accuracy 100.0%" in text


def test_progress_on_a_terminal_without_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    out = _Terminal()
    bar = demo.Progress("moons", 4, out)
    for k in range(4):
        bar.update(k, 0.5, 0.75)
    assert out.getvalue().endswith("[" + "#" * 20 + "] moons step    4/4  loss 0.5000  accuracy  75.0%\n")


def test_the_demos_loss_curve_is_on_a_log_scale(tmp_path, monkeypatch):
    plt = pytest.importorskip("matplotlib.pyplot")
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    result = demo.train("spiral", 30)
    paths = demo._plot(result, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["spiral_boundary.png", "spiral_loss.png"]
    ax = figures[-1].axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "loss (log scale)"
    assert ax.get_xlabel() == "step"
    assert ax.get_title().startswith("spiral: training loss, replay tier (final ")
    assert list(ax.get_lines()[0].get_ydata()) == result["losses"]
