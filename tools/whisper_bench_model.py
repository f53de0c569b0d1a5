"""A Whisper with whisper-tiny's shapes and random weights, for `decoctl bench` against transformers' generate.

No Whisper can be downloaded here, so this builds one: whisper-tiny's shapes (d_model 384, 4 encoder and 4 decoder
layers, 6 heads, feed-forward 1536, 80 mel bins, 1500 source and 448 target positions) and its vocabulary of 51865
ids laid out as Whisper's (``<|endoftext|>`` 50257, ``<|startoftranscript|>`` 50258, 99 language tokens,
``<|translate|>``, ``<|transcribe|>``, ``<|startoflm|>``, ``<|startofprev|>``, ``<|nospeech|>``,
``<|notimestamps|>`` 50363, then the 1501 timestamps), with random weights from a fixed seed. Its tokenizer is
built here: the tests' byte-level BPE (decoctl.testing), filler entries up to 50257, then Whisper's special tokens.
The speed of a model depends on its shapes, not on what its weights learned; what it says is garbage.

Random weights never say anything worth stopping for, and may say end-of-text at any step: the generation config
suppresses ``<|endoftext|>`` (``suppress_tokens``, which decoctl and the bench's ``hf`` contenders both apply), so
every generation runs to the bench's ``-n``. It suppresses the timestamp tokens too, which a trained Whisper does
not write after ``<|notimestamps|>`` and random weights do (one id in 35): transformers' generate reads a timestamp
in the output as the end of a segment and goes over the recording again from there, work that neither a trained
model nor decoctl's one generation per window does (the bench refuses such a run).

Run in the test-exports environment (torch, transformers < 4.58, optimum-onnx):

    build/venv-exports/bin/python tools/whisper_bench_model.py

Output under build/whisper-bench/ (``--out``): ``hf`` (the transformers checkpoint, for ``hf(model=...)``), ``onnx``
(optimum-onnx's ``automatic-speech-recognition-with-past`` export with the checkpoint's generation config, the
tokenizer and the feature extractor's config beside it, for decoctl), ``audio/speech-N.wav`` (synthetic speech-like
signals: voiced syllables on a wandering pitch with formant-like harmonics, pauses and a little noise; 16 kHz mono
PCM, 5 to 29 s) and ``prompts.jsonl`` (one ``{"audio": ..., "language": "en"}`` per file, paths relative to it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import wave
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "whisper-bench"
SEED = 20261129
SAMPLING_RATE = 16000
#: seconds of each synthetic recording (every one inside Whisper's 30 s window)
DURATIONS = (5.0, 12.0, 20.0, 29.0)
#: whisper-tiny's shapes
D_MODEL, LAYERS, HEADS, FFN, MEL_BINS = 384, 4, 6, 1536, 80
SOURCE_POSITIONS, TARGET_POSITIONS = 1500, 448
#: Whisper's multilingual vocabulary: the text tokens below END_OF_TEXT, then its special tokens and timestamps
END_OF_TEXT = 50257
_LANGUAGE_CODES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg lt la mi "
    "ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so af oc ka be tg sd "
    "gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su"
)
LANGUAGES = tuple(_LANGUAGE_CODES.split())
TIMESTAMPS = 1501
SPECIALS = (
    "<|endoftext|>",
    "<|startoftranscript|>",
    *(f"<|{code}|>" for code in LANGUAGES),
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nospeech|>",
    "<|notimestamps|>",
    *(f"<|{0.02 * i:.2f}|>" for i in range(TIMESTAMPS)),
)
VOCAB = END_OF_TEXT + len(SPECIALS)
ID = {token: END_OF_TEXT + index for index, token in enumerate(SPECIALS[:-TIMESTAMPS])}


def build_tokenizer(folder: Path) -> None:
    """tokenizer.json with Whisper's 51865 ids: the tests' byte-level BPE, filler text entries ``<|tN|>`` (never
    produced by encoding, decoded as their own text) up to END_OF_TEXT, then the special tokens as added tokens;
    tokenizer_config.json naming ``<|endoftext|>`` as Whisper's does."""
    from decoctl.testing import _tokenizer

    with tempfile.TemporaryDirectory() as scratch:
        trained = json.loads(_tokenizer.build_tokenizer(Path(scratch), vocab_size=849).read_text(encoding="utf-8"))
    vocab: dict[str, int] = trained["model"]["vocab"]
    for index in range(len(vocab), END_OF_TEXT):
        vocab[f"<|t{index}|>"] = index
    base = [t for t in trained["added_tokens"] if t["id"] < END_OF_TEXT]
    trained["added_tokens"] = base + [
        {
            "id": END_OF_TEXT + index,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for index, token in enumerate(SPECIALS)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(trained), encoding="utf-8")
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": TARGET_POSITIONS,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def build_model(seed: int) -> Any:
    """WhisperForConditionalGeneration with whisper-tiny's shapes, random weights from ``seed``, and Whisper's
    generation settings (language and task tables, ``<|endoftext|>`` suppressed)."""
    import torch
    import transformers

    config = transformers.WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=MEL_BINS,
        d_model=D_MODEL,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN,
        max_source_positions=SOURCE_POSITIONS,
        max_target_positions=TARGET_POSITIONS,
        decoder_start_token_id=ID["<|startoftranscript|>"],
        eos_token_id=END_OF_TEXT,
        pad_token_id=END_OF_TEXT,
        bos_token_id=END_OF_TEXT,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    generation = model.generation_config
    generation.decoder_start_token_id = ID["<|startoftranscript|>"]
    generation.eos_token_id = generation.pad_token_id = generation.bos_token_id = END_OF_TEXT
    generation.is_multilingual = True
    generation.lang_to_id = {f"<|{code}|>": ID[f"<|{code}|>"] for code in LANGUAGES}
    generation.task_to_id = {"transcribe": ID["<|transcribe|>"], "translate": ID["<|translate|>"]}
    generation.no_timestamps_token_id = ID["<|notimestamps|>"]
    generation.max_initial_timestamp_index = 50
    generation.max_length = TARGET_POSITIONS
    # random weights may end at any step (the bench's -n decides every generation's length) and write timestamps
    # after <|notimestamps|>, as a trained model does not
    timestamps = ID["<|notimestamps|>"] + 1
    generation.suppress_tokens = [END_OF_TEXT, *range(timestamps, timestamps + TIMESTAMPS)]
    generation.begin_suppress_tokens = None
    generation.forced_decoder_ids = None
    return model


def speech_like(seconds: float, rng: np.random.Generator) -> np.ndarray:
    """float32[samples] in [-1, 1]: syllables of 120-300 ms on a pitch wandering around 90-220 Hz, their harmonics
    shaped by two moving formants, pauses between words, and a faint noise floor."""
    samples = int(seconds * SAMPLING_RATE)
    out = np.zeros(samples, np.float64)
    position = int(0.2 * SAMPLING_RATE)
    base = rng.uniform(90, 220)
    while position < samples - SAMPLING_RATE // 10:
        length = int(rng.uniform(0.12, 0.3) * SAMPLING_RATE)
        length = min(length, samples - position)
        t = np.arange(length) / SAMPLING_RATE
        pitch = base * (1 + 0.08 * np.sin(2 * np.pi * rng.uniform(1, 4) * t + rng.uniform(0, 2 * np.pi)))
        phase = 2 * np.pi * np.cumsum(pitch) / SAMPLING_RATE
        formants = rng.uniform(300, 900), rng.uniform(900, 2500)
        voiced = np.zeros(length)
        for harmonic in range(1, 30):
            frequency = harmonic * pitch.mean()
            if frequency > SAMPLING_RATE / 2:
                break
            gain = sum(np.exp(-(((frequency - f) / 150) ** 2)) for f in formants) + 0.05
            voiced += gain / harmonic * np.sin(harmonic * phase)
        envelope = np.sin(np.pi * np.arange(length) / length) ** 2
        out[position : position + length] += voiced * envelope
        position += length
        if rng.random() < 0.25:  # a pause between words
            position += int(rng.uniform(0.1, 0.4) * SAMPLING_RATE)
    out += rng.normal(0, 0.003, samples)
    out *= 0.5 / max(float(np.abs(out).max()), 1e-9)
    return out.astype(np.float32)


def write_wav(path: Path, samples: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(SAMPLING_RATE)
        writer.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


def write_audio(out: Path, seed: int) -> Path:
    """The recordings and the bench's prompts file; its path."""
    rng = np.random.default_rng(seed)
    records = []
    for index, seconds in enumerate(DURATIONS, 1):
        name = f"audio/speech-{index}.wav"
        write_wav(out / name, speech_like(seconds, rng))
        records.append({"audio": name, "language": "en"})
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return prompts


def export(out: Path, seed: int) -> None:
    """The checkpoint under out/hf and optimum-onnx's export under out/onnx, with the files decoctl reads beside it
    (the export writes generation_config.json from config.json alone, so the checkpoint's replaces it)."""
    import transformers
    from optimum.exporters.onnx import main_export

    source, folder = out / "hf", out / "onnx"
    for stale in (source, folder):
        shutil.rmtree(stale, ignore_errors=True)
    model = build_model(seed)
    model.save_pretrained(source)
    transformers.WhisperFeatureExtractor(feature_size=MEL_BINS).save_pretrained(source)
    build_tokenizer(source)
    main_export(str(source), output=folder, task="automatic-speech-recognition-with-past", do_validation=False)
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        shutil.copy(source / name, folder / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT.relative_to(REPO)})")
    parser.add_argument("--seed", type=int, default=SEED, help="the weights' and the recordings' seed")
    parser.add_argument("--audio-only", action="store_true", help="write the recordings and prompts, no model")
    args = parser.parse_args(argv)
    prompts = write_audio(args.out, args.seed)
    if not args.audio_only:
        export(args.out, args.seed)
    sys.stderr.write(f"wrote {args.out}/hf, {args.out}/onnx and {prompts}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
