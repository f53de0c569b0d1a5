"""The parts of an encoder-decoder model beside its stepping decoder: the encoder and the first-pass decoder.

Optimum exports T5, BART and Marian as several graphs (see spec.EncoderDecoderParts): the encoder, a decoder for
the first pass from an empty cache (it computes the cross-attention KV from the encoder's output) and a decoder
for every later pass (it takes that KV as ``past_key_values.N.encoder.*``), or one merged decoder holding both
behind ``use_cache_branch``. The loader opens each file once; this module checks what the graphs take and give
against what the decoder runner binds (decoctl.model._decoder_runner), and holds the sessions.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import onnxruntime as ort

from decoctl.errors import ModelLoadError
from decoctl.model._audio_features import AudioFeatures
from decoctl.model._kv_cache import graph_dtype
from decoctl.model._spec import SEQ2SEQ_EXPORT, EncoderDecoderParts, ModelSpec

__all__ = ["Encoder", "read_encoder"]

#: token ids and masks: what the runner feeds
_INT64 = "tensor(int64)"


@attrs.frozen(kw_only=True)
class Encoder:
    """An encoder-decoder model's encoder and first-pass decoder, opened (``LoadedModel.encoder``).

    ``session``: the encoder. ``first``: the decoder that runs a pass from an empty cache (the model's own
    session where the decoder is merged). ``hidden_size`` / ``hidden_dtype``: the width and element type of the
    encoder's output. ``first_takes_hidden`` / ``step_takes_hidden``: whether each decoder graph has the
    ``encoder_hidden_states`` input (a with-past decoder often has not: the cross-attention KV replaces it).
    ``step_takes_mask``: whether the stepping decoder takes ``encoder_attention_mask``. ``cross_heads`` /
    ``cross_head_size``: the shape of the cross-attention KV, [1, heads, source, head_size] per layer.
    """

    parts: EncoderDecoderParts
    session: ort.InferenceSession
    first: ort.InferenceSession
    hidden_size: int
    hidden_dtype: np.dtype[Any]
    first_inputs: frozenset[str]
    step_inputs: frozenset[str]
    cross_heads: int
    cross_head_size: int
    #: a speech encoder's feature extractor (its input is ``audio.features(window)``); None for a text encoder
    audio: AudioFeatures | None = None

    def dry_source(self, tokens: np.ndarray) -> np.ndarray:
        """What a load-time dry run encodes: ``tokens`` for a text encoder, one window of silence's features for a
        speech encoder."""
        if self.audio is None:
            return tokens
        return self.audio.features(np.zeros(0, np.float32))

    def describe(self) -> list[str]:
        """What ``decoctl models info`` prints about the parts, a line each."""
        parts = self.parts
        first = "the merged decoder's no-past branch" if parts.merged else parts.first_file.name
        if self.audio is not None:
            audio = self.audio
            encoder = (
                f"encoder: {parts.encoder_file.name} (input_features [{audio.feature_size}, {audio.frames}] -> "
                f"{parts.encoder_output_name} [{parts.source_length}, {self.hidden_size}]), run once per "
                f"{audio.chunk_length} s of audio at {audio.sampling_rate} Hz"
            )
        else:
            encoder = (
                f"encoder: {parts.encoder_file.name} (input_ids, attention_mask -> {parts.encoder_output_name} "
                f"[source, {self.hidden_size}]), run once per generation; source up to {parts.source_length} tokens"
            )
        return [
            encoder,
            f"decoder first pass: {first}, writes the cross-attention KV ({self.cross_heads} heads x "
            f"{self.cross_head_size} per layer), bound once for every later pass",
            f"decoder starts from token {parts.decoder_start_token_id} (decoder_start_token_id)",
        ]


def read_encoder(
    spec: ModelSpec, encoder: ort.InferenceSession, first: ort.InferenceSession, step: ort.InferenceSession
) -> Encoder:
    """Check the three graphs (``first`` is ``step`` for a merged decoder) against what the runner binds and return
    the Encoder record; ModelLoadError names the file and what it lacks."""
    parts = spec.encoder_decoder
    if parts is None:
        raise ModelLoadError(f"{spec.path} is not an encoder-decoder model")
    inputs = {i.name: i for i in encoder.get_inputs()}
    outputs = {o.name: o for o in encoder.get_outputs()}
    audio = _read_speech(spec, inputs) if parts.speech else None
    needed = [] if audio is not None else [parts.encoder_ids_name, parts.encoder_mask_name]
    missing = [n for n in needed if n not in inputs] + [n for n in (parts.encoder_output_name,) if n not in outputs]
    if missing:
        takes = ", ".join(f"{i.name} {i.type}" for i in encoder.get_inputs())
        speech = " (a speech or vision encoder: decoctl runs text encoders)" if "input_features" in inputs else ""
        raise ModelLoadError(
            f"{parts.encoder_file} lacks {missing}: it takes {takes}{speech}; decoctl feeds token ids and their mask "
            f"and reads {parts.encoder_output_name}: export a text-to-text model with {SEQ2SEQ_EXPORT}"
        )
    wrong = [f"{n} is {inputs[n].type}" for n in needed if inputs[n].type != _INT64]
    hidden = outputs[parts.encoder_output_name]
    hidden_dtype = graph_dtype(hidden.type)
    width = hidden.shape[-1] if hidden.shape else None
    if hidden_dtype is None:
        wrong.append(f"{hidden.name} is {hidden.type}")
    if wrong:
        raise ModelLoadError(
            f"{parts.encoder_file} has inputs/outputs of types decoctl does not bind ({'; '.join(wrong)}): token ids "
            "and mask are int64, the output float32, float16 or bfloat16; re-export it"
        )
    if not isinstance(width, int):
        raise ModelLoadError(
            f"{parts.encoder_file} gives {hidden.name} with shape {hidden.shape}: decoctl needs its width fixed in "
            "the graph; re-export it"
        )
    first_inputs = {i.name: i for i in first.get_inputs()}
    first_outputs = {o.name for o in first.get_outputs()}
    step_inputs = {i.name: i for i in step.get_inputs()}
    first_file = parts.first_file
    missing = [n for n in (spec.input_ids_name, parts.hidden_input_name) if n not in first_inputs]
    missing += [spec.logits_name] if spec.logits_name not in first_outputs else []
    for layer in range(spec.num_layers):
        missing += [
            n for n in (*spec.present_names(layer), *parts.present_cross_names(layer)) if n not in first_outputs
        ]
        missing += [n for n in parts.past_cross_names(layer) if n not in step_inputs]
    if missing:
        raise ModelLoadError(
            f"{first_file} and {spec.onnx_file} lack the inputs/outputs {missing[:6]} that an encoder-decoder export "
            f"has ({spec.num_layers} decoder layers in config.json): the files do not belong together, or the "
            f"export is not Optimum's; export the model again with {SEQ2SEQ_EXPORT}"
        )
    node = first_inputs[parts.hidden_input_name]
    if node.type != hidden.type or (isinstance(node.shape[-1], int) and node.shape[-1] != width):
        raise ModelLoadError(
            f"{first_file} takes {parts.hidden_input_name} as {node.type}{node.shape} but {parts.encoder_file} gives "
            f"{hidden.type}{hidden.shape}: the encoder belongs to another export; copy the files of one export"
        )
    shape = list(step_inputs[parts.past_cross_names(0)[0]].shape)
    heads, size = (shape[1], shape[3]) if len(shape) == 4 else (None, None)
    if not isinstance(heads, int) or not isinstance(size, int):
        heads, size = spec.num_kv_heads, spec.head_size
    return Encoder(
        parts=parts,
        session=encoder,
        first=first,
        hidden_size=width,
        hidden_dtype=hidden_dtype,
        first_inputs=frozenset(first_inputs),
        step_inputs=frozenset(step_inputs),
        cross_heads=heads,
        cross_head_size=size,
        audio=audio,
    )


def _read_speech(spec: ModelSpec, inputs: dict[str, Any]) -> AudioFeatures:
    """A speech encoder's feature extractor, checked against the encoder's ``input_features`` input (mel bins and
    frames fixed in the graph must be the extractor's)."""
    parts = spec.encoder_decoder
    assert parts is not None
    audio = AudioFeatures.from_folder(spec.path)
    node = inputs.get(parts.encoder_ids_name)
    if node is None or node.type != "tensor(float)" or len(node.shape) != 3:
        takes = ", ".join(f"{i.name} {i.type}{i.shape}" for i in inputs.values())
        raise ModelLoadError(
            f"{parts.encoder_file} takes {takes}; a Whisper encoder takes {parts.encoder_ids_name} "
            f"float32[batch, mel, frames]: export it with optimum-cli export onnx -m MODEL --task "
            "automatic-speech-recognition-with-past OUT"
        )
    expected = (audio.feature_size, audio.frames)
    for axis, (have, want) in enumerate(zip(node.shape[1:], expected, strict=True), start=1):
        if isinstance(have, int) and have != want:
            raise ModelLoadError(
                f"{parts.encoder_file} takes {parts.encoder_ids_name} with axis {axis} of {have} but "
                f"{spec.path / 'preprocessor_config.json'} makes {want} (feature_size {audio.feature_size}, "
                f"{audio.frames} frames): the feature extractor belongs to another model; copy the export's own"
            )
    return audio
