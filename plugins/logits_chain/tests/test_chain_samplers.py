"""llama.cpp's samplers (top-n-sigma, dynamic temperature, XTC, DRY) against straightforward reference
implementations of their definitions; transformers has none of them to compare with."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from chain_cases import random_case
from decoctl_logits_chain.dry import Dry, breaker_ids

from decoctl import ConfigError, Generator, ProcessContext
from decoctl.plugins import PluginRegistry
from decoctl.testing import chi_square_p

# -- top-n-sigma and dynamic temperature ---------------------------------------------------------------------------


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("n", [0.0, 0.5, 1.5])
def test_top_n_sigma_keeps_logits_within_n_deviations_of_the_maximum(n: float, masked: bool, build: Any) -> None:
    for seed in range(4):
        rows, context = random_case(seed, masked=masked)
        want = rows.copy()
        for row in want:
            finite = row[np.isfinite(row)].astype(np.float64)
            row[row < finite.max() - n * finite.std()] = -np.inf
        got = build([{"name": "top_n_sigma", "n": n}])(rows, context)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        np.testing.assert_array_equal(got[np.isfinite(got)], rows[np.isfinite(got)])


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(("temperature", "delta", "exponent"), [(1.0, 0.5, 1.0), (0.8, 0.7, 2.0), (1.5, 0.0, 1.0)])
def test_dynamic_temperature_divides_by_the_entropy_scaled_temperature(
    temperature: float, delta: float, exponent: float, masked: bool, build: Any
) -> None:
    for seed in range(4):
        rows, context = random_case(seed, masked=masked)
        want = []
        for row in rows.astype(np.float64):
            alive = row[np.isfinite(row)]
            p = np.exp(alive - alive.max())
            p /= p.sum()
            entropy = -(p * np.log(p)).sum()
            t = temperature - delta + 2 * delta * (entropy / np.log(alive.size)) ** exponent
            want.append(row / t)
        chain = build(
            [{"name": "dynamic_temperature", "temperature": temperature, "delta": delta, "exponent": exponent}]
        )
        np.testing.assert_allclose(chain(rows, context), np.array(want), rtol=1e-5)


def test_a_confident_row_is_sharpened_and_an_unsure_one_flattened(build: Any) -> None:
    rows = np.array([[10.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.9]], np.float32)
    context = ProcessContext(np.array([1]), np.array([], np.int64), [[], []])
    out = build([{"name": "dynamic_temperature", "temperature": 1.0, "delta": 0.5}])(rows.copy(), context)
    assert out[0, 0] > rows[0, 0]  # low entropy: T near 0.5
    assert abs(out[1, 0] - out[1, 3]) < abs(rows[1, 0] - rows[1, 3])  # high entropy: T near 1.5


# -- XTC ---------------------------------------------------------------------------------------------------------------


def _excluded(p: np.ndarray, threshold: float, min_keep: int) -> np.ndarray:
    """llama.cpp's XTC when its coin says act: the distribution after removing the top choices but the last."""
    above = np.flatnonzero(p >= threshold)
    if above.size < 2 or (p > 0).sum() - (above.size - 1) < min_keep:
        return p
    keep = above[np.argmin(p[above])]
    out = p.copy()
    out[above[above != keep]] = 0.0
    return out / out.sum()


def _softmax(row: np.ndarray) -> np.ndarray:
    wide = row.astype(np.float64)
    p = np.exp(wide - wide.max())
    return p / p.sum()


