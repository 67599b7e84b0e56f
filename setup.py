"""Build pygrad: the C core is compiled by cffi (out-of-line API mode).

One abi3 wheel serves every supported CPython: cffi compiles against the
limited API, and bdist_wheel is told so below.
"""
import sys

from setuptools import setup

options = {}
if sys.implementation.name == "cpython":
    options["bdist_wheel"] = {"py_limited_api": "cp39"}

setup(
    cffi_modules=["pygrad/_build.py:ffibuilder"],
    options=options,
)
