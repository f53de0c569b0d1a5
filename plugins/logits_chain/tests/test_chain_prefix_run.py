"""A PrefixRun (neighbouring penalties, no_repeat_ngram, min_new_tokens, min_length fused into one step) gives,
bit for bit, what its processors give one after another recounting every prefix, through whole generations:
random commits, drafted paths that are then rejected, resets (also with the same prompt object again)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from chain_cases import EOS
from decoctl_logits_chain.history import JointTally, TokenTally
from decoctl_logits_chain.penalties import PrefixRun

from decoctl import ProcessContext, ProcessorChain

PREFIXED: tuple[dict[str, Any], ...] = (
    {"name": "repetition_penalty", "penalty": 1.3},
    {"name": "repetition_penalty", "penalty": 0.7, "include_prompt": False},
    {"name": "presence_penalty", "penalty": 0.8},
    {"name": "presence_penalty", "penalty": -0.4, "include_prompt": True},
    {"name": "frequency_penalty", "penalty": 0.3},
    {"name": "frequency_penalty", "penalty": -0.55, "include_prompt": True},
    {"name": "frequency_penalty", "penalty": -1.5e38},  # overflows to -inf: -inf - -inf after a ban is NaN
    {"name": "no_repeat_ngram", "ngram_size": 1},
    {"name": "no_repeat_ngram", "ngram_size": 2},
    {"name": "no_repeat_ngram", "ngram_size": 3},
    {"name": "min_new_tokens", "min_new_tokens": 4},
    {"name": "min_length", "min_length": 15},
)
VOCAB = 24  # small, so tokens and n-grams repeat


def random_chains(count: int) -> list[list[dict[str, Any]]]:
    rng = np.random.default_rng(5)
    chains = []
    for _ in range(count):
        picked = rng.choice(len(PREFIXED), size=int(rng.integers(2, 6)), replace=False)
        chain = [PREFIXED[i] for i in picked]
        if rng.random() < 0.3:
            chain.append({"name": "top_k", "top_k": 5})  # a step after the run ends it
        chains.append(chain)
    return chains


def one_by_one(chain: ProcessorChain, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
    out = rows.copy()
    for processor in chain.processors:
        out = processor(out, context)
    return out


def random_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32[n, VOCAB] with the values whose handling differs most: -inf, +-0.0, ties, NaN-free."""
    rows = (rng.normal(size=(n, VOCAB)) * 2).astype(np.float32)
    rows[rng.random(rows.shape) < 0.1] = -np.inf
    rows[rng.random(rows.shape) < 0.05] = -0.0
    rows[rng.random(rows.shape) < 0.05] = 0.0
    return rows


def assert_bitwise_equal(fused: np.ndarray, plain: np.ndarray, message: str) -> None:
    np.testing.assert_array_equal(fused.view(np.int32), plain.view(np.int32), err_msg=message)


def generations(rng: np.random.Generator, chain: ProcessorChain) -> Any:
    """Two generations (the second with the first's prompt object again: a reset must still start over) and a
    third with a new prompt; yields (rows, context) for each call a controller would make."""
    first = rng.integers(0, VOCAB, int(rng.integers(1, 12)))
    for prompt in (first, first, rng.integers(0, VOCAB, 7)):
        chain.reset(prompt)
        output: list[int] = []
        for _ in range(30):
            if rng.random() < 0.5:
                paths: list[list[int]] = [[]]  # the next position only: greedy decoding, a sampler
            else:
                drafted = [int(t) for t in rng.integers(0, VOCAB, int(rng.integers(1, 4)))]
                paths = [drafted[:i] for i in range(len(drafted) + 1)]
            context = ProcessContext(prompt, np.asarray(output, np.int64), paths, eos_token_ids=frozenset(EOS))
            yield random_rows(rng, len(paths)), context
            accepted = [int(t) for t in rng.integers(0, VOCAB, int(rng.integers(1, 3)))]
            output += accepted
            chain.commit(accepted)


