"""A model folder's pipeline description lowered, by phase, to what runs: one function for every layout.

Every folder runs a description (decoctl.model._pipeline): its pipeline.json, else the one its config implies
(onnxruntime-genai's vision sections; an encoder-decoder export; a plain decoder). :func:`open_sessions` opens each
session it names (the decoder is the loader's, already open), :func:`lower` checks them against the description
(every edge, port, type and fixed size; the phase order; one decoder) and turns each phase into its runner's part:

- ``generation``: the chain of once-per-input sessions, run by decoctl.model._pipeline_executor.OncePerInput. Its
  output feeds either a chunk-phase embedding stage (a vision-language model: decoctl.model._vision) or the
  decoder's cross-attention (an encoder-decoder model's encoder: decoctl.model._encoder_decoder).
- ``chunk``: an embedding stage (it turns ids and image features into the decoder's ``inputs_embeds``), or a session
  sharing the decoder's KV cache: an encoder-decoder's first-pass decoder (the one the encoder feeds) or a split
  export's prefill graph (decoctl.model._prefill).
- ``step``: the decoder, run by the runner every forward.

This happens once, at load: the step path binds what was lowered and does no work of its own per step. A rewind
truncates the decoder's KV cache only; nothing of the generation phase runs again until a new input comes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import onnxruntime as ort

from decoctl.errors import ModelLoadError
from decoctl.logs import get_logger
from decoctl.model import _pipeline as pipelines
from decoctl.model._capabilities import AUX_HIDDEN_STATES, HIDDEN_STATES, Capabilities
from decoctl.model._encoder_decoder import Encoder, read_encoder
from decoctl.model._gemma3_vision import gemma3_images
from decoctl.model._pipeline_executor import OncePerInput, check_phases
from decoctl.model._prefill import PrefillGraph, read_prefill
from decoctl.model._qwen_vl import qwen_vision
from decoctl.model._spec import ModelSpec
from decoctl.model._vision import ImagePreprocessor, TokenEmbedder, VisionParts, read_embedding_table
from decoctl.model._vision_families import vision_family

__all__ = ["Lowered", "description_of", "lower", "open_sessions"]

log = get_logger(__name__)

#: opens one graph file as a session (the loader's, with its options and provider)
OpenSession = Callable[[Path], ort.InferenceSession]


@attrs.frozen(kw_only=True)
class Lowered:
    """What a description lowers to: the parts beside the decoder (None where the layout has none), the spec (an
    encoder-decoder's parts named as the description names them) and, per hidden-state tap the decoder gives,
    why a controller reading it cannot have it on every forward (``tap_gaps``: capability -> the reason and fix)."""

    description: pipelines.Pipeline
    spec: ModelSpec
    encoder: Encoder | None = None
    vision: VisionParts | None = None
    prefill: PrefillGraph | None = None
    tap_gaps: Mapping[str, str] = attrs.field(factory=dict)


def description_of(spec: ModelSpec) -> pipelines.Pipeline:
    """The description the folder runs: its pipeline.json, else its genai_config.json's vision sections, else the
    preset its layout implies (encoder-decoder, or decoder-only)."""
    found = pipelines.read_pipeline(spec.path)
    if found is not None:
        return found
    decoder = _relative(spec, spec.onnx_file)
    parts = spec.encoder_decoder
    if parts is not None:
        return pipelines.encoder_decoder(
            _relative(spec, parts.encoder_file),
            decoder,
            first=None if parts.merged else _relative(spec, parts.first_file),
            output=parts.encoder_output_name,
            hidden_input=parts.hidden_input_name,
            origin=f"{spec.path} (the encoder-decoder preset)",
        )
    return pipelines.decoder_only(decoder, origin=f"{spec.path} (the decoder-only preset)")


def _relative(spec: ModelSpec, file: Path) -> str:
    try:
        return str(file.relative_to(spec.path))
    except ValueError:
        return str(file)


def open_sessions(
    spec: ModelSpec, description: pipelines.Pipeline, decoder: ort.InferenceSession, open_session: OpenSession
) -> dict[str, ort.InferenceSession]:
    """Each session the description names, opened once (the step-phase one is ``decoder``, which the loader opened
    from ``spec.onnx_file``; a session naming that same file shares it)."""
    steps = [s for s in description.stages if s.phase == "step"]
    if len(steps) != 1:
        raise ModelLoadError(
            f"{description.origin}: a pipeline has exactly one step-phase session (the decoder, run every forward); "
            f"this one has {[s.name for s in steps] or 'none'}: give the decoder phase 'step' and the others "
            "'generation' or 'chunk'"
        )
    step = steps[0]
    if (spec.path / step.file).resolve() != spec.onnx_file.resolve():
        config = "genai_config.json's" if spec.layout == "genai" else "the folder's"
        raise ModelLoadError(
            f"{description.origin}: session {step.name!r} names {step.file} but {config} decoder is "
            f"{spec.onnx_file.name}: name the same file"
        )
    sessions: dict[str, ort.InferenceSession] = {}
    for stage in description.stages:
        path = spec.path / stage.file
        if stage is step or path.resolve() == spec.onnx_file.resolve():
            sessions[stage.name] = decoder
            continue
        if not path.is_file():
            raise ModelLoadError(f"{description.origin}: session {stage.name!r} names {path}, which does not exist")
        sessions[stage.name] = open_session(path)
    return sessions


def lower(
    spec: ModelSpec,
    description: pipelines.Pipeline,
    sessions: Mapping[str, ort.InferenceSession],
    capabilities: Capabilities,
) -> Lowered:
    """Check ``description`` against its opened ``sessions`` and lower it by phase (the module docstring);
    ModelLoadError naming the file, the session or edge, and the fix for a description decoctl cannot honour."""
    description.validate({name: pipelines.ports_of(session) for name, session in sessions.items()})
    check_phases(description)
    origin = description.origin
    step = next(s for s in description.stages if s.phase == "step")
    chain = OncePerInput(description, sessions) if any(s.phase == "generation" for s in description.stages) else None
    chunk = [s for s in description.stages if s.phase == "chunk"]
    writers = [s for s in chunk if s.shares_kv]
    embedders = [s for s in chunk if not s.shares_kv]
    for kind, found in (("session sharing the decoder's KV cache", writers), ("embedding session", embedders)):
        if len(found) > 1:
            raise ModelLoadError(
                f"{origin}: the chunk phase holds one {kind}; this description has {[s.name for s in found]}: "
                "keep one of them (export the others into it)"
            )
    writer = writers[0] if writers else None
    embedder = embedders[0] if embedders else None
    targets = {e.ends()[1][0] for e in description.edges if chain is not None and e.ends()[0][0] == chain.last}
    embeds = capabilities.inputs_embeds
    if embeds is not None and (step.name, embeds) not in {e.ends()[1] for e in description.edges}:
        raise ModelLoadError(
            f"{spec.onnx_file} takes {embeds} instead of token ids, but {spec.path} describes no stage that makes "
            "them: add the embedding (and vision) sections to genai_config.json, or a pipeline.json "
            "(docs/ARCHITECTURE.md)"
        )
    if chain is not None and embedder is not None and embedder.name in targets:
        if writer is not None:
            raise ModelLoadError(
                f"{origin}: a vision-language pipeline (once-per-image sessions into {embedder.name!r}) with a "
                f"session sharing the decoder's KV cache ({writer.name!r}) is not lowered by decoctl: remove "
                f"{writer.name!r}"
            )
        vision = _vision_parts(spec, description, dict(sessions), capabilities, chain, embedder)
        return Lowered(description=description, spec=spec, vision=vision)
    if chain is not None and targets & {step.name, *(w.name for w in writers)}:
        return _encoder_parts(spec, description, sessions, chain, writer, step.name)
    if spec.encoder_decoder is not None:
        raise ModelLoadError(
            f"{origin}: {spec.path} is an encoder-decoder export, but no once-per-input session of this description "
            f"feeds the decoder's cross-attention ({_phases(description)}): add the encoder, phase 'generation', with "
            f"an edge from its output to the decoder's {spec.encoder_decoder.hidden_input_name} (`decoctl models "
            "pipeline` on the folder without its pipeline.json prints the preset to start from)"
        )
    if chain is not None or embedder is not None:
        raise ModelLoadError(
            f"{origin}: decoctl lowers once-per-input sessions into an embedding session (a vision-language model) "
            "or into the decoder's cross-attention (an encoder-decoder model), and a chunk-phase session as an "
            f"embedding or a prefill sharing the decoder's KV; this description has {_phases(description)}: "
            "connect the once-per-input chain's last output to one of those, or see docs/ARCHITECTURE.md"
        )
    if writer is not None:
        prefill = read_prefill(spec, sessions[writer.name], sessions[step.name], str(spec.path / writer.file))
        taps = ((HIDDEN_STATES, capabilities.hidden_states), (AUX_HIDDEN_STATES, capabilities.aux_hidden_states))
        gaps = {
            tap: (
                f"{origin}: session {writer.name!r} ({writer.file}) runs every multi-token forward and gives no "
                f"{tap} there (decoctl reads logits only from a prefill chunk), so a controller reading the "
                f"decoder's {tap} would see none after a prompt or a verification: remove {writer.name!r} from the "
                f"pipeline (the decoder then runs every forward), or use a controller that reads no {tap}"
            )
            for tap, given in taps
            if given is not None
        }
        return Lowered(description=description, spec=spec, prefill=prefill, tap_gaps=gaps)
    return Lowered(description=description, spec=spec)


def _phases(description: pipelines.Pipeline) -> str:
    return ", ".join(f"{s.name} ({s.phase}{', shares_kv' if s.shares_kv else ''})" for s in description.stages)


def _encoder_parts(
    spec: ModelSpec,
    description: pipelines.Pipeline,
    sessions: Mapping[str, ort.InferenceSession],
    chain: OncePerInput,
    writer: pipelines.Stage | None,
    decoder: str,
) -> Lowered:
    """The once-per-input chain feeding the decoder's cross-attention: an encoder-decoder model's encoder, and the
    first-pass decoder (``writer``, or the merged decoder itself)."""
    origin = description.origin
    parts = spec.encoder_decoder
    if parts is None:
        raise ModelLoadError(
            f"{origin}: the once-per-input session {chain.last!r} feeds the decoder's cross-attention, but "
            f"{spec.path} is not an encoder-decoder export (config.json with is_encoder_decoder, Optimum's "
            "layout): export the model as one, or feed the chain into an embedding session"
        )
    if len(chain.order) > 1:
        # the decoder runner binds the encoder's input and output in place (IO binding), which a chain of several
        # sessions does not offer
        raise ModelLoadError(
            f"{origin}: an encoder-decoder's once-per-input part is one session (the encoder), which the decoder "
            f"runner binds in place; this description chains {list(chain.order)}: export them as one graph"
        )
    encoder = chain.last
    reader = writer.name if writer is not None else decoder
    edge = next(e for e in description.edges if e.ends()[0][0] == encoder and e.ends()[1][0] == reader)
    (_, output), (_, hidden_input) = edge.ends()
    first = sessions[reader]
    parts = attrs.evolve(
        parts,
        encoder_file=spec.path / description.stage(encoder).file,
        first_file=spec.path / description.stage(reader).file,
        merged=writer is None,
        encoder_output_name=output,
        hidden_input_name=hidden_input,
    )
    spec = attrs.evolve(spec, encoder_decoder=parts)
    found = read_encoder(spec, sessions[encoder], first, sessions[decoder])
    return Lowered(description=description, spec=spec, encoder=found)


def _vision_parts(
    spec: ModelSpec,
    description: pipelines.Pipeline,
    sessions: dict[str, ort.InferenceSession],
    capabilities: Capabilities,
    chain: OncePerInput,
    embedding: pipelines.Stage,
) -> VisionParts:
    """The once-per-image chain and the embedding stage of a vision-language model, with its image preprocessor."""
    if capabilities.inputs_embeds is None:
        raise ModelLoadError(
            f"{description.origin}: the embedding stage feeds the decoder, but {spec.onnx_file} takes token ids; "
            "export the decoder with the builder's exclude_embeds=true"
        )
    if spec.image_token_id is None:
        raise ModelLoadError(f"{spec.path / 'genai_config.json'}: a vision-language model needs model.image_token_id")
    edge = {e.ends()[1]: e.ends()[0] for e in description.edges}
    feature_input = next(t[1] for t in edge if t[0] == embedding.name and edge[t][0] == chain.last)
    feature_output = edge[(embedding.name, feature_input)][1]
    step = next(s.name for s in description.stages if s.phase == "step")
    embeds_output = edge[(step, capabilities.inputs_embeds)][1]
    ids_input = embedding.host_inputs[0]
    session = sessions[embedding.name]
    table = read_embedding_table(spec.path / embedding.file, ids_input)
    embedder = TokenEmbedder(
        session, table, image_token=spec.image_token_id, ids=ids_input, features=feature_input, output=embeds_output
    )
    embedder.check_table()
    config_path = spec.path / "genai_config.json"
    family = vision_family(config_path)
    preprocessor = ImagePreprocessor.from_folder(spec.path)
    qwen = qwen_vision(config_path, preprocessor) if family == "qwen2_5_vl" else None
    if (qwen is not None) != (capabilities.position_axes == 3):
        raise ModelLoadError(
            f"{config_path}: model.type {family!r} but {spec.onnx_file}'s {capabilities.position_ids} is "
            f"{'three' if capabilities.position_axes == 3 else 'one'} position(s) a token: the type and the decoder "
            "do not belong together (M-RoPE decoders take int64[3, batch, sequence]); export them together"
        )
    marks, blocks = gemma3_images(spec, capabilities) if family == "gemma3" else (None, None)
    log.debug("decoctl.vision_loaded", model=str(spec.path), family=family, table=embedder.table is not None)
    vision: Any = sessions[chain.last] if len(chain.order) == 1 else chain
    return VisionParts(
        qwen=qwen,
        marks=marks,
        blocks=blocks,
        vision=vision,
        pixel_input=description.stage(chain.order[0]).host_inputs[0],
        feature_output=feature_output,
        embedder=embedder,
        preprocessor=preprocessor,
        image_token=spec.image_token_id,
    )
