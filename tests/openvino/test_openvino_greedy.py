"""Every controller on OpenVINO's provider commits what it commits on the CPU provider (greedy is exact), on the
bundled demo models and, where it is imported on this machine (not in CI), on Gemma 3 270M int8."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from decoctl import Generator
from decoctl.errors import ConfigError, ModelLoadError
from decoctl.generation._chat_template import encode_prompt
from decoctl.host import Sequence
from decoctl.importers._registry import load_registry
from decoctl.model._loader import load_model

PROMPT = "def fibonacci(n):"


def _tokens(models: dict[str, str], controller: str, provider: str, **options: object) -> tuple[int, ...]:
    generator = Generator(models, controller, options=options, threads=1, providers=provider)
    assert generator.models["target"].session.get_providers()[0] == (
        "OpenVINOExecutionProvider" if provider == "openvino" else "CPUExecutionProvider"
    )
    return generator.generate(PROMPT, max_new_tokens=24).tokens


@pytest.mark.parametrize(
    ("controller", "options"),
    [
        ("greedy", {}),
        ("speculative", {}),
        ("lookahead", {}),
        ("eagle", {}),
        ("eagle", {"drafting": "tree"}),
    ],
    ids=["greedy", "speculative", "lookahead", "eagle-chain", "eagle-tree"],
)
def test_openvino_commits_what_cpu_commits_on_the_demo_model(controller: str, options: dict[str, object]) -> None:
    models = {"target": "pycode"}
    assert _tokens(models, controller, "openvino", **options) == _tokens(models, controller, "cpu", **options)


def test_openvino_greedy_equals_cpu_on_gemma3_270m_int8_or_refuses_its_ring_caches_by_name() -> None:
    """The import keeps Gemma 3's sliding layers in ring caches, which onnxruntime-openvino 1.24's GroupQueryAttention
    does not know: where the import has them the load is refused naming them; otherwise greedy is equal."""
    if "gemma3-270m-int8" not in set(load_registry()):
        pytest.skip("gemma3-270m-int8 is not imported here: decoctl models import gemma3-270m --int8 (not in CI)")
    models = {"target": "gemma3-270m-int8"}
    try:
        on_openvino = _tokens(models, "greedy", "openvino")
    except ModelLoadError as exc:
        assert "keeps ring caches" in str(exc)
        return
    assert on_openvino == _tokens(models, "greedy", "cpu")


def test_an_option_openvino_does_not_know_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match=r"refused its options.*bogus"):
        Generator({"target": "pycode"}, "greedy", threads=1, providers="openvino:bogus=1")


@pytest.mark.parametrize("name", ["gemma3-270m-int8-fullkv", "gemma3-270m-fullkv"])
def test_openvino_greedy_equals_cpu_on_gemma3_270m_with_full_kv(name: str) -> None:
    """Gemma 3 imported with full-length KV on its sliding layers (no ring caches) loads on onnxruntime-openvino."""
    if name not in set(load_registry()):
        flag = "--int8 " if "int8" in name else ""
        pytest.skip(f"{name} is not imported here: decoctl models import gemma3-270m {flag}--full-kv (not in CI)")
    models = {"target": name}
    assert _tokens(models, "greedy", "openvino") == _tokens(models, "greedy", "cpu")


@pytest.mark.parametrize("controller", ["greedy", "speculative"])
def test_openvino_commits_what_cpu_commits_on_gemma3_270m_fp32_over_the_real_model_prompts(controller: str) -> None:
    """fp32 (full-length KV): 64 new tokens of each of the first four real-model prompts, greedy and prompt lookup."""
    if "gemma3-270m-fullkv" not in set(load_registry()):
        pytest.skip("gemma3-270m-fullkv is not imported here: decoctl models import gemma3-270m --full-kv (not in CI)")
    lines = (Path(__file__).parents[2] / "examples" / "real_model_prompts.jsonl").read_text().splitlines()[:4]
    options = {"drafter": "prompt-lookup"} if controller == "speculative" else {}
    committed = {}
    for provider in ("cpu", "openvino"):
        generator = Generator(
            {"target": "gemma3-270m-fullkv"}, controller, options=options, threads=1, providers=provider
        )
        committed[provider] = [
            generator.generate(json.loads(line)["prompt"], max_new_tokens=64).tokens for line in lines
        ]
    assert committed["openvino"] == committed["cpu"]


def test_openvino_logits_on_gemma3_270m_int8_differ_from_cpu_by_less_than_the_choices_they_keep() -> None:
    """Where greedy parts (token 23 of the first real-model prompt, docs/PROVIDERS.md): the providers' logits differ
    by less than 2 at every step, and the argmax differs only where the CPU provider's two best are that close."""
    if "gemma3-270m-int8-fullkv" not in set(load_registry()):
        pytest.skip("gemma3-270m-int8-fullkv is not imported here (not in CI)")
    first = (Path(__file__).parents[2] / "examples" / "real_model_prompts.jsonl").read_text().splitlines()[0]
    prompt = json.loads(first)["prompt"]
    greedy = Generator({"target": "gemma3-270m-int8-fullkv"}, "greedy", threads=1)
    tokens = greedy.generate(prompt, max_new_tokens=32).tokens
    model = greedy.models["target"]
    ids = np.asarray(encode_prompt(model.tokenizer, prompt), np.int64)
    logits = {}
    for provider in ("cpu", "openvino"):
        sequence = Sequence("target", load_model(model.spec.path, threads=1, provider=provider))
        sequence.prefill(ids)
        rows = []
        for token in tokens:
            rows.append(sequence.logits()[-1].copy())
            sequence.forward(np.array([token], np.int64))
        logits[provider] = np.stack(rows)
    difference = np.abs(logits["cpu"] - logits["openvino"]).max(axis=1)
    assert difference.max() < 2.0
    best_two = np.sort(logits["cpu"], axis=1)[:, -2:]
    gap = best_two[:, 1] - best_two[:, 0]
    flipped = logits["cpu"].argmax(axis=1) != logits["openvino"].argmax(axis=1)
    assert np.all(gap[flipped] < 2 * difference[flipped])
