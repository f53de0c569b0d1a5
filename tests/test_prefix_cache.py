"""The prefix cache: a prompt that starts with a kept prompt (or a prompt and its answer) copies that KV and prefills
only the rest, and every output equals the output without the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import ConfigError, Generator, load_model
from decoctl.generation._prefix_cache import BLOCK_TOKENS, PrefixCache
from decoctl.host import Sequence
from decoctl.plugins import PluginRegistry
from decoctl.testing import build_eagle_head, build_genai_model

#: a shared "system prompt" of 135 tokens with the test tokenizer: eight whole blocks and seven tokens
SYSTEM = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n" * 3
QUESTIONS = ("print(fib(10))", "x = fib(3)", "class A:\n    pass")
NEW_TOKENS = 20

GREEDY_CONTROLLERS = [
    ("greedy", {}, ()),
    ("speculative", {"drafter": "prompt-lookup"}, ()),
    ("speculative", {"drafter": "draft-model"}, ("draft",)),
    ("lookahead", {}, ()),
    ("eagle", {"drafting": "chain"}, ("eagle",)),
    ("eagle", {"drafting": "tree", "depth": 3, "topk": 2, "nodes": 6}, ("eagle",)),
    ("beam", {"num_beams": 3}, ()),
]
SAMPLING_CONTROLLERS = [
    ("sample", {}, ()),
    ("sample", {"n": 2}, ()),
    # adaptive off: the adaptive draft lengths and gates follow measured time, and the draws follow the drafts
    ("speculative", {"drafter": "prompt-lookup", "sampling": True, "adaptive": False}, ()),
    ("speculative", {"drafter": "draft-model", "sampling": True, "adaptive": False}, ("draft",)),
    ("lookahead", {"sampling": True, "adaptive": False}, ()),
    ("eagle", {"drafting": "tree", "sampling": True, "adaptive": False}, ("eagle",)),
]


def _id(case: tuple[str, dict[str, Any], tuple[str, ...]]) -> str:
    name, options, _ = case
    return name + "".join(f"-{k}={v}" for k, v in options.items())


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(
        tmp_path_factory.mktemp("prefix-target"), seed=3, hidden_states=True, tree_inputs=True, max_length=512
    )


@pytest.fixture(scope="module")
def head(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_eagle_head(
        tmp_path_factory.mktemp("prefix-eagle"), target, copy_layer=0, feature_mix=0.1, tree_inputs=True
    )


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Windowed layers of 32 positions with ring caches (capacity 96: the window and the rewind slack)."""
    return build_genai_model(
        tmp_path_factory.mktemp("prefix-ring"), seed=4, max_length=512, local_window_size=32, ring_cache=True
    )


@pytest.fixture
def plugins() -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    for distribution in ("decoctl_speculative", "decoctl_lookahead", "decoctl_eagle"):
        registry.register(pytest.importorskip(f"{distribution}.plugin"), distribution)
    return registry


def _outputs(generator: Generator, prompts: tuple[str, ...], seed: int | None = 0) -> list[Any]:
    results = [generator.generate(p, max_new_tokens=NEW_TOKENS, seed=seed) for p in prompts]
    return [[c.tokens for c in r.completions] if r.completions else r.tokens for r in results]


def _pair(
    case: tuple[str, dict[str, Any], tuple[str, ...]], models: dict[str, Path], registry: PluginRegistry
) -> tuple[Generator, Generator]:
    name, options, extra = case
    chosen = {"target": models["target"], **{role: models[role] for role in extra}}
    off = Generator(chosen, name, options=options, registry=registry, threads=1)
    on = Generator(chosen, name, options=options, registry=registry, threads=1, prefix_cache_mb=8)
    return off, on


@pytest.mark.parametrize("case", GREEDY_CONTROLLERS, ids=_id)
def test_every_greedy_controller_gives_the_same_tokens_with_the_cache(
    case: tuple[str, dict[str, Any], tuple[str, ...]],
    target: Path,
    genai_draft: Path,
    head: Path,
    plugins: PluginRegistry,
) -> None:
    off, on = _pair(case, {"target": target, "draft": genai_draft, "eagle": head}, plugins)
    prompts = tuple(SYSTEM + q for q in QUESTIONS)
    assert _outputs(on, prompts) == _outputs(off, prompts)
    assert on.prefix_cache is not None
    stats = on.prefix_cache.stats()
    # the second and third prompts copy the system prompt's whole blocks (it ends mid-block)
    assert stats.hits == 2 and stats.tokens_saved == 2 * 8 * BLOCK_TOKENS


@pytest.mark.parametrize("case", SAMPLING_CONTROLLERS, ids=_id)
def test_every_sampling_controller_draws_the_same_seeded_samples_with_the_cache(
    case: tuple[str, dict[str, Any], tuple[str, ...]],
    target: Path,
    genai_draft: Path,
    head: Path,
    plugins: PluginRegistry,
) -> None:
    off, on = _pair(case, {"target": target, "draft": genai_draft, "eagle": head}, plugins)
    prompts = tuple(SYSTEM + q for q in QUESTIONS)
    assert _outputs(on, prompts, seed=11) == _outputs(off, prompts, seed=11)
    assert on.prefix_cache is not None and on.prefix_cache.stats().hits == 2


