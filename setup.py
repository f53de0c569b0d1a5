"""Only what pyproject.toml cannot say: the package list of the remapped source folder, and the compiled C ABI
bridge (decoctl._abi, built by cffi from abi/).

The import package ``decoctl`` lives in core/. pyproject's automatic discovery cannot search a remapped folder, so the
packages are found here, every folder under core/ that is not a cache: a new subpackage is in the wheel without
anyone listing it (tests/test_distribution.py checks the built wheel against the source tree).
"""

from setuptools import find_namespace_packages, setup

PACKAGES = ["decoctl", *(f"decoctl.{name}" for name in find_namespace_packages("core", exclude=["*__pycache__*"]))]

setup(
    packages=PACKAGES,
    cffi_modules=["abi/build_bridge.py:ffibuilder"],
    # the bridge is compiled in cffi's out-of-line API mode against the stable ABI (_abi.abi3.so): one wheel for
    # CPython 3.11 and newer on a platform, and the wheel's tags say so
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