@pytest.mark.parametrize("tables", random_chains(60), ids=lambda t: ",".join(d["name"] for d in t))
def test_a_prefix_run_equals_its_processors_recounting_bit_for_bit(build: Any, tables: Any) -> None:
    fused, fresh = build(tables), build(tables)  # fresh is never reset: its processors recount every prefix
    assert isinstance(fused.steps[0], PrefixRun), fused.steps
    rng = np.random.default_rng(len(tables))
    with np.errstate(all="ignore"):  # the overflowing penalty's warnings
        for rows, context in generations(rng, fused):
            assert_bitwise_equal(fused(rows, context), one_by_one(fresh, rows, context), str(tables))


def test_the_fused_pass_runs_where_no_row_has_a_path(build: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    text = "repetition_penalty=1.1,presence_penalty=0.1,frequency_penalty=0.1,no_repeat_ngram=6,min_new_tokens=2"
    chain, reference = build(text), build(text)
    (run,) = chain.steps
    assert isinstance(run, PrefixRun)
    called: list[str] = []
    for member in run.members:
        member_call = type(member).__call__

        def spy(self: Any, rows: np.ndarray, context: Any, _call: Any = member_call) -> np.ndarray:
            if self in run.members:
                called.append(type(self).__name__)
            return _call(self, rows, context)

        monkeypatch.setattr(type(member), "__call__", spy)
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, VOCAB, 8)
    chain.reset(prompt)
    chain.commit([3, 4])
    for paths, one_by_one_expected in (([[]], False), ([[], [5]], True)):
        context = ProcessContext(prompt, np.array([3, 4], np.int64), paths, eos_token_ids=frozenset(EOS))
        rows = random_rows(rng, len(paths))
        assert_bitwise_equal(chain(rows, context), one_by_one(reference, rows, context), str(paths))
        assert bool(called) == one_by_one_expected, (paths, called)


def test_only_prefix_processors_fuse_and_commit_still_reaches_each(build: Any) -> None:
    chain = build("repetition_penalty=1.2,logit_bias=3:1,presence_penalty=0.5,no_repeat_ngram=2,top_k=5")
    kinds = [type(step).__name__ for step in chain.steps]
    assert kinds == ["RepetitionPenalty", "LogitBias", "PrefixRun", "TopK"]
    assert len(chain.processors) == 5


@pytest.mark.parametrize(
    "penalties",
    [
        [(JointTally.SCALE, 1.3, True), (JointTally.ONCE, 0.8, False), (JointTally.PER_COUNT, 0.3, False)],
        [(JointTally.PER_COUNT, -0.7, True), (JointTally.SCALE, 1.1, False), (JointTally.ONCE, -0.1, True)],
        [(JointTally.PER_COUNT, 1e-3, False)],
    ],
)
def test_joint_tally_operands_equal_a_recount_after_every_commit(penalties: Any) -> None:
    penalties = [(kind, np.float32(amount), include_prompt) for kind, amount, include_prompt in penalties]
    rng = np.random.default_rng(9)
    joint = JointTally(penalties)
    for _ in range(2):  # the second generation starts the record over
        prompt = rng.integers(0, 200, 40)
        joint.reset(prompt)
        output: list[int] = []
        for _ in range(60):
            assert joint.follows(ProcessContext(prompt, np.asarray(output, np.int64), [[]]))
            for i, (kind, amount, include_prompt) in enumerate(penalties):
                counted = np.concatenate((prompt, output)) if include_prompt else np.asarray(output, np.int64)
                tokens, counts = np.unique(counted, return_counts=True)
                expected = np.zeros(joint.ids.size, bool if kind == JointTally.SCALE else np.float32)
                where = [joint.position[int(t)] for t in tokens]
                if kind == JointTally.SCALE:
                    expected[where] = True
                elif kind == JointTally.ONCE:
                    expected[where] = amount
                else:
                    expected[where] = amount * counts.astype(np.float32)  # what FrequencyPenalty computes
                np.testing.assert_array_equal(joint.operand(i), expected)
            prompted = set(prompt.tolist()) if any(include for _, _, include in penalties) else set()
            assert sorted(joint.ids.tolist()) == sorted(set(output) | prompted)
            accepted = [int(t) for t in rng.integers(0, 200, int(rng.integers(1, 4)))]
            output += accepted
            joint.commit(accepted)


