"""Parallel sampling (``sample -o n=N``, ``best_of=M``): N samples of one prompt on forked rows, one prefill.

The distribution test is a chi-square goodness of fit over the first two tokens of 2,500 samples (500 seeds x 5
samples) against the exact marginals computed from the target. Power: the same samples must refute a plausible bug,
sampling at temperature 1.0 instead of 1.3 (a total-variation difference of about 0.05-0.1), at p < 1e-3; at 2,500
samples the statistic rejects it every time, so a pass is evidence, not luck.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import ConfigError, GenerationError, Generator
from decoctl.cli import main
from decoctl.controllers import sample_from_logits
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model._batch_step import BatchStep
from decoctl.model._runner import Runner
from decoctl.plugins import PluginRegistry, hookimpl
from decoctl.specs import ProcessorSpec
from decoctl.testing import EOS_TOKEN_ID, reference_logits
from decoctl.testing._distributions import (
    NO_SECOND,
    PenaliseSeenPlugin,
    chi_square_p,
    exact_two_token_marginals,
    softmax,
)

PROMPT = "def fib(n):"
TEMPERATURE = 1.3
ALPHA = 1e-3


def samples(model: Path, registry: PluginRegistry, **options: Any) -> Generator:
    return Generator({"target": model}, "sample", options={"temperature": TEMPERATURE, **options}, registry=registry)


def test_one_sample_draws_what_a_plain_sampling_loop_draws(genai_model: Path, registry: PluginRegistry) -> None:
    result = samples(genai_model, registry, n=1).generate(PROMPT, max_new_tokens=12, seed=11)

    sequence = Sequence("target", load_model(genai_model, threads=1))
    rng = np.random.default_rng(11)
    row = sequence.prefill(sequence.model.tokenizer.encode(PROMPT))[0]
    expected = []
    for _ in range(12):
        token = sample_from_logits(np.array(row), rng, TEMPERATURE)
        expected.append(token)
        if token == EOS_TOKEN_ID:
            break
        row = sequence.forward([token])[0]
    assert list(result.tokens) == expected
    assert len(result.completions) == 1


def test_the_first_of_n_samples_is_the_one_sample_of_the_same_seed(genai_model: Path, registry: PluginRegistry) -> None:
    alone = samples(genai_model, registry).generate(PROMPT, max_new_tokens=12, seed=4)
    many = samples(genai_model, registry, n=4).generate(PROMPT, max_new_tokens=12, seed=4)

    assert len(many.completions) == 4
    assert many.completions[0].tokens == alone.tokens == many.tokens
    assert len({c.tokens for c in many.completions}) == 4  # each sample draws from its own stream


def test_n_samples_are_reproducible_for_a_seed(genai_model: Path, registry: PluginRegistry) -> None:
    generator = samples(genai_model, registry, n=3)
    first = [c.tokens for c in generator.generate(PROMPT, max_new_tokens=10, seed=7).completions]

    assert [c.tokens for c in generator.generate(PROMPT, max_new_tokens=10, seed=7).completions] == first
    assert [c.tokens for c in generator.generate(PROMPT, max_new_tokens=10, seed=8).completions] != first


def test_samples_follow_the_targets_distribution_on_the_first_two_tokens(
    genai_model: Path, registry: PluginRegistry
) -> None:
    generator = samples(genai_model, registry, n=5)
    first: dict[int, int] = {}
    second: dict[int, int] = {}
    for seed in range(500):
        for completion in generator.generate(PROMPT, max_new_tokens=2, seed=seed).completions:
            tokens = completion.tokens
            first[tokens[0]] = first.get(tokens[0], 0) + 1
            key = tokens[1] if len(tokens) > 1 else NO_SECOND
            second[key] = second.get(key, 0) + 1
    trials = 2500
    ids = generator.tokenizer.encode(PROMPT)

    p1, p2 = exact_two_token_marginals(genai_model, ids, temperature=TEMPERATURE, eos_token_ids=(EOS_TOKEN_ID,))
    assert chi_square_p(first, p1, trials) > ALPHA
    assert chi_square_p(second, p2, trials) > ALPHA
    wrong1, wrong2 = exact_two_token_marginals(genai_model, ids, temperature=1.0, eos_token_ids=(EOS_TOKEN_ID,))
    assert min(chi_square_p(first, wrong1, trials), chi_square_p(second, wrong2, trials)) < ALPHA


def test_the_samples_share_one_prefill_and_step_together(
    genai_model: Path, registry: PluginRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    generator = samples(genai_model, registry, n=4)
    generator.generate(PROMPT, max_new_tokens=3)  # warm: the rows are built
    fed: list[int] = []
    steps: list[int] = []
    run, step = Runner.run, BatchStep.run
    monkeypatch.setattr(Runner, "run", lambda self, ids, *a, **k: fed.append(len(ids)) or run(self, ids, *a, **k))
    monkeypatch.setattr(Runner, "step", lambda self, token: pytest.fail("a row stepped alone"))
    monkeypatch.setattr(
        BatchStep,
        "run",
        lambda self, tokens, lengths, positions=None: (
            steps.append(len(tokens)) or step(self, tokens, lengths, positions)
        ),
    )

    result = generator.generate(PROMPT, max_new_tokens=6)

    assert fed == [len(generator.tokenizer.encode(PROMPT))]  # the prompt, once: the other rows were forked
    assert steps == [4] * 5  # one Run a step over the four rows; the last step only commits
    assert all(len(c.tokens) == 6 for c in result.completions)


def mean_logprob(model: Path, prompt: list[int], tokens: tuple[int, ...]) -> float:
    rows = reference_logits(model, [*prompt, *tokens])[len(prompt) - 1 : -1]
    return float(np.mean([np.log(softmax(row, TEMPERATURE)[t]) for row, t in zip(rows, tokens, strict=True)]))


def test_each_sample_is_scored_by_the_mean_log_probability_of_its_tokens(
    genai_model: Path, registry: PluginRegistry
) -> None:
    generator = samples(genai_model, registry, n=3)
    result = generator.generate(PROMPT, max_new_tokens=8, seed=2)
    ids = generator.tokenizer.encode(PROMPT)

    for completion in result.completions:
        assert completion.score == pytest.approx(mean_logprob(genai_model, ids, completion.tokens), abs=1e-4)


def test_best_of_keeps_the_n_best_samples_by_mean_log_probability(genai_model: Path, registry: PluginRegistry) -> None:
    every = samples(genai_model, registry, n=6).generate(PROMPT, max_new_tokens=8, seed=3).completions
    best = samples(genai_model, registry, n=2, best_of=6).generate(PROMPT, max_new_tokens=8, seed=3)

    ranked = sorted(every, key=lambda c: -(c.score or 0.0))
    assert [c.tokens for c in best.completions] == [c.tokens for c in ranked[:2]]
    assert best.completions[0].score is not None and best.completions[1].score is not None
    assert best.completions[0].score >= best.completions[1].score
    assert best.tokens == best.completions[0].tokens
    assert best.stats.controller == {"samples": 6, "kept": 2, "tokens": sum(len(c.tokens) for c in every)}


def test_a_stop_string_ends_only_the_samples_whose_text_holds_it(genai_model: Path, registry: PluginRegistry) -> None:
    generator = samples(genai_model, registry, n=4)
    free = generator.generate(PROMPT, max_new_tokens=16, seed=5).completions
    texts = [c.text for c in free]
    stop = next(
        texts[1][i : i + 2] for i in range(len(texts[1]) - 1) if all(texts[1][i : i + 2] not in t for t in texts[2:])
    )

    stopped = generator.generate(PROMPT, max_new_tokens=16, seed=5, stop=[stop]).completions

    assert stopped[1].stop_reason == "stop_string"
    assert stopped[1].text == texts[1][: texts[1].index(stop)]
    for before, after in zip(free[2:], stopped[2:], strict=True):
        assert (after.tokens, after.stop_reason) == (before.tokens, "max_new_tokens")


class FavourEos:
    """A stateless test processor that adds 4 to the EOS logit, so that some samples end early."""

    stateless = True

    def __init__(self, options: dict[str, Any]) -> None:
        del options

    def __call__(self, rows: np.ndarray, context: Any) -> np.ndarray:
        rows[:, EOS_TOKEN_ID] += 4.0
        return rows

    def commit(self, tokens: Any) -> None:
        del tokens

    def reset(self, prompt: Any) -> None:
        del prompt


class FavourEosPlugin:
    @hookimpl
    def decoctl_logits_processors(self) -> list[ProcessorSpec]:
        return [ProcessorSpec(name="favour-eos", summary="test processor", factory=FavourEos)]


def test_eos_ends_each_sample_on_its_own(genai_model: Path, registry: PluginRegistry) -> None:
    registry.register(FavourEosPlugin(), "favour-eos")
    generator = Generator(
        {"target": genai_model}, "sample", options={"n": 8}, processors="favour-eos", registry=registry
    )

    completions = generator.generate(PROMPT, max_new_tokens=10, seed=1).completions

    reasons = {c.stop_reason for c in completions}
    assert reasons == {"eos", "max_new_tokens"}
    for completion in completions:
        ended = completion.stop_reason == "eos"
        assert (completion.tokens[-1] == EOS_TOKEN_ID) == ended
        assert EOS_TOKEN_ID not in completion.tokens[:-1]
        assert ended or len(completion.tokens) == 10


def test_best_of_below_n_is_refused(genai_model: Path, registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match="best_of=2 must be at least n=3"):
        samples(genai_model, registry, n=3, best_of=2)


def test_a_chain_with_state_per_sequence_is_refused_with_several_samples(
    genai_model: Path, registry: PluginRegistry
) -> None:
    registry.register(PenaliseSeenPlugin(), "test-processors")
    generator = Generator(
        {"target": genai_model}, "sample", options={"n": 2}, processors="penalise-seen", registry=registry
    )
    with pytest.raises(GenerationError, match="holds state per sequence"):
        generator.generate(PROMPT, max_new_tokens=4)


def test_several_samples_on_a_concatenated_cache_model_step_one_run_per_row(
    optimum_model: Path, genai_model: Path, registry: PluginRegistry
) -> None:
    alone = samples(optimum_model, registry).generate(PROMPT, max_new_tokens=12, seed=4)
    many = samples(optimum_model, registry, n=3).generate(PROMPT, max_new_tokens=12, seed=4)

    assert many.completions[0].tokens == alone.tokens
    assert len({c.tokens for c in many.completions}) == 3
    assert many.stats.trace["rows"] == "one Run per row (concatenated KV cache)"
    assert "rows" not in samples(genai_model, registry, n=3).generate(PROMPT, max_new_tokens=2).stats.trace


def test_the_command_line_prints_every_sample_numbered(
    genai_model: Path, registry: PluginRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["-c", "sample", "-o", "n=3", "-o", "temperature=1.3", "-n", "6", "--seed", "2", "--stats", "none"]
    assert main(["generate", PROMPT, "-m", str(genai_model), *flags]) == 0
    completions = samples(genai_model, registry, n=3).generate(PROMPT, max_new_tokens=6, seed=2).completions

    expected = completions[0].text + "\n"
    for number, completion in enumerate(completions[1:], 2):
        expected += f"--- completion {number} (score {completion.score:.3f}) ---\n{completion.text}\n"
    assert capsys.readouterr().out == expected
