"""The same controllers on encoder-decoder models: speculative decoding with an encoder-decoder draft and prompt
lookup from the source give greedy's tokens; controllers that need what the model lacks, a draft of another kind or
decoder start, and a prompt longer than the encoder takes are refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from decoctl_eagle import plugin as eagle_plugin
from decoctl_lookahead import plugin as lookahead_plugin
from decoctl_speculative import plugin as speculative_plugin
from decoctl_speculative.drafters import PromptLookupDrafter

from decoctl import CapabilityError, ConfigError, GenerationError, Generator
from decoctl.cli import main
from decoctl.plugins import PluginRegistry
from decoctl.testing import build_optimum_model

PROMPTS = ("def fibonacci(n):", "class Stack:\n    def push(self, item):", "for x in range(10):")
NEW = 24


@pytest.fixture
def plugins() -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    registry.register(speculative_plugin, "speculative")
    registry.register(lookahead_plugin, "lookahead")
    registry.register(eagle_plugin, "eagle")
    return registry


def _greedy(folder: Path) -> dict[str, list[int]]:
    generator = Generator({"target": str(folder)}, "greedy", threads=1)
    return {p: list(generator.generate(p, max_new_tokens=NEW).tokens) for p in PROMPTS}


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_speculative_with_an_encoder_decoder_draft_gives_greedy_s_tokens(
    seq2seq: Any, plugins: PluginRegistry, name: str
) -> None:
    target = seq2seq.folder(name)
    models = {"target": str(target), "draft": str(seq2seq.folder(f"{name}-draft", "merged"))}
    generator = Generator(models, "speculative", options={"k": 3, "adaptive": False}, registry=plugins, threads=1)
    for prompt, tokens in _greedy(target).items():
        result = generator.generate(prompt, max_new_tokens=NEW)
        assert list(result.tokens) == tokens, prompt
        assert result.stats.forwards["draft"] > 0


def test_the_target_as_its_own_draft_accepts_every_draft(seq2seq: Any, plugins: PluginRegistry) -> None:
    target = str(seq2seq.folder("t5"))
    generator = Generator(
        {"target": target, "draft": target}, "speculative", options={"k": 4, "adaptive": False}, registry=plugins
    )
    for prompt, tokens in _greedy(seq2seq.folder("t5")).items():
        result = generator.generate(prompt, max_new_tokens=NEW)
        assert list(result.tokens) == tokens
        # every verify forward takes all 4 drafts and the target's own token (the last may be cut by max_new_tokens)
        assert result.stats.tokens_per_target_forward > 4


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_prompt_lookup_gives_greedy_s_tokens(seq2seq: Any, plugins: PluginRegistry, name: str) -> None:
    target = seq2seq.folder(name)
    generator = Generator(
        {"target": str(target)}, "speculative", options={"drafter": "prompt-lookup"}, registry=plugins, threads=1
    )
    for prompt, tokens in _greedy(target).items():
        assert list(generator.generate(prompt, max_new_tokens=NEW).tokens) == tokens, prompt


def test_sampling_speculation_is_reproducible_on_encoder_decoder_models(seq2seq: Any, plugins: PluginRegistry) -> None:
    models = {"target": str(seq2seq.folder("bart")), "draft": str(seq2seq.folder("bart-draft"))}
    # a fixed draft length: the adaptive rule's choices follow measured times, and with them the random draws
    options = {"sampling": True, "adaptive": False, "k": 3}
    generator = Generator(models, "speculative", options=options, registry=plugins, threads=1)
    first = generator.generate(PROMPTS[0], max_new_tokens=NEW, seed=3)
    assert first.tokens and list(generator.generate(PROMPTS[0], max_new_tokens=NEW, seed=3).tokens) == list(
        first.tokens
    )


class _Host:
    """What the prompt-lookup drafter reads of a host."""

    def __init__(self, source: list[int]) -> None:
        self.source_tokens = np.asarray(source, np.int64)


def test_prompt_lookup_copies_from_the_source() -> None:
    """An encoder-decoder target's source is indexed before the decoder's tokens: a summary or translation that
    reaches a name of the source drafts what followed it there."""
    drafter = PromptLookupDrafter(ngram_min=1, ngram_max=3)
    drafter.start(_Host([50, 60, 70, 80, 90]))  # type: ignore[arg-type]
    context = np.array([2, 11, 60, 70])  # decoder start, then output that reached "60 70"
    drafts, _ = drafter.propose(None, context, 3)  # type: ignore[arg-type]
    assert drafts == [80, 90, 2]
    # the index grows by the new tokens only, after the source
    drafts, _ = drafter.propose(None, np.array([2, 11, 60, 70, 80, 90, 2, 11]), 2)  # type: ignore[arg-type]
    assert drafts == [60, 70]


@pytest.mark.parametrize(
    ("controller", "options", "capability"),
    [("eagle", {}, "features"), ("lookahead", {}, "tree")],
)
def test_controllers_that_need_what_the_decoder_lacks_are_refused(
    seq2seq: Any, plugins: PluginRegistry, controller: str, options: dict[str, Any], capability: str
) -> None:
    folder = str(seq2seq.folder("t5"))
    models = {"target": folder, "eagle": folder} if controller == "eagle" else {"target": folder}
    with pytest.raises((CapabilityError, GenerationError)) as caught:
        Generator(models, controller, options=options, registry=plugins).generate(PROMPTS[0], max_new_tokens=4)
    error = caught.value if isinstance(caught.value, CapabilityError) else caught.value.__cause__
    assert isinstance(error, CapabilityError)
    assert capability in str(error) or "hidden_states" in str(error)


def test_a_decoder_only_draft_is_refused(seq2seq: Any, plugins: PluginRegistry, tmp_path: Path) -> None:
    draft = build_optimum_model(tmp_path / "draft", seed=1, vocab=384)
    with pytest.raises(ConfigError, match="decoder-only model but the target"):
        Generator({"target": str(seq2seq.folder("t5")), "draft": str(draft)}, "speculative", registry=plugins)


def test_a_draft_that_starts_its_decoder_elsewhere_is_refused(seq2seq: Any, plugins: PluginRegistry) -> None:
    models = {"target": str(seq2seq.folder("bart")), "draft": str(seq2seq.folder("t5-draft"))}
    with pytest.raises(ConfigError, match=r"starts its decoder from token 2 but the target .* from 1"):
        Generator(models, "speculative", registry=plugins)


def test_a_prompt_longer_than_the_encoder_takes_is_refused(seq2seq: Any) -> None:
    generator = Generator({"target": str(seq2seq.folder("bart"))}, "greedy", threads=1)
    with pytest.raises(ConfigError, match=r"takes at most 128.*shorten the prompt"):
        generator.generate("x = 1\n" * 200, max_new_tokens=4)


def test_the_command_line_generates_from_a_folder(seq2seq: Any, capsys: pytest.CaptureFixture[str]) -> None:
    folder = seq2seq.folder("t5")
    expected = Generator({"target": str(folder)}, "greedy", threads=1).generate(PROMPTS[0], max_new_tokens=8).text
    assert main(["generate", "-m", str(folder), PROMPTS[0], "-n", "8", "--threads", "1", "--stats", "none"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == expected


def test_the_bench_runs_lookup_and_a_draft_against_greedy_with_identical_outputs(
    seq2seq: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:2]))
    report = tmp_path / "bench.json"
    args = ["bench", "-m", str(seq2seq.folder("t5")), "--draft", str(seq2seq.folder("t5-draft"))]
    args += ["--contenders", "greedy,lookup=speculative(drafter=prompt-lookup),speculative", "--prompts", str(prompts)]
    args += ["-n", "8", "--repeats", "1", "--threads", "1", "--calibration-pairs", "1", "--no-huge-pages"]
    assert main([*args, "--require-identical", "--json", str(report)]) == 0
    contenders = {c["name"]: c for c in json.loads(report.read_text())["contenders"]}
    assert set(contenders) == {"greedy", "lookup", "speculative"}
    assert all(c["identical_to_baseline"] for c in contenders.values())


def test_the_raw_onnxruntime_contender_is_refused_for_an_encoder_decoder_model(
    seq2seq: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "-m", str(seq2seq.folder("t5")), "--contenders", "greedy,raw-ort", "-n", "4"]) == 2
    assert "raw-ort runs decoder-only models" in capsys.readouterr().err
