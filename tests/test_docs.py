"""docs/: every public name of pygrad has a heading in docs/api.md, and every
```python block of docs/*.md runs.

- A name is documented when a Markdown heading of docs/api.md has it in a
  code span: ``### `pygrad.nn.MLP(nin, nouts, fused=True, engine="c")` ``
  documents ``pygrad.nn.MLP``, ``#### `Value.backward()` `` documents
  ``Value.backward`` (a member may be named after any class of its MRO, so
  ``Module.zero_grad`` documents ``MLP.zero_grad`` too).  Checked: the names
  in the modules' ``__all__``, the public methods, properties, dunders and
  instance attributes of the documented classes.  A heading that spells out
  a signature must match the code's parameters and defaults.
- The blocks of one page run in order in one namespace.  A ``print(...)``
  line ending in ``# -> text`` must print exactly ``text``.  Blocks that
  import micrograd (the test extra brings it) run on their own, each in a fresh
  namespace, when micrograd is installed.
- Links to ``#anchors`` point to existing headings.
- The guides (the API reference, the "coming from" pages, scaling out) each
  have runnable examples; the maintainers' pages (internals, lifetime,
  performance, development: what moved out of the README) may have none,
  and whatever blocks they have run too.
"""
import ast
import dataclasses
import inspect
import pathlib
import random
import re

import pytest

import pygrad
from pygrad import boundary, data, demo, functional, losses, nn, optim, reference, viz
from helpers import python_blocks, run_blocks

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
GUIDES = ["api.md", "coming-from-micrograd.md", "coming-from-pytorch.md", "scaling-out.md",
          "microgpt.md", "higher-order.md"]
MAINTAINERS = ["internals.md", "lifetime.md", "performance.md", "development.md",
               "batched-tier.md"]
PAGES = GUIDES + MAINTAINERS
# The API reference: api.md, and the batched tier's page (its newer members).
API = "\n".join((DOCS / page).read_text(encoding="utf-8")
                 for page in ("api.md", "batched-tier.md"))

# Dunders that are bookkeeping, not API.
_NOT_API = {"__module__", "__doc__", "__dict__", "__weakref__", "__slots__", "__qualname__",
            "__annotations__", "__firstlineno__", "__static_attributes__", "__init__",
            "__new__", "__init_subclass__", "__subclasshook__", "__hash__", "__eq__",
            "__dataclass_fields__", "__dataclass_params__", "__match_args__", "__orig_bases__",
            "__parameters__", "__class_getitem__",   # typing: Module[P] (docs: pygrad.nn.Scalar)
            # copy and pickle protocol: documented in prose ("Copies and pickles")
            "__getstate__", "__setstate__", "__reduce__", "__reduce_ex__", "__deepcopy__",
            "__copy__", "__replace__",  # copy.replace (3.13 adds it to namedtuples)
            # a model's edits reaching its caches: documented in prose (pygrad.nn);
            # Value's internal slots: docs/lifetime.md ("Writing pygrad's internal
            # attributes can't crash")
            "__setattr__", "__delattr__"}


def heading_spans(markdown: str) -> "list[str]":
    """The code spans of every heading outside fenced code."""
    spans, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            spans += re.findall(r"`([^`]+)`", line)
    return spans


SPANS = heading_spans(API)


def documented(name: str) -> bool:
    """``name`` (``pygrad.x.y`` or ``Class.member``) opens a heading span,
    optionally after ``pygrad.`` / ``pygrad.module.``, and is followed by
    no more name characters (so ``pygrad.sum`` is not ``pygrad.summary``)."""
    pattern = re.compile(r"(?:^|[^\w.])(?:pygrad\.(?:\w+\.)?)?" + re.escape(name) + r"(?![\w.])")
    return any(pattern.search(" " + s) for s in SPANS)


