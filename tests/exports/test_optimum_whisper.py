"""Whisper as optimum-onnx exports it (``automatic-speech-recognition-with-past``: encoder_model.onnx, the two
decoders and the merged one), a tiny random WhisperForConditionalGeneration: decoctl's greedy transcription equals
the transformers model's, through the merged decoder and through the pair; speculative decoding with a smaller
Whisper export as the draft and prompt lookup give the same tokens."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import optimum_exports  # noqa: F401  (skips this file, saying why, where optimum-onnx cannot export)
import pytest
from decoctl_speculative import plugin as speculative_plugin

from decoctl import Generator
from decoctl.plugins import PluginRegistry
from decoctl.testing._tokenizer import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tokenizer, write_tokenizer_config

VOCAB = 384
#: Whisper's special tokens, inside the tests' vocabulary
START, ENGLISH, TRANSCRIBE, TRANSLATE, NO_TIMESTAMPS = 300, 301, 303, 304, 305
PROMPT = [START, ENGLISH, TRANSCRIBE, NO_TIMESTAMPS]
NEW = 24


def _model(width: int, layers: int, seed: int) -> Any:
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=80,
        d_model=width,
        encoder_layers=1,
        decoder_layers=layers,
        encoder_attention_heads=width // 8,
        decoder_attention_heads=width // 8,
        encoder_ffn_dim=2 * width,
        decoder_ffn_dim=2 * width,
        max_source_positions=1500,
        max_target_positions=96,
        decoder_start_token_id=START,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
        bos_token_id=EOS_TOKEN_ID,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        init_std=1.0,
    )
    model = transformers.WhisperForConditionalGeneration(config).eval()
    generation = model.generation_config
    generation.is_multilingual = True
    generation.lang_to_id = {"<|en|>": ENGLISH}
    generation.task_to_id = {"transcribe": TRANSCRIBE, "translate": TRANSLATE}
    generation.no_timestamps_token_id = NO_TIMESTAMPS
    generation.suppress_tokens = generation.begin_suppress_tokens = generation.forced_decoder_ids = None
    return model


def _export(model: Any, root: Path) -> Path:
    """optimum-onnx's export of ``model``, with the files a Hub repository carries beside it (the checkpoint's
    generation_config.json, which the export writes from config.json alone, the tokenizer, the feature extractor)."""
    import transformers
    from optimum.exporters.onnx import main_export

    source, folder = root / "hf", root / "onnx"
    model.save_pretrained(source)
    transformers.WhisperFeatureExtractor().save_pretrained(source)
    build_tokenizer(source, vocab_size=VOCAB)
    write_tokenizer_config(source, model_max_length=96)
    main_export(str(source), output=folder, task="automatic-speech-recognition-with-past", do_validation=False)
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        shutil.copy(source / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    target, draft = _model(32, 2, seed=5), _model(16, 1, seed=7)
    return {
        "model": target,
        "target": _export(target, tmp_path_factory.mktemp("whisper")),
        "draft": _export(draft, tmp_path_factory.mktemp("whisper-draft")),
    }


def _audio(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(16000 * (seed + 1)) * 0.1).astype(np.float32)


def _reference(model: Any, audio: np.ndarray) -> list[int]:
    """Greedy with the transformers model's forward over the whole sequence each step."""
    import torch
    import transformers

    features = transformers.WhisperFeatureExtractor()(audio, sampling_rate=16000, return_tensors="pt")
    ids = list(PROMPT)
    with torch.no_grad():
        encoded = model.get_encoder()(features["input_features"])
        for _ in range(NEW):
            ids.append(
                int(model(encoder_outputs=encoded, decoder_input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            )
            if ids[-1] == EOS_TOKEN_ID:
                break
    return ids[len(PROMPT) :]


@pytest.mark.parametrize("seed", [1, 2])
def test_greedy_equals_transformers_through_the_merged_decoder_and_the_pair(
    whisper: dict[str, Any], tmp_path: Path, seed: int
) -> None:
    audio = _audio(seed)
    expected = _reference(whisper["model"], audio)
    merged = Generator({"target": str(whisper["target"])}, "greedy", threads=1)
    assert list(merged.generate("", audio=audio, language="en", max_new_tokens=NEW).tokens) == expected
    pair = tmp_path / "pair"
    shutil.copytree(whisper["target"], pair)
    (pair / "decoder_model_merged.onnx").unlink()
    two = Generator({"target": str(pair)}, "greedy", threads=1)
    assert list(two.generate("", audio=audio, language="en", max_new_tokens=NEW).tokens) == expected


def test_speculative_with_a_whisper_draft_and_prompt_lookup_give_greedy_s_tokens(whisper: dict[str, Any]) -> None:
    plugins = PluginRegistry(autoload=False)
    plugins.register(speculative_plugin, "speculative")
    audio = _audio(1)
    expected = _reference(whisper["model"], audio)
    models = {"target": str(whisper["target"]), "draft": str(whisper["draft"])}
    drafted = Generator(models, "speculative", options={"k": 3, "adaptive": False}, registry=plugins, threads=1)
    result = drafted.generate("", audio=audio, language="en", max_new_tokens=NEW)
    assert list(result.tokens) == expected
    assert result.stats.forwards["draft"] > 0
    lookup = Generator(
        {"target": str(whisper["target"])},
        "speculative",
        options={"drafter": "prompt-lookup"},
        registry=plugins,
        threads=1,
    )
    assert list(lookup.generate("", audio=audio, language="en", max_new_tokens=NEW).tokens) == expected
