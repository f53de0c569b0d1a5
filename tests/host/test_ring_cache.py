"""Ring caches: windowed layers whose GroupQueryAttention keeps a window-sized buffer (``sliding_window_cache=1``).

Every model here has a twin built from the same weights whose windowed layers keep full-length caches (the graph
onnxruntime-genai's builder writes with ``windowed_kv_cache=false``); the oracle is onnxruntime's single pass over
the twin. A small ``ring_slack`` makes the kernel evict within a few tokens, so every test crosses evictions.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoctl import CapabilityError, Generator, SequenceError
from decoctl.errors import ModelLoadError
from decoctl.host import Rows, Sequence
from decoctl.model import load_model
from decoctl.model._kv_cache import describe_layers
from decoctl.model._ring_cache import resident_count
from decoctl.plugins import PluginRegistry
from decoctl.testing import build_eagle_head, build_genai_model, reference_logits

ATOL = 1e-4
WINDOW = 4
#: the windows the property tests run on: a window below the slack's size and one above it
WINDOWS = (WINDOW, 7)
SLACK = 2
EXAMPLES = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def build_pair(root: Path, *, tree_inputs: bool, window: int = WINDOW) -> tuple[Path, Path]:
    common = {"seed": 21, "num_layers": 3, "local_window_size": window, "tree_inputs": tree_inputs}
    ring = build_genai_model(root / "ring", ring_cache=True, **common)
    twin = build_genai_model(root / "twin", **common)
    return ring, twin


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A ring model (windows on layers 0 and 1, layer 2 full) and its full-length twin."""
    return build_pair(tmp_path_factory.mktemp("ring"), tree_inputs=False)


