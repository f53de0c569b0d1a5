"""Beam search (decoctl.controllers) against its oracle, transformers' generate(num_beams=...) on the same weights (the
builder's Llama export, whose two EOS ids make a search keep 3 * num_beams continuations), and against
onnxruntime-genai's own beam search where the two agree.

onnxruntime-genai 0.18 follows transformers' older beam scorer: a finished hypothesis is normalised by the whole
sequence's length (the prompt counted, its EOS not), the EOS is left out of the returned sequence, and the
early-stop check measures the same way. So its beams equal transformers' (and decoctl's) when length_penalty is
0, where lengths do not count; with another length_penalty they may rank hypotheses differently. On this model,
"import os" with 4 beams and length_penalty 1 (early_stopping true or false): onnxruntime-genai returns a
6-token hypothesis (ended by EOS) first, where transformers and decoctl return two of 12 tokens; with
length_penalty 2, "def fibonacci(n):"'s second sequence is a 4-token one there."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from builder_models import Export

from decoctl import ConfigError, Generator
from decoctl.cli import main
from decoctl.plugins import PluginRegistry
from decoctl.testing import build_genai_model

PROMPTS = ("def fibonacci(n):", "x", "class Stack:", "import os")
MAX_NEW = 12
SCORE_TOLERANCE = 1e-4
#: (num_beams, length_penalty, early_stopping, num_return_sequences)
SEARCHES = [
    (1, 1.0, "false", 1),
    (3, 1.0, "false", 2),
    (4, 0.0, "true", 1),
    (4, 2.0, "never", 4),
    (3, 1.0, "never", 3),
    (4, 1.0, "true", 2),
    (3, 0.0, "never", 2),
]
EARLY = {"true": True, "false": False, "never": "never"}


def beam(model: Export | Path, registry: PluginRegistry, processors: str | None = None, **options: Any) -> Generator:
    folder = model.onnx if isinstance(model, Export) else model
    return Generator({"target": str(folder)}, "beam", options=options, processors=processors, registry=registry)


@functools.cache
def transformers_model(folder: Path) -> tuple[Any, Any]:
    """(tokenizer, model) of a Hugging Face folder, loaded once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder).eval()


def transformers_beams(model: Export, prompt: str, **generate: Any) -> list[tuple[list[int], float | None]]:
    """transformers' returned sequences (new tokens, padding cut) and their sequences_scores (None for 1 beam)."""
    tokenizer, hf = transformers_model(model.hf)
    encoded = tokenizer(prompt, return_tensors="pt")
    out = hf.generate(
        **encoded,
        do_sample=False,
        eos_token_id=list(model.eos),
        return_dict_in_generate=True,
        output_scores=True,
        **generate,
    )
    start = encoded.input_ids.shape[1]
    found = []
    for i in range(generate.get("num_return_sequences", 1)):
        tokens = [int(t) for t in out.sequences[i, start:]]
        if generate["num_beams"] > 1:  # a beam's generated length: the steps that name its beam
            found.append((tokens[: int((out.beam_indices[i] >= 0).sum())], float(out.sequences_scores[i])))
        else:  # greedy: padding (the first EOS id) follows the EOS that ended it
            ends = [at for at, t in enumerate(tokens) if t in model.eos]
            found.append((tokens[: ends[0] + 1] if ends else tokens, None))
    return found


def onnxruntime_genai_beams(model: Export, prompt: str, num_beams: int, early: bool, count: int) -> list[list[int]]:
    import onnxruntime_genai as og

    og_model = og.Model(str(model.onnx))
    # the prompt as transformers (and decoctl) encode it: onnxruntime-genai's tokenizer leaves out the BOS that this
    # model's tokenizer.json adds in its post-processor
    ids = transformers_model(model.hf)[0](prompt).input_ids
    params = og.GeneratorParams(og_model)
    params.set_search_options(
        num_beams=num_beams,
        length_penalty=0.0,
        early_stopping=early,
        num_return_sequences=count,
        max_length=len(ids) + MAX_NEW,
        do_sample=False,
    )
    generator = og.Generator(og_model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(i)][len(ids) :] for i in range(count)]


