"""Small helpers shared by the examples: the command line every example
takes, a result check that fails the run, and a decision-boundary plot."""
import argparse
import os
import re
from typing import Any, List, Optional, Sequence

import numpy as np


def summary(doc: str) -> str:
    """The first paragraph of a docstring as one line of plain text: reST
    markup (``code``, :role:`name`, `link`_) reduced to its text."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    paragraph = re.sub(r":[\w:]+:`([^`]*)`", r"\1", paragraph)    # :func:`x` -> x
    paragraph = re.sub(r"``([^`]*)``", r"\1", paragraph)          # ``x`` -> x
    return re.sub(r"`([^`<]*?)\s*(?:<[^>]*>)?`_{0,2}", r"\1", paragraph)  # `x <url>`_ -> x


def make_parser(doc: str, writes: str = "", out_default: str = "pygrad-examples") -> argparse.ArgumentParser:
    """The command line every example shares: ``--quick`` and ``--out DIR``
    (and ``--help``, described by the docstring's first paragraph).
    ``writes`` names the files the example writes into DIR (empty: none, but
    --out is accepted all the same).  Files go into DIR only, never
    straight into the working directory: the default is a folder of their
    own, ``./pygrad-examples/`` (listed in .gitignore).  An example with options of its own adds
    them to the parser this returns."""
    p = argparse.ArgumentParser(description=summary(doc))
    p.add_argument("--quick", action="store_true", help="a smaller run, a few seconds")
    what = f"the folder for {writes}" if writes else "for files; this example writes none"
    p.add_argument("--out", metavar="DIR", default=out_default,
                   help=f"{what} (default: {out_default})")
    return p


def parse_args(doc: str, argv: Optional[Sequence[str]], writes: str = "") -> argparse.Namespace:
    """Parse ``argv`` (None: sys.argv) with :func:`make_parser`."""
    return make_parser(doc, writes).parse_args(argv)


def check(ok: bool, what: str) -> None:
    """Print the outcome of a check; a failed check ends the run with exit 1."""
    print(f"  [{'ok' if ok else 'FAILED'}] {what}")
    if not ok:
        raise SystemExit(1)


def plot_decision_boundary(model: Any, X: np.ndarray, y: np.ndarray, path: str,
                           title: str) -> Optional[str]:
    """Colour the plane by the model's class under the data points (pygrad's
    one helper, pygrad.boundary: the whole grid in one batched C call); the
    PNG's path, or None without matplotlib."""
    from pygrad.boundary import plot_decision_boundary as plot
    written = plot(model, X, y, path, title)
    if written is None:
        print("  (matplotlib is not installed: no plot; pip install matplotlib)")
    else:
        print(f"  wrote {written}")
    return written


def accuracy(predicted: Any, y: Any) -> float:
    return float(np.mean(np.asarray(predicted) == np.asarray(y)))