def test_a_concatenated_cache_model_reuses_prefixes_exactly(optimum_model: Path, registry: PluginRegistry) -> None:
    off = Generator({"target": optimum_model}, registry=registry, threads=1)
    on = Generator({"target": off.models["target"]}, registry=registry, threads=1, prefix_cache_mb=8)
    prompts = tuple(SYSTEM + q for q in QUESTIONS)
    assert _outputs(on, prompts) == _outputs(off, prompts)
    assert on.prefix_cache is not None and on.prefix_cache.stats().tokens_saved == 2 * 8 * BLOCK_TOKENS


def test_a_ring_cache_model_reuses_the_prefix_up_to_the_rings_capacity(ring: Path, registry: PluginRegistry) -> None:
    off = Generator({"target": ring}, registry=registry, threads=1)
    on = Generator({"target": off.models["target"]}, registry=registry, threads=1, prefix_cache_mb=8)
    prompts = tuple(SYSTEM + q for q in QUESTIONS)  # 142 tokens and more: past the window of 32 and the ring's 96
    assert _outputs(on, prompts) == _outputs(off, prompts)
    assert on.prefix_cache is not None
    stats = on.prefix_cache.stats()
    # reuse stops at the ring's capacity (96 positions: six blocks), the prompts' first six blocks copied each time
    assert stats.hits == 2 and stats.tokens_saved == 2 * 96 and stats.blocks == 96 // BLOCK_TOKENS


def test_a_ring_cache_model_reuses_a_whole_prompt_inside_the_window(ring: Path, registry: PluginRegistry) -> None:
    off = Generator({"target": ring}, registry=registry, threads=1)
    on = Generator({"target": off.models["target"]}, registry=registry, threads=1, prefix_cache_mb=8)
    prompts = ("def f(x):\n    return x + 1\n\n", "def f(x):\n    return x + 1\n\nprint(f(2))")
    assert _outputs(on, prompts) == _outputs(off, prompts)
    assert on.prefix_cache is not None and on.prefix_cache.stats().hits == 1


def test_chat_turns_reuse_the_previous_turns_prompt_and_answer(target: Path, registry: PluginRegistry) -> None:
    off = Generator({"target": target}, registry=registry, threads=1)
    on = Generator({"target": off.models["target"]}, registry=registry, threads=1, prefix_cache_mb=8)
    template = target / "chat_template.jinja"
    template.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>")
    history: dict[str, list[dict[str, str]]] = {"off": [], "on": []}
    for turn in ("def fib(n):", "and fact(n)?", "now in one line"):
        for name, generator in (("off", off), ("on", on)):
            history[name].append({"role": "user", "content": turn})
            answer = generator.chat(history[name], template=template, max_new_tokens=NEW_TOKENS)
            history[name].append({"role": "assistant", "content": answer.text})
        assert history["on"] == history["off"]
    assert on.prefix_cache is not None
    stats = on.prefix_cache.stats()
    # turns two and three copy the earlier turns (their prompts and answers), whole blocks of them
    assert stats.hits == 2 and stats.tokens_saved > 2 * NEW_TOKENS


def test_a_prompt_that_is_all_cached_still_computes_its_last_token(target: Path, registry: PluginRegistry) -> None:
    off = Generator({"target": target}, registry=registry, threads=1)
    on = Generator({"target": off.models["target"]}, registry=registry, threads=1, prefix_cache_mb=8)
    prompt = "x = 1\n" * 16  # exactly five blocks
    assert len(off.tokenizer.encode(prompt)) == 5 * BLOCK_TOKENS
    assert _outputs(on, (prompt, prompt)) == _outputs(off, (prompt, prompt))
    assert on.prefix_cache is not None
    # the second run copies four blocks: the fifth holds the last token, whose logits are computed
    assert on.prefix_cache.stats().tokens_saved == 4 * BLOCK_TOKENS


def test_batched_prompts_reuse_prefixes_shared_across_the_file(target: Path, registry: PluginRegistry) -> None:
    off = Generator({"target": target}, registry=registry, threads=1)
    on = Generator({"target": off.models["target"]}, registry=registry, threads=1, prefix_cache_mb=8)
    prompts = [SYSTEM + q for q in QUESTIONS] * 2
    expected = [r.tokens for r in off.generate_batch(prompts, max_new_tokens=NEW_TOKENS, batch_size=2)]
    assert [r.tokens for r in on.generate_batch(prompts, max_new_tokens=NEW_TOKENS, batch_size=2)] == expected
    assert on.prefix_cache is not None and on.prefix_cache.stats().hits >= 4


