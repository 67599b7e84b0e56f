"""Build pygrad: the C core is compiled by cffi (out-of-line API mode).

One abi3 wheel serves every supported CPython: cffi compiles against the
limited API, and bdist_wheel is told so below.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def index_description(readme: str) -> str:
    """README.md as the package index shows it: there is no project home to
    link to yet, so links into the repository (docs/, examples/), which an
    index page can't follow, become the path in plain text, and pictures
    stored in the repository are left out."""
    readme = re.sub(r"!\[[^\]]*\]\((?!https?://)[^)]*\)\n?", "", readme)
    return re.sub(r"\[([^\]]+)\]\((?!https?://|#)([^)#]+)(?:#[^)]*)?\)",
                  lambda m: m.group(1) if m.group(1).strip("`") == m.group(2)
                  else f"{m.group(1)} (`{m.group(2)}` in the source distribution)",
                  readme)


# Every build compiles every C file: an object left from older sources
# (build_ext reuses objects newer than their own .c, whatever headers or
# ops.def changed since) would otherwise link into a core whose build stamp
# (csrc/cffi_build.py) says it is current.
options = {"build_ext": {"force": True}}
if sys.implementation.name == "cpython":
    options["bdist_wheel"] = {"py_limited_api": "cp39"}
if os.environ.get("PYGRAD_SANITIZE") == "1":
    # build_ext reuses any up-to-date object file whatever flags made it, so
    # sanitized objects get their own folder, apart from the normal build's.
    options["build"] = {"build_base": os.path.join("build", "sanitize")}

NO_COMPILER = """
pygrad: compiling the C core failed ({error}).
`pip install .` compiles csrc/ and needs a C compiler (gcc or clang; Debian
or Ubuntu: apt-get install gcc; macOS: xcode-select --install). Without one,
install a wheel instead, which needs no compiler: `bash .ci/wheel` builds one
into dist/ (on any machine with a compiler), then `pip install dist/*.whl`.
"""


def build_ext_saying_what_to_do(base: type) -> type:
    """``base`` (setuptools' build_ext), printing NO_COMPILER to stderr when
    the compile or link fails, then re-raising: pip alone would show only
    its generic 'Failed building wheel'."""
    from setuptools.errors import CCompilerError, ExecError, PlatformError

    class BuildExt(base):  # type: ignore[valid-type, misc]
        def run(self) -> None:
            try:
                super().run()
            except (CCompilerError, ExecError, PlatformError) as e:
                sys.stderr.write(NO_COMPILER.format(error=e))
                raise

    return BuildExt


if __name__ == "__main__":      # setuptools runs this file as __main__ too
    # Imported here: the tests read index_description() where setuptools may
    # be absent (3.12 and later venvs have none).
    from setuptools import setup
    from setuptools.command.build_ext import build_ext

    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    setup(
        # The License field, not pyproject's PEP 639 license expression: `pip
        # show` of the pips that Python 3.9-3.13 bundle (23.0-24.2) reads only
        # License, and setuptools writes one field or the other, never both.
        license="MIT",
        long_description=index_description(readme),
        long_description_content_type="text/markdown",
        cffi_modules=["csrc/cffi_build.py:ffibuilder"],
        # cffi subclasses this one for its own step (writing the C source)
        cmdclass={"build_ext": build_ext_saying_what_to_do(build_ext)},
        options=options,
    )
