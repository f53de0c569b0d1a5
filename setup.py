"""Only what pyproject.toml cannot say: the compiled C ABI bridge (decoctl._abi, built by cffi from abi/)."""

from setuptools import setup

setup(cffi_modules=["abi/build_bridge.py:ffibuilder"])