def test_blocks_evicted_while_a_request_runs_leave_its_output_unchanged(target: Path, registry: PluginRegistry) -> None:
    model = load_model(target, threads=1)
    reference = Generator({"target": model}, registry=registry, threads=1)
    expected = reference.generate(SYSTEM + QUESTIONS[0], max_new_tokens=NEW_TOKENS).tokens
    cache = PrefixCache(model, 10 * _block_bytes(model))
    writer = Sequence("target", model, max_length=512)
    writer.prefill(np.asarray(reference.tokenizer.encode(SYSTEM), np.int64))
    cache.store(writer)
    ids = np.asarray(reference.tokenizer.encode(SYSTEM + QUESTIONS[0]), np.int64)
    reader = Sequence("target", model, max_length=512)
    copied = cache.restore(reader, ids)
    assert copied == 8 * BLOCK_TOKENS
    # another prompt fills the whole budget while the reader runs: every block it copied is evicted
    other = Sequence("target", model, max_length=512)
    other.prefill(np.asarray(reference.tokenizer.encode("import os\n" * 60), np.int64))
    cache.store(other)
    assert cache.stats().evicted >= 8 and cache.stats().bytes <= cache.budget
    logits = reader.prefill(ids[copied:])
    tokens = [int(np.argmax(logits[-1]))]
    while len(tokens) < NEW_TOKENS:
        tokens.append(int(np.argmax(reader.forward((tokens[-1],))[-1])))
    assert tuple(tokens) == tuple(expected)


def test_a_prefix_written_by_one_request_serves_the_next_only_once_whole(
    target: Path, registry: PluginRegistry
) -> None:
    model = load_model(target, threads=1)
    tokenizer = model.tokenizer
    cache = PrefixCache(model, 64 * _block_bytes(model))
    ids = np.asarray(tokenizer.encode(SYSTEM + QUESTIONS[0]), np.int64)
    writer = Sequence("target", model, max_length=512)
    writer.prefill(ids[:40], logits=False)  # the first request is half-way through its prompt
    cache.store(writer)
    arriving = Sequence("target", model, max_length=512)
    assert cache.restore(arriving, ids) == 2 * BLOCK_TOKENS  # the two blocks written so far, not the third's start
    logits = arriving.prefill(ids[2 * BLOCK_TOKENS :])
    whole = Sequence("target", model, max_length=512)
    np.testing.assert_array_equal(np.argmax(logits[-1]), np.argmax(whole.prefill(ids)[-1]))


def test_eviction_takes_the_least_recent_chains_tails_first(target: Path) -> None:
    model = load_model(target, threads=1)
    tokenizer = model.tokenizer
    cache = PrefixCache(model, 10 * _block_bytes(model))
    first, second = "a = 1\n" * 16, "b = 2\n" * 16  # five blocks each
    for text in (first, second):
        row = Sequence("target", model, max_length=512)
        row.prefill(np.asarray(tokenizer.encode(text), np.int64))
        cache.store(row)
    third = Sequence("target", model, max_length=512)
    third.prefill(np.asarray(tokenizer.encode("c = 3\n" * 8), np.int64))  # two blocks: the oldest chain's tail goes
    cache.store(third)
    assert cache.cached(np.asarray(tokenizer.encode(first + "x"), np.int64), 512) == 3 * BLOCK_TOKENS  # its head stays
    assert cache.cached(np.asarray(tokenizer.encode(second + "x"), np.int64), 512) == 5 * BLOCK_TOKENS
    assert cache.stats().blocks == 10 and cache.stats().evicted == 2


def _block_bytes(model: Any) -> int:
    return PrefixCache(model, 2**30).block_bytes


def test_a_budget_below_one_block_is_refused_at_start(target: Path, registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match=r"holds no block of model .*give at least 1 MB, or leave the cache off"):
        Generator({"target": target}, registry=registry, prefix_cache_mb=0.001)


def test_a_cache_for_one_model_refuses_another_models_rows(target: Path, ring: Path) -> None:
    cache = PrefixCache(load_model(target), 2**20)
    other = Sequence("target", load_model(ring), max_length=64)
    with pytest.raises(ConfigError, match="give each model its own cache"):
        cache.restore(other, np.arange(40, dtype=np.int64))


def test_generate_prompts_with_the_cache_prints_what_it_prints_without(target: Path, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": SYSTEM + q, "max_new_tokens": 8}) + "\n" for q in QUESTIONS))

    def texts(*flags: str) -> list[str]:
        command = [sys.executable, "-m", "decoctl.cli", "generate", "-m", str(target), "--prompts", str(prompts)]
        done = subprocess.run(
            [*command, "--stats", "none", "--batch-size", "1", *flags],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        return [json.loads(line)["text"] for line in done.stdout.splitlines()]

    assert texts("--prefix-cache-mb", "8") == texts()


def test_generate_refuses_a_budget_below_one_block_at_start(target: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "decoctl.cli", "generate", "-m", str(target), "--prefix-cache-mb", "0.0001", "x"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2 and "holds no block" in done.stderr and done.stdout == ""