@pytest.mark.parametrize("probability", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("threshold", [0.02, 0.1, 0.5])
def test_xtc_returns_the_mixture_of_acting_and_not_acting(probability: float, threshold: float, build: Any) -> None:
    for seed in range(4):
        rows, context = random_case(seed, vocab=32)
        rows *= 0.6  # flatter rows: several tokens above the thresholds
        chain = build([{"name": "xtc", "probability": probability, "threshold": threshold}])
        out = chain(rows.copy(), context)
        for row, got in zip(rows, out, strict=True):
            p = _softmax(row)
            want = (1 - probability) * p + probability * _excluded(p, threshold, 1)
            np.testing.assert_allclose(_softmax(got), want, atol=1e-6)


def test_xtc_leaves_a_row_alone_when_too_few_tokens_would_remain(build: Any) -> None:
    rows = np.log(np.array([[0.4, 0.35, 0.25, 0.0]], np.float32) + 1e-30)
    rows[0, 3] = -np.inf
    context = ProcessContext(np.array([1]), np.array([], np.int64), [[]])
    kept = build([{"name": "xtc", "probability": 1.0, "threshold": 0.2, "min_tokens_to_keep": 2}])(rows.copy(), context)
    np.testing.assert_allclose(_softmax(kept[0]), _softmax(rows[0]), atol=1e-7)
    acted = build([{"name": "xtc", "probability": 1.0, "threshold": 0.2}])(rows.copy(), context)
    np.testing.assert_allclose(_softmax(acted[0])[:3], [0.0, 0.0, 1.0], atol=1e-7)


def test_sampling_the_xtc_row_equals_llama_cpp_coin_then_draw(build: Any) -> None:
    """llama.cpp flips a coin each step, then samples: 40,000 such draws against the mixture decoctl samples from
    (chi-square, fixed seed; the 0.25 probability moves two tokens' frequency by ~10%: power ~1 at this size)."""
    rng = np.random.default_rng(11)
    row = np.log(np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.07], np.float32))
    context = ProcessContext(np.array([1]), np.array([], np.int64), [[]])
    mixture = _softmax(
        build([{"name": "xtc", "probability": 0.25, "threshold": 0.15}])(row[None, :].copy(), context)[0]
    )
    p = _softmax(row)
    acting = _excluded(p, 0.15, 1)
    draws = 40_000
    coins = rng.random(draws) < 0.25
    counts = np.bincount(rng.choice(6, size=int((~coins).sum()), p=p), minlength=6)
    counts += np.bincount(rng.choice(6, size=int(coins.sum()), p=acting), minlength=6)
    observed = dict(enumerate(counts.tolist()))
    assert chi_square_p(observed, dict(enumerate(mixture)), draws) > 0.001
    assert chi_square_p(observed, dict(enumerate(p)), draws) < 1e-6  # and the test tells XTC from no XTC


# -- DRY ---------------------------------------------------------------------------------------------------------------


def _dry_reference(
    prefix: list[int], vocab: int, multiplier: float, base: float, allowed: int, breakers: set[int]
) -> np.ndarray:
    """The penalty per token by the definition: for every j, the longest l >= 1 with prefix[j-l:j] equal to the
    prefix's last l tokens and no breaker among them; token prefix[j] would extend that repetition."""
    size = len(prefix)
    longest = np.zeros(vocab, np.int64)
    for j in range(1, size):
        length = 0
        while (
            length < j
            and prefix[j - 1 - length] == prefix[size - 1 - length]
            and prefix[size - 1 - length] not in breakers
        ):
            length += 1
        longest[prefix[j]] = max(longest[prefix[j]], length)
    penalty = np.zeros(vocab, np.float64)
    hit = longest >= allowed
    penalty[hit] = multiplier * base ** (longest[hit] - allowed)
    return penalty