@pytest.mark.parametrize(("num_beams", "length_penalty", "early_stopping", "count"), SEARCHES)
def test_beam_search_equals_transformers_generate(
    llama: Export,
    registry: PluginRegistry,
    num_beams: int,
    length_penalty: float,
    early_stopping: str,
    count: int,
) -> None:
    generator = beam(
        llama,
        registry,
        num_beams=num_beams,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        num_return_sequences=count,
    )
    for prompt in PROMPTS:
        result = generator.generate(prompt, max_new_tokens=MAX_NEW)
        expected = transformers_beams(
            llama,
            prompt,
            num_beams=num_beams,
            length_penalty=length_penalty,
            early_stopping=EARLY[early_stopping],
            num_return_sequences=count,
            max_new_tokens=MAX_NEW,
        )
        assert [list(c.tokens) for c in result.completions] == [tokens for tokens, _ in expected], prompt
        for completion, (_, score) in zip(result.completions, expected, strict=True):
            if score is not None:
                assert completion.score == pytest.approx(score, abs=SCORE_TOLERANCE), prompt
            ended = completion.tokens[-1] in llama.eos
            assert completion.stop_reason == ("eos" if ended else "max_new_tokens"), prompt


def test_the_searches_end_both_in_eos_and_at_max_new_tokens(llama: Export, registry: PluginRegistry) -> None:
    """What makes the comparisons above cover both ways a hypothesis finishes."""
    generator = beam(llama, registry, num_beams=3, num_return_sequences=3)
    reasons = {c.stop_reason for p in PROMPTS for c in generator.generate(p, max_new_tokens=MAX_NEW).completions}
    assert reasons == {"eos", "max_new_tokens"}


@pytest.mark.parametrize(
    ("num_beams", "chain", "transformers_options"),
    [
        (3, "no_repeat_ngram=2", {"no_repeat_ngram_size": 2}),
        (4, "repetition_penalty=1.5", {"repetition_penalty": 1.5}),
        (1, "repetition_penalty=1.5", {"repetition_penalty": 1.5}),
        (4, "repetition_penalty=1.3,no_repeat_ngram=3", {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3}),
    ],
)
def test_the_logits_chain_applies_per_beam_as_in_transformers(
    llama: Export, registry: PluginRegistry, num_beams: int, chain: str, transformers_options: dict[str, Any]
) -> None:
    plugin = pytest.importorskip("decoctl_logits_chain.plugin")
    registry.register(plugin, "logits-chain")
    generator = beam(llama, registry, chain, num_beams=num_beams)
    for prompt in PROMPTS:
        result = generator.generate(prompt, max_new_tokens=16)
        expected = transformers_beams(llama, prompt, num_beams=num_beams, max_new_tokens=16, **transformers_options)
        assert list(result.tokens) == expected[0][0], prompt


@pytest.mark.parametrize(("num_beams", "early_stopping", "count"), [(3, "false", 2), (4, "true", 3), (2, "false", 1)])
def test_onnxruntime_genai_beam_search_agrees_without_a_length_penalty(
    llama: Export, registry: PluginRegistry, num_beams: int, early_stopping: str, count: int
) -> None:
    options = {"num_beams": num_beams, "length_penalty": 0.0, "early_stopping": early_stopping}
    generator = beam(llama, registry, num_return_sequences=count, **options)
    for prompt in PROMPTS:
        ours = [list(c.tokens) for c in generator.generate(prompt, max_new_tokens=MAX_NEW).completions]
        theirs = onnxruntime_genai_beams(llama, prompt, num_beams, early_stopping == "true", count)
        # onnxruntime-genai leaves the EOS that ended a hypothesis out of the sequence it returns
        assert [t[:-1] if t[-1] in llama.eos else t for t in ours] == theirs, prompt


def test_one_beam_is_greedy_decoding(genai_model: Path, registry: PluginRegistry) -> None:
    greedy = Generator({"target": str(genai_model)}, "greedy", registry=registry)
    one = beam(genai_model, registry, num_beams=1)
    for prompt in ("def f(x):", "import os"):
        assert one.generate(prompt, max_new_tokens=10).tokens == greedy.generate(prompt, max_new_tokens=10).tokens


