"""examples/c_controller/best_of_n.c, built with the example Makefile, against Python references: n completions,
completion i starting with the i-th most likely first token and continuing as decoctl's greedy does from it, scored
by mean log-probability and ranked best first; through the Generator and the CLI."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import (
    AbiError,
    ConfigError,
    ControllerSpec,
    GenerationError,
    GenerationResult,
    Generator,
    ProcessContext,
    ProcessorSpec,
    hookimpl,
)
from decoctl.abi import library_controller_spec
from decoctl.cli import main
from decoctl.host import Host
from decoctl.plugins import PluginRegistry
from decoctl.specs import Option
from decoctl.testing import EOS_TOKEN_ID, reference_logits

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "c_controller"
PROMPT = "def fib(n):"


@pytest.fixture(scope="module")
def best_of_n(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """libbest_of_n.so as the example Makefile builds it (gcc, -Wall -Wextra)."""
    folder = tmp_path_factory.mktemp("best-of-n")
    done = subprocess.run(
        ["make", "-C", str(EXAMPLES), f"BUILD={folder}", "CC=gcc", f"{folder}/libbest_of_n.so"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    return folder / "libbest_of_n.so"


def log_softmax(row: np.ndarray) -> np.ndarray:
    scaled = np.asarray(row, np.float64)
    top = scaled.max()
    return scaled - (top + np.log(np.exp(scaled - top).sum()))


# -- the Python reference: decoctl's greedy from a forced first token ------------------------------------------------


class ForcedThenGreedy:
    """Commits the option ``first``, then the argmax of the processed logits, one forward per token; its stats carry
    the mean log-probability of its tokens under the processed rows they were picked from."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.first = int(options["first"])
        self.logprobs: list[float] = []

    def start(self, host: Host) -> None:
        del host

    def step(self, host: Host) -> None:
        target = host.target
        row = np.asarray(host.process(target.logits()[-1:])[0])
        token = int(np.argmax(row)) if host.output_tokens else self.first
        if host.commit((token,)):
            self.logprobs.append(float(log_softmax(row)[token]))
        if not host.done:
            target.forward((token,))

    def stats(self) -> Mapping[str, Any]:
        return {"score": float(np.mean(self.logprobs))}


class ForcedPlugin:
    @hookimpl
    def decoctl_controllers(self) -> list[ControllerSpec]:
        return [
            ControllerSpec(
                name="forced_greedy",
                summary="greedy after a forced first token",
                factory=ForcedThenGreedy,
                options=(Option(name="first", type="int", default=0, minimum=0),),
            )
        ]


class EndsEarly:
    """Favours EOS once a completion holds 1 + (its first token % 5) tokens: completions end at their own lengths.
    Stateless, so several outputs may share it; nothing changes before the first token."""

    stateless = True

    def __init__(self, options: Mapping[str, Any]) -> None:
        del options

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for row in range(len(rows)):
            generated = context.generated(row)
            if len(generated) and len(generated) == 1 + int(generated[0]) % 5:
                rows[row, EOS_TOKEN_ID] += 1000.0
        return rows


class RemembersEnds(EndsEarly):
    """EndsEarly declaring state of its own: several outputs cannot share it."""

    stateless = False

    def commit(self, tokens: Any) -> None:
        del tokens

    def reset(self, prompt: np.ndarray) -> None:
        del prompt


class EndsPlugin:
    @hookimpl
    def decoctl_logits_processors(self) -> list[ProcessorSpec]:
        return [
            ProcessorSpec(name="ends_early", summary="EOS after 1 + first % 5 tokens", factory=EndsEarly),
            ProcessorSpec(name="remembers_ends", summary="ends_early with state", factory=RemembersEnds),
        ]


def plugins() -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    registry.register(ForcedPlugin(), "forced")
    registry.register(EndsPlugin(), "ends")
    return registry


def generate(model: Path, controller: str, registry: PluginRegistry, n: int, **options: Any) -> GenerationResult:
    generator = Generator({"target": model}, controller, registry=registry, threads=1, **options)
    return generator.generate(PROMPT, max_new_tokens=n)


def prompt_ids(model: Path) -> list[int]:
    return list(Generator({"target": model}, "greedy", threads=1).tokenizer.encode(PROMPT))


def first_tokens(model: Path, rows: int) -> list[int]:
    """The ``rows`` most likely first tokens after the prompt (of equal logits the lower id first), from a
    from-scratch run of the model (EndsEarly, the one processor the tests use, leaves the first token alone)."""
    row = reference_logits(model, prompt_ids(model))[-1]
    return [int(t) for t in np.argsort(-row, kind="stable")[:rows]]


def check_against_the_references(
    result: GenerationResult, model: Path, registry: PluginRegistry, rows: int, new: int, processors: str | None
) -> None:
    """Every completion is the forced greedy of one of the top ``rows`` first tokens, with that run's score; the
    completions come ranked by score, best first."""
    firsts = first_tokens(model, rows)
    assert len(result.completions) == rows
    assert sorted(c.tokens[0] for c in result.completions) == sorted(firsts)
    references = [
        generate(model, "forced_greedy", registry, new, options={"first": first}, processors=processors)
        for first in firsts
    ]
    by_first = {c.tokens[0]: c for c in result.completions}
    for first, reference in zip(firsts, references, strict=True):
        got = by_first[first]
        assert got.tokens == reference.tokens
        assert got.text == reference.text
        assert got.stop_reason == reference.stats.stop_reason
        assert got.score == pytest.approx(reference.stats.controller["score"], rel=1e-5, abs=1e-6)
    scores = [c.score for c in result.completions]
    assert None not in scores
    assert scores == sorted(scores, reverse=True)
    expected_order = sorted(range(rows), key=lambda i: -references[i].stats.controller["score"])
    assert [c.tokens[0] for c in result.completions] == [firsts[i] for i in expected_order]
    assert (result.tokens, result.text) == (result.completions[0].tokens, result.completions[0].text)


