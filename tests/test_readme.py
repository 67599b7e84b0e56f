"""Every Python example in README.md runs (each block on its own)."""
import pathlib

import pytest

from helpers import python_blocks, run_blocks

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("i", range(len(BLOCKS)), ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(i):
    run_blocks([BLOCKS[i]], f"README.md, block {i}")
