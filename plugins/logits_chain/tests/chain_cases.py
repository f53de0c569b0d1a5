"""Random rows and prefixes shared by the logits-chain tests (a module of its own: test directories of several
distributions each have a conftest, so test modules import helpers from here, not from conftest)."""

from __future__ import annotations

import numpy as np

from decoctl import ProcessContext

EOS = (1, 5)


def random_case(seed: int, *, vocab: int = 64, masked: bool = False) -> tuple[np.ndarray, ProcessContext]:
    """Three rows with a two-token drafted chain (row i follows drafted[:i]) over a small vocabulary, so random
    prefixes repeat tokens and n-grams. ``masked``: about 30% of the logits already -inf, as after a top_k."""
    rng = np.random.default_rng(seed)
    rows = (rng.normal(size=(3, vocab)) * 2.5).astype(np.float32)
    if masked:
        drop = rng.random(rows.shape) < 0.3
        drop[np.arange(3), rows.argmax(axis=1)] = False
        rows[drop] = -np.inf
    prompt = rng.integers(0, vocab, 12)
    output = rng.integers(0, vocab, int(rng.integers(0, 8)))
    drafted = [int(t) for t in rng.integers(0, vocab, 2)]
    paths = [drafted[:i] for i in range(3)]
    return rows, ProcessContext(prompt, output, paths, eos_token_ids=frozenset(EOS))


#: one chain per stateless processor, with values that change something on random rows
STATELESS_CHAINS = (
    "temperature=0.7",
    "top_k=5",
    "top_p=0.8",
    "min_p=0.1",
    "typical_p=0.7",
    "epsilon=0.01",
    "eta=0.05",
    "repetition_penalty=1.3",
    "presence_penalty=0.8",
    "frequency_penalty=0.5",
    "no_repeat_ngram=2",
    "min_length=16",
    "min_new_tokens=4",
    "logit_bias=3:-2.5 7:4",
    "bad_words=4 | 7 8 60",
    "suppress_tokens=3 7",
    "exponential_decay_length_penalty=3",
    "top_h=0.4",
    "top_n_sigma=1",
    "dynamic_temperature=1.2",
    "xtc=0.7",
    "sequence_bias=5 6:-2 | 9:1.5",
    "suppress_tokens_at_begin=3 7",
    "normalize",
    "greedy",
    "sample",
    "repetition_penalty=1.2,no_repeat_ngram=2,min_new_tokens=3,top_k=20,top_p=0.9,temperature=0.8",
)
