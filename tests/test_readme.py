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


def test_the_index_description_has_no_link_an_index_page_cant_follow():
    """setup.py gives the package index README.md with links into the
    repository turned into plain paths (there is no project home yet)."""
    import re
    import runpy
    setup_py = pathlib.Path(__file__).resolve().parent.parent / "setup.py"
    if not setup_py.exists():
        pytest.skip("no setup.py beside the tests")
    describe = runpy.run_path(str(setup_py), run_name="not_main")["index_description"]
    readme = setup_py.with_name("README.md").read_text(encoding="utf-8")
    text = describe(readme)
    assert re.search(r"\]\((?!https?://|#)", readme), "README has no repository links to test"
    assert not re.search(r"\]\((?!https?://|#)", text), re.findall(r"\]\((?!https?://|#)[^)]*\)", text)
    assert "`docs/api.md`" in text and "in the source distribution" in text
    # nothing else is lost: the text outside links is the same
    strip = lambda s: re.sub(r"!?\[[^\]]*\]\([^)]*\)", "", s)          # noqa: E731
    assert len(strip(text)) >= len(strip(readme))


# -- the README as a front door (issue 40) --------------------------------------

TEXT = README.read_text(encoding="utf-8")
ROOT = README.parent


def _section(title: str) -> str:
    """The text of the ``## title`` section, up to the next ``## ``."""
    head = f"\n## {title}\n"
    assert head in TEXT, f"README has no '## {title}' section"
    return TEXT.split(head, 1)[1].split("\n## ", 1)[0]


def test_the_readme_is_at_most_300_lines():
    """Internals, lifetime, the full benchmark record and CI live in docs/."""
    assert len(TEXT.splitlines()) <= 300, len(TEXT.splitlines())


def test_the_ci_commands_block_is_the_two_commands():
    """.ci/run runs the lines between the markers literally, the test
    command last: install + the demo, then install + the tests."""
    import re
    m = re.search(r"^<!-- ci-commands:begin -->\n```sh\n(.*?)^```\n<!-- ci-commands:end -->$",
                  TEXT, re.S | re.M)
    assert m, "README.md has no ci-commands block .ci/run can read"
    commands = m.group(1).splitlines()
    assert len(commands) == 2, commands
    demo, tests = commands
    assert demo.startswith("python -m pip install ") and demo.endswith("&& pygrad"), demo
    assert tests.startswith("python -m pip install ") and tests.endswith("&& pytest"), tests
    assert '".[test' in tests, "the test command installs the test extra"


def test_the_first_paragraph_names_every_import_to_swap():
    """micrograd's demo uses micrograd.nn too, whose layers build micrograd
    Values: swapping only the Value import breaks it.  The first paragraph
    names both swaps, the ones examples/08_micrograd_port.py makes (and
    tests/test_examples.py checks against micrograd itself)."""
    import re
    first = " ".join(TEXT.split("\n\n")[1].split())
    assert "`from micrograd.engine import Value` to `from pygrad import Value`" in first, first
    assert "`from micrograd.nn import MLP` to `from pygrad.nn import MLP`" in first, first
    port = (ROOT / "examples" / "08_micrograd_port.py").read_text(encoding="utf-8")
    swapped = set(re.findall(r"^#   from micrograd\.(\w+) import (\w+)$", port, re.M))
    assert swapped == {("engine", "Value"), ("nn", "MLP")}, swapped


def test_the_readme_test_command_brings_micrograd_for_the_dropin_tests():
    """The tests that compare against micrograd itself skip without it: the
    `test` extra that the README's command installs brings it (pinned)."""
    import re
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    extra = re.search(r"^test = \[(.*?)\]$", pyproject, re.S | re.M)
    assert extra, "pyproject.toml has no test extra"
    assert '"micrograd==0.1.0"' in extra.group(1), extra.group(1)


def test_the_readme_has_the_dropin_table_and_the_tiers():
    table = _section("Coming from micrograd")
    assert "| micrograd | pygrad | note |" in table
    assert "| `from micrograd.engine import Value` | `from pygrad import Value`" in table
    tiers = _section("The tiers")
    for name, link in [("Eager `Value`", "docs/api.md#"), ("Fused `pygrad.nn`", "docs/api.md#"),
                       ("Replay: `pygrad.compile`", "docs/api.md#"),
                       ("Batched: `Program.map`", "docs/api.md#")]:
        assert f"**{name}.**" in tiers, name
        paragraph = tiers.split(f"**{name}.**", 1)[1].split("\n\n", 1)[0]
        assert f"]({link}" in paragraph, f"the {name} tier links to nothing in docs/"


def test_every_benchmark_table_comes_with_its_command():
    """A figure in the README is tied to the command that measures it: each
    table in Benchmarks has a `python benchmarks/...` command in the text
    just before it, and that script exists."""
    import re
    bench = _section("Benchmarks")
    assert "`python benchmarks/run.py`" in bench
    tables = 0
    for before, _ in re.findall(r"((?:[^\n]+\n)+)\n(\| [^\n]+\|\n\|[ \-:|]+\|\n)", bench):
        scripts = re.findall(r"python (benchmarks/[\w]+\.py)", before)
        assert scripts, f"a benchmark table without its command: {before[-200:]!r}"
        assert all((ROOT / s).exists() for s in scripts), scripts
        tables += 1
    assert tables >= 2


def test_the_readme_states_the_pythons_pyproject_claims():
    import re
    pyproject = (ROOT / "pyproject.toml")
    if not pyproject.exists():
        pytest.skip("no pyproject.toml beside the tests")
    claimed = sorted(int(v) for v in re.findall(r'"Programming Language :: Python :: 3\.(\d+)"',
                                                pyproject.read_text(encoding="utf-8")))
    assert f"CPython 3.{claimed[0]} to 3.{claimed[-1]}" in " ".join(TEXT.split())


def test_the_readmes_links_lead_somewhere():
    """Relative links name files that exist; a link to docs/page.md#anchor
    names a heading of that page (GitHub's slugs, as tests/test_docs.py)."""
    import re
    from test_docs import _anchors      # a page's anchors, named relative to docs/
    links = re.findall(r"\]\(((?!https?://)[^)#\s]*)(?:#([^)\s]+))?\)", TEXT)
    assert len(links) >= 10
    for target, anchor in links:
        path = ROOT / (target or README.name)
        assert path.exists(), f"README links to missing {target}"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(f"../{target or README.name}"), \
                f"README: no heading for {target}#{anchor}"