def test_a_lazy_tally_read_after_many_commits_catches_up_on_all_of_them() -> None:
    tally, prompt = TokenTally(include_prompt=True), np.array([1, 2, 2], np.int64)
    tally.lazy = True
    tally.reset(prompt)
    output = [2, 5, 5, 5, 7]
    for token in output:
        tally.commit([token])  # nobody reads the tally meanwhile (a fused run answers for it)
    context = ProcessContext(prompt, np.asarray(output, np.int64), [[]])
    assert tally.follows(context)
    tally.catch_up(context)
    ids, counts = tally.with_path([7, 9])
    assert dict(zip(ids.tolist(), counts.tolist(), strict=True)) == {1: 1, 2: 3, 5: 3, 7: 2, 9: 1}


TAILS = ("", "top_k=5,top_p=0.9,temperature=0.7", "temperature=1.3,greedy", "top_k=3")


def argmax_chains(count: int) -> list[tuple[list[dict[str, Any]], str]]:
    rng = np.random.default_rng(17)
    chains = []
    for _ in range(count):
        picked = rng.choice(len(PREFIXED), size=int(rng.integers(1, 5)), replace=False)
        chains.append(([PREFIXED[i] for i in picked], str(rng.choice(TAILS))))
    return chains


def contested_rows(rng: np.random.Generator, n: int, context: ProcessContext) -> np.ndarray:
    """Rows whose maximum is often a token of the row's prefix (or an EOS id), with a runner-up close enough that a
    penalty may move the argmax (sometimes one float32 step below it, sometimes tied with it)."""
    rows = random_rows(rng, n)
    for index, row in enumerate(rows):
        # a token of this row's prefix (its drafted path included) or an EOS id
        seen = np.concatenate((context.prefix(index), context.paths[index], EOS)).astype(np.int64)
        if rng.random() < 0.7:
            top, other = int(rng.choice(seen)), int(rng.integers(0, VOCAB))
            row[top] = np.float32(rng.normal() * 3 + 8)
            gap = rng.choice(["ulp", "tie", "small", "large"])
            if other != top:
                row[other] = {
                    "ulp": np.nextafter(row[top], np.float32(-np.inf)),
                    "tie": row[top],
                    "small": row[top] - np.float32(0.05),
                    "large": row[top] - np.float32(3.0),
                }[gap]
    return rows


@pytest.mark.parametrize("tables, tail", argmax_chains(50), ids=lambda t: str(t) if isinstance(t, str) else None)
def test_argmax_from_unprocessed_rows_equals_the_processed_rows_argmax(build: Any, tables: Any, tail: str) -> None:
    full = tables + ([{"name": part.split("=")[0], **_option(part)} for part in tail.split(",")] if tail else [])
    chain, fresh = build(full), build(full)
    kept: list[bool] = []
    decide = ProcessorChain._keeps_unprocessed

    def spy(self: Any, *args: Any) -> bool:
        kept.append(decide(self, *args))
        return kept[-1]

    chain._keeps_unprocessed = spy.__get__(chain)  # type: ignore[method-assign]
    rng = np.random.default_rng(len(full))
    with np.errstate(all="ignore"):
        for _, context in generations(rng, chain):
            rows = contested_rows(rng, len(context.paths), context)
            before = rows.copy()
            expected = fresh(rows, context).argmax(axis=1)  # fresh recounts every prefix
            np.testing.assert_array_equal(chain.argmax(rows, context), expected, err_msg=str(full))
            assert_bitwise_equal(rows, before, "argmax must leave the caller's rows as they are")
    if all(d.get("penalty", 1) >= (1 if d["name"] == "repetition_penalty" else 0) for d in tables):
        assert any(kept), "penalties that only lower logits: the argmax must often come from the unprocessed rows"