@pytest.mark.parametrize("rows", [1, 3])
def test_best_of_n_is_greedy_from_each_of_the_n_most_likely_first_tokens_ranked_by_mean_logprob(
    rows: int, genai_model: Path, best_of_n: Path
) -> None:
    registry = plugins()
    result = generate(genai_model, str(best_of_n), registry, 12, options={"n": rows})
    check_against_the_references(result, genai_model, registry, rows, 12, None)
    assert all(len(c.tokens) == 12 or c.stop_reason == "eos" for c in result.completions)
    ids = prompt_ids(genai_model)
    for completion in result.completions:  # the score, recomputed from scratch: mean log-softmax of each token
        logits = reference_logits(genai_model, [*ids, *completion.tokens])[len(ids) - 1 : -1]
        recomputed = np.mean([log_softmax(row)[t] for row, t in zip(logits, completion.tokens, strict=True)])
        assert completion.score == pytest.approx(recomputed, abs=1e-4)
    stats = result.stats.controller
    assert stats["n"] == rows
    # one step_rows a token after the first (none after the last), over every row still going
    assert stats["batched_steps"] == max(len(c.tokens) for c in result.completions) - 1
    assert stats["batched_rows"] == sum(len(c.tokens) - 1 for c in result.completions)


def test_completions_that_end_at_different_lengths_leave_the_batch_and_the_chain_runs_per_row(
    genai_model: Path, best_of_n: Path
) -> None:
    registry = plugins()
    rows = 4
    result = generate(genai_model, str(best_of_n), registry, 16, options={"n": rows}, processors="ends_early")
    check_against_the_references(result, genai_model, registry, rows, 16, "ends_early")
    assert {c.stop_reason for c in result.completions} == {"eos"}
    assert len({len(c.tokens) for c in result.completions}) > 1  # ragged: rows left the batch at their own steps
    assert [c.tokens[0] for c in result.completions] != first_tokens(genai_model, rows)  # ranking moved some
    for completion in result.completions:
        assert len(completion.tokens) == 2 + completion.tokens[0] % 5
    assert result.stats.controller["batched_steps"] == max(len(c.tokens) for c in result.completions) - 1
    assert result.stats.controller["batched_rows"] == sum(len(c.tokens) - 1 for c in result.completions)


def test_best_of_n_in_debug_mode_reads_every_host_row_within_its_lifetime(genai_model: Path, best_of_n: Path) -> None:
    registry = plugins()
    plain = generate(genai_model, str(best_of_n), registry, 10, options={"n": 3}, processors="ends_early")
    debug = generate(genai_model, str(best_of_n), registry, 10, options={"n": 3}, processors="ends_early", debug=True)
    assert [(c.tokens, c.score) for c in debug.completions] == [(c.tokens, c.score) for c in plain.completions]


def test_rows_for_sizes_the_rows_from_the_option_n(best_of_n: Path) -> None:
    spec = library_controller_spec(best_of_n)
    assert spec.name == "best-of-n"  # names are normalised (decoctl.specs)
    assert spec.rows({"n": 3}) == 3
    assert spec.rows({"n": 7}) == 7
    assert [(o.name, o.default, o.minimum, o.maximum) for o in spec.options] == [("n", 3, 1, 64)]
    # the host checks the schema before it asks; asked directly, rows_for refuses and says why in last_error(NULL)
    with pytest.raises(AbiError, match=r"rows_for returned status -1: best_of_n: option n must be from 1 to 64"):
        spec.rows({"n": 65})


def test_a_stateful_chain_is_refused_clearly(genai_model: Path, best_of_n: Path) -> None:
    registry = plugins()
    with pytest.raises(GenerationError) as caught:
        generate(genai_model, str(best_of_n), registry, 4, options={"n": 2}, processors="remembers_ends")
    assert isinstance(caught.value.__cause__, ConfigError)
    assert "holds state per sequence (remembers-ends)" in str(caught.value.__cause__)


def test_a_concat_cache_model_steps_its_rows_one_run_per_row(optimum_model: Path, best_of_n: Path) -> None:
    registry = plugins()
    result = generate(optimum_model, str(best_of_n), registry, 8, options={"n": 3})
    check_against_the_references(result, optimum_model, registry, 3, 8, None)
    assert result.stats.trace["rows"] == "one Run per row (concatenated KV cache)"
    alone = generate(optimum_model, str(best_of_n), registry, 8, options={"n": 1})  # n=1 is greedy on any model
    assert alone.tokens == generate(optimum_model, "greedy", registry, 8).tokens


def test_cli_prints_the_numbered_completions(
    genai_model: Path, best_of_n: Path, registry: PluginRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = "def parse(line):"
    expected = Generator(
        {"target": genai_model}, str(best_of_n), registry=registry, threads=1, options={"n": 3}
    ).generate(prompt, max_new_tokens=8)
    capsys.readouterr()
    args = ["generate", prompt, "-m", str(genai_model), "-c", str(best_of_n), "-o", "n=3", "-n", "8"]
    assert main([*args, "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    first, second, third = expected.completions
    assert out == (
        f"{first.text}\n"
        f"--- completion 2 (score {second.score:.3f}) ---\n{second.text}\n"
        f"--- completion 3 (score {third.score:.3f}) ---\n{third.text}\n"
    )
    assert "controller: best-of-n" in err
    assert '-- best-of-n: {"n": 3, "batched_steps": 7, "batched_rows": 21}' in err
