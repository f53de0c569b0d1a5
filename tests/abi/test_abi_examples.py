"""The example C controllers (examples/c_controller) against the built-in greedy, by path, entry point and CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from decoctl import ConfigError, ControllerSpec, GenerationResult, Generator, ProcessContext, ProcessorSpec, hookimpl
from decoctl.abi import ABI_MAJOR, ABI_MINOR, library_controller_spec
from decoctl.cli import main
from decoctl.plugins import PluginRegistry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "c_controller"
PROMPT = "def fib(n):"
REPETITIVE = "def fib(n): return fib(n-1) + fib(n-2)\ndef fib(n): return fib(n-1) + fib(n-2)\n"
LAYOUTS = ["genai_model", "optimum_model"]


def generate(
    model: Path, controller: str, registry: PluginRegistry, prompt: str = PROMPT, n: int = 24, **options: Any
) -> GenerationResult:
    generator = Generator({"target": model}, controller, registry=registry, threads=1, **options)
    return generator.generate(prompt, max_new_tokens=n)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_c_greedy_is_token_identical_to_the_builtin_greedy(
    layout: str, request: pytest.FixtureRequest, c_examples: dict[str, Path], registry: PluginRegistry
) -> None:
    model = request.getfixturevalue(layout)
    expected = generate(model, "greedy", registry)
    result = generate(model, f"{c_examples['greedy']}:greedy", registry)
    assert result.tokens == expected.tokens
    assert result.text == expected.text
    assert result.stats.forwards == expected.stats.forwards


@pytest.mark.parametrize("layout", LAYOUTS)
def test_c_prompt_lookup_is_greedy_with_fewer_target_forwards_on_a_repetitive_prompt(
    layout: str, request: pytest.FixtureRequest, c_examples: dict[str, Path], registry: PluginRegistry
) -> None:
    model = request.getfixturevalue(layout)
    expected = generate(model, "greedy", registry, REPETITIVE, n=64)
    result = generate(model, f"{c_examples['prompt_lookup']}:prompt_lookup", registry, REPETITIVE, n=64)
    assert result.tokens == expected.tokens
    assert result.stats.forwards["target"] < expected.stats.forwards["target"]
    assert result.stats.controller["accepted"] > 0
    assert result.stats.controller["forwards"] == result.stats.forwards["target"]


def test_c_controller_options_reach_create_as_json_with_defaults_filled(
    genai_model: Path, c_examples: dict[str, Path], registry: PluginRegistry
) -> None:
    reference = f"{c_examples['prompt_lookup']}:prompt_lookup"
    stats = generate(genai_model, reference, registry, REPETITIVE, options={"k": 2}).stats.controller
    assert (stats["k"], stats["ngram"]) == (2, 3)
    assert stats["drafted"] <= 2 * stats["forwards"]


def test_an_option_the_c_controller_does_not_declare_is_refused(
    genai_model: Path, c_examples: dict[str, Path], registry: PluginRegistry
) -> None:
    with pytest.raises(ConfigError, match=r"has no option 'depth'.*k, ngram"):
        generate(genai_model, f"{c_examples['prompt_lookup']}:prompt_lookup", registry, options={"depth": 3})


class Cycle:
    """Favours token 100 + (position % 4): its output depends on every row's own prefix, drafted part included."""

    def __init__(self, options: dict[str, Any]) -> None:
        del options

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for row in range(len(rows)):
            rows[row, 100 + len(context.prefix(row)) % 4] += 4.0
        return rows

    def commit(self, tokens: Sequence[int]) -> None:
        del tokens

    def reset(self, prompt: np.ndarray) -> None:
        del prompt


class CyclePlugin:
    @hookimpl
    def decoctl_logits_processors(self) -> list[ProcessorSpec]:
        return [ProcessorSpec(name="cycle", summary="favour a cycle of four tokens", factory=Cycle)]


