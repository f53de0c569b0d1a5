"""The CUDA provider (onnxruntime-gpu on a machine with an NVIDIA GPU): greedy commits what the CPU provider commits
on the bundled demo model. Elsewhere the tests skip, saying why."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from decoctl import Generator

CUDA = "CUDAExecutionProvider"

pytestmark = pytest.mark.skipif(
    CUDA not in ort.get_available_providers(),
    reason=f"{CUDA} is not in this onnxruntime ({ort.get_available_providers()}): install onnxruntime-gpu on a "
    "machine with an NVIDIA GPU (docs/PROVIDERS.md)",
)


def test_cuda_greedy_commits_what_cpu_greedy_commits_on_the_demo_model() -> None:
    on_cuda = Generator({"target": "pycode"}, "greedy", threads=1, providers="cuda:device_id=0")
    assert on_cuda.models["target"].session.get_providers()[0] == CUDA
    on_cpu = Generator({"target": "pycode"}, "greedy", threads=1)
    prompt = "def fibonacci(n):"
    assert on_cuda.generate(prompt, max_new_tokens=32).tokens == on_cpu.generate(prompt, max_new_tokens=32).tokens
