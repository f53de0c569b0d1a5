"""Tiny random-weight Whisper models, exported in Optimum's speech-to-text layout with torch.onnx.export.

optimum-onnx needs transformers < 4.58 (the ``test-exports`` environment), so these tests export in the main
environment themselves, writing Optimum's file names and input/output names exactly:

- ``encoder_model.onnx``: ``input_features`` float32[batch, mel, 3000] -> ``last_hidden_state``;
- ``decoder_model.onnx``: ``input_ids``, ``encoder_hidden_states`` -> ``logits``, ``present.N.decoder.key/value``,
  ``present.N.encoder.key/value``;
- ``decoder_with_past_model.onnx``: ``input_ids`` and ``past_key_values.N.decoder.key/value`` and
  ``past_key_values.N.encoder.key/value`` -> ``logits``, ``present.N.decoder.key/value``.

The folder also holds config.json, generation_config.json (with Whisper's language and task tables, ids inside the
tests' vocabulary), preprocessor_config.json (WhisperFeatureExtractor's) and the tests' byte-level tokenizer.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from decoctl.testing._tokenizer import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tokenizer, write_tokenizer_config

VOCAB = 384
#: Whisper's special tokens, the last ids of the tests' vocabulary: transformers' Whisper generate reads every id
#: after no_timestamps_token_id as a timestamp, so none may follow it
START, ENGLISH, FRENCH, TRANSCRIBE, TRANSLATE, NO_TIMESTAMPS = range(VOCAB - 6, VOCAB)
TARGET_POSITIONS = 96
OPSET = 17
#: seeds whose random weights greedy-decode the tests' audio into more than one repeated token
SEEDS = {"whisper": 5, "whisper-draft": 7}


def hf_config(name: str) -> Any:
    """ "whisper" (two decoder layers, width 32) or "whisper-draft" (one layer, width 16)."""
    import transformers

    width, layers = (16, 1) if name.endswith("-draft") else (32, 2)
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
        max_target_positions=TARGET_POSITIONS,
        decoder_start_token_id=START,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
        bos_token_id=EOS_TOKEN_ID,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        init_std=1.0,
    )
    config._attn_implementation = "eager"
    return config


def generation_config(model: Any) -> Any:
    """Whisper's generation settings with the language and task tables (transformers' generate reads them)."""
    config = model.generation_config
    config.decoder_start_token_id = START
    config.eos_token_id = EOS_TOKEN_ID
    config.pad_token_id = PAD_TOKEN_ID
    config.is_multilingual = True
    config.lang_to_id = {"<|en|>": ENGLISH, "<|fr|>": FRENCH}
    config.task_to_id = {"transcribe": TRANSCRIBE, "translate": TRANSLATE}
    config.no_timestamps_token_id = NO_TIMESTAMPS
    config.suppress_tokens = None
    config.begin_suppress_tokens = None
    config.forced_decoder_ids = None
    return config


def _flat_cache(cache: Any, layers: int, *, cross: bool) -> list[Any]:
    flat = []
    for layer in range(layers):
        own, other = cache.self_attention_cache.layers[layer], cache.cross_attention_cache.layers[layer]
        flat += [own.keys, own.values] + ([other.keys, other.values] if cross else [])
    return flat


def _names(prefix: str, layers: int, parts: tuple[str, ...]) -> list[str]:
    return [f"{prefix}.{layer}.{part}.{kv}" for layer in range(layers) for part in parts for kv in ("key", "value")]


def export(model: Any, folder: Path) -> None:
    """Write ``model`` (a WhisperForConditionalGeneration in eval mode) as Optimum's three graphs."""
    import torch
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    layers = model.config.decoder_layers

    class Part(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

    class Encoder(Part):
        def forward(self, input_features: Any) -> Any:
            return self.model.get_encoder()(input_features=input_features).last_hidden_state

    class Decoder(Part):
        def forward(self, input_ids: Any, encoder_hidden_states: Any) -> Any:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            out = self.model(
                encoder_outputs=(encoder_hidden_states,),
                decoder_input_ids=input_ids,
                past_key_values=cache,
                use_cache=True,
            )
            return (out.logits, *_flat_cache(out.past_key_values, layers, cross=True))

    class DecoderWithPast(Part):
        def forward(self, input_ids: Any, *past: Any) -> Any:
            cache = EncoderDecoderCache([tuple(past[4 * i : 4 * i + 4]) for i in range(layers)])
            hidden = past[2].new_zeros((past[2].shape[0], 1, model.config.d_model))  # unread: the cross KV is past
            out = self.model(
                encoder_outputs=(hidden,), decoder_input_ids=input_ids, past_key_values=cache, use_cache=True
            )
            return (out.logits, *_flat_cache(out.past_key_values, layers, cross=False))

    batch, source, target = "batch_size", "encoder_sequence_length", "decoder_sequence_length"
    past_length = "past_decoder_sequence_length"
    features = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 80, 3000)).astype(np.float32))
    decoder_ids = torch.tensor([[START, ENGLISH, TRANSCRIBE]])
    step_ids = torch.tensor([[9, 4]])
    presents = _names("present", layers, ("decoder", "encoder"))
    pasts = _names("past_key_values", layers, ("decoder", "encoder"))
    step_presents = _names("present", layers, ("decoder",))
    folder.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoder = Encoder().eval()
        hidden = encoder(features)
        torch.onnx.export(
            encoder,
            (features,),
            str(folder / "encoder_model.onnx"),
            input_names=["input_features"],
            output_names=["last_hidden_state"],
            dynamic_axes={"input_features": {0: batch}, "last_hidden_state": {0: batch}},
            dynamo=False,
            opset_version=OPSET,
        )
        decoder = Decoder().eval()
        first = decoder(decoder_ids, hidden)
        axes = {
            "input_ids": {0: batch, 1: target},
            "encoder_hidden_states": {0: batch, 1: source},
            "logits": {0: batch, 1: target},
            **{n: {0: batch, 2: source if ".encoder." in n else target} for n in presents},
        }
        torch.onnx.export(
            decoder,
            (decoder_ids, hidden),
            str(folder / "decoder_model.onnx"),
            input_names=["input_ids", "encoder_hidden_states"],
            output_names=["logits", *presents],
            dynamic_axes=axes,
            dynamo=False,
            opset_version=OPSET,
        )
        axes = {
            "input_ids": {0: batch, 1: target},
            "logits": {0: batch, 1: target},
            **{n: {0: batch, 2: source if ".encoder." in n else past_length} for n in pasts},
            **{n: {0: batch, 2: f"{past_length} + {target}"} for n in step_presents},
        }
        torch.onnx.export(
            DecoderWithPast().eval(),
            (step_ids, *first[1:]),
            str(folder / "decoder_with_past_model.onnx"),
            input_names=["input_ids", *pasts],
            output_names=["logits", *step_presents],
            dynamic_axes=axes,
            dynamo=False,
            opset_version=OPSET,
        )
    model.eval()


