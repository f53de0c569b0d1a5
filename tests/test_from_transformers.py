"""transformers' logits processors in a decoctl chain (decoctl.from_transformers): the same numbers as transformers on
the same inputs, the tokens of transformers' own greedy loop, and every controller's tokens with them in the chain."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hf = pytest.importorskip("transformers.generation.logits_process")

from decoctl import ConfigError, Generator, ProcessContext, ProcessorChain, from_transformers  # noqa: E402
from decoctl.host import Sequence as Seq  # noqa: E402
from decoctl.model import load_model  # noqa: E402
from decoctl.plugins import PluginRegistry  # noqa: E402
from decoctl.testing import EOS_TOKEN_ID, build_eagle_head, build_genai_model  # noqa: E402

PROMPTS = ["def fib(n):", "x = [i * i for i in range(10)]\nx = [i * i for i in range(10)]\nx = ["]
NEW = 24
VOCAB = 96

#: transformers processors, each made for a prompt of the given length
PROCESSORS: dict[str, Callable[[int], Any]] = {
    "repetition_penalty": lambda p: hf.RepetitionPenaltyLogitsProcessor(1.4),
    "no_repeat_ngram": lambda p: hf.NoRepeatNGramLogitsProcessor(2),
    "min_length": lambda p: hf.MinLengthLogitsProcessor(p + 6, [EOS_TOKEN_ID]),
    "min_new_tokens": lambda p: hf.MinNewTokensLengthLogitsProcessor(p, 6, [EOS_TOKEN_ID]),
    "no_bad_words": lambda p: hf.NoBadWordsLogitsProcessor([[11, 12], [13]], [EOS_TOKEN_ID]),
    "sequence_bias": lambda p: hf.SequenceBiasLogitsProcessor([[[4, 5], -3.0], [[6], 2.5]]),
    "suppress_tokens": lambda p: hf.SuppressTokensLogitsProcessor([3, 8], device="cpu"),
    "temperature": lambda p: hf.TemperatureLogitsWarper(0.7),
    "top_k": lambda p: hf.TopKLogitsWarper(5),
    "top_p": lambda p: hf.TopPLogitsWarper(0.8),
}


# -- the same numbers as transformers on the same inputs ----------------------------------------------------------
def random_case(seed: int) -> tuple[np.ndarray, ProcessContext]:
    """Five rows whose prefixes differ (a prompt, a committed output, drafted paths of lengths 0..2 and a branch),
    with repeated tokens so that the penalties and n-gram rules act."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(3, 16, 6).astype(np.int64)
    output = rng.integers(3, 16, 4).astype(np.int64)
    paths = [(), (int(output[-1]),), (int(output[-1]), 5), (4,), (12, 11)]
    rows = (rng.standard_normal((len(paths), VOCAB)) * 3).astype(np.float32)
    return rows, ProcessContext(prompt, output, paths, eos_token_ids=frozenset({EOS_TOKEN_ID}))