def _option(part: str) -> dict[str, Any]:
    name, _, value = part.partition("=")
    if not value:
        return {}
    number = float(value)
    key = {"top_k": "top_k", "top_p": "top_p", "temperature": "temperature"}[name]
    return {key: int(number) if name == "top_k" else number}


def test_temperature_bounds_round_like_float32() -> None:
    from decoctl_logits_chain.warpers import Temperature

    rng = np.random.default_rng(2)
    for _ in range(2000):
        temperature = Temperature(float(rng.uniform(0.05, 3)))
        top = np.float32(rng.normal() * 10)
        second = np.nextafter(top, np.float32(-np.inf)) if rng.random() < 0.5 else np.float32(top - rng.random())
        numpy_says = second / temperature.temperature < top / temperature.temperature
        assert (temperature.bound_argmax(float(top), float(second)) is not None) == bool(numpy_says)


@pytest.mark.parametrize(
    "table",
    [
        {"name": "repetition_penalty", "penalty": 1.3},
        {"name": "repetition_penalty", "penalty": 1.0001},
        {"name": "presence_penalty", "penalty": 0.37},
        {"name": "frequency_penalty", "penalty": 0.1},
        {"name": "frequency_penalty", "penalty": 0.3333},
    ],
    ids=str,
)
def test_a_penalty_on_one_logit_equals_the_penalty_on_a_row(build: Any, table: Any) -> None:
    """``lower`` (the argmax bound's arithmetic on one value) against the processor on rows, bit for bit."""
    (penalty,) = build([table]).processors
    rng = np.random.default_rng(4)
    values = np.concatenate(
        [(rng.normal(size=3000) * 10).astype(np.float32), np.float32([0.0, -0.0, 1e-30, -3e38, 3e38])]
    )
    for count in (1, 2, 3, 7, 100):
        prompt = np.zeros(0, np.int64)
        output = np.full(count, 5, np.int64)  # token 5, seen ``count`` times
        context = ProcessContext(prompt, output, [[]] * values.size)
        rows = np.zeros((values.size, VOCAB), np.float32)
        rows[:, 5] = values
        with np.errstate(over="ignore"):  # -3e38 * 1.3: -inf, as in float32
            expected = penalty(rows, context)[:, 5]
        got = np.array([penalty.lower(float(v), count) for v in values], np.float32)
        assert_bitwise_equal(got, expected, f"{table} count={count}")


@pytest.mark.parametrize("text", ["min_new_tokens=4", "min_length=7", "presence_penalty=0.2,min_new_tokens=4"])
def test_eos_held_back_by_row_each_row_counting_its_own_drafted_tokens(build: Any, text: str) -> None:
    chain, prompt = build(text + ",top_k=2"), np.array([7, 8, 9], np.int64)
    chain.reset(prompt)
    chain.commit([2, 3, 4])
    # row 0 follows 3 generated tokens (EOS held back), row 1 a drafted fourth (EOS allowed)
    context = ProcessContext(prompt, np.array([2, 3, 4], np.int64), [[], [6]], eos_token_ids=frozenset(EOS))
    rows = np.zeros((2, VOCAB), np.float32)
    rows[:, EOS[0]], rows[:, 11] = 5.0, 1.0
    np.testing.assert_array_equal(chain.argmax(rows, context), [11, EOS[0]])


def test_commit_and_reset_reach_every_processor_that_keeps_state(build: Any) -> None:
    from decoctl_logits_chain.base import Processor

    class Counting(Processor):
        def __init__(self) -> None:
            self.seen: list[int] = []

        def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
            return rows

        def commit(self, tokens: Any) -> None:
            self.seen += list(tokens)

    counting = Counting()
    chain = ProcessorChain((*build("top_k=5,min_new_tokens=2,no_repeat_ngram=2").processors, counting))
    assert not counting.stateless and chain.processors[0].stateless and chain.processors[1].stateless
    prompt = np.array([1, 2], np.int64)
    chain.reset(prompt)
    chain.commit([3, 4])
    assert counting.seen == [3, 4]
    assert chain.processors[2].table.follows(ProcessContext(prompt, np.array([3, 4], np.int64), [[]]))
