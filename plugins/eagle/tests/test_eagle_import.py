"""`decoctl eagle import`: published EAGLE-1/2 and EAGLE-3 heads (config.json + model.safetensors or
pytorch_model.bin) become ONNX heads that compute what the authors' forward computes, and run under -c eagle.

Each imported head is run by decoctl's host and compared with a from-scratch torch reference of its architecture
(eagle_published) on random weights; logits and predicted features agree to 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import eagle_published as published  # noqa: E402  (needs torch)
from decoctl_eagle.heads import import_head  # noqa: E402

from decoctl import CapabilityError, ConfigError, Generator  # noqa: E402
from decoctl.cli import main  # noqa: E402
from decoctl.host import Sequence  # noqa: E402
from decoctl.model import load_model  # noqa: E402
from decoctl.plugins import PluginRegistry  # noqa: E402
from decoctl.testing import build_genai_model, first_divergence_is_a_tie  # noqa: E402

VOCAB, DRAFT_VOCAB = 384, 120
TOKENS = [5, 17, 3, 250, 9, 77, 120, 4]
TOLERANCE = 1e-4
FORMATS = ["safetensors", "bin"]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A three-layer target with the final hidden states (EAGLE-1's features) and three taps (EAGLE-3's)."""
    return build_genai_model(
        tmp_path_factory.mktemp("target"),
        seed=3,
        num_layers=3,
        hidden=published.HIDDEN,
        hidden_states=True,
        tap_layers=(0, 1, 2),
        tree_inputs=True,
    )


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """decoctl's model registry in a folder of the test's own."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.fixture
def registry() -> PluginRegistry:
    from decoctl_eagle import plugin

    registry = PluginRegistry(autoload=False)
    registry.register(plugin, "eagle")
    return registry


def _target_tensor(target: Path, name: str) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load_model(str(target / "model.onnx")).graph
    return next(numpy_helper.to_array(t) for t in graph.initializer if t.name == name).copy()


def _run(head: Path, tokens: list[int], features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sequence = Sequence("eagle", load_model(head, threads=1))
    logits = np.array(sequence.forward(tokens, features=features))
    return logits, np.array(sequence.hidden_states())


@pytest.mark.parametrize("file_format", FORMATS)
def test_an_eagle1_head_computes_the_authors_forward(
    file_format: str, target: Path, tmp_path: Path, registry: PluginRegistry
) -> None:
    weights = published.random_weights("eagle-1", VOCAB, seed=1)
    source = published.save_checkpoint(
        tmp_path / "eagle1", weights, published.config(VOCAB), spelling="layers.0", file_format=file_format
    )
    head = import_head(source, target, out=tmp_path / "head", register=False, plugins=registry)
    features = np.random.default_rng(0).standard_normal((len(TOKENS), published.HIDDEN)).astype(np.float32)
    logits, hidden = _run(head.folder, TOKENS, features)
    lm_head = torch.from_numpy(_target_tensor(target, "model.lm_head").T.copy())
    want_logits, want_hidden = published.eagle1_forward(weights, lm_head, TOKENS, features)
    assert np.abs(logits - want_logits).max() < TOLERANCE
    assert np.abs(hidden - want_hidden).max() < TOLERANCE


@pytest.mark.parametrize("file_format", FORMATS)
@pytest.mark.parametrize("spelling", ["midlayer", "layers.0"])
def test_an_eagle3_head_computes_the_authors_forward(
    spelling: str, file_format: str, target: Path, tmp_path: Path, registry: PluginRegistry
) -> None:
    """Rows fed the target's taps and rows fed the head's own feature (drafting) in one pass; the draft
    vocabulary's logits land on their target ids (d + d2t[d]), every other token is -inf."""
    weights = published.random_weights("eagle-3", VOCAB, draft_vocab=DRAFT_VOCAB, embeddings=False, seed=2)
    table = published.config(VOCAB, draft_vocab=DRAFT_VOCAB, rope_scaling=published.LLAMA3_SCALING)
    source = published.save_checkpoint(tmp_path / "eagle3", weights, table, spelling=spelling, file_format=file_format)
    head = import_head(source, target, out=tmp_path / "head", register=False, plugins=registry)
    rng = np.random.default_rng(1)
    n, h = len(TOKENS), published.HIDDEN
    taps = rng.standard_normal((n, 3 * h)).astype(np.float32)
    own = rng.standard_normal((n, h)).astype(np.float32)
    from_taps = np.arange(n) < 5  # synced rows, then drafted ones
    features = np.concatenate([taps * from_taps[:, None], own * ~from_taps[:, None]], axis=1)
    logits, hidden = _run(head.folder, TOKENS, features)
    embeddings = torch.from_numpy(_target_tensor(target, "model.embed_tokens"))  # the head has none: the target's
    want_draft, want_hidden = published.eagle3_forward(
        weights, embeddings, TOKENS, taps, own, from_taps, published.LLAMA3_SCALING
    )
    ids = (torch.arange(DRAFT_VOCAB) + weights["d2t"]).numpy()
    assert np.abs(logits[:, ids] - want_draft).max() < TOLERANCE
    others = np.delete(logits, ids, axis=1)
    assert np.isneginf(others).all()
    assert np.abs(hidden - want_hidden).max() < TOLERANCE