def _module_names():
    """Groups of qualified names, one per public object: a re-export (e.g.
    ``pygrad.functional.dot``, which is ``pygrad.dot``) is documented
    under any of its names."""
    # sum and compile are public but kept out of __all__ (they'd shadow builtins)
    qualified = [(f"pygrad.{n}", getattr(pygrad, n)) for n in [*pygrad.__all__, "sum", "compile"]]
    for mod in (nn, optim, losses, data, viz, functional, demo, boundary):
        qualified.append((mod.__name__, mod))
        qualified += [(f"{mod.__name__}.{n}", getattr(mod, n)) for n in mod.__all__]
    # reference.__all__ lists only Value: take every public callable defined there.
    qualified += [(f"pygrad.reference.{n}", obj) for n, obj in vars(reference).items()
                  if not n.startswith("_") and callable(obj)
                  and getattr(obj, "__module__", None) == reference.__name__]
    groups: "dict[int, list[str]]" = {}
    for name, obj in qualified:
        key = id(obj) if callable(obj) or inspect.ismodule(obj) else id(name)
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def _instances():
    """One instance of each documented class, for its instance attributes
    (Python's global random state is left as it was)."""
    state = random.getstate()
    try:
        return _make_instances()
    finally:
        random.setstate(state)


def _make_instances():
    v = pygrad.Value(1.0)
    ctx = pygrad.Context()
    ctx.save_for_backward(1.0)
    return [nn.Neuron(2), nn.Layer(2, 2), nn.MLP(2, [2, 1]), optim.SGD([v]), optim.Adam([v]),
            pygrad.Inputs([v]), ctx]


CLASSES = [pygrad.Value, nn.Module, nn.Neuron, nn.Layer, nn.MLP, optim.Optimizer, optim.SGD,
           optim.Adam, pygrad.Program, pygrad.Inputs, pygrad.Function, pygrad.Context,
           pygrad.GradcheckResult]

# micrograd's API has these underscore names; pygrad.Value keeps them.
MICROGRAD_MEMBERS = ["_op", "_prev", "_backward"]


def _member_names():
    """(owners, member) pairs: a member is documented under any owner."""
    out = []
    for cls in CLASSES:
        owners = [c.__name__ for c in cls.__mro__ if c is not object]
        members = {n for n in dir(cls) if not n.startswith("_")}
        members |= {n for n in dir(cls) if n.startswith("__") and n.endswith("__")
                    and n not in _NOT_API and getattr(cls, n) is not getattr(object, n, None)}
        if dataclasses.is_dataclass(cls):
            members |= {f.name for f in dataclasses.fields(cls)}
        if cls is pygrad.Value:
            members |= set(MICROGRAD_MEMBERS)
        out += [(owners, m) for m in sorted(members)]
    for obj in _instances():
        owners = [c.__name__ for c in type(obj).__mro__ if c is not object]
        out += [(owners, n) for n in sorted(getattr(obj, "__dict__", {}))
                if not n.startswith("_")]
    return out


MODULE_NAMES = _module_names()
MEMBERS = _member_names()


def test_api_headings_are_found():
    """The matcher itself: a real heading matches, a prefix doesn't."""
    assert documented("pygrad.nn.MLP") and documented("Value.backward")
    assert not documented("pygrad.nn.ML") and not documented("Value.back")


@pytest.mark.parametrize("names", MODULE_NAMES, ids=[g[0] for g in MODULE_NAMES])
def test_public_name_has_api_heading(names):
    assert any(documented(n) for n in names), f"{' / '.join(names)}: no heading in docs/api.md"


@pytest.mark.parametrize("owners,member", MEMBERS, ids=[f"{o[0]}.{m}" for o, m in MEMBERS])
def test_public_member_has_api_heading(owners, member):
    assert any(documented(f"{o}.{member}") for o in owners), \
        f"{owners[0]}.{member} has no heading in docs/api.md"


# -- the code blocks ------------------------------------------------------------

def _needs_micrograd(code: str) -> bool:
    return re.search(r"^\s*(from|import)\s+micrograd\b", code, re.M) is not None


