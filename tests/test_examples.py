"""The Python examples run as they are (``python examples/custom_loop.py``, ``python examples/custom_processor.py``),
do what they say, and the README shows them as they are, each in at most 25 lines."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from decoctl import Generator

ROOT = Path(__file__).parents[1]
EXAMPLES = ROOT / "examples"
PROMPT = "def fib(n):"
NEW = 48  # what both examples generate


def run_example(name: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # a library that prints nothing unless asked
    return done.stdout


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_custom_loop_example_runs_its_loop_as_an_object(genai_model: Path) -> None:
    out = run_example("custom_loop.py", PROMPT, str(genai_model))

    by_path = Generator({"target": genai_model}, f"{EXAMPLES / 'custom_loop.py'}:MyLoop", options={"penalty": 2.0})
    expected = by_path.generate(PROMPT, max_new_tokens=NEW)
    greedy = Generator({"target": genai_model}).generate(PROMPT, max_new_tokens=NEW)
    assert out == expected.text + "\n"
    assert expected.tokens != greedy.tokens  # its penalty changed what greedy would pick


def test_the_custom_processor_example_runs_its_processor_in_the_chain(genai_model: Path) -> None:
    out = run_example("custom_processor.py", PROMPT, str(genai_model))

    penalise = load("custom_processor").Penalise(1.5)
    expected = Generator({"target": genai_model}, processors=[penalise]).generate(PROMPT, max_new_tokens=NEW)
    greedy = Generator({"target": genai_model}).generate(PROMPT, max_new_tokens=NEW)
    assert out == expected.text + "\n"
    assert expected.tokens != greedy.tokens  # the processor changed what greedy would pick


@pytest.mark.demo
@pytest.mark.parametrize("name", ["custom_loop.py", "custom_processor.py"])
def test_each_example_runs_with_no_arguments_on_the_demo_model(name: str) -> None:
    assert run_example(name).strip()


def readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize(("name", "cls"), [("custom_loop", "MyLoop"), ("custom_processor", "Penalise")])
def test_the_readme_shows_each_example_as_it_is_in_at_most_25_lines(name: str, cls: str) -> None:
    source = (EXAMPLES / f"{name}.py").read_text(encoding="utf-8")
    definition = re.search(rf"^class {cls}:\n(?:(?:    .*)?\n)+", source, re.M)
    assert definition is not None
    body = definition.group(0).rstrip("\n") + "\n"
    shown = [block for block in readme_blocks() if body in block]
    assert shown, f"the README shows no block with examples/{name}.py's {cls} as it is"
    assert len(shown[0].rstrip("\n").splitlines()) <= 25