@pytest.mark.parametrize("name", list(PROCESSORS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_adapter_gives_transformers_numbers_on_each_rows_prefix(name: str, seed: int) -> None:
    rows, context = random_case(seed)
    processor = PROCESSORS[name](len(context.prompt))
    expected = np.concatenate(
        [
            processor(torch.from_numpy(context.prefix(i)[None]), torch.from_numpy(rows[i : i + 1].copy())).numpy()
            for i in range(len(rows))
        ]
    )
    got = ProcessorChain([from_transformers(processor)])(rows, context)
    np.testing.assert_array_equal(got, expected)
    assert not np.array_equal(got, rows)  # the processor acted on these rows


def test_the_adapter_leaves_the_callers_rows_alone() -> None:
    rows, context = random_case(0)
    before = rows.copy()
    ProcessorChain([from_transformers(hf.TemperatureLogitsWarper(0.5))])(rows, context)
    np.testing.assert_array_equal(rows, before)


# -- transformers' greedy loop ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("hf-target"), seed=3, hidden_states=True, tree_inputs=True)


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("hf-draft"), seed=4, num_layers=1, hidden=32, num_heads=2)


@pytest.fixture(scope="module")
def head(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_eagle_head(
        tmp_path_factory.mktemp("hf-eagle"), target, copy_layer=0, feature_mix=0.1, tree_inputs=True
    )


@pytest.fixture
def plugins() -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    for distribution in ("decoctl_speculative", "decoctl_lookahead", "decoctl_eagle"):
        registry.register(pytest.importorskip(f"{distribution}.plugin"), distribution)
    return registry


def transformers_greedy(model: Path, prompt: str, processors: Sequence[Any]) -> tuple[int, ...]:
    """What transformers' greedy search does, over decoctl's model: input_ids grow by each chosen token, every
    processor runs on (input_ids, scores) in turn, the argmax is taken, EOS ends it."""
    sequence = Seq("target", load_model(model, threads=1))
    ids = sequence.model.tokenizer.encode(prompt)
    row = np.array(sequence.prefill(ids)[0])
    generated: list[int] = []
    while len(generated) < NEW:
        input_ids = torch.tensor([ids + generated])
        scores = torch.from_numpy(row[None].copy())
        for processor in processors:
            scores = processor(input_ids, scores)
        generated.append(int(scores.argmax(dim=-1)))
        if generated[-1] == EOS_TOKEN_ID:
            break
        row = np.array(sequence.forward([generated[-1]])[0])
    return tuple(generated)


def penalties(prompt_length: int) -> list[Any]:
    return [
        hf.RepetitionPenaltyLogitsProcessor(1.5),
        hf.NoRepeatNGramLogitsProcessor(2),
        hf.MinNewTokensLengthLogitsProcessor(prompt_length, 4, [EOS_TOKEN_ID]),
    ]


def adapted(target: Path, prompt: str) -> list[Any]:
    length = len(load_model(target, threads=1).tokenizer.encode(prompt))
    return [from_transformers(p) for p in penalties(length)]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_with_adapted_processors_is_transformers_greedy_loop(
    prompt: str, target: Path, registry: PluginRegistry
) -> None:
    expected = transformers_greedy(target, prompt, penalties(len(load_model(target).tokenizer.encode(prompt))))
    generator = Generator({"target": target}, "greedy", processors=adapted(target, prompt), registry=registry)
    got = generator.generate(prompt, max_new_tokens=NEW).tokens
    assert got == expected
    plain = Generator({"target": target}, "greedy", registry=registry).generate(prompt, max_new_tokens=NEW).tokens
    assert got != plain  # the processors changed what was chosen


# -- under every controller ---------------------------------------------------------------------------------------
def path_dependent(target: Path, prompt: str) -> list[Any]:
    """Processors whose effect on a row depends on the drafted tokens before it (its prefix and its length), mild
    enough that the drafters' guesses are still accepted."""
    length = len(load_model(target, threads=1).tokenizer.encode(prompt))
    return [
        from_transformers(hf.RepetitionPenaltyLogitsProcessor(1.2)),
        from_transformers(hf.MinNewTokensLengthLogitsProcessor(length, 6, [EOS_TOKEN_ID])),
    ]


#: greedy-verifying controllers: (name, options, roles beyond the target, whether its drafts get accepted here)
GREEDY_CONTROLLERS = [
    ("speculative", {"drafter": "prompt-lookup", "k": 4, "adaptive": False}, (), False),
    ("speculative", {"drafter": "draft-model", "k": 3, "adaptive": False}, ("draft",), True),
    ("lookahead", {"window": 3, "ngram": 3, "guesses": 2, "adaptive": False}, (), True),
    ("eagle", {"drafting": "chain", "k": 3, "adaptive": False}, ("eagle",), True),
    ("eagle", {"drafting": "tree", "depth": 3, "topk": 2, "nodes": 6}, ("eagle",), True),
    ("beam", {"num_beams": 1}, (), False),
]


def _id(case: tuple[Any, ...]) -> str:
    return case[0] + "".join(f"-{k}={v}" for k, v in case[1].items())


@pytest.mark.parametrize("case", GREEDY_CONTROLLERS, ids=_id)
def test_every_greedy_controller_with_adapted_processors_gives_greedys_tokens(
    case: tuple[str, dict[str, Any], tuple[str, ...], bool],
    target: Path,
    head: Path,
    plugins: PluginRegistry,
) -> None:
    name, options, extra, accepts = case
    # the target drafts for itself: its drafts are accepted unless the chain's processing of the verified rows differs
    roles = {"target": target, **{role: {"draft": target, "eagle": head}[role] for role in extra}}
    drafted = accepted = 0
    for prompt in PROMPTS:
        baseline = Generator({"target": target}, "greedy", processors=path_dependent(target, prompt), registry=plugins)
        expected = baseline.generate(prompt, max_new_tokens=NEW).tokens
        controller = Generator(
            roles, name, options=options, processors=path_dependent(target, prompt), registry=plugins
        )
        result = controller.generate(prompt, max_new_tokens=NEW)
        assert result.tokens == expected, prompt
        drafted += result.stats.controller.get("drafted", 0)
        accepted += len(result.tokens) - result.stats.forwards["target"]
    if name != "beam":
        assert drafted > 0  # rows were verified with drafted tokens in their prefixes
    if accepts:
        assert accepted > 0  # and some of those drafts were accepted


def numpy_top_k(rows: np.ndarray, context: ProcessContext) -> np.ndarray:
    """transformers' TopKLogitsWarper(5) in numpy (float32, the same comparison)."""
    kth = np.partition(rows, rows.shape[1] - 5, axis=1)[:, rows.shape[1] - 5, None]
    rows[rows < kth] = -np.inf
    return rows


def numpy_temperature(rows: np.ndarray, context: ProcessContext) -> np.ndarray:
    rows /= np.float32(0.7)
    return rows


#: sampling controllers: (name, options, roles beyond the target)
SAMPLING_CONTROLLERS = [
    ("sample", {}, ()),
    ("sample", {"n": 3}, ()),
    ("speculative", {"drafter": "draft-model", "sampling": True, "k": 3, "adaptive": False}, ("draft",)),
    ("lookahead", {"sampling": True, "adaptive": False}, ()),
    ("eagle", {"drafting": "chain", "sampling": True, "k": 3, "adaptive": False}, ("eagle",)),
]


@pytest.mark.parametrize("case", SAMPLING_CONTROLLERS, ids=_id)
def test_every_sampling_controller_draws_with_adapted_warpers_what_it_draws_with_numpy_twins(
    case: tuple[str, dict[str, Any], tuple[str, ...]],
    target: Path,
    draft: Path,
    head: Path,
    plugins: PluginRegistry,
) -> None:
    name, options, extra = case
    roles = {"target": target, **{role: {"draft": draft, "eagle": head}[role] for role in extra}}
    warpers = [from_transformers(hf.TemperatureLogitsWarper(0.7)), from_transformers(hf.TopKLogitsWarper(5))]
    with_hf = Generator(roles, name, options=options, processors=warpers, registry=plugins)
    twins = Generator(roles, name, options=options, processors=[numpy_temperature, numpy_top_k], registry=plugins)
    for seed in (1, 2):
        got = with_hf.generate(PROMPTS[0], max_new_tokens=NEW, seed=seed)
        assert [c.tokens for c in got.completions] == [
            c.tokens for c in twins.generate(PROMPTS[0], max_new_tokens=NEW, seed=seed).completions
        ]


def test_batched_prompts_with_adapted_processors_give_each_prompts_own_tokens(
    target: Path, registry: PluginRegistry
) -> None:
    processors = [
        from_transformers(hf.RepetitionPenaltyLogitsProcessor(1.5)),
        from_transformers(hf.TopKLogitsWarper(5)),
    ]
    generator = Generator({"target": target}, "greedy", processors=processors, registry=registry)
    prompts = [*PROMPTS, "import os", "class A:"]
    alone = [generator.generate(p, max_new_tokens=NEW).tokens for p in prompts]
    results = generator.generate_batch(prompts, batch_size=3, max_new_tokens=NEW)
    assert [r.tokens for r in results] == alone
    assert results[0].stats.trace["batched"].endswith("refilled as prompts finish")


# -- refusals -----------------------------------------------------------------------------------------------------
def test_beam_search_refuses_an_adapted_warper_as_transformers_leaves_warpers_out(registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match=r"sample-only processors \(TopKLogitsWarper \(transformers\)\)"):
        Generator(
            {"target": "/no/such/model"},
            "beam",
            processors=[from_transformers(hf.TopKLogitsWarper(5))],
            registry=registry,
        )


def test_an_adapted_processor_that_returns_a_wrong_shape_is_named(target: Path, registry: PluginRegistry) -> None:
    def cut(input_ids: Any, scores: Any) -> Any:
        return scores[:, :10]

    generator = Generator({"target": target}, "greedy", processors=[from_transformers(cut)], registry=registry)
    with pytest.raises(Exception, match=r"logits processor 'function \(transformers\)' returned \[1, 10\]"):
        generator.generate(PROMPTS[0], max_new_tokens=4)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (hf.TopKLogitsWarper, r"from_transformers\(TopKLogitsWarper\): that is a class"),
        (3, r"from_transformers\(int\): it is not callable"),
        (from_transformers(hf.TopKLogitsWarper(5)), "it is wrapped already"),
    ],
    ids=["class", "not callable", "wrapped twice"],
)
def test_what_is_no_transformers_processor_is_refused(given: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_transformers(given)
