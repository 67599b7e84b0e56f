"""Shared test helpers."""
import math
import os
import subprocess
import sys
import textwrap


def run_python(script: str, timeout: float = 120, prelude: str = "") -> str:
    """Run ``prelude + script`` in a new Python; its stdout (the test fails
    if it exits non-zero or outlasts ``timeout``)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    # cwd: the tests' folder, where no pygrad source tree can shadow the one
    # under test (the repository root's, or an sdist's, has no compiled core).
    out = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script)],
                         capture_output=True, text=True, timeout=timeout, env=env,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def micrograd_style_tanh(V):
    """tanh as a micrograd user adds it: a Value with a Python _backward."""
    def tanh(self):
        t = math.tanh(self.data)
        out = V(t, (self,), "mytanh")

        def _backward():
            self.grad += (1 - t ** 2) * out.grad
        out._backward = _backward
        return out
    return tanh


def square_function():
    """x * x as a pygrad.Function (its partial 2x is captured at forward time)."""
    from pygrad import Function

    class Square(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_values
            return (2.0 * x * grad,)
    return Square


# -- bit-exact comparison of doubles ------------------------------------------

def bits(x: float) -> bytes:
    """The IEEE 754 bytes of a double."""
    import struct
    return struct.pack("<d", x)


def same_double(x: float, y: float) -> bool:
    """Bit equality (so 0.0 != -0.0), except that any nan equals any nan:
    C's 0/0 is the sign-bit-set default nan on x86, Python's math.nan is not."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return bits(x) == bits(y)


def show(x: float) -> str:
    return f"{x!r} ({bits(x).hex()})"


def assert_same_doubles(got, expected, what: str = "value") -> None:
    """Two equally long sequences of doubles agree bit for bit (see same_double)."""
    got, expected = list(got), list(expected)
    assert len(got) == len(expected), f"{what}: {len(got)} != {len(expected)} entries"
    for i, (a, b) in enumerate(zip(got, expected)):
        assert same_double(a, b), f"{what}[{i}]: {show(a)} != {show(b)}"


# -- Markdown code blocks (README.md, docs/*.md) ------------------------------

def python_blocks(markdown: str) -> "list[str]":
    """The bodies of the ```python fenced blocks of a Markdown text, in order."""
    import re
    return re.findall(r"^```python\n(.*?)^```[ \t]*$", markdown, re.S | re.M)


def run_blocks(blocks, filename: str, namespace=None) -> dict:
    """Run code blocks in order in one namespace (a new one by default).

    A line with a ``print(...)`` call that ends in a ``# -> text`` comment
    must print exactly ``text``; the blocks' other output goes to stdout.
    Returns the namespace."""
    import builtins
    import io
    import re
    ns = {"__name__": "__docs__"} if namespace is None else namespace
    for i, code in enumerate(blocks):
        name = f"{filename}, block {i}"
        expected = {}
        for lineno, line in enumerate(code.splitlines(), 1):
            m = re.search(r"\bprint\(.*\)\s*# -> (.*)$", line)
            if m:
                expected[lineno] = m.group(1).rstrip()
        printed: "dict[int, list[str]]" = {}

        def doc_print(*args, _name=name, _printed=printed, **kwargs):
            frame = __import__("sys")._getframe(1)
            if frame.f_code.co_filename == _name and kwargs.get("file") is None:
                buf = io.StringIO()
                builtins.print(*args, **kwargs, file=buf)
                _printed.setdefault(frame.f_lineno, []).append(buf.getvalue())
                builtins.print(buf.getvalue(), end="")
            else:
                builtins.print(*args, **kwargs)

        ns["print"] = doc_print
        try:
            exec(compile(code, name, "exec"), ns)
        finally:
            ns.pop("print", None)
        for lineno, text in expected.items():
            got = "".join(printed.get(lineno, [])).rstrip("\n")
            assert got == text, f"{name}, line {lineno}: printed {got!r}, the comment says {text!r}"
    return ns


def run_in_threads(work, n: int = 3) -> list:
    """Run ``work()`` in n threads at once; the exceptions they raised."""
    import threading
    errors = []

    def guarded():
        try:
            work()
        except Exception as e:  # pragma: no cover - reported to the caller
            errors.append(e)
    threads = [threading.Thread(target=guarded) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def interrupt_at_every_line(call, modules) -> int:
    """Run ``call()`` again and again, a KeyboardInterrupt raised at its
    1st, 2nd, ... line in files ending with ``modules`` (sys.settrace: at a
    chosen point, never raced), until a run gets through; after each, a
    clean run must give the first clean run's doubles bit for bit, and so
    must the run that got through.  Returns how many lines were tried."""
    import sys
    expected = [bits(x) for x in call()]
    line = 0
    while True:
        line += 1
        seen = [0]

        def tracer(frame, event, arg):
            if frame.f_code.co_filename.endswith(modules) and event == "line":
                seen[0] += 1
                if seen[0] == line:
                    raise KeyboardInterrupt
            return tracer
        sys.settrace(tracer)
        try:
            got = call()
        except KeyboardInterrupt:
            got = None
        finally:
            sys.settrace(None)
        assert [bits(x) for x in call()] == expected, f"after an interrupt at line {line}"
        if got is not None:
            assert [bits(x) for x in got] == expected
            return line


# -- micrograd's own loops ----------------------------------------------------

def micrograd_backward(root):
    """micrograd's own backward(): a topological order through _prev (by
    object), each node's _backward() in reverse."""
    topo, seen = [], set()

    def build(v):
        if v not in seen:
            seen.add(v)
            for c in v._prev:
                build(c)
            topo.append(v)
    build(root)
    for v in topo:
        v.grad = 0.0
    root.grad = 1.0
    for v in reversed(topo):
        v._backward()
