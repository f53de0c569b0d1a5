"""The host counts every forward of a role by the tokens it fed, plain and tree forwards apart, with its time."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl import Generator
from decoctl.host import ForwardSizes, Sequence
from decoctl.model import load_model
from decoctl.testing import build_genai_model


@pytest.fixture(scope="module")
def tree_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("sizes-tree"), seed=3, tree_inputs=True)


def counts(sizes: ForwardSizes) -> tuple[dict[int, int], dict[int, int]]:
    return {n: c for n, (c, _) in sizes.chain.items()}, {n: c for n, (c, _) in sizes.tree.items()}


def test_every_forward_is_counted_by_its_size_and_kind(tree_model: Path) -> None:
    sequence = Sequence("target", load_model(tree_model, threads=1), max_length=64)
    sequence.prefill([5, 6, 7, 8, 9], chunk=2)  # chunks of 2, 2, 1
    sequence.forward((10,))  # the one-token decode path
    sequence.forward([11, 12, 13])
    sequence.forward([14, 15, 16], tree=[-1, 0, 0])
    sequence.keep([0, 1])
    sequence.forward([17])
    sizes = sequence.stats.sizes()
    assert counts(sizes) == ({2: 2, 1: 3, 3: 1}, {3: 1})
    seconds = sum(s for _, s in sizes.chain.values()) + sum(s for _, s in sizes.tree.values())
    assert seconds == pytest.approx(sequence.stats.seconds)
    assert sum(n * c for n, (c, _) in [*sizes.chain.items(), *sizes.tree.items()]) == sequence.stats.tokens_fed


def test_since_gives_the_forwards_after_a_snapshot() -> None:
    before = ForwardSizes(chain={1: (3, 0.3), 4: (1, 0.2)})
    now = ForwardSizes(chain={1: (5, 0.5), 4: (1, 0.2), 2: (1, 0.1)}, tree={7: (2, 0.4)})
    later = now.since(before)
    assert counts(later) == ({1: 2, 2: 1}, {7: 2})
    assert later.chain[1][1] == pytest.approx(0.2)


def test_a_generations_sizes_cover_decoding_only(tree_model: Path) -> None:
    generator = Generator({"target": tree_model}, "greedy")
    first = generator.generate("def f(x):", max_new_tokens=6)
    second = generator.generate("def f(x):", max_new_tokens=6)  # the same Sequence, its counters going on
    for result in (first, second):
        assert counts(result.stats.forward_sizes["target"]) == ({1: 5}, {})  # the prefill gave the first token
