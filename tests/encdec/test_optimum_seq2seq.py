"""optimum-onnx's own exports of the tiny T5, BART and Marian models load and give transformers' greedy tokens.

optimum-onnx needs transformers < 4.58, so this runs in the ``test-exports`` extra's environment (pyproject.toml says
how to make it: ``build/venv-exports/bin/python -m pytest tests/encdec/test_optimum_seq2seq.py``); elsewhere it
skips, saying why. Each export is made as ``optimum-cli export onnx --task text2text-generation-with-past`` makes it
(its merged decoder, next to the two it was merged from) and with ``--no-post-process`` (the pair alone). The
Marian model's export has no tokenizer.json (MarianTokenizer is sentencepiece-only): decoctl refuses it, naming the
fix, and the script docs/MODELS.md gives writes one that encodes as MarianTokenizer does (it needs sentencepiece,
which the test-exports extra brings; without it those tests skip).
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from decoctl import Generator, ModelLoadError
from decoctl.model._loader import load_model


def _why_not() -> str | None:
    try:
        versions = {name: importlib.metadata.version(name) for name in ("optimum-onnx", "transformers")}
    except importlib.metadata.PackageNotFoundError as exc:
        return f"{exc.name} is not installed (the test-exports extra brings it: see pyproject.toml)"
    if tuple(int(part) for part in versions["transformers"].split(".")[:2]) >= (4, 58):
        return f"optimum-onnx needs transformers < 4.58, and {versions['transformers']} is installed"
    return None


REASON = _why_not()
if REASON is not None:
    pytest.skip(f"optimum-onnx encoder-decoder exports: {REASON}", allow_module_level=True)

PROMPTS = ("def fibonacci(n):", "class Stack:\n    def push(self, item):", "for x in range(10):")
NEW = 24


@pytest.fixture(scope="module")
def optimum_folder(seq2seq: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from optimum.exporters.onnx import main_export

    made: dict[tuple[str, bool], Path] = {}

    def folder(name: str, post_process: bool) -> Path:
        if (name, post_process) not in made:
            root = tmp_path_factory.mktemp(f"optimum-{name}")
            source = seq2seq.folder(name)  # config, generation config, tokenizer
            seq2seq.model(name).save_pretrained(root / "source")
            for path in source.glob("*.json"):
                if not (root / "source" / path.name).exists():
                    (root / "source" / path.name).write_bytes(path.read_bytes())
            main_export(
                str(root / "source"),
                output=root / name,
                task="text2text-generation-with-past",
                do_validation=False,
                no_post_process=not post_process,
            )
            made[(name, post_process)] = root / name
        return made[(name, post_process)]

    return folder


@pytest.mark.parametrize("post_process", [True, False], ids=["merged", "pair"])
@pytest.mark.parametrize("name", ["t5", "bart", "marian"])
def test_optimum_s_export_gives_transformers_greedy_tokens(
    seq2seq: Any, optimum_folder: Any, name: str, post_process: bool
) -> None:
    import torch

    folder = optimum_folder(name, post_process)
    generator = Generator({"target": str(folder)}, "greedy", threads=1)
    parts = generator.models["target"].spec.encoder_decoder
    assert parts is not None and parts.merged == post_process
    for prompt in PROMPTS:
        ids = generator.tokenizer.encode(prompt)
        with torch.no_grad():
            expected = seq2seq.model(name).generate(input_ids=torch.tensor([ids]), max_new_tokens=NEW, do_sample=False)[
                0, 1:
            ]
        assert list(generator.generate(prompt, max_new_tokens=NEW).tokens) == expected.tolist(), prompt


@pytest.mark.parametrize("post_process", [True, False], ids=["merged", "pair"])
@pytest.mark.parametrize("name", ["t5", "bart"])
def test_verify_forwards_on_optimum_s_export_give_greedy_tokens(
    seq2seq: Any, optimum_folder: Any, name: str, post_process: bool
) -> None:
    """Speculative decoding feeds several tokens after a past: the with-past decoder must take them."""
    pytest.importorskip("decoctl_speculative", reason="the speculative plugin is not installed here")
    from decoctl_speculative import plugin

    from decoctl.plugins import PluginRegistry

    registry = PluginRegistry(autoload=False)
    registry.register(plugin, "speculative")
    folder = str(optimum_folder(name, post_process))
    greedy = Generator({"target": folder}, "greedy", threads=1)
    speculative = Generator(
        {"target": folder, "draft": folder}, "speculative", options={"k": 4, "adaptive": False}, registry=registry
    )
    for prompt in PROMPTS:
        expected = greedy.generate(prompt, max_new_tokens=NEW).tokens
        assert speculative.generate(prompt, max_new_tokens=NEW).tokens == expected, prompt


@pytest.mark.parametrize("post_process", [True, False], ids=["merged", "pair"])
@pytest.mark.parametrize("name", ["t5", "bart", "marian"])
def test_a_rewind_to_zero_on_optimum_s_export_reuses_the_cross_kv(
    optimum_folder: Any, name: str, post_process: bool
) -> None:
    """After a rewind to 0 the with-past decoder runs with an empty self-attention past over the bound
    cross-attention KV: optimum's graphs take the empty past and give the first pass's logits."""
    import numpy as np

    from decoctl.host import Sequence
    from decoctl.model._decoder_runner import DecoderRunner
    from decoctl.model._loader import load_model

    model = load_model(optimum_folder(name, post_process), threads=1)
    start = model.encoder.parts.decoder_start_token_id if model.encoder else 0
    sequence = Sequence("target", model)
    sequence.encode([40, 41, 42, 43, 1])
    expected = np.array(sequence.forward([start, 7, 9, 11]))
    for fed in ([start, 7, 9, 11], [start]):
        sequence.rewind(0)
        np.testing.assert_allclose(sequence.forward(fed), expected[: len(fed)], atol=1e-5)
    runner = sequence._runner
    assert isinstance(runner, DecoderRunner)
    assert (runner.encoder_runs, runner.cross_passes) == (1, 1)


# -- Marian: Optimum's export has no tokenizer.json; docs/MODELS.md's script writes one ---------------------------

MODELS_MD = Path(__file__).resolve().parents[2] / "docs" / "MODELS.md"
#: texts the converted tokenizer must encode and decode as MarianTokenizer does: code, accents, full-width forms
#: (the sentencepiece normaliser), characters the model does not know, runs of spaces, a language code
TEXTS = (
    "def fibonacci(n):",
    "The house is wonderful.",
    "  leading and   many  spaces ",
    "Ça coûte 5 € — ﬁne ｆｕｌｌ",
    "unknown 手 漢字 chars",
    ">>de<< Hello world",
    "tabs\tand\nnewlines",
    "</s> inside",
    "",
)


def marian_script() -> str:
    """The script docs/MODELS.md gives for writing a Marian export's tokenizer.json."""
    text = MODELS_MD.read_text(encoding="utf-8")
    section = text[text.index("### Marian (opus-mt)") :]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.fixture(scope="module")
