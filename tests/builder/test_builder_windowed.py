"""onnxruntime-genai's default export of windowed models (Gemma 2 and gpt-oss, window 16): their sliding-window
layers keep window-sized ring caches (GroupQueryAttention's sliding_window_cache=1). They load, run past the window
and past evictions with transformers' greedy tokens, rewind exactly, and take trees after enable-tree; every
drafting strategy gives greedy's tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from builder_models import PROMPT, WINDOW, Export, greedy_continuation

from decoctl import Generator
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model._runner import dry_forward
from decoctl.model.graph import enable_tree
from decoctl.plugins import PluginRegistry

ATOL = 1e-4
#: long enough to run past the ring's capacity (window 16 + slack 64) and so through evictions
NEW_TOKENS = 96


@pytest.fixture(scope="module")
def tree_export(gemma2: Export, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return enable_tree(gemma2.onnx, tmp_path_factory.mktemp("gemma2-tree") / "model")


def test_the_windowed_layers_load_as_ring_caches_and_the_dry_forward_runs(gemma2: Export) -> None:
    model = load_model(gemma2.onnx, threads=1)

    assert [(r.layer, r.window) for r in model.capabilities.rings] == [(0, WINDOW), (2, WINDOW)]
    assert dry_forward(model).startswith("dry forward ok")


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss"])
def test_greedy_equals_transformers_past_the_window_and_its_evictions(
    name: str, request: pytest.FixtureRequest
) -> None:
    from transformers import AutoModelForCausalLM

    windowed: Export = request.getfixturevalue(name)
    sequence = Sequence("target", load_model(windowed.onnx, threads=1), max_length=256)
    assert sequence.model.capabilities.rings  # the windowed layers keep ring caches
    prompt = sequence.model.tokenizer.encode(PROMPT)
    expected = greedy_continuation(AutoModelForCausalLM.from_pretrained(windowed.hf).eval(), prompt, NEW_TOKENS)

    greedy = [int(np.argmax(sequence.forward(prompt)[-1]))]  # no EOS: every step runs, past every eviction
    while len(greedy) < NEW_TOKENS:
        greedy.append(int(np.argmax(sequence.forward(greedy[-1:])[-1])))

    assert greedy == expected


@pytest.mark.parametrize(
    ("controller", "options"),
    [("speculative", {"drafter": "prompt-lookup"}), ("lookahead", {}), ("beam", {"num_beams": 1})],
)
def test_drafting_strategies_give_greedys_tokens_on_ring_caches(
    tree_export: Path, controller: str, options: dict[str, object]
) -> None:
    registry = PluginRegistry()
    prompt = "def total(items):\n    total = 0\n    for item in items:\n        total += item\n    return total\n" * 2
    greedy = Generator({"target": tree_export}, "greedy", registry=registry, threads=1)
    drafting = Generator({"target": tree_export}, controller, options=options, registry=registry, threads=1)

    expected = greedy.generate(prompt, max_new_tokens=NEW_TOKENS)
    result = drafting.generate(prompt, max_new_tokens=NEW_TOKENS)

    assert list(result.tokens) == list(expected.tokens)


def test_rewinds_at_the_slacks_edge_are_exact_on_a_builder_export(gemma2: Export) -> None:
    slack = 3
    ring = Sequence("target", load_model(gemma2.onnx, threads=1, ring_slack=slack), max_length=128)
    plain = Sequence("target", load_model(gemma2.onnx, threads=1, ring_slack=slack), max_length=128)
    fed = [(7 * i) % 300 + 3 for i in range(60)]
    ring.forward(fed[:40])
    for start in range(40, 56, 4):
        ring.forward(fed[start : start + slack + 1])
        ring.rewind(start)  # back by slack + 1, the deepest rewind the slack guarantees
        logits = np.array(ring.forward(fed[start : start + 4]))
        plain.rewind(0)
        expected = np.array(plain.forward(fed[: start + 4]))[-4:]
        np.testing.assert_allclose(logits, expected, atol=ATOL)


def test_enable_tree_on_a_ring_export_writes_a_copy_whose_trees_are_exact(gemma2: Export, tree_export: Path) -> None:
    plain = Sequence("target", load_model(gemma2.onnx, threads=1))
    tree = Sequence("target", load_model(tree_export, threads=1))
    prefix = [(11 * i) % 300 + 3 for i in range(3 * WINDOW)]
    nodes, parents = [5, 6, 7, 8, 9, 10], [-1, 0, 0, 1, -1, 4]
    tree.forward(prefix)

    rows = np.array(tree.forward(nodes, tree=parents))

    for node in range(len(parents)):
        path = [node]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        plain.rewind(0)
        expected = plain.forward(prefix + [nodes[i] for i in path])[-1]
        np.testing.assert_allclose(rows[node], expected, atol=ATOL, err_msg=f"node {node}")