def _blocks(page: str) -> "list[str]":
    path = DOCS / page
    return python_blocks(path.read_text(encoding="utf-8")) if path.exists() else []


def test_docs_pages_exist():
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(PAGES)
    for page in GUIDES:
        assert len(_blocks(page)) >= 3, f"{page} has too few examples"


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    blocks = [b for b in _blocks(page) if not _needs_micrograd(b)]
    run_blocks(blocks, f"docs/{page}")


MICROGRAD_BLOCKS = [(page, i, b) for page in PAGES for i, b in enumerate(_blocks(page))
                    if _needs_micrograd(b)]


@pytest.mark.parametrize("page,index,code", MICROGRAD_BLOCKS,
                         ids=[f"{p}-block{i}" for p, i, _ in MICROGRAD_BLOCKS])
def test_micrograd_examples_run(page, index, code):
    pytest.importorskip("micrograd")
    run_blocks([code], f"docs/{page} (micrograd block {index})")


def test_signatures_in_headings_match_the_code():
    """A heading that spells out a callable's parameters spells them as the
    code does: the same names in the same order, the same defaults (extra
    keywords a ``**kwargs`` passes on may follow)."""
    targets = {f"pygrad.{n}": getattr(pygrad, n) for n in pygrad.__all__}
    for mod in (nn, optim, losses, data, viz, functional, demo, reference, boundary):
        targets.update({f"{mod.__name__}.{n}": getattr(mod, n) for n in dir(mod)
                        if not n.startswith("_") and callable(getattr(mod, n))})
    for cls in CLASSES:
        targets.update({f"{cls.__name__}.{n}": getattr(cls, n) for n in dir(cls)
                        if not n.startswith("_") and inspect.isroutine(getattr(cls, n))})
    checked = 0
    for span in SPANS:
        m = re.fullmatch(r"([\w.]+)\((.*)\)", span)
        if not m or m.group(1) not in targets or "..." in m.group(2):
            continue
        shown = ast.parse(f"def f({m.group(2)}): pass").body[0].args
        shown_defaults = dict(zip([a.arg for a in shown.args][::-1],
                                  [ast.literal_eval(d) for d in shown.defaults][::-1]))
        params = [p for p in inspect.signature(targets[m.group(1)]).parameters.values()
                  if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"]
        names = [a.arg for a in shown.args]
        assert names[:len(params)] == [p.name for p in params], span
        for p in params:
            if p.default is not p.empty:
                assert shown_defaults.get(p.name, p.empty) == p.default, \
                    f"{span}: {p.name} defaults to {p.default!r}"
            else:
                assert p.name not in shown_defaults, f"{span}: {p.name} has no default"
        checked += 1
    assert checked >= 50


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped
    (``_`` and ``-`` kept), spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: str) -> "set[str]":
    """The anchors of a page, named relative to docs/ (``../README.md`` too)."""
    text, fenced, out = (DOCS / page).read_text(encoding="utf-8"), False, set()
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.add(_slug(line.lstrip("#")))
    return out


@pytest.mark.parametrize("page", PAGES)
def test_links_point_to_headings(page):
    text = (DOCS / page).read_text(encoding="utf-8")
    for target, anchor in re.findall(r"\]\(((?:\.\./)?[\w\-]*\.md)?#([^)\s]+)\)", text):
        assert anchor in _anchors(target or page), f"{page}: no heading for {target}#{anchor}"
    for target in re.findall(r"\]\(((?:\.\./)?[\w\-]+\.md)(?:#[^)]*)?\)", text):
        assert (DOCS / target).exists(), f"{page}: link to missing {target}"


@pytest.mark.parametrize("page", PAGES)
def test_each_page_says_its_blocks_run_in_order(page):
    """The blocks share one session (test_page_examples_run runs them so):
    a reader who copies one block alone must be told."""
    if not _blocks(page):
        return
    opening = (DOCS / page).read_text(encoding="utf-8").split("\n## ", 1)[0]
    assert re.search(r"run in order", " ".join(opening.split())), f"docs/{page}"
