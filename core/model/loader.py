"""Open a model folder: parse its config, start an onnxruntime session, read its capabilities."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import onnxruntime as ort
import structlog

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.model import fed_lengths, huge_pages, window_bias
from decoctl.model.capabilities import ATTENTION_BIAS, Capabilities
from decoctl.model.spec import ModelSpec
from decoctl.model.tokenizer import Tokenizer

__all__ = ["LoadedModel", "default_threads", "load_model", "session_options"]

log = structlog.get_logger(__name__)


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
    if count < 1:
        raise ConfigError(f"threads={count} is not a thread count: give 1 or more (default {default_threads()})")
    options = ort.SessionOptions()
    options.intra_op_num_threads = count
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return options


@attrs.frozen(kw_only=True)
class LoadedModel:
    """One opened model: shared by every Sequence that runs it (each Sequence has its own KV cache)."""

    name: str
    spec: ModelSpec
    session: ort.InferenceSession
    capabilities: Capabilities
    tokenizer: Tokenizer
    threads: int


def load_model(
    path: str | Path, *, name: str | None = None, threads: int | None = None, feed_lengths: bool | None = None
) -> LoadedModel:
    """Load a model folder in the onnxruntime-genai or Optimum layout.

    :param path: the folder holding the config, model.onnx and tokenizer.json.
    :param name: a display name (defaults to the folder name).
    :param threads: intra-op threads; None takes onnxruntime-genai's default (cores/2, at least 1).
    :param feed_lengths: remove onnxruntime-genai's attention-mask subgraph and feed GroupQueryAttention's
        sequence lengths directly (decoctl.model.fed_lengths; the same logits, a cheaper step). None: on unless
        the environment sets DECOCTL_FEED_LENGTHS=0.
    """
    spec = ModelSpec.from_folder(path)
    options = session_options(threads)
    if feed_lengths is None:
        feed_lengths = os.environ.get("DECOCTL_FEED_LENGTHS", "1") not in ("0", "")
    rewritten = _without_mask_subgraph(spec) if feed_lengths and spec.layout == "genai" else None
    windowed = _window_in_bias(spec, rewritten.model if rewritten else None) if spec.layout == "genai" else None
    graph = windowed.model if windowed else rewritten.model if rewritten else None
    try:
        with huge_pages.contiguous_allocations():
            if graph is None:
                session = ort.InferenceSession(str(spec.onnx_file), options, providers=["CPUExecutionProvider"])
            else:
                # the graph comes from memory; its external data still lies next to the file it was read from
                options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(spec.onnx_file.parent))
                session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types; all mean "not loadable"
        raise ModelLoadError(
            f"onnxruntime could not load {spec.onnx_file} ({type(exc).__name__}: {exc}): the file is corrupt "
            "or was exported for a newer onnxruntime; re-export it"
        ) from exc
    # the weights now sit in onnxruntime's buffers: put them on huge pages (see huge_pages.py for the measurement)
    huge_pages.collapse()
    capabilities = Capabilities.from_session(
        session, spec, rewritten.inputs if rewritten else None, windowed.windows if windowed else ()
    )
    tokenizer = Tokenizer.from_file(spec.tokenizer_file, bos_token_id=spec.bos_token_id, add_bos=spec.add_bos)
    if tokenizer.vocab_size > spec.vocab_size:
        raise ModelLoadError(
            f"{spec.tokenizer_file} has {tokenizer.vocab_size} tokens but the model's vocabulary is "
            f"{spec.vocab_size}: the tokenizer belongs to another model"
        )
    model = LoadedModel(
        name=name or spec.path.name,
        spec=spec,
        session=session,
        capabilities=capabilities,
        tokenizer=tokenizer,
        threads=options.intra_op_num_threads,
    )
    log.debug(
        "decoctl.model_loaded",
        model=model.name,
        layout=spec.layout,
        capabilities=capabilities.names(),
        threads=model.threads,
        fed_lengths=rewritten is not None,
    )
    return model


def _window_in_bias(spec: ModelSpec, graph: bytes | None) -> window_bias.Rewritten | None:
    """The graph (``graph``, or the file) with its sliding windows moved into bias inputs of their own so that
    tree forwards stay exact on windowed layers (decoctl.model.window_bias), or None where nothing moves."""
    if graph is None:
        size = spec.onnx_file.stat().st_size if spec.onnx_file.is_file() else 0
        if not 0 < size <= MAX_REWRITTEN_BYTES:
            return None
        graph = spec.onnx_file.read_bytes()
    try:
        result = window_bias.rewrite(graph, ATTENTION_BIAS)
    except ModelLoadError:
        return None  # not a readable graph: onnxruntime's own load reports it with the file and the fix
    if isinstance(result, window_bias.Kept):
        return None
    log.debug("decoctl.window_moved_to_bias", model=str(spec.path), windows=[w.window for w in result.windows])
    return result


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
