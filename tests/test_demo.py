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


def test_moons_reference_engine_gives_the_same_losses(moons):
    ref = demo.train_moons(steps=2, engine="reference")
    assert ref["losses"] == moons["losses"][:2]


def test_spiral_reaches_95_percent_accuracy():
    result = demo.train_spiral(steps=200)
    assert len(result["losses"]) == 200
    assert result["accuracy"][-1] >= 0.95
    assert result["losses"][-1] < result["losses"][0]


def test_cli_runs_moons_and_checks_the_reference(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = demo.main(["--dataset", "moons", "--steps", "5", "--no-plot",
                    "--reference-seconds", "0.001"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "== moons: 5 steps" in out
    assert "same losses bit for bit: True" in out
    assert "(estimate from 1 step)" in out          # the budget bounds the slow engine
    assert "spiral" not in out
    assert os.listdir(tmp_path) == []        # --no-plot writes nothing


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


def test_cli_batched_tier_says_how_close_it_is(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert demo.main(["--dataset", "moons", "--steps", "3", "--no-plot", "--tier", "batched",
                      "--reference-seconds", "0.001"]) == 0
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