@pytest.mark.parametrize("name", ["greedy", "prompt_lookup"])
def test_the_logits_chain_reaches_c_controllers_through_process_with_drafted_prefixes(
    name: str, genai_model: Path, c_examples: dict[str, Path]
) -> None:
    registry = PluginRegistry(autoload=False)
    registry.register(CyclePlugin(), "cycle")
    expected = generate(genai_model, "greedy", registry, REPETITIVE, n=48, processors="cycle")
    assert expected.tokens != generate(genai_model, "greedy", registry, REPETITIVE, n=48).tokens
    result = generate(genai_model, f"{c_examples[name]}:{name}", registry, REPETITIVE, n=48, processors="cycle")
    assert result.tokens == expected.tokens
    if name == "prompt_lookup":
        assert result.stats.controller["accepted"] > 0


class Keeper:
    """The identity, declaring that it keeps a unique maximum (``bound_argmax``), and counting its calls."""

    calls = 0

    def __init__(self, options: dict[str, Any]) -> None:
        del options

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        Keeper.calls += 1
        return rows

    def bound_argmax(self, top: np.float32, second: np.float32) -> tuple[np.float32, np.float32]:
        return top, second

    def commit(self, tokens: Sequence[int]) -> None:
        del tokens

    def reset(self, prompt: np.ndarray) -> None:
        del prompt


class KeeperPlugin:
    @hookimpl
    def decoctl_logits_processors(self) -> list[ProcessorSpec]:
        return [ProcessorSpec(name="keeper", summary="identity that keeps the argmax", factory=Keeper)]


def test_c_greedy_takes_the_hosts_argmax_which_skips_processors_that_keep_the_maximum(
    genai_model: Path, c_examples: dict[str, Path]
) -> None:
    registry = PluginRegistry(autoload=False)
    registry.register(CyclePlugin(), "cycle")
    registry.register(KeeperPlugin(), "keeper")
    expected = generate(genai_model, "greedy", registry, REPETITIVE, n=24, processors="cycle,keeper")
    Keeper.calls = 0
    result = generate(
        genai_model, f"{c_examples['greedy']}:greedy", registry, REPETITIVE, n=24, processors="cycle,keeper"
    )
    assert result.tokens == expected.tokens
    assert Keeper.calls == 0  # argmax (ABI 1.2) ran the cycle processor only: random logits have no tied maximum
    generate(genai_model, f"{c_examples['greedy']}:greedy", registry, REPETITIVE, n=4, processors="keeper,cycle")
    assert Keeper.calls > 0  # not trailing: it runs


def test_a_plugin_distribution_can_ship_a_compiled_library(
    genai_model: Path, c_examples: dict[str, Path], registry: PluginRegistry
) -> None:
    library = c_examples["prompt_lookup"]

    class ShipsLibraries:
        @hookimpl
        def decoctl_controllers(self) -> list[ControllerSpec]:
            return [
                ControllerSpec(name="c-greedy", summary="greedy in C", library=c_examples["greedy"], symbol="greedy"),
                attrs.evolve(library_controller_spec(library, "prompt_lookup"), name="c-lookup"),
            ]

    registry.register(ShipsLibraries(), "ships-libraries")
    expected = generate(genai_model, "greedy", registry, REPETITIVE, n=32)
    assert generate(genai_model, "c-greedy", registry, REPETITIVE, n=32).tokens == expected.tokens
    lookup = generate(genai_model, "c-lookup", registry, REPETITIVE, n=32, options={"k": 4})
    assert lookup.tokens == expected.tokens
    assert lookup.stats.controller["k"] == 4


