"""decoctl's M-RoPE positions (decoctl.model._qwen_vl.MRopePositions) equal transformers' get_rope_index on prompts of
text and images of random grids, fed whole or in chunks of any size, and after a rewind, with every later token at
its index plus the rope delta."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from decoctl.errors import ConfigError
from decoctl.model._qwen_vl import MRopePositions

torch = pytest.importorskip("torch")
qwen = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")

IMAGE = 9
MERGE = 2


def transformers_positions(ids: list[int], grids: list[tuple[int, int, int]]) -> tuple[np.ndarray, int]:
    """get_rope_index's int64[3, n] positions and rope delta, called on a stand-in for the model (it reads only the
    config's merge size and tokens per second)."""
    model = qwen.Qwen2_5_VLModel
    owner = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=MERGE)))
    owner.config.vision_config.tokens_per_second = 2
    owner.get_vision_position_ids = lambda *a, **k: model.get_vision_position_ids(owner, *a, **k)
    input_ids = torch.tensor([ids])
    positions, deltas = model.get_rope_index(
        owner, input_ids, (input_ids == IMAGE).int(), image_grid_thw=torch.tensor(grids) if grids else None
    )
    return positions[:, 0].numpy(), int(deltas[0, 0])


def prompt(rng: np.random.Generator) -> tuple[list[int], list[tuple[int, int, int]]]:
    ids: list[int] = list(rng.integers(10, 50, rng.integers(1, 5)))
    grids = []
    for _ in range(rng.integers(1, 4)):
        grid = (1, 2 * int(rng.integers(1, 6)), 2 * int(rng.integers(1, 6)))
        grids.append(grid)
        ids += [IMAGE] * (grid[1] * grid[2] // MERGE**2)
        ids += list(rng.integers(10, 50, rng.integers(1, 5)))
    return [int(i) for i in ids], grids


def fed(positions: MRopePositions, ids: list[int], grids: list[tuple[int, int, int]], cuts: list[int]) -> np.ndarray:
    """Feed ``ids`` in pieces ending at ``cuts``, as a runner does: the positions of every piece."""
    out = np.zeros((3, len(ids)), np.int64)
    start = 0
    for end in [*cuts, len(ids)]:
        if end <= start:
            continue
        before = sum(1 for token in ids[:start] if token == IMAGE)
        positions.fill(np.array(ids[start:end]), start, before, tuple(grids), out[:, start:end])
        start = end
    return out


@pytest.mark.parametrize("seed", range(12))
def test_positions_equal_get_rope_index_whole_and_in_chunks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids, grids = prompt(rng)
    expected, delta = transformers_positions(ids, grids)
    cuts = sorted(int(c) for c in rng.integers(1, len(ids), 4))

    whole = fed(MRopePositions(256, IMAGE, MERGE), ids, grids, [])
    chunked = fed(MRopePositions(256, IMAGE, MERGE), ids, grids, cuts)

    np.testing.assert_array_equal(whole, expected)
    np.testing.assert_array_equal(chunked, expected)
    later = MRopePositions(256, IMAGE, MERGE)
    fed(later, ids, grids, [])
    assert later.next_position(len(ids)) == len(ids) + delta


def test_a_rewind_then_other_tokens_take_the_positions_the_index_gives() -> None:
    ids, grids = prompt(np.random.default_rng(3))
    positions = MRopePositions(256, IMAGE, MERGE)
    fed(positions, ids, grids, [])
    generated = np.zeros((3, 4), np.int64)
    images = ids.count(IMAGE)
    positions.fill(np.array([11, 12, 13, 14]), len(ids), images, tuple(grids), generated)

    again = np.zeros((3, 2), np.int64)
    positions.fill(np.array([20, 21]), len(ids) + 2, images, tuple(grids), again)

    np.testing.assert_array_equal(again, generated[:, 2:])


def test_a_text_token_inside_an_image_is_refused() -> None:
    positions = MRopePositions(64, IMAGE, MERGE)
    out = np.zeros((3, 4), np.int64)

    with pytest.raises(ConfigError, match=r"token 5 at index 2 falls inside image 0's image tokens"):
        positions.fill(np.array([3, IMAGE, 5, IMAGE]), 0, 0, ((1, 4, 4),), out)