def test_bfloat16_weights_are_read_as_their_float32_values(tmp_path: Path) -> None:
    from decoctl_eagle.checkpoint import read_tensors
    from safetensors.torch import save_file

    values = torch.randn(4, 6).to(torch.bfloat16)
    save_file({"w": values, "ids": torch.arange(3)}, str(tmp_path / "model.safetensors"))
    read = read_tensors(tmp_path / "model.safetensors")
    assert read["w"].dtype == np.float32 and np.array_equal(read["w"], values.float().numpy())
    assert read["ids"].tolist() == [0, 1, 2]


# ------------------------------------------------------------------------------------------------ refusals


def _eagle3_source(tmp_path: Path, vocab: int = VOCAB, **changes: torch.Tensor | None) -> Path:
    weights = published.random_weights("eagle-3", vocab, draft_vocab=DRAFT_VOCAB, seed=4)
    for name, value in changes.items():
        if value is None:
            del weights[name]
        else:
            weights[name] = value
    table = published.config(vocab, draft_vocab=DRAFT_VOCAB)
    return published.save_checkpoint(tmp_path / "src", weights, table, spelling="midlayer", file_format="safetensors")


def test_an_unknown_tensor_is_named(target: Path, tmp_path: Path, registry: PluginRegistry) -> None:
    source = _eagle3_source(tmp_path, **{"layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)})
    with pytest.raises(ConfigError, match=r"does not have: midlayer\.self_attn\.rotary_emb\.inv_freq"):
        import_head(source, target, out=tmp_path / "head", plugins=registry)


def test_a_wrong_shape_is_named(target: Path, tmp_path: Path, registry: PluginRegistry) -> None:
    source = _eagle3_source(tmp_path, **{"layers.0.self_attn.k_proj.weight": torch.zeros(32, published.HIDDEN)})
    with pytest.raises(
        ConfigError, match=r"tensor midlayer\.self_attn\.k_proj\.weight .* shape \[32, 64\], expected \[32, 128\]"
    ):
        import_head(source, target, out=tmp_path / "head", plugins=registry)


def test_a_missing_tensor_is_named(target: Path, tmp_path: Path, registry: PluginRegistry) -> None:
    source = _eagle3_source(tmp_path, **{"layers.0.hidden_norm.weight": None})
    with pytest.raises(ConfigError, match=r"lacks tensor\(s\) an EAGLE-3 head needs: midlayer\.hidden_norm\.weight"):
        import_head(source, target, out=tmp_path / "head", plugins=registry)


def test_another_targets_vocabulary_is_refused(target: Path, tmp_path: Path, registry: PluginRegistry) -> None:
    source = _eagle3_source(tmp_path, vocab=VOCAB + 16)
    refused = rf"vocabulary {VOCAB + 16} \(tensor t2d \[{VOCAB + 16}\]\), the target's {VOCAB}"
    with pytest.raises(ConfigError, match=refused):
        import_head(source, target, out=tmp_path / "head", plugins=registry)


def test_another_targets_hidden_size_is_refused(tmp_path: Path, registry: PluginRegistry) -> None:
    wide = build_genai_model(tmp_path / "wide", hidden=96, num_heads=4, num_layers=1, hidden_states=True)
    weights = published.random_weights("eagle-1", VOCAB, seed=5)
    source = published.save_checkpoint(
        tmp_path / "src", weights, published.config(VOCAB), spelling="layers.0", file_format="safetensors"
    )
    with pytest.raises(
        ConfigError, match=r"fit target wide: hidden size 64 \(tensor fc\.weight \[64, 128\]\), the target's 96"
    ):
        import_head(source, wide, out=tmp_path / "head", plugins=registry)


def test_an_eagle3_head_needs_a_target_with_three_taps(tmp_path: Path, registry: PluginRegistry) -> None:
    plain = build_genai_model(tmp_path / "plain", num_layers=1, hidden_states=True)
    refused = r"fit target plain: it is fed three taps .*the target has none.*enable-taps"
    with pytest.raises(CapabilityError, match=refused):
        import_head(_eagle3_source(tmp_path), plain, out=tmp_path / "head", plugins=registry)


# ------------------------------------------------------------------------------------------------ use


@pytest.mark.parametrize("architecture", ["eagle-1", "eagle-3"])
def test_an_imported_head_runs_under_eagle_with_greedys_tokens(
    architecture: str, target: Path, tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Imported through the command line, found as the target's head without --role, lossless."""
    if architecture == "eagle-1":
        weights, table = published.random_weights("eagle-1", VOCAB, seed=6), published.config(VOCAB)
    else:
        weights = published.random_weights("eagle-3", VOCAB, draft_vocab=DRAFT_VOCAB, seed=6)
        table = published.config(VOCAB, draft_vocab=DRAFT_VOCAB)
    source = published.save_checkpoint(tmp_path / "src", weights, table, spelling="layers.0", file_format="safetensors")
    assert main(["eagle", "import", str(source), "--target", str(target)]) == 0
    assert "registered in" in capsys.readouterr().out
    registry = PluginRegistry()
    baseline = Generator({"target": target}, "greedy", registry=registry, threads=1)
    for options in ({"drafting": "chain", "k": 3}, {"drafting": "tree", "depth": 3, "topk": 2, "nodes": 5}):
        eagle = Generator({"target": target}, "eagle", options=options, registry=registry, threads=1)
        assert data_dir in eagle.models["eagle"].spec.path.parents  # the head imported into decoctl's models
        for prompt in ("def fib(n):", "import os\nimport sys\n"):
            expected = baseline.generate(prompt, max_new_tokens=24).tokens
            got = eagle.generate(prompt, max_new_tokens=24).tokens
            assert first_divergence_is_a_tie(target, baseline.tokenizer.encode(prompt), expected, got), prompt


def test_info_describes_a_head_and_checks_it_against_a_target(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _eagle3_source(tmp_path)
    assert main(["eagle", "info", str(source), "--target", str(target)]) == 0
    out = capsys.readouterr().out
    assert "EAGLE-3 published checkpoint" in out and "hidden 64, 4 attention heads of 16 (2 KV)" in out
    assert f"draft vocabulary: {DRAFT_VOCAB} of {VOCAB} target tokens" in out and f"matches {target.name}: yes" in out
    assert main(["eagle", "import", str(source), "--target", str(target), "--out", str(tmp_path / "head")]) == 0
    capsys.readouterr()
    plain = build_genai_model(tmp_path / "plain", num_layers=1, hidden_states=True)
    assert main(["eagle", "info", str(tmp_path / "head"), "--target", str(plain)]) == 1
    out = capsys.readouterr().out
    assert "EAGLE-3 ONNX head" in out and f"target: {target.name} ({target.resolve()})" in out
    assert "matches plain: no: it is fed three taps (aux_hidden_states of width 192); the target has none" in out
