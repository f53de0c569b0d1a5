"""Fixtures of the C ABI tests: the example controllers and the misbehaving test controllers, built with gcc."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from decoctl.testing import build_eagle_head

ROOT = Path(__file__).resolve().parents[2]
ABI_DIR = ROOT / "abi"
EXAMPLES = ROOT / "examples" / "c_controller"
MISBEHAVE = Path(__file__).resolve().parent / "c" / "misbehave.c"
QUERIES = Path(__file__).resolve().parent / "c" / "queries.c"

Build = Callable[..., Path]


def compile_library(source: Path, output: Path, *defines: str) -> Path:
    """gcc -shared: one C file into ``output``, with ``-D`` flags; the test fails with gcc's message."""
    command = ["gcc", "-std=c11", "-O1", "-Wall", "-fPIC", "-shared", f"-I{ABI_DIR}", *defines, "-o", str(output)]
    done = subprocess.run([*command, str(source)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"gcc failed on {source}:\n{done.stderr}"
    return output


@pytest.fixture(scope="session")
def compile_c() -> Callable[..., Path]:
    """compile_c(source, output, *defines) -> output: gcc -shared, failing the test with gcc's message."""
    return compile_library


@pytest.fixture(scope="session")
def c_examples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> built library of examples/c_controller (greedy, prompt_lookup)."""
    folder = tmp_path_factory.mktemp("c-examples")
    return {
        name: compile_library(EXAMPLES / f"{name}.c", folder / f"lib{name}.so") for name in ("greedy", "prompt_lookup")
    }


@pytest.fixture(scope="session")
def misbehave(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The library of well-formed test controllers (probes and rule breakers) in tests/abi/c/misbehave.c."""
    return compile_library(MISBEHAVE, tmp_path_factory.mktemp("misbehave") / "libmisbehave.so")


@pytest.fixture(scope="session")
def c_queries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The library of tests/abi/c/queries.c: controllers that read (or misuse) the queries the bridge answers in C."""
    return compile_library(QUERIES, tmp_path_factory.mktemp("queries") / "libqueries.so")


@pytest.fixture(scope="session")
def eagle_head(genai_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random EAGLE head (features input, tree inputs) for the shared genai_model target."""
    return build_eagle_head(tmp_path_factory.mktemp("eagle"), genai_model, seed=9, tree_inputs=True)


@pytest.fixture
def build_broken(tmp_path: Path) -> Build:
    """build_broken("-DWRONG_MAJOR") -> a library whose entry breaks the rule the flag names."""

    def build(*defines: str) -> Path:
        name = "lib" + "-".join(d.removeprefix("-D").lower() for d in defines) + ".so"
        return compile_library(MISBEHAVE, tmp_path / name, *defines)

    return build
