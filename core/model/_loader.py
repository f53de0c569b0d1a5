"""Open a model folder: parse its config, start an onnxruntime session, read its capabilities."""

from __future__ import annotations

import contextlib
import numbers
import os
from collections.abc import Mapping
from pathlib import Path

import attrs
import onnxruntime as ort

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.logs import get_logger
from decoctl.model import _huge_pages as pages
from decoctl.model import _kv_layout as kv_layout
from decoctl.model import _lowering as lowering
from decoctl.model import _pipeline as pipelines
from decoctl.model._adapters import AdapterTable
from decoctl.model._capabilities import ATTENTION_BIAS, Capabilities
from decoctl.model._encoder_decoder import Encoder
from decoctl.model._kv_cache import kv_dtype, kv_shape
from decoctl.model._prefill import PrefillGraph
from decoctl.model._providers import CPU, Provider, SessionWithoutFallback
from decoctl.model._ring_cache import DEFAULT_SLACK, RingLayer
from decoctl.model._ring_probe import probe_rings
from decoctl.model._spec import ModelSpec
from decoctl.model._tokenizer import Tokenizer
from decoctl.model._vision import VisionParts
from decoctl.model.graph import _fed_lengths as fed_lengths
from decoctl.model.graph import _logit_rows as logit_rows
from decoctl.model.graph import _lora_stacks as lora_graph
from decoctl.model.graph import _protowire as protowire
from decoctl.model.graph import _window_bias as window_bias

__all__ = ["LoadedModel", "default_threads", "load_model", "session_options"]

log = get_logger(__name__)


#: onnxruntime's session config key for where a graph loaded from memory finds its external data
EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"
#: graph files up to this size are rewritten in memory (onnxruntime-genai's builder keeps weights outside them)
MAX_REWRITTEN_BYTES = 256 << 20