@pytest.fixture(scope="module")
def tree_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same with tree inputs (the loader widens the ring layers' kernel window by the slack)."""
    return build_pair(tmp_path_factory.mktemp("ring-tree"), tree_inputs=True)


@pytest.fixture(scope="module", params=WINDOWS)
def windowed_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """A ring model with tree inputs and its twin, per window of WINDOWS, and that window."""
    window = request.param
    return (*build_pair(tmp_path_factory.mktemp(f"ring-{window}"), tree_inputs=True, window=window), window)


def ring_sequence(folder: Path, max_length: int = 96) -> Sequence:
    return Sequence("target", load_model(folder, threads=1, ring_slack=SLACK), max_length=max_length)


def tokens(data: st.DataObject, vocab: int, low: int, high: int, label: str) -> list[int]:
    return data.draw(st.lists(st.integers(0, vocab - 1), min_size=low, max_size=high), label=label)


def test_the_windowed_layers_are_read_from_the_graph_as_ring_layers(pair: tuple[Path, Path]) -> None:
    model = load_model(pair[0], threads=1, ring_slack=SLACK)

    assert [(r.layer, r.window, r.kernel_window) for r in model.capabilities.rings] == [(0, 4, 4), (1, 4, 4)]
    assert load_model(pair[1], threads=1).capabilities.rings == ()


def test_a_ring_layers_memory_is_its_window_and_slack_whatever_the_length(pair: tuple[Path, Path]) -> None:
    sequence = ring_sequence(pair[0], max_length=256)
    kv = sequence._runner.kv

    shapes = [pair_[0].shape for pair_ in kv._buffers]  # type: ignore[attr-defined]

    assert shapes[0][2] == shapes[1][2] == WINDOW + SLACK
    assert shapes[2][2] == 256


@EXAMPLES
@given(data=st.data())
def test_forwards_and_rewinds_within_the_slack_give_the_twins_logits(
    pair: tuple[Path, Path], data: st.DataObject
) -> None:
    ring, twin = pair
    sequence = ring_sequence(ring)
    vocab = sequence.vocab_size
    fed = tokens(data, vocab, 1, 3 * WINDOW, "prompt")
    sequence.forward(fed)
    for _ in range(data.draw(st.integers(1, 8), label="rounds")):
        new = tokens(data, vocab, 1, SLACK + 2, "fed")

        logits = np.array(sequence.forward(new))

        fed += new
        np.testing.assert_allclose(logits, reference_logits(twin, fed)[-len(new) :], atol=ATOL)
        back = data.draw(st.integers(0, min(SLACK + 1, len(new))), label="rewound")
        sequence.rewind(len(fed) - back)
        fed = fed[: len(fed) - back]


@EXAMPLES
@given(data=st.data())
def test_a_rewind_is_exact_or_refused_by_name_never_wrong(
    windowed_pair: tuple[Path, Path, int], data: st.DataObject
) -> None:
    ring, twin, window = windowed_pair
    sequence = ring_sequence(ring)
    vocab = sequence.vocab_size
    fed = tokens(data, vocab, 1, 4 * window, "prompt")
    sequence.forward(fed)
    for _ in range(data.draw(st.integers(1, 6), label="rounds")):
        fed += tokens(data, vocab, 1, 2 * window, "fed")
        sequence.forward(fed[sequence.length :])
        target = data.draw(st.integers(0, len(fed)), label="rewind to")
        try:
            sequence.rewind(target)
        except SequenceError as exc:
            assert f"window {window}" in str(exc) and f"spill of {SLACK}" in str(exc)
            assert sequence.length == len(fed)  # refused: nothing changed
            continue
        fed = fed[:target]
    probe = tokens(data, vocab, 1, 3, "probe")
    np.testing.assert_allclose(
        np.array(sequence.forward(probe)), reference_logits(twin, fed + probe)[-len(probe) :], atol=ATOL
    )


def test_a_rewind_past_what_the_ring_holds_names_the_window_and_the_slack(pair: tuple[Path, Path]) -> None:
    sequence = ring_sequence(pair[0])
    sequence.forward(list(range(1, 31)))

    with pytest.raises(SequenceError, match=r"window 4.*spill of 2.*ring_slack"):
        sequence.rewind(10)

    assert sequence.length == 30
    np.testing.assert_allclose(
        np.array(sequence.forward([7])), reference_logits(pair[1], [*range(1, 31), 7])[-1:], atol=ATOL
    )


def test_a_rewind_to_the_start_is_always_possible(pair: tuple[Path, Path]) -> None:
    sequence = ring_sequence(pair[0])
    sequence.forward(list(range(1, 40)))

    sequence.rewind(0)

    np.testing.assert_allclose(np.array(sequence.forward([3, 4, 5])), reference_logits(pair[1], [3, 4, 5]), atol=ATOL)


def test_the_resident_count_follows_onnxruntimes_documented_layout() -> None:
    # capacity 6, window 4: eviction reclaims G = 3 positions at a time once 6 are held
    assert [resident_count(t, 6, 4) for t in range(1, 13)] == [1, 2, 3, 4, 5, 6, 4, 5, 6, 4, 5, 6]


@EXAMPLES
@given(data=st.data())
def test_every_tree_row_equals_a_plain_forward_of_its_path_on_ring_layers(
    windowed_pair: tuple[Path, Path, int], data: st.DataObject
) -> None:
    ring, twin, window = windowed_pair
    sequence = ring_sequence(ring)
    vocab = sequence.vocab_size
    prefix = tokens(data, vocab, 1, 5 * window, "prefix")
    size = data.draw(st.integers(1, SLACK + 1), label="tree size")
    parents = [data.draw(st.integers(-1, i - 1), label="parent") for i in range(size)]
    nodes = tokens(data, vocab, size, size, "tree tokens")
    sequence.forward(prefix)

    rows = np.array(sequence.forward(nodes, tree=parents))

    for leaf in set(range(size)) - set(parents):
        path = [leaf]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        expected = reference_logits(twin, prefix + [nodes[i] for i in path])[len(prefix) :]
        np.testing.assert_allclose(rows[path], expected, atol=ATOL)
        sequence_kept = ring_sequence(ring)
        sequence_kept.forward(prefix)
        sequence_kept.forward(nodes, tree=parents)
        sequence_kept.keep(path)
        after = np.array(sequence_kept.forward([1]))
        np.testing.assert_allclose(
            after, reference_logits(twin, prefix + [nodes[i] for i in path] + [1])[-1:], atol=ATOL
        )


def test_a_tree_larger_than_the_slack_is_refused_by_name(tree_pair: tuple[Path, Path]) -> None:
    sequence = ring_sequence(tree_pair[0])
    sequence.forward(list(range(1, 20)))

    with pytest.raises(CapabilityError, match=r"tree of 4 tokens.*window 4.*at most 3"):
        sequence.forward([1, 2, 3, 4], tree=[-1, 0, 0, 0])


@EXAMPLES
@given(data=st.data())
def test_batched_steps_forks_and_reorders_on_ring_rows_give_each_row_its_own_logits(
    tree_pair: tuple[Path, Path], data: st.DataObject
) -> None:
    ring, twin = tree_pair
    rows = Rows("target", load_model(ring, threads=1, ring_slack=SLACK), capacity=3, max_length=64)
    vocab = rows[0].vocab_size
    rows[0].forward(tokens(data, vocab, 1, 3 * WINDOW, "prompt"))
    for _ in range(2):
        child = rows.fork(data.draw(st.sampled_from(rows.ids), label="fork of"))
        extra = tokens(data, vocab, 0, WINDOW, "row's own tokens")  # rows of different lengths
        if extra:
            rows[child].forward(extra)
    expected = {r: rows[r].tokens.tolist() for r in rows.ids}
    for _ in range(data.draw(st.integers(1, 2 * WINDOW), label="steps")):
        stepped = data.draw(st.lists(st.sampled_from(rows.ids), min_size=1, unique=True), label="stepped rows")
        fed = tokens(data, vocab, len(stepped), len(stepped), "step tokens")

        logits = np.array(rows.step(fed, rows=stepped))

        for i, row in enumerate(stepped):
            expected[row].append(fed[i])
            np.testing.assert_allclose(logits[i], reference_logits(twin, expected[row])[-1], atol=ATOL)
        if data.draw(st.booleans(), label="reorder"):
            parents = data.draw(st.lists(st.sampled_from(rows.ids), min_size=len(rows), max_size=len(rows)))
            before = {r: list(t) for r, t in expected.items()}
            rows.reorder(parents)
            expected = {row: list(before[parent]) for row, parent in enumerate(parents)}
    for row in rows.ids:
        assert rows[row].tokens.tolist() == expected[row]


def test_a_ring_window_larger_than_the_context_is_refused_by_name(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path / "m", seed=3, num_layers=2, local_window_size=300, ring_cache=True)

    with pytest.raises(
        ModelLoadError, match=r"layer 0 keeps a ring cache of window 300, larger than the model's context \(256\)"
    ):
        load_model(folder, threads=1)


def test_models_info_shows_each_layers_cache_kind_and_capacity(pair: tuple[Path, Path]) -> None:
    model = load_model(pair[0], threads=1, ring_slack=SLACK)

    lines = describe_layers(model.spec, model.capabilities.rings, 256)

    assert lines == [
        "layer 2: shared past/present buffer, 256 positions",
        "layers 0-1: ring cache, window 4, 6 positions and a spill of 2 (rewinds of up to 3 tokens exact)",
    ]


def test_a_run_refused_inside_onnxruntimes_kernel_says_so_and_names_the_node(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sequence = ring_sequence(pair[0])
    refusal = (
        "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running GroupQueryAttention node. "
        "Name:'/model/layers.0/attn/GroupQueryAttention' Status Message: rotary dimension 16 is not supported"
    )

    def refuse() -> None:
        raise RuntimeError(refusal)

    monkeypatch.setattr(sequence._runner._fast, "run", refuse)

    with pytest.raises(
        ModelLoadError,
        match=r"inside onnxruntime .* GroupQueryAttention kernel at node "
        r"/model/layers.0/attn/GroupQueryAttention: rotary dimension 16 is not supported",
    ):
        sequence.forward([1, 2, 3])


def test_a_window_the_config_declares_but_the_graph_drops_is_refused_at_load(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path / "m", seed=3, num_layers=2)  # no window in the graph
    config_file = folder / "genai_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["model"]["decoder"]["sliding_window"] = {"window_size": 16, "layers": [], "cache_slack": 0}
    config_file.write_text(json.dumps(config), encoding="utf-8")

    with pytest.raises(ModelLoadError, match=r"declares a sliding window of 16 .* add \"layer_types\""):
        load_model(folder, threads=1)


@pytest.mark.parametrize(
    ("controller", "options"),
    [
        ("eagle", {"drafting": "tree", "depth": 3, "topk": 2, "nodes": 6}),
        ("eagle", {"drafting": "chain", "k": 3, "adaptive": False}),
        ("lookahead", {}),
    ],
)
def test_eagle_and_lookahead_trees_give_greedys_tokens_past_evictions(
    tmp_path_factory: pytest.TempPathFactory, controller: str, options: dict[str, object]
) -> None:
    root = tmp_path_factory.mktemp("ring-eagle")
    target = build_genai_model(
        root / "target",
        seed=3,
        num_layers=2,
        hidden_states=True,
        tree_inputs=True,
        local_window_size=WINDOW,
        ring_cache=True,
    )
    head = build_eagle_head(root / "head", target, copy_layer=0, feature_mix=0.1, tree_inputs=True)
    registry = PluginRegistry()
    prompt = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)\n"
    greedy = Generator({"target": target}, "greedy", registry=registry, threads=1)
    roles = {"target": target, "eagle": head} if controller == "eagle" else {"target": target}
    drafting = Generator(roles, controller, options=options, registry=registry, threads=1)

    expected = greedy.generate(prompt, max_new_tokens=160)  # past the ring's capacity: 4 + 64 for trees, + 64
    result = drafting.generate(prompt, max_new_tokens=160)

    assert list(result.tokens) == list(expected.tokens)
    assert len(expected.tokens) + expected.stats.prompt_tokens > WINDOW + 2 * 64
    if controller == "eagle":  # the head imitates the target: its drafts are accepted, across the evictions
        assert result.stats.tokens_per_target_forward > 1.2


def test_a_rewind_below_what_an_earlier_lay_out_kept_is_refused(tmp_path: Path) -> None:
    """A rewind that moves nothing in the kernel's layout may still reach positions an earlier rewind's lay-out
    left behind (the rows below them hold other positions' data): refused, never read."""
    ring, twin = build_pair(tmp_path, tree_inputs=True)
    sequence = ring_sequence(ring)
    fed = [0]
    sequence.forward(fed)
    for new, rewind_to in (([0, 0, 1, 0], 5), ([0, 0, 0, 0], 6), ([0], None)):
        fed += new
        sequence.forward(new)
        if rewind_to is not None:
            sequence.rewind(rewind_to)
            fed = fed[:rewind_to]
    with pytest.raises(SequenceError, match=r"window 4.*spill of 2"):
        sequence.rewind(1)
    assert sequence.length == len(fed)  # refused: nothing changed
    np.testing.assert_allclose(np.array(sequence.forward([0])), reference_logits(twin, [*fed, 0])[-1:], atol=ATOL)