def test_a_stop_string_cuts_each_returned_hypothesis(genai_model: Path, registry: PluginRegistry) -> None:
    generator = beam(genai_model, registry, num_beams=3, num_return_sequences=3)
    free = generator.generate("def f(x):", max_new_tokens=10)
    stop = free.completions[1].text[2:4]
    cut = generator.generate("def f(x):", max_new_tokens=10, stop=[stop])
    for before, after in zip(free.completions, cut.completions, strict=True):
        assert after.score == before.score  # the search is the same: the cut comes after it
        at = before.text.find(stop)
        assert after.text == (before.text if at < 0 else before.text[:at])
        assert after.stop_reason == (before.stop_reason if at < 0 else "stop_string")


def test_more_sequences_than_beams_is_refused_before_loading(registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match="num_return_sequences=3 is more than num_beams=2"):
        Generator({"target": "/no/such/model"}, "beam", options={"num_beams": 2, "num_return_sequences": 3})


def test_an_unknown_early_stopping_is_refused(registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match="early_stopping"):
        Generator({"target": "/no/such/model"}, "beam", options={"early_stopping": "sometimes"}, registry=registry)


def test_several_sequences_through_a_chain_that_keeps_state_equal_transformers(
    llama: Export, registry: PluginRegistry
) -> None:
    """Beam search commits its hypotheses whole once the search ends, so a chain that keeps per-sequence state
    (no_repeat_ngram, repetition_penalty) serves every returned sequence."""
    plugin = pytest.importorskip("decoctl_logits_chain.plugin")
    registry.register(plugin, "logits-chain")
    generator = beam(llama, registry, "repetition_penalty=1.3,no_repeat_ngram=3", num_beams=3, num_return_sequences=2)
    for prompt in PROMPTS:
        result = generator.generate(prompt, max_new_tokens=16)
        expected = transformers_beams(
            llama,
            prompt,
            num_beams=3,
            num_return_sequences=2,
            max_new_tokens=16,
            repetition_penalty=1.3,
            no_repeat_ngram_size=3,
        )
        assert [list(c.tokens) for c in result.completions] == [tokens for tokens, _ in expected], prompt


def test_beams_on_a_concatenated_cache_model_equal_those_on_its_shared_buffer_twin(
    optimum_model: Path, registry: PluginRegistry, tmp_path: Path
) -> None:
    """The Optimum test model and a builder-layout model of the same seed and sizes compute the same function
    (decoctl.testing): the same searches, one Run per row on the first, one Run per step on the second."""
    twin = build_genai_model(tmp_path, seed=3, num_kv_heads=4)
    options = {"num_beams": 3, "num_return_sequences": 2, "length_penalty": 1.0}
    for prompt in PROMPTS:
        expected = beam(twin, registry, **options).generate(prompt, max_new_tokens=MAX_NEW)
        result = beam(optimum_model, registry, **options).generate(prompt, max_new_tokens=MAX_NEW)
        assert [c.tokens for c in result.completions] == [c.tokens for c in expected.completions], prompt
        assert [c.score for c in result.completions] == pytest.approx(
            [c.score for c in expected.completions], abs=SCORE_TOLERANCE
        )
        assert result.stats.trace["rows"] == "one Run per row (concatenated KV cache)"
        assert "rows" not in expected.stats.trace


def test_the_cli_prints_every_returned_sequence_numbered(
    genai_model: Path, registry: PluginRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = beam(genai_model, registry, num_beams=3, num_return_sequences=2).generate("def f(x):", max_new_tokens=8)
    args = ["generate", "def f(x):", "-m", str(genai_model), "-c", "beam", "-o", "num_beams=3"]
    assert main([*args, "-o", "num_return_sequences=2", "-n", "8", "--threads", "1"]) == 0
    second = expected.completions[1]
    assert capsys.readouterr().out == (
        f"{expected.completions[0].text}\n--- completion 2 (score {second.score:.3f}) ---\n{second.text}\n"
    )