def test_cli_generates_with_a_library_controller_by_path(
    genai_model: Path, c_examples: dict[str, Path], registry: PluginRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = generate(genai_model, "greedy", registry, n=12).text
    capsys.readouterr()
    args = ["generate", PROMPT, "-m", str(genai_model), "-c", f"{c_examples['greedy']}:greedy", "-n", "12"]
    assert main([*args, "--threads", "1", "--no-stream"]) == 0
    out, err = capsys.readouterr()
    assert out == expected + "\n"
    assert "controller: greedy" in err


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``decoctl`` command in a fresh process (normal mode, whatever the tests run in)."""
    command = [str(Path(sys.executable).with_name("decoctl")), *args]
    env = {k: v for k, v in os.environ.items() if k != "DECOCTL_DEBUG"}
    return subprocess.run(command, capture_output=True, text=True, check=False, env=env, timeout=300)


def test_cli_takes_a_librarys_only_controller_without_a_name(
    genai_model: Path, c_examples: dict[str, Path], registry: PluginRegistry
) -> None:
    expected = generate(genai_model, "greedy", registry, n=8).text
    done = run_cli(
        "generate",
        PROMPT,
        "-m",
        str(genai_model),
        "-c",
        str(c_examples["greedy"]),
        "-n",
        "8",
        "--threads",
        "1",
        "--no-stream",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected + "\n"
    assert "controller: greedy" in done.stderr


def test_cli_refuses_a_library_of_several_controllers_without_a_name_and_lists_them(
    genai_model: Path, misbehave: Path
) -> None:
    done = run_cli("generate", PROMPT, "-m", str(genai_model), "-c", str(misbehave), "-n", "4")
    assert done.returncode == 2
    assert done.stderr.startswith(f"decoctl: error: {misbehave} provides ")
    assert "(probe_all, process_probe, " in done.stderr
    assert f"pick one with {misbehave}:NAME" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_reports_a_positive_step_status_as_an_invalid_status(genai_model: Path, misbehave: Path) -> None:
    done = run_cli("generate", PROMPT, "-m", str(genai_model), "-c", f"{misbehave}:positive_step", "-n", "4")
    assert done.returncode == 2
    assert "decoctl: error: " in done.stderr
    assert f"C controller 'positive_step' ({misbehave}) step returned 1, an invalid status" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_header_abi_md_and_the_host_state_one_abi_version() -> None:
    header = (EXAMPLES.parents[1] / "abi" / "decoctl.h").read_text(encoding="utf-8")
    major = re.search(r"#define DECOCTL_ABI_MAJOR (\d+)", header)
    minor = re.search(r"#define DECOCTL_ABI_MINOR (\d+)", header)
    assert major and minor
    version = f"{major[1]}.{minor[1]}"
    assert f"the decoctl C ABI, version {version} " in header.splitlines()[1]
    abi_md = (EXAMPLES.parents[1] / "abi" / "ABI.md").read_text(encoding="utf-8")
    assert abi_md.splitlines()[0] == f"# The decoctl C ABI ({version})"
    assert f"{ABI_MAJOR}.{ABI_MINOR}" == version


def test_the_example_makefile_builds_every_library(tmp_path: Path) -> None:
    done = subprocess.run(
        ["make", "-C", str(EXAMPLES), f"BUILD={tmp_path}", "CC=gcc"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert {p.name for p in tmp_path.iterdir()} == {"libgreedy.so", "libprompt_lookup.so", "libbest_of_n.so"}
    assert "warning" not in done.stderr


def test_the_complete_example_in_abi_md_builds_and_runs(
    tmp_path: Path, genai_model: Path, registry: PluginRegistry, compile_c: Callable[..., Path]
) -> None:
    text = (EXAMPLES.parents[1] / "abi" / "ABI.md").read_text(encoding="utf-8")
    source = tmp_path / "mine.c"
    source.write_text(text.split("```c\n", 1)[1].split("```", 1)[0], encoding="utf-8")
    library = compile_c(source, tmp_path / "libmine.so")
    result = generate(genai_model, f"{library}:no_repeat", registry, n=24, options={"window": 4})
    tokens = list(result.tokens)
    assert all(tokens[i] not in tokens[max(0, i - 4) : i] for i in range(len(tokens)))
    assert result.stats.trace["options"] == {"window": 4}
