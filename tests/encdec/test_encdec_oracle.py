"""Encoder-decoder models against transformers on the same weights: greedy token for token, the logits chain as
transformers' processors, sampling equal in distribution; the decoder's cache rewinds and keeps as any other."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from decoctl import Generator
from decoctl.host import Sequence
from decoctl.model._loader import load_model
from decoctl.testing._distributions import NO_SECOND, chi_square_p, sample_two_tokens, softmax

PROMPTS = ("def fibonacci(n):", "class Stack:\n    def push(self, item):", "return result", "for x in range(10):")
NEW = 24


def _hf_greedy(seq2seq: Any, name: str, ids: list[int], **generate: Any) -> list[int]:
    """transformers' generate() on the same weights: the new tokens (the decoder start token left out)."""
    import torch

    model = seq2seq.model(name)
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=NEW,
            do_sample=False,
            **generate,
        )
    return [int(t) for t in out[0, 1:]]


@pytest.mark.parametrize("variant", ["pair", "merged"])
@pytest.mark.parametrize("name", ["t5", "bart"])
def test_greedy_equals_transformers_token_for_token(seq2seq: Any, name: str, variant: str) -> None:
    generator = Generator({"target": str(seq2seq.folder(name, variant))}, "greedy", threads=1)
    for prompt in PROMPTS:
        ids = generator.tokenizer.encode(prompt)
        result = generator.generate(prompt, max_new_tokens=NEW)
        assert list(result.tokens) == _hf_greedy(seq2seq, name, ids), prompt
        assert result.stats.prompt_tokens == len(ids)  # the source's tokens, not the decoder start token


def test_the_logits_chain_equals_transformers_processors(seq2seq: Any) -> None:
    """Processors see the decoder's tokens (its start token, then the output), as transformers' do."""
    generator = Generator(
        {"target": str(seq2seq.folder("t5"))},
        "greedy",
        processors="repetition_penalty=1.5,no_repeat_ngram=2",
        threads=1,
    )
    for prompt in PROMPTS:
        ids = generator.tokenizer.encode(prompt)
        expected = _hf_greedy(seq2seq, "t5", ids, repetition_penalty=1.5, no_repeat_ngram_size=2)
        assert list(generator.generate(prompt, max_new_tokens=NEW).tokens) == expected, prompt


def _exact_marginals(seq2seq: Any, ids: list[int], temperature: float) -> tuple[dict[int, float], dict[int, float]]:
    """p(t1) and p(t2) = sum p(t1) p(t2 | t1) from transformers' logits (NO_SECOND for an EOS first token)."""
    import torch

    model = seq2seq.model("t5")
    start, eos = model.config.decoder_start_token_id, model.config.eos_token_id
    source = torch.tensor([ids])
    with torch.no_grad():
        encoded = model.get_encoder()(input_ids=source).last_hidden_state
        first = softmax(
            model(encoder_outputs=(encoded,), decoder_input_ids=torch.tensor([[start]])).logits[0, -1].numpy(),
            temperature,
        )
        tokens = np.flatnonzero(first > 1e-7)
        decoder = torch.tensor([[start, int(t)] for t in tokens])
        rows = model(encoder_outputs=(encoded.expand(len(tokens), -1, -1),), decoder_input_ids=decoder).logits[:, -1]
    second = np.zeros(len(first))
    no_second = 0.0
    for token, row in zip(tokens, rows.numpy(), strict=True):
        if int(token) == eos:
            no_second += first[token]
        else:
            second += first[token] * softmax(row, temperature)
    return dict(enumerate(first.tolist())), {**dict(enumerate(second.tolist())), NO_SECOND: no_second}


def test_sampling_follows_transformers_distribution(seq2seq: Any) -> None:
    """The first two sampled tokens of 600 seeded generations against the exact marginals transformers' logits
    give (chi-square, cells expecting < 5 pooled). Power, checked on the same samples: the marginals at another
    temperature (1.5 for 2.5) are rejected with p < 1e-6."""
    prompt, temperature, trials = PROMPTS[0], 2.5, 600
    generator = Generator(
        {"target": str(seq2seq.folder("t5"))}, "sample", options={"temperature": temperature}, threads=1
    )
    ids = generator.tokenizer.encode(prompt)
    first, second = sample_two_tokens(generator, prompt, trials)
    p_first, p_second = _exact_marginals(seq2seq, ids, temperature)
    assert chi_square_p(first, p_first, trials) > 1e-3
    assert chi_square_p(second, p_second, trials) > 1e-3
    wrong_first, wrong_second = _exact_marginals(seq2seq, ids, 1.5)
    assert min(chi_square_p(first, wrong_first, trials), chi_square_p(second, wrong_second, trials)) < 1e-6


def test_rewind_and_keep_give_what_a_fresh_decoder_gives(seq2seq: Any) -> None:
    model = load_model(seq2seq.folder("bart"), threads=1)
    start = model.encoder.parts.decoder_start_token_id if model.encoder else 0
    source = [40, 41, 42, 43, 44]
    fresh = Sequence("target", model)
    fresh.encode(source)
    expected = fresh.forward([start, 7, 9, 11]).copy()
    sequence = Sequence("target", model)
    sequence.encode(source)
    sequence.forward([start, 7])
    sequence.forward([8, 8])
    sequence.rewind(2)  # drop the two wrong tokens
    np.testing.assert_allclose(sequence.forward([9, 11]), expected[2:], atol=1e-4)
    sequence.rewind(1)
    sequence.forward([5, 7, 6, 9])
    sequence.keep([0, 1])  # the chain's first two tokens
    assert list(sequence.tokens) == [start, 5, 7]
    sequence.rewind(1)
    np.testing.assert_allclose(sequence.forward([7, 9, 11]), expected[1:], atol=1e-4)
    sequence.rewind(0)  # from an empty cache: the with-past decoder, over the same source's cross-attention KV
    np.testing.assert_allclose(sequence.forward([start, 7, 9, 11]), expected, atol=1e-4)


def test_the_cross_attention_kv_is_written_once_and_bound_in_place(seq2seq: Any) -> None:
    """The first pass writes the cross-attention KV into the runner's buffers; steps read those buffers where they
    are (the same arrays, unchanged), and a new source replaces them."""
    model = load_model(seq2seq.folder("t5", "merged"), threads=1)
    sequence = Sequence("target", model)
    sequence.encode([30, 31, 32])
    sequence.forward([2])
    runner = sequence._runner
    buffers = [array for pair in runner._cross for array in pair]
    written = [array.copy() for array in buffers]
    assert all(np.any(array != 0) for array in written)
    for token in (5, 6, 7, 8):
        sequence.forward([token])
    assert [array for pair in runner._cross for array in pair] == buffers  # no new buffer
    for array, before in zip(buffers, written, strict=True):
        np.testing.assert_array_equal(array, before)
    sequence.encode([50, 51, 52])
    sequence.forward([2])
    assert any(not np.array_equal(array, before) for array, before in zip(buffers, written, strict=True))
