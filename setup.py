"""Build pygrad: the C core is compiled by cffi (out-of-line API mode).

One abi3 wheel serves every supported CPython: cffi compiles against the
limited API, and bdist_wheel is told so below.
"""
import os
import sys

from setuptools import setup

options = {}
if sys.implementation.name == "cpython":
    options["bdist_wheel"] = {"py_limited_api": "cp39"}
if os.environ.get("PYGRAD_SANITIZE") == "1":
    # build_ext reuses any up-to-date object file whatever flags made it, so
    # sanitized objects get their own folder, apart from the normal build's.
    options["build"] = {"build_base": os.path.join("build", "sanitize")}

setup(
    cffi_modules=["csrc/cffi_build.py:ffibuilder"],
    options=options,
)
