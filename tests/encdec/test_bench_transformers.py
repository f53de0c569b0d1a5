"""transformers' generation as bench contenders (decoctl.bench._transformers) on the weights the tiny T5 and BART
exports came from: greedy, assisted decoding with the draft's weights and prompt lookup give decoctl greedy's tokens;
what they need and lack is refused by name."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest

from decoctl import ConfigError, Generator
from decoctl.bench._transformers import TransformersContender
from decoctl.cli import main

#: the prompts the session's models were seeded for (tests/encdec/seq2seq_exports.py: no near-ties on their path)
PROMPTS = ("def fibonacci(n):", "class Stack:\n    def push(self, item):", "for x in range(10):")
NEW = 24


@pytest.fixture(scope="module")
def weights(seq2seq: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """name -> the folder save_pretrained writes for the session's transformers model ``name``."""
    root = tmp_path_factory.mktemp("hf-weights")

    def folder(name: str) -> Path:
        if not (root / name).exists():
            seq2seq.model(name).save_pretrained(root / name)
        return root / name

    return folder


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def _contender(seq2seq: Any, name: str, kind: str, options: dict[str, str]) -> TransformersContender:
    target = Generator({"target": str(seq2seq.folder(name))}, "greedy", threads=1).models["target"]
    return TransformersContender(kind, target, 1, options)


def _transformers_major() -> int:
    transformers = pytest.importorskip("transformers")
    return int(transformers.__version__.split(".")[0])


#: transformers 4.x's prompt lookup ends at once on a decoder that starts from EOS, as BART's does (refused then)
LOOKUP_ON_BART = pytest.mark.skipif(
    _transformers_major() < 5, reason="transformers 4.x: hf-lookup is refused on BART (see the refusal test)"
)


@pytest.mark.parametrize(
    ("name", "lookup"),
    # BART's hf-lookup where transformers runs it (see the refusal test below)
    [("t5", True), ("bart", False), pytest.param("bart", True, marks=LOOKUP_ON_BART)],
    ids=["t5", "bart", "bart-lookup"],
)
def test_the_transformers_contenders_give_decoctl_greedy_s_tokens_in_the_bench(
    seq2seq: Any, weights: Any, prompts: Path, tmp_path: Path, name: str, lookup: bool
) -> None:
    model, draft = weights(name), weights(f"{name}-draft")
    contenders = f"greedy,hf=hf(model={model}),assisted=hf-assisted(model={model};draft={draft};k=3)"
    contenders += f",lookup=hf-lookup(model={model};k=4)" if lookup else ""
    report = tmp_path / "bench.json"
    args = ["bench", "-m", str(seq2seq.folder(name)), "--contenders", contenders, "--prompts", str(prompts)]
    args += ["-n", str(NEW), "--repeats", "1", "--threads", "1", "--calibration-pairs", "1", "--no-huge-pages"]
    assert main([*args, "--require-identical", "--json", str(report)]) == 0
    rows = {c["name"]: c for c in json.loads(report.read_text())["contenders"]}
    assert set(rows) == {"greedy", "hf", "assisted", *(["lookup"] if lookup else [])}
    assert all(row["identical_to_baseline"] for row in rows.values())
    # greedy's forwards are one a token after the first, as decoctl counts its own
    assert rows["hf"]["target_forwards"] == rows["greedy"]["target_forwards"]


def test_assisted_decoding_with_the_target_as_its_own_draft_takes_its_whole_draft_in_one_forward(
    seq2seq: Any, weights: Any
) -> None:
    contender = _contender(
        seq2seq, "t5", "hf-assisted", {"model": str(weights("t5")), "draft": str(weights("t5")), "confidence": "0"}
    )
    generator = Generator({"target": str(seq2seq.folder("t5"))}, "greedy", threads=1)
    for prompt in PROMPTS:
        outcome = contender.run(prompt, generator.tokenizer.encode(prompt), NEW)
        assert outcome.tokens == generator.generate(prompt, max_new_tokens=NEW).tokens
        # the first forward takes the start token and the whole draft (k=20), and later ones most of theirs
        assert outcome.ledger.chain.get(21) == 1
        assert sum(outcome.ledger.chain.values()) <= 4
        assert outcome.ledger.other_seconds > 0


@pytest.mark.parametrize("name", ["t5", pytest.param("bart", marks=LOOKUP_ON_BART)])
def test_prompt_lookup_feeds_the_looked_up_tokens_and_keeps_greedy_s(seq2seq: Any, weights: Any, name: str) -> None:
    contender = _contender(seq2seq, name, "hf-lookup", {"model": str(weights(name)), "k": "4"})
    generator = Generator({"target": str(seq2seq.folder(name))}, "greedy", threads=1)
    forwards = tokens = 0
    for prompt in PROMPTS:
        outcome = contender.run(prompt, generator.tokenizer.encode(prompt), NEW)
        assert outcome.tokens == generator.generate(prompt, max_new_tokens=NEW).tokens
        forwards += sum(outcome.ledger.chain.values())
        tokens += len(outcome.tokens)
    # the outputs repeat themselves, so lookups in them are accepted: fewer forwards than greedy's one a token
    assert forwards < tokens - len(PROMPTS)


@pytest.mark.skipif(_transformers_major() >= 5, reason="transformers 5 runs prompt lookup on BART")
def test_prompt_lookup_on_a_decoder_starting_from_eos_is_refused_on_transformers_4(seq2seq: Any, weights: Any) -> None:
    with pytest.raises(ConfigError, match=r"ends prompt lookup before the first token .* install transformers 5"):
        _contender(seq2seq, "bart", "hf-lookup", {"model": str(weights("bart"))})


@pytest.mark.parametrize(
    ("kind", "options", "expected"),
    [
        ("hf", lambda weights, tmp: {}, "contender hf needs the target's transformers weights: hf(model=DIR)"),
        (
            "hf-assisted",
            lambda weights, tmp: {"model": str(weights("t5"))},
            "contender hf-assisted needs the draft's transformers weights: hf-assisted(draft=DIR)",
        ),
        ("hf", lambda weights, tmp: {"model": str(tmp)}, "holds no config.json: give a folder from save_pretrained"),
        ("hf", lambda weights, tmp: {"model": str(weights("t5")), "k": "3"}, "contender hf has no option 'k'"),
    ],
    ids=["no-model", "no-draft", "not-a-checkpoint", "unknown-option"],
)
def test_a_contender_missing_what_it_needs_is_refused_by_name(
    seq2seq: Any, weights: Any, tmp_path: Path, kind: str, options: Any, expected: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        _contender(seq2seq, "t5", kind, options(weights, tmp_path))
    assert expected in str(refused.value)


def test_weights_of_another_kind_than_the_onnx_model_are_refused(seq2seq: Any, tmp_path: Path) -> None:
    import transformers

    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=384)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ConfigError, match="is a decoder-only model but the bench's model t5 is an encoder-decoder"):
        _contender(seq2seq, "t5", "hf", {"model": str(tmp_path / "gpt2")})


def test_a_missing_torch_names_the_extra_to_install(
    seq2seq: Any, weights: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_import = builtins.__import__

    def without_torch(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_torch)
    args = ["bench", "-m", str(seq2seq.folder("t5")), "--contenders", f"greedy,hf(model={weights('t5')})"]
    assert main([*args, "-n", "4", "--repeats", "1", "--no-huge-pages"]) == 2
    error = capsys.readouterr().err
    assert "contender hf needs torch and transformers (torch is missing)" in error
    assert "pip install 'decoctl[bench-transformers]'" in error
