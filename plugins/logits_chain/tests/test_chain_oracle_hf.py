"""Every processor transformers also has gives its results (allclose) on random logits and prefixes.

transformers' processor sees one row at a time with that row's own prefix as input_ids (prompt, committed
output, drafted tokens before the row); ours sees all rows at once with ``context.paths``. Needs the test extra.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from chain_cases import EOS, random_case
from transformers.generation import logits_process as hf

from decoctl import ProcessContext

pytestmark = pytest.mark.oracle

Case = Callable[[ProcessContext], tuple[Any, Any]]


def _bad_words(context: ProcessContext) -> tuple[Any, Any]:
    last = context.prefix(2)  # sequences that row 2's prefix completes, plus some that match nothing
    sequences = [[int(last[-1]), 9], [int(last[-2]), int(last[-1]), 11], [4], [EOS[0]], [int(last[-3]), 13], [7, 8, 60]]
    return [{"name": "bad_words", "sequences": str(sequences)}], hf.NoBadWordsLogitsProcessor(sequences, list(EOS))


def _sequence_bias(context: ProcessContext) -> tuple[Any, Any]:
    last = context.prefix(1)  # sequences that row 1's prefix ends with, one-token ones, and one that matches nothing
    biases = [[[int(last[-1]), 9], -2.0], [[int(last[-2]), int(last[-1]), 11], 3.5], [[4], 1.5], [[7, 8, 60], -4.0]]
    return [{"name": "sequence_bias", "biases": str(biases)}], hf.SequenceBiasLogitsProcessor(biases)


CASES: dict[str, Case] = {
    "temperature": lambda c: ("temperature=0.7", hf.TemperatureLogitsWarper(0.7)),
    "temperature-hot": lambda c: ("temperature=1.6", hf.TemperatureLogitsWarper(1.6)),
    "top_k": lambda c: ("top_k=5", hf.TopKLogitsWarper(5)),
    "top_k-keep": lambda c: (
        [{"name": "top_k", "top_k": 3, "min_tokens_to_keep": 6}],
        hf.TopKLogitsWarper(3, min_tokens_to_keep=6),
    ),
    "top_p": lambda c: ("top_p=0.8", hf.TopPLogitsWarper(0.8)),
    "top_p-keep": lambda c: (
        [{"name": "top_p", "top_p": 0.3, "min_tokens_to_keep": 4}],
        hf.TopPLogitsWarper(0.3, min_tokens_to_keep=4),
    ),
    "min_p": lambda c: ("min_p=0.1", hf.MinPLogitsWarper(0.1)),
    "min_p-keep": lambda c: (
        [{"name": "min_p", "min_p": 0.5, "min_tokens_to_keep": 5}],
        hf.MinPLogitsWarper(0.5, min_tokens_to_keep=5),
    ),
    "typical_p": lambda c: ("typical_p=0.7", hf.TypicalLogitsWarper(0.7)),
    "typical_p-keep": lambda c: (
        [{"name": "typical_p", "typical_p": 0.2, "min_tokens_to_keep": 3}],
        hf.TypicalLogitsWarper(0.2, min_tokens_to_keep=3),
    ),
    "epsilon": lambda c: ("epsilon=0.01", hf.EpsilonLogitsWarper(0.01)),
    "epsilon-keep": lambda c: (
        [{"name": "epsilon", "epsilon": 0.05, "min_tokens_to_keep": 3}],
        hf.EpsilonLogitsWarper(0.05, min_tokens_to_keep=3),
    ),
    "eta": lambda c: ("eta=0.05", hf.EtaLogitsWarper(0.05)),
    "eta-keep": lambda c: (
        [{"name": "eta", "eta": 0.2, "min_tokens_to_keep": 3}],
        hf.EtaLogitsWarper(0.2, min_tokens_to_keep=3),
    ),
    "repetition_penalty": lambda c: ("repetition_penalty=1.3", hf.RepetitionPenaltyLogitsProcessor(1.3)),
    "repetition_penalty-reward": lambda c: ("repetition_penalty=0.7", hf.RepetitionPenaltyLogitsProcessor(0.7)),
    "repetition_penalty-no-prompt": lambda c: (
        [{"name": "repetition_penalty", "penalty": 1.5, "include_prompt": False}],
        hf.RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=len(c.prompt)),
    ),
    "no_repeat_ngram-1": lambda c: ("no_repeat_ngram=1", hf.NoRepeatNGramLogitsProcessor(1)),
    "no_repeat_ngram-2": lambda c: ("no_repeat_ngram=2", hf.NoRepeatNGramLogitsProcessor(2)),
    "no_repeat_ngram-3": lambda c: ("no_repeat_ngram=3", hf.NoRepeatNGramLogitsProcessor(3)),
    "min_length": lambda c: ("min_length=16", hf.MinLengthLogitsProcessor(16, list(EOS))),
    "min_new_tokens": lambda c: ("min_new_tokens=4", hf.MinNewTokensLengthLogitsProcessor(len(c.prompt), 4, list(EOS))),
    "logit_bias": lambda c: (
        "logit_bias=3:-2.5 7:4 1:1",
        hf.SequenceBiasLogitsProcessor([[[3], -2.5], [[7], 4.0], [[1], 1.0]]),
    ),
    "bad_words": _bad_words,
    "suppress_tokens": lambda c: ("suppress_tokens=3 7 1", hf.SuppressTokensLogitsProcessor([3, 7, 1])),
    "top_h": lambda c: ("top_h=0.4", hf.TopHLogitsWarper(0.4)),
    "top_h-wide": lambda c: ("top_h=0.9", hf.TopHLogitsWarper(0.9)),
    "sequence_bias": lambda c: _sequence_bias(c),
    "suppress_tokens_at_begin": lambda c: (
        "suppress_tokens_at_begin=3 7 1",
        hf.SuppressTokensAtBeginLogitsProcessor([3, 7, 1], len(c.prompt)),
    ),
    "suppress_tokens_at_begin-later": lambda c: (
        [{"name": "suppress_tokens_at_begin", "tokens": "3 7 1", "at": len(c.output) + 1}],
        hf.SuppressTokensAtBeginLogitsProcessor([3, 7, 1], len(c.prompt) + len(c.output) + 1),
    ),
    "normalize": lambda c: ("normalize", hf.LogitNormalization()),
    "remove_invalid": lambda c: ("remove_invalid", hf.InfNanRemoveLogitsProcessor()),
    "exponential_decay_length_penalty": lambda c: (
        [{"name": "exponential_decay_length_penalty", "start": 3, "factor": 1.3}],
        hf.ExponentialDecayLengthPenalty((3, 1.3), list(EOS), len(c.prompt)),
    ),
}


def hf_rows(processor: Any, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
    """transformers' processor on each row alone, with that row's own prefix as input_ids."""
    out = []
    for index in range(len(rows)):
        input_ids = torch.from_numpy(context.prefix(index))[None, :]
        out.append(processor(input_ids, torch.from_numpy(rows[index : index + 1].copy())).numpy()[0])
    return np.stack(out)


@pytest.mark.parametrize("vocab", [64, 1024], ids=["vocab64", "vocab1024"])  # top_p/typical_p: head or full sort
@pytest.mark.parametrize("masked", [False, True], ids=["raw", "premasked"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("case", sorted(CASES))
def test_processor_equals_transformers(case: str, seed: int, masked: bool, vocab: int, build: Any) -> None:
    rows, context = random_case(seed, vocab=vocab, masked=masked)
    ours_spec, theirs = CASES[case](context)
    ours = build(ours_spec)(rows, context)
    np.testing.assert_allclose(ours, hf_rows(theirs, rows, context), rtol=1e-5, atol=1e-5)


def test_the_oracle_cases_cover_every_processor_transformers_has(registry: Any) -> None:
    """presence/frequency penalties, grammar, the terminals and llama.cpp's samplers have no transformers
    counterpart."""
    covered = {name.split("-")[0].replace("_", "-") for name in CASES}
    without = {"presence-penalty", "frequency-penalty", "grammar", "greedy", "sample"}
    without |= {"dry", "xtc", "top-n-sigma", "dynamic-temperature"}  # llama.cpp's: tested in test_chain_samplers
    assert covered | without == set(registry.processors())
