"""Karpathy's microgpt.py, as written and on pygrad, side by side in one run.

    python benchmarks/bench_microgpt.py --source PATH/microgpt.py \\
        --data PATH/names.txt --steps 100 [--repeats 3]

``--source`` is your copy of the gist (microgpt.py, February 2026), and
``--data`` its names.txt (karpathy/makemore), which the script reads as
``input.txt``.  Neither ships with pygrad.  Each repeat runs, one fresh
process each and in turn (the first variant moving one place per repeat,
so that load on a shared machine hits each alike):

  original   the file as written, on CPython
  eager      the strict swap: its ``class Value`` block replaced by
             ``from pygrad import Value`` (docs/microgpt.md)
  compiled   the documented recipe (docs/microgpt.md), applied by this
             script to the file: one compiled program per document length
  pypy       the file as written, on ``pypy3`` (when on the PATH)
  eager_gc_off  the swap with the cyclic collector off (``gc.disable()``
             first): not a recipe, the bound of the eager row (what the
             collector's walks over the tracked Values cost)

``num_steps`` is set to ``--steps`` in each, and the step line prints the
loss with every digit (``repr``) so that runs can be compared.  The figure
is the CPU time (user + system) of the whole process: loading, training
and the 20 samples.  It prints a table of medians, whether each variant's
losses and samples match the original's, and last one JSON line:
original_cpu_s, eager_cpu_s, compiled_cpu_s, pypy_cpu_s (null without
pypy3), eager_max_rel_dev and compiled_max_rel_dev (the largest relative
difference of a step's loss from the original's).
"""
import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from microgpt_recipe import apply_recipe, strict_swap  # noqa: E402

STEPS_LINE = re.compile(r"^num_steps = \d+", re.M)
PRINT_LOSS = "| loss {loss.data:.4f}"


def variant_sources(source: str, steps: int) -> Dict[str, str]:
    """The file of each variant, with num_steps and the loss's digits set."""
    if not STEPS_LINE.search(source) or PRINT_LOSS not in source:
        raise SystemExit("bench_microgpt: --source does not look like microgpt.py "
                         "(no `num_steps = N` line or loss print)")
    base = STEPS_LINE.sub(f"num_steps = {steps}", source, count=1)
    base = base.replace(PRINT_LOSS, "| loss {loss.data!r}")
    eager = strict_swap(base)
    return {"original": base, "eager": eager, "compiled": apply_recipe(base),
            "eager_gc_off": "import gc; gc.disable()\n" + eager}


def run_one(python: List[str], path: str, cwd: str) -> Tuple[float, str]:
    """CPU seconds of one process running the file, and what it printed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(python + [path], cwd=cwd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"bench_microgpt: {os.path.basename(path)} failed:\n{out.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, out.stdout


def losses_and_samples(stdout: str) -> Tuple[List[float], List[str]]:
    losses = [float(x) for x in re.findall(r"\| loss (\S+)", stdout.replace("\r", "\n"))]
    samples = re.findall(r"^sample +\d+: (.*)$", stdout, re.M)
    return losses, samples


def max_rel_dev(a: List[float], b: List[float]) -> Optional[float]:
    if len(a) != len(b) or not a:
        return None
    return max(abs(x - y) / abs(y) if y else abs(x) for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", required=True, help="your copy of microgpt.py")
    ap.add_argument("--data", required=True, help="names.txt (read as input.txt)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-pypy", action="store_true", help="skip pypy3 even if installed")
    args = ap.parse_args()

    with open(args.source, encoding="utf-8") as f:
        sources = variant_sources(f.read(), args.steps)
    pypy = None if args.no_pypy else shutil.which("pypy3")
    work = tempfile.mkdtemp(prefix="bench_microgpt_")
    shutil.copy(args.data, os.path.join(work, "input.txt"))
    runs: List[Tuple[str, List[str], str]] = []
    for name, text in sources.items():
        path = os.path.join(work, f"{name}.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        runs.append((name, [sys.executable], path))
    if pypy:
        runs.append(("pypy", [pypy], os.path.join(work, "original.py")))

    times: Dict[str, List[float]] = {name: [] for name, _, _ in runs}
    printed: Dict[str, str] = {}
    for r in range(args.repeats):
        order = runs[r % len(runs):] + runs[:r % len(runs)]
        for name, python, path in order:
            cpu, stdout = run_one(python, path, work)
            times[name].append(cpu)
            printed.setdefault(name, stdout)
            print(f"  repeat {r + 1}: {name:9s} {cpu:8.2f} s CPU", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)

    ref_losses, ref_samples = losses_and_samples(printed["original"])
    med = {name: statistics.median(t) for name, t in times.items()}
    devs: Dict[str, Optional[float]] = {}
    print(f"\nmicrogpt.py, {args.steps} steps, median of {args.repeats} (CPU s, whole process)")
    print(f"{'variant':10s} {'CPU s':>9s} {'original/this':>14s} {'max rel dev':>12s}  samples")
    for name in times:
        losses, samples = losses_and_samples(printed[name])
        devs[name] = max_rel_dev(losses, ref_losses)
        dev = "n/a" if devs[name] is None else f"{devs[name]:.1e}"
        same = "identical" if samples == ref_samples else "differ"
        print(f"{name:10s} {med[name]:9.2f} {med['original'] / med[name]:13.1f}× {dev:>12s}  {same}")
    print(json.dumps({
        "steps": args.steps,
        "original_cpu_s": round(med["original"], 3),
        "eager_cpu_s": round(med["eager"], 3),
        "compiled_cpu_s": round(med["compiled"], 3),
        "pypy_cpu_s": round(med["pypy"], 3) if "pypy" in med else None,
        "eager_max_rel_dev": devs["eager"],
        "compiled_max_rel_dev": devs["compiled"],
    }))


if __name__ == "__main__":
    main()
