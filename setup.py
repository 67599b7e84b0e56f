"""Build pygrad: the C core is compiled by cffi (out-of-line API mode).

One abi3 wheel serves every supported CPython: cffi compiles against the
limited API, and bdist_wheel is told so below.
"""
import os
import sys

from setuptools import setup

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

setup(
    # The License field, not pyproject's PEP 639 license expression: `pip show`
    # of the pips that Python 3.9-3.13 bundle (23.0-24.2) reads only License,
    # and setuptools writes one field or the other, never both.
    license="MIT",
    cffi_modules=["csrc/cffi_build.py:ffibuilder"],
    options=options,
)