def default_threads() -> int:
    """onnxruntime-genai's default intra-op thread count: one per two cores, at least one."""
    return max(1, (os.cpu_count() or 1) // 2)


def session_options(threads: int | None) -> ort.SessionOptions:
    """The session settings every contender shares, so that comparisons are fair."""
    count = default_threads() if threads is None else threads
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 1:
        raise ConfigError(f"threads={count!r} is not a thread count: give 1 or more (default {default_threads()})")
    cores = os.cpu_count() or 1
    if count > cores:
        # allowed (a benchmark may want it), but threads beyond the cores only wait for each other
        log.warning("decoctl.threads_above_cores", threads=count, cores=cores, hint=f"use {cores} or fewer")
    options = ort.SessionOptions()
    options.intra_op_num_threads = count
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # fatal only: onnxruntime would print its errors (a C++ dump) to stderr before raising them, and decoctl
    # reports every one it raises, with the file and the fix
    options.log_severity_level = 4
    return options


@attrs.frozen(kw_only=True)
class LoadedModel:
    """One opened model: shared by every Sequence that runs it (each Sequence has its own KV cache).

    ``session`` runs the decoder step by step; ``encoder``: an encoder-decoder model's encoder and first-pass
    decoder (decoctl.model._encoder_decoder), None for a decoder-only model; ``vision``: a vision-language model's
    vision encoder, embedding stage and image preprocessor (decoctl.model._vision), None otherwise; ``prefill``: a
    split export's prefill graph, None otherwise.
    """

    name: str
    spec: ModelSpec
    session: ort.InferenceSession
    capabilities: Capabilities
    tokenizer: Tokenizer
    threads: int
    encoder: Encoder | None = None
    vision: VisionParts | None = None
    #: a split export's prefill graph (decoctl.model._prefill): multi-token forwards run it chunk by chunk
    prefill: PrefillGraph | None = None
    #: the execution provider its sessions run on (decoctl.model._providers)
    provider: Provider = CPU
    #: the LoRA slots in the stacked form and the adapters loaded in them (decoctl.model._adapters); None: as exported
    adapters: AdapterTable | None = None
    #: the pipeline description it runs (its pipeline.json or the preset its config implies), as lowered at load
    pipeline: pipelines.Pipeline | None = None
    #: hidden-state taps the decoder gives that a controller cannot read on every forward: capability -> why and
    #: the fix (decoctl.model._lowering; the controller check refuses a controller that needs one)
    tap_gaps: Mapping[str, str] = attrs.field(factory=dict)


def load_model(
    path: str | Path,
    *,
    name: str | None = None,
    threads: int | None = None,
    feed_lengths: bool | None = None,
    huge_pages: bool = False,
    ring_slack: int = DEFAULT_SLACK,
    provider: str | Provider = CPU,
    lora_stacks: bool = False,
) -> LoadedModel:
    """Load a model folder in the onnxruntime-genai or Optimum layout.

    :param path: the folder holding the config, model.onnx and tokenizer.json.
    :param name: a display name (defaults to the folder name).
    :param threads: intra-op threads; None takes onnxruntime-genai's default (cores/2, at least 1).
    :param feed_lengths: remove onnxruntime-genai's attention-mask subgraph and feed GroupQueryAttention's
        sequence lengths directly (decoctl.model.graph._fed_lengths; the same logits, a cheaper step). None: on unless
        the environment sets DECOCTL_FEED_LENGTHS=0.
    :param huge_pages: place the weights for 2 MiB pages (decoctl.model._huge_pages): glibc's mmap threshold is
        raised while the session loads, then the process's large resident memory is madvised into huge pages.
        Both act on the whole process, so they are off unless asked (the command line asks); they make a CPU
        model's step faster and steadier across sessions (huge_pages.py has the measurement).
    :param ring_slack: positions a sliding-window layer with a ring cache keeps beyond its window, the depth of
        the rewinds and the size of the trees that stay exact there (decoctl.model._ring_cache).
    :param provider: the execution provider and its options, ``"openvino"`` or ``"openvino:device_type=CPU"`` or a
        Provider (decoctl.model._providers; default CPU); one this onnxruntime lacks is refused with its package.
    :param lora_stacks: take the LoRA slots in the stacked form, so that rows of different adapters share one Run
        (decoctl.model.graph._lora_stacks; ``adapters`` then holds table 0, the base model); off, the graph as it is.
    """
    spec = ModelSpec.from_folder(path)
    provider = Provider.parse(provider)
    provider.check_installed()
    options = session_options(threads)
    if feed_lengths is None:
        feed_lengths = os.environ.get("DECOCTL_FEED_LENGTHS", "1") not in ("0", "")
    if isinstance(ring_slack, bool) or not isinstance(ring_slack, int) or ring_slack < 0:
        raise ConfigError(f"ring_slack={ring_slack!r} is not a number of positions: give 0 or more")
    rewritten = _without_mask_subgraph(spec) if feed_lengths and spec.layout == "genai" else None
    source = rewritten.model if rewritten else _graph_bytes(spec) if spec.layout == "genai" else None
    windowed = _window_in_bias(spec, source, ring_slack) if source is not None else None
    graph = windowed.model if windowed else rewritten.model if rewritten else None
    graph = _with_logits_from(spec, graph if graph is not None else source, provider) or graph
    # LoRA slots as stacked tables with a per-row index: rows of different adapters in one Run (docs/ADAPTERS.md)
    stacked = (
        lora_graph.rewrite(graph or source or _graph_bytes(spec) or b"", str(spec.onnx_file)) if lora_stacks else None
    )
    graph = stacked.model if stacked else graph
    rings = _ring_layers(spec, source, windowed, ring_slack)
    # what the folder runs: its pipeline.json, or the preset its config implies (decoctl.model._lowering)
    description = lowering.description_of(spec)
    with pages.contiguous_allocations() if huge_pages else contextlib.nullcontext():
        session = _session(spec.onnx_file, graph, options, provider)
        sessions = lowering.open_sessions(
            spec, description, session, lambda file: _session(file, None, options, provider)
        )
    if huge_pages:
        # the weights now sit in onnxruntime's buffers: put them on huge pages (see huge_pages.py for the measurement)
        pages.collapse()
    spec = _with_graph_kv(spec, session)
    past = {name for layer in range(spec.num_layers) for name in spec.past_names(layer)}
    attention = kv_layout.check(spec, source, {i.name: i.shape for i in session.get_inputs() if i.name in past})
    if rings:
        probe_rings(spec.onnx_file, rings, attention, spec.head_size, kv_dtype(session, spec))
    capabilities = Capabilities.from_session(
        session, spec, rewritten.inputs if rewritten else None, windowed.windows if windowed else (), rings
    )
    lowered = lowering.lower(spec, description, sessions, capabilities)
    spec = lowered.spec
    tokenizer = Tokenizer.from_file(spec.tokenizer_file, bos_token_id=spec.bos_token_id, add_bos=spec.add_bos)
    _check_vocabulary(spec, session, tokenizer)
    model = LoadedModel(
        name=name or spec.path.name,
        spec=spec,
        session=session,
        capabilities=capabilities,
        tokenizer=tokenizer,
        threads=options.intra_op_num_threads,
        encoder=lowered.encoder,
        vision=lowered.vision,
        prefill=lowered.prefill,
        provider=provider,
        pipeline=description,
        tap_gaps=lowered.tap_gaps,
        adapters=AdapterTable.base(stacked) if stacked else None,
    )
    log.debug(
        "decoctl.model_loaded",
        model=model.name,
        layout=spec.layout,
        capabilities=capabilities.names(),
        threads=model.threads,
        fed_lengths=rewritten is not None,
        providers=session.get_providers(),
    )
    return model


def _session(
    onnx_file: Path, graph: bytes | None, options: ort.SessionOptions, provider: Provider = CPU
) -> ort.InferenceSession:
    """An onnxruntime session of ``onnx_file`` (or of ``graph``, that file rewritten in memory) on ``provider``, or
    ModelLoadError naming the file and what is wrong with it (ConfigError where the provider refused its options)."""
    providers = provider.session_providers()
    try:
        if graph is None:
            session = SessionWithoutFallback(str(onnx_file), options, providers=providers)
        else:
            # the graph comes from memory; its external data still lies next to the file it was read from
            options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(onnx_file.parent))
            session = SessionWithoutFallback(graph, options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types; all mean "not loadable"
        refused = provider.refused(exc, onnx_file)
        if refused is not None:
            raise refused from exc
        damaged = _external_data_problem(onnx_file)
        if damaged:
            raise ModelLoadError(f"onnxruntime could not load {onnx_file}: {damaged}") from exc
        raise ModelLoadError(
            f"onnxruntime could not load {onnx_file} ({type(exc).__name__}: {exc}): the file is corrupt "
            "or was exported for a newer onnxruntime; re-export it"
        ) from exc
    provider.check_session(session, onnx_file)
    return session


def _with_graph_kv(spec: ModelSpec, session: ort.InferenceSession) -> ModelSpec:
    """The spec with the KV heads and head size of the graph's past inputs, which is what the cache binds (a
    multi-query Falcon has one KV head whatever its config's num_kv_heads says)."""
    heads, size = kv_shape(session, spec)
    if (heads, size) == (spec.num_kv_heads, spec.head_size):
        return spec
    log.debug(
        "decoctl.kv_shape_from_graph",
        model=str(spec.path),
        config=[spec.num_kv_heads, spec.head_size],
        graph=[heads, size],
    )
    return attrs.evolve(spec, num_kv_heads=heads, head_size=size)


def _check_vocabulary(spec: ModelSpec, session: ort.InferenceSession, tokenizer: Tokenizer) -> None:
    """The config's vocab_size and special ids against the graph's logits width, and the tokenizer against
    both: a mismatch raises now, with the file to fix, rather than in onnxruntime at the first forward."""
    config = spec.path / ("genai_config.json" if spec.layout == "genai" else "config.json")
    logits = next((o for o in session.get_outputs() if o.name == spec.logits_name), None)
    width = logits.shape[-1] if logits is not None and logits.shape else None
    if isinstance(width, int) and width != spec.vocab_size:
        raise ModelLoadError(
            f"{config} says vocab_size {spec.vocab_size} but the graph's {spec.logits_name} output has {width} "
            f"entries per token: set vocab_size to {width} (or re-export the model with its config)"
        )
    parts = spec.encoder_decoder
    start = (parts.decoder_start_token_id,) if parts is not None else ()
    for what, ids in (
        ("eos_token_id", spec.eos_token_ids),
        ("bos_token_id", (spec.bos_token_id,)),
        ("decoder_start_token_id", start),
    ):
        bad = [i for i in ids if i is not None and not 0 <= i < spec.vocab_size]
        if bad:
            raise ModelLoadError(
                f"{config}: {what} {bad[0]} is not a token of the model (its vocabulary is 0..{spec.vocab_size - 1}):"
                " fix the config"
            )
    # the graph may have more rows than the tokenizer has tokens (vocabularies padded to a multiple of 64 or
    # 128, as Qwen2's and Phi-3's are), and a tokenizer may carry special tokens added past the graph's rows
    # (image or tool markers) that ordinary text does not encode to; but a base vocabulary larger than the
    # graph means ordinary text encodes to ids the graph has no row for: the tokenizer belongs to another model
    if tokenizer.base_vocab_size > spec.vocab_size:
        raise ModelLoadError(
            f"{spec.tokenizer_file} has {tokenizer.base_vocab_size} tokens but the model's vocabulary is "
            f"{spec.vocab_size}: the tokenizer belongs to another model"
        )


def _external_data_problem(onnx_file: Path) -> str | None:
    """What is wrong with the external data files the graph's weights point into (missing, or shorter than
    the offsets and lengths the graph gives), or None where nothing is (or the graph cannot be read)."""
    try:
        if onnx_file.stat().st_size > MAX_REWRITTEN_BYTES:
            return None  # weights inside the graph file: nothing points outside it
        needed = _external_data_extents(onnx_file.read_bytes())
    except (OSError, ModelLoadError, UnicodeDecodeError, ValueError):
        return None
    for location, end in sorted(needed.items()):
        path = onnx_file.parent / location
        try:
            size = path.stat().st_size
        except OSError:
            return f"its weights file {path} is missing: copy it next to {onnx_file.name} again"
        if size < end:
            return (
                f"its weights file {path} is {size} bytes but the graph reads up to byte {end}: the file is "
                "truncated (an interrupted copy or download); copy or download it again"
            )
    return None


# ModelProto.graph, GraphProto.initializer, TensorProto.external_data, StringStringEntryProto.key / .value
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_EXTERNAL_DATA, _ENTRY_KEY, _ENTRY_VALUE = 7, 5, 13, 1, 2


def _external_data_extents(model: bytes) -> dict[str, int]:
    """External data file (relative location) -> the end of the last byte range the graph's initializers read."""
    ends: dict[str, int] = {}
    for graph in (f for f in protowire.fields(model) if f.number == _MODEL_GRAPH):
        for tensor in (f for f in protowire.fields(graph.payload) if f.number == _GRAPH_INITIALIZER):
            entries = {}
            for entry in (f for f in protowire.fields(tensor.payload) if f.number == _TENSOR_EXTERNAL_DATA):
                parts = {
                    p.number: p.text for p in protowire.fields(entry.payload) if p.number in (_ENTRY_KEY, _ENTRY_VALUE)
                }
                entries[parts.get(_ENTRY_KEY, "")] = parts.get(_ENTRY_VALUE, "")
            if "location" in entries and "length" in entries:
                end = int(entries.get("offset") or 0) + int(entries["length"])
                ends[entries["location"]] = max(ends.get(entries["location"], 0), end)
    return ends


def _graph_bytes(spec: ModelSpec) -> bytes | None:
    """The graph file's bytes where it is small enough to rewrite in memory (weights kept outside it)."""
    size = spec.onnx_file.stat().st_size if spec.onnx_file.is_file() else 0
    return spec.onnx_file.read_bytes() if 0 < size <= MAX_REWRITTEN_BYTES else None


def _ring_layers(
    spec: ModelSpec, graph: bytes | None, windowed: window_bias.Rewritten | None, ring_slack: int
) -> tuple[RingLayer, ...]:
    """The layers whose GroupQueryAttention keeps a ring cache, read from the graph as exported, with the kernel
    window the loaded graph runs (widened where the window moved into a tree bias)."""
    if graph is None:
        return ()
    try:
        found = window_bias.ring_windows(graph)
    except ModelLoadError:
        return ()
    layers = {spec.past_names(layer)[0]: layer for layer in range(spec.num_layers)}
    widened = windowed.widened if windowed else {}
    rings = []
    for past_key, window in found.items():
        if past_key not in layers:
            continue  # Capabilities.from_session names inputs the config promises and the graph lacks
        if window > spec.context_length:
            raise ModelLoadError(
                f"{spec.onnx_file}: layer {layers[past_key]} keeps a ring cache of window {window}, larger than the "
                f"model's context ({spec.context_length}): the export and its config disagree; export it again "
                "without windowed_kv_cache, or with the model's real context length"
            )
        rings.append(
            RingLayer(
                layer=layers[past_key], window=window, kernel_window=widened.get(past_key, window), slack=ring_slack
            )
        )
    return tuple(sorted(rings, key=lambda r: r.layer))


def _window_in_bias(spec: ModelSpec, graph: bytes, ring_slack: int) -> window_bias.Rewritten | None:
    """The graph with its sliding windows moved into bias inputs of their own so that tree forwards stay exact on
    windowed layers (decoctl.model.graph._window_bias), or None where nothing moves."""
    try:
        result = window_bias.rewrite(graph, ATTENTION_BIAS, ring_slack)
    except ModelLoadError:
        return None  # not a readable graph: onnxruntime's own load reports it with the file and the fix
    if isinstance(result, window_bias.Kept):
        return None
    log.debug("decoctl.window_moved_to_bias", model=str(spec.path), windows=[w.window for w in result.windows])
    return result


def _with_logits_from(spec: ModelSpec, graph: bytes | None, provider: Provider = CPU) -> bytes | None:
    """The graph with an input that picks the first position its LM head computes (a prompt's forward then computes
    the last row only: decoctl.model.graph._logit_rows), or None where it stays as it is."""
    if graph is None:
        return None
    if not provider.takes_logit_rows:
        log.debug("decoctl.logits_from_kept", model=str(spec.path), reason=f"provider {provider.short}")
        return None
    try:
        result = logit_rows.rewrite(graph, spec.logits_name)
    except ModelLoadError:
        return None  # not a readable graph: onnxruntime's own load reports it with the file and the fix
    if isinstance(result, logit_rows.Kept):
        log.debug("decoctl.logits_from_kept", model=str(spec.path), reason=result.reason)
        return None
    return result.model


def _without_mask_subgraph(spec: ModelSpec) -> fed_lengths.Rewritten | None:
    """The graph with its mask subgraph removed, or None (logged with the reason) where it does not apply."""
    size = spec.onnx_file.stat().st_size if spec.onnx_file.is_file() else 0
    if not 0 < size <= MAX_REWRITTEN_BYTES:
        # weights inside the graph file: splicing it would hold a second copy of them in memory while loading
        log.info("decoctl.mask_subgraph_kept", model=str(spec.path), reason=f"graph file of {size} bytes")
        return None
    try:
        result = fed_lengths.rewrite(spec.onnx_file.read_bytes(), spec.attention_mask_name)
    except ModelLoadError as exc:
        # not a readable graph: onnxruntime's own load, right after, reports it with the file and the fix
        result = fed_lengths.Kept(reason=str(exc))
    if isinstance(result, fed_lengths.Kept):
        log.info("decoctl.mask_subgraph_kept", model=str(spec.path), reason=result.reason)
        return None
    log.debug("decoctl.mask_subgraph_removed", model=str(spec.path), nodes=result.removed_nodes)
    return result
