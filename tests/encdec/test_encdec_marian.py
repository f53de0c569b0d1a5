"""Marian (MarianMTModel) on the same footing as T5 and BART: greedy equals transformers' generate() token for token
on a tiny random model whose decoder starts from PAD, with scaled embeddings, sinusoidal positions, a shared
vocabulary and a random final_logits_bias; prompt lookup gives the same tokens, beam search (with a banned token)
transformers' beams; a folder that holds Marian's sentencepiece files instead of tokenizer.json is refused, naming
the file and the fix."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from decoctl_speculative import plugin as speculative_plugin

from decoctl import Generator, ModelLoadError
from decoctl.plugins import PluginRegistry

PROMPTS = ("def fibonacci(n):", "class Stack:\n    def push(self, item):", "return result", "for x in range(10):")
NEW = 24


@pytest.mark.parametrize("variant", ["pair", "merged"])
def test_greedy_equals_transformers_token_for_token(seq2seq: Any, variant: str) -> None:
    generator = Generator({"target": str(seq2seq.folder("marian", variant))}, "greedy", threads=1)
    parts = generator.models["target"].spec.encoder_decoder
    assert parts is not None and parts.decoder_start_token_id == seq2seq.model("marian").config.pad_token_id
    for prompt in PROMPTS:
        ids = generator.tokenizer.encode(prompt)
        assert list(generator.generate(prompt, max_new_tokens=NEW).tokens) == seq2seq.greedy("marian", ids, NEW), prompt


def test_the_oracle_depends_on_final_logits_bias(seq2seq: Any) -> None:
    """The comparison above would catch a runtime that dropped the bias: without it transformers decodes otherwise."""
    import torch

    model = seq2seq.model("marian")
    tokenizer = Generator({"target": str(seq2seq.folder("marian"))}, "greedy", threads=1).tokenizer
    sources = [tokenizer.encode(prompt) for prompt in PROMPTS]
    with_bias = [seq2seq.greedy("marian", source, NEW) for source in sources]
    bias = model.final_logits_bias.clone()
    try:
        model.final_logits_bias.zero_()
        without = [seq2seq.greedy("marian", source, NEW) for source in sources]
    finally:
        with torch.no_grad():
            model.final_logits_bias.copy_(bias)
    assert with_bias != without


def test_speculative_prompt_lookup_equals_transformers(seq2seq: Any) -> None:
    registry = PluginRegistry(autoload=False)
    registry.register(speculative_plugin, "speculative")
    folder = str(seq2seq.folder("marian"))
    lookup = Generator({"target": folder}, "speculative", options={"drafter": "prompt-lookup"}, registry=registry)
    for prompt in PROMPTS:
        expected = seq2seq.greedy("marian", lookup.tokenizer.encode(prompt), NEW)
        assert list(lookup.generate(prompt, max_new_tokens=NEW).tokens) == expected, prompt


def test_beam_search_with_a_suppressed_token_equals_transformers_bad_words(seq2seq: Any) -> None:
    """What docs/MODELS.md asks for to get an opus-mt checkpoint's default output (its config sets num_beams 4 and
    bad_words_ids [[pad]]): -c beam -o num_beams=N -p suppress_tokens=ID. The banned token here is one the search
    picks, so banning it changes the output."""
    folder = str(seq2seq.folder("marian"))
    plain = Generator({"target": folder}, "beam", options={"num_beams": 3}, threads=1)
    ids = plain.tokenizer.encode(PROMPTS[1])
    chosen = list(plain.generate(PROMPTS[1], max_new_tokens=NEW).tokens)
    assert chosen == seq2seq.greedy("marian", ids, NEW, num_beams=3)
    banned = chosen[0]
    banning = Generator(
        {"target": folder}, "beam", options={"num_beams": 3}, processors=f"suppress_tokens={banned}", threads=1
    )
    expected = seq2seq.greedy("marian", ids, NEW, num_beams=3, bad_words_ids=[[banned]])
    assert banned not in expected
    assert list(banning.generate(PROMPTS[1], max_new_tokens=NEW).tokens) == expected


def test_a_folder_with_marian_s_sentencepiece_files_instead_of_tokenizer_json_is_refused(
    seq2seq: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "opus-mt"
    shutil.copytree(seq2seq.folder("marian"), folder)
    (folder / "tokenizer.json").unlink()
    for name in ("source.spm", "target.spm", "vocab.json"):  # what Optimum's export of a Marian model saves
        (folder / name).write_bytes(b"{}")
    with pytest.raises(ModelLoadError) as caught:
        Generator({"target": str(folder)}, "greedy")
    message = str(caught.value)
    assert f"{folder / 'tokenizer.json'} is missing" in message
    assert "Marian tokenizer (source.spm, target.spm, vocab.json)" in message
    assert "docs/MODELS.md (Encoder-decoder models, Marian)" in message