@pytest.mark.parametrize("allowed", [1, 2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_dry_penalises_as_the_definition_says(seed: int, allowed: int) -> None:
    rng = np.random.default_rng(seed)
    vocab = 12
    pieces = [list(rng.integers(0, vocab, int(rng.integers(2, 7)))) for _ in range(3)]
    prefix = [int(t) for _ in range(6) for t in pieces[int(rng.integers(0, 3))] + [int(rng.integers(0, vocab))]]
    breakers = {int(rng.integers(0, vocab))} if seed % 2 else set()
    rows = rng.normal(size=(1, vocab)).astype(np.float32)
    context = ProcessContext(np.array(prefix[:5]), np.array(prefix[5:]), [[]])
    dry = Dry(0.8, 1.75, allowed, 0, breakers=(), breaker_ids=sorted(breakers))
    got = dry(rows.copy(), context)
    want = rows[0] - _dry_reference(prefix, vocab, 0.8, 1.75, allowed, breakers)
    np.testing.assert_allclose(got[0], want, rtol=1e-6)


def test_dry_sees_each_row_with_its_own_drafted_path_and_only_its_window() -> None:
    prompt = np.array([4, 5, 6, 7, 9, 4, 5])
    rows = np.zeros((3, 12), np.float32)
    context = ProcessContext(prompt, np.array([6], np.int64), [[], [7], [7, 1]])
    dry = Dry(1.0, 2.0, 2, 0, breakers=(), breaker_ids=())
    out = dry(rows.copy(), context)
    # row 0 ends 4 5 6 (matched 3 long at the start): 7 is penalised 2^(3-2); row 1 ends 4 5 6 7: 9 gets 2^(4-2)
    assert out[0, 7] == -2.0 and out[1, 9] == -4.0
    assert (out[2] == 0).all()  # ends with 1: never seen before
    windowed = Dry(1.0, 2.0, 2, 4, breakers=(), breaker_ids=())(rows.copy(), context)
    assert windowed[0, 7] == 0.0  # the last 4 tokens (7 9 4 5 6 -> 9 4 5 6) hold no earlier 4 5 6


def test_a_breaker_ends_the_repetition() -> None:
    prefix = np.array([3, 1, 2, 8, 3, 1, 2])
    rows = np.zeros((1, 10), np.float32)
    context = ProcessContext(prefix, np.array([], np.int64), [[]])
    free = Dry(1.0, 2.0, 2, 0, breakers=(), breaker_ids=())(rows.copy(), context)
    broken = Dry(1.0, 2.0, 2, 0, breakers=(), breaker_ids=[1])(rows.copy(), context)
    assert free[0, 8] == -2.0  # 3 1 2 repeated: 8 would make it 4 long
    assert broken[0, 8] == 0.0  # only "2" counts: 1 is a breaker; 1 < allowed_length


def test_dry_caps_the_penalty_instead_of_overflowing() -> None:
    prefix = np.array([1, 2] * 400)
    rows = np.zeros((1, 4), np.float32)
    out = Dry(0.8, 1.75, 2, 0, breakers=(), breaker_ids=())(rows, ProcessContext(prefix, np.array([], np.int64), [[]]))
    assert np.isfinite(out).all() and out[0, 1] < -1e37


def test_text_breakers_resolve_through_the_tokenizer(tokenizer: Any) -> None:
    ids = breaker_ids(tokenizer, ["\n"])
    assert ids and all("\n" in tokenizer.decode([t]) for t in ids)
    assert not any("\n" in tokenizer.decode([t]) for t in range(tokenizer.vocab_size) if t not in ids)


def test_text_breakers_without_a_tokenizer_name_the_fix() -> None:
    context = ProcessContext(np.array([1, 2, 1]), np.array([], np.int64), [[]])
    with pytest.raises(ConfigError, match="breaker_ids"):
        Dry(0.8, 1.75, 2, 0)(np.zeros((1, 4), np.float32), context)


def test_dry_runs_in_a_generation_with_its_default_breakers(tiny_model: Any, registry: PluginRegistry) -> None:
    generator = Generator({"target": str(tiny_model)}, "greedy", registry=registry, processors="dry=0.8")
    result = generator.generate("def fib(n):", max_new_tokens=12)
    assert result.stats.new_tokens == 12


# -- refusals ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chain", "message"),
    [
        ([{"name": "xtc", "threshold": 0.7}], "threshold=0.7"),
        ([{"name": "xtc", "probability": 1.5}], "probability=1.5"),
        ([{"name": "dynamic_temperature", "temperature": 0.5, "delta": 0.5}], "delta=0.5"),
        ([{"name": "dry", "base": 1.0}], "base=1.0"),
        ([{"name": "top_h", "top_h": 0.0}], "top_h=0.0"),
        ([{"name": "sequence_bias", "biases": "5 6"}], "TOKENS:BIAS"),
    ],
)
def test_bad_values_raise_before_generation(chain: Any, message: str, build: Any) -> None:
    with pytest.raises(ConfigError, match=message):
        build(chain)