class WhisperExports:
    """The session's Whisper exports, each made once on first use under ``root``: ``model(name)`` is the transformers
    model (the oracle), ``folder(name)`` its export."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._models: dict[str, Any] = {}
        self._folders: dict[str, Path] = {}

    def model(self, name: str) -> Any:
        if name not in self._models:
            import torch
            import transformers

            torch.manual_seed(SEEDS[name])
            model = transformers.WhisperForConditionalGeneration(hf_config(name)).eval()
            generation_config(model)
            self._models[name] = model
        return self._models[name]

    def greedy(self, name: str, audio: np.ndarray, max_new_tokens: int, **generate: Any) -> list[int]:
        """transformers' generate() over ``audio`` (float32 samples at 16 kHz) without sampling: the tokens after
        the decoder's prompt (start, language, task, no-timestamps)."""
        import torch
        import transformers

        torch.set_num_threads(1)
        features = transformers.WhisperFeatureExtractor()(audio, sampling_rate=16000, return_tensors="pt")
        with torch.no_grad():
            out = self.model(name).generate(
                features["input_features"], max_new_tokens=max_new_tokens, do_sample=False, **generate
            )
        tokens = [int(t) for t in out[0]]
        while tokens and tokens[0] in (START, ENGLISH, FRENCH, TRANSCRIBE, TRANSLATE, NO_TIMESTAMPS):
            tokens.pop(0)
        return tokens

    def reference(
        self,
        name: str,
        audio: np.ndarray,
        max_new_tokens: int,
        prompt: list[int],
        suppress: tuple[int, ...] = (),
        begin_suppress: tuple[int, ...] = (),
    ) -> list[int]:
        """Greedy decoding with the transformers model's forward, the whole sequence each step (no cache): the
        tokens after ``prompt``; ``suppress`` never chosen, ``begin_suppress`` not first."""
        import torch
        import transformers

        torch.set_num_threads(1)
        features = transformers.WhisperFeatureExtractor()(audio, sampling_rate=16000, return_tensors="pt")
        model = self.model(name)
        ids = list(prompt)
        with torch.no_grad():
            encoded = model.get_encoder()(features["input_features"])
            for _ in range(max_new_tokens):
                logits = model(encoder_outputs=encoded, decoder_input_ids=torch.tensor([ids])).logits[0, -1]
                banned = [*suppress, *(begin_suppress if len(ids) == len(prompt) else ())]
                logits[banned] = -float("inf")
                ids.append(int(logits.argmax()))
                if ids[-1] == EOS_TOKEN_ID:
                    break
        return ids[len(prompt) :]

    def folder(self, name: str) -> Path:
        if name not in self._folders:
            import transformers

            folder = self.root / name
            model = self.model(name)
            export(model, folder)
            model.config.save_pretrained(folder)
            model.generation_config.save_pretrained(folder)
            transformers.WhisperFeatureExtractor().save_pretrained(folder)
            build_tokenizer(folder, vocab_size=VOCAB)
            write_tokenizer_config(folder, model_max_length=TARGET_POSITIONS)
            self._folders[name] = folder
        return self._folders[name]
