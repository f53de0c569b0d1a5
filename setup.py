"""Only what pyproject.toml cannot say (the C ABI issue adds the cffi bridge's cffi_modules here)."""

from setuptools import setup

setup()