def marian_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(Optimum's export, the transformers folder it came from) of a tiny random Marian model whose tokenizer is a
    real MarianTokenizer: a sentencepiece model trained here, used as source.spm and target.spm, and its vocab.json
    laid out as opus-mt's (</s> 0, <unk> 1, the pieces, a language code, <pad> last)."""
    sentencepiece = pytest.importorskip("sentencepiece", reason="MarianTokenizer needs sentencepiece")
    import torch
    import transformers
    from optimum.exporters.onnx import main_export

    from decoctl.testing._tokenizer import TRAINING_TEXT

    root = tmp_path_factory.mktemp("marian")
    (root / "train.txt").write_text(TRAINING_TEXT + "\n".join(TEXTS[:5]) + "\n", encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(root / "train.txt"),
        model_prefix=str(root / "spm"),
        vocab_size=300,
        model_type="unigram",
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    source = root / "source"
    source.mkdir()
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(root / "spm.model", source / name)
    trained = sentencepiece.SentencePieceProcessor(model_file=str(root / "spm.model"))
    pieces = [trained.id_to_piece(i) for i in range(trained.get_piece_size())]
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in pieces:
        if piece not in ("<s>", "</s>", "<unk>"):
            vocab[piece] = len(vocab)
    vocab[">>de<<"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (source / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tokenizer = transformers.MarianTokenizer(
        str(source / "source.spm"), str(source / "target.spm"), str(source / "vocab.json")
    )
    # a seed whose greedy steps over TEXTS[:4] keep their top two logits at least 0.2 apart (onnxruntime's and torch's
    # float32 logits differ by ~3e-3 here)
    torch.manual_seed(1)
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        scale_embedding=True,
        pad_token_id=vocab["<pad>"],
        eos_token_id=vocab["</s>"],
        decoder_start_token_id=vocab["<pad>"],
        forced_eos_token_id=None,
        init_std=1.0,
    )
    model = transformers.MarianMTModel(config).eval()
    model.final_logits_bias.normal_(0.0, 1.0)
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    main_export(str(source), output=root / "opus-mt-tiny", task="text2text-generation-with-past", do_validation=False)
    return root / "opus-mt-tiny", source


def test_optimum_s_marian_export_without_tokenizer_json_is_refused_naming_the_fix(
    marian_export: tuple[Path, Path], tmp_path: Path
) -> None:
    export, _ = marian_export
    folder = tmp_path / "as-exported"
    shutil.copytree(export, folder)
    (folder / "tokenizer.json").unlink(missing_ok=True)
    assert {"source.spm", "target.spm", "vocab.json"} <= {p.name for p in folder.iterdir()}
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json is missing: the folder holds a Marian tokenizer"):
        Generator({"target": str(folder)}, "greedy")


def test_the_documented_script_writes_a_tokenizer_json_equal_to_marian_tokenizer(
    marian_export: tuple[Path, Path], tmp_path: Path
) -> None:
    import transformers

    export, source = marian_export
    folder = tmp_path / "converted"
    shutil.copytree(export, folder)
    script = tmp_path / "marian_tokenizer.py"
    script.write_text(marian_script(), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script), str(folder)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    marian = transformers.MarianTokenizer.from_pretrained(source)
    converted = load_model(folder, threads=1).tokenizer
    for text in TEXTS:
        ids = marian(text).input_ids
        assert converted.encode(text) == ids, text
        assert converted.decode(ids) == marian.decode(ids, skip_special_tokens=True), text


def test_optimum_s_marian_export_with_the_converted_tokenizer_gives_transformers_greedy_tokens(
    marian_export: tuple[Path, Path], tmp_path: Path
) -> None:
    import torch
    import transformers

    export, source = marian_export
    folder = tmp_path / "opus-mt-tiny"
    shutil.copytree(export, folder)
    subprocess.run([sys.executable, "-c", marian_script(), str(folder)], check=True)
    model = transformers.MarianMTModel.from_pretrained(source).eval()
    marian = transformers.MarianTokenizer.from_pretrained(source)
    generator = Generator({"target": str(folder)}, "greedy", threads=1)
    parts = generator.models["target"].spec.encoder_decoder
    assert parts is not None and parts.merged and parts.decoder_start_token_id == model.config.pad_token_id
    for prompt in TEXTS[:4]:
        ids = marian(prompt).input_ids
        with torch.no_grad():
            expected = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=NEW, do_sample=False)[0, 1:]
        result = generator.generate(prompt, max_new_tokens=NEW)
        assert list(result.tokens) == expected.tolist(), prompt
        assert result.text == marian.decode(expected, skip_special_tokens=True)
