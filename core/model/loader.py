"""Open a model folder: parse its config, start an onnxruntime session, read its capabilities."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import onnxruntime as ort
import structlog

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.model import huge_pages
from decoctl.model.capabilities import Capabilities
from decoctl.model.spec import ModelSpec
from decoctl.model.tokenizer import Tokenizer

__all__ = ["LoadedModel", "default_threads", "load_model", "session_options"]

log = structlog.get_logger(__name__)


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


def load_model(path: str | Path, *, name: str | None = None, threads: int | None = None) -> LoadedModel:
    """Load a model folder in the onnxruntime-genai or Optimum layout.

    :param path: the folder holding the config, model.onnx and tokenizer.json.
    :param name: a display name (defaults to the folder name).
    :param threads: intra-op threads; None takes onnxruntime-genai's default (cores/2, at least 1).
    """
    spec = ModelSpec.from_folder(path)
    options = session_options(threads)
    try:
        session = ort.InferenceSession(str(spec.onnx_file), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types; all mean "not loadable"
        raise ModelLoadError(
            f"onnxruntime could not load {spec.onnx_file} ({type(exc).__name__}: {exc}): the file is corrupt "
            "or was exported for a newer onnxruntime; re-export it"
        ) from exc
    # the weights now sit in onnxruntime's buffers: put them on huge pages (see huge_pages.py for the measurement)
    huge_pages.collapse()
    capabilities = Capabilities.from_session(session, spec)
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
    )
    return model
