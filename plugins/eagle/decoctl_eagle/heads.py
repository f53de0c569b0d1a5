"""EAGLE heads on this machine: import a published one, register a head for its target, describe one.

``register_head(target, head_dir)`` is the one way a head becomes the default "eagle" role of its target (so
``decoctl generate -c eagle --model TARGET`` finds it without ``--role``): ``decoctl eagle import`` and ``decoctl
eagle train`` both call it. It records the head in decoctl's user-level model registry (decoctl.models_dir(),
``decoctl models`` lists it) and as that target's default for the role.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from decoctl import (
    ConfigError,
    PluginRegistry,
    RegisteredModel,
    models_dir,
    register_role_default,
    resolve_model,
)
from decoctl.model.eagle_graph import EAGLE1, EAGLE3, FEATURES, HeadDims, write_head
from decoctl_eagle.checkpoint import WEIGHT_FILES, read_checkpoint
from decoctl_eagle.controller import HEAD
from decoctl_eagle.fit import HeadShape, architecture_of, mismatches
from decoctl_eagle.target import read_target

__all__ = ["HeadInfo", "ImportedHead", "describe_head", "import_head", "register_head"]


@attrs.frozen(kw_only=True)
class ImportedHead:
    """What ``import_head`` wrote: the head's folder and name, its sizes, and the registry file (None when it was
    not registered)."""

    name: str
    folder: Path
    dims: HeadDims
    target: str
    registry: Path | None


def register_head(
    target: str | Path,
    head_dir: str | Path,
    *,
    name: str | None = None,
    summary: str = "",
    source: str = "",
    plugins: PluginRegistry | None = None,
) -> Path:
    """Register the head in ``head_dir`` as ``name`` (default: the folder's name) and make it the default "eagle"
    role of ``target`` (a registered model name or a folder). A head registered later for the same target replaces
    it as the default. Returns the registry file."""
    target_name, target_path = resolve_model(str(target), plugins or PluginRegistry())
    folder = Path(head_dir).expanduser().resolve()
    model = RegisteredModel(
        name=name or folder.name,
        path=folder,
        summary=summary or f"EAGLE head for {target_name}",
        source=source,
    )
    return register_role_default(model, target=target_path, role=HEAD)


def import_head(
    source: str | Path,
    target: str | Path,
    *,
    out: str | Path | None = None,
    name: str | None = None,
    register: bool = True,
    plugins: PluginRegistry | None = None,
) -> ImportedHead:
    """Convert a published EAGLE-1/2 or EAGLE-3 head (decoctl_eagle.checkpoint) for ``target`` into the ONNX head
    the eagle controller runs, and register it as the target's default head.

    :param source: the head's folder (config.json and model.safetensors or pytorch_model.bin).
    :param target: the target, a registered model name or an onnxruntime-genai folder with the features the head
        is fed (hidden_states for EAGLE-1, three aux_hidden_states taps for EAGLE-3).
    :param out: the folder to write; default ``<decoctl data dir>/models/NAME``.
    :param name: the registered name; default ``<target>-<source folder>``.
    """
    registry = plugins or PluginRegistry()
    target_name, target_path = resolve_model(str(target), registry)
    target_model = read_target(target_path, name=target_name)
    checkpoint = read_checkpoint(source)
    dims, weights = checkpoint.for_target(target_model)
    # named as the registry names it (decoctl.specs.normalise_name), so the default folder carries the same name
    head_name = (name or f"{target_name}-{checkpoint.folder.resolve().name}").strip().lower().replace("_", "-")
    folder = Path(out).expanduser() if out is not None else models_dir() / head_name
    described = f"{checkpoint.architecture} head from {checkpoint.file}"
    write_head(folder, dims, weights, target_dir=target_path, target_name=target_name, source=str(checkpoint.file))
    registry_file = None
    if register:
        registry_file = register_head(
            target_path,
            folder,
            name=head_name,
            summary=f"{dims.architecture.upper()} head for {target_name}",
            source=described,
            plugins=registry,
        )
    return ImportedHead(name=head_name, folder=folder, dims=dims, target=target_name, registry=registry_file)


# -------------------------------------------------------------------------------------------------- describing


@attrs.frozen(kw_only=True)
class HeadInfo:
    """A head as ``decoctl eagle info`` shows it: an ONNX head folder or a published checkpoint."""

    path: Path
    kind: str  # "onnx" or "checkpoint"
    architecture: str
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate: int | None
    vocab: int
    draft_vocab: int
    feature_size: int
    target: str
    details: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        kind = "ONNX head (role eagle)" if self.kind == "onnx" else "published checkpoint, not converted"
        inner = f", intermediate {self.intermediate}" if self.intermediate else ""
        if self.architecture == EAGLE3:
            features = f"{self.feature_size} (three target taps of {self.hidden} and the head's own feature)"
        else:
            features = f"{self.feature_size} (the target's final hidden state)"
        drafts = (
            f"{self.draft_vocab} of {self.vocab} target tokens"
            if self.draft_vocab != self.vocab
            else f"the target's whole vocabulary ({self.vocab})"
        )
        return [
            f"{self.path}: {self.architecture.upper()} {kind}",
            f"  target: {self.target}",
            f"  sizes: hidden {self.hidden}, {self.num_heads} attention heads of {self.head_size} "
            f"({self.num_kv_heads} KV){inner}, 1 decoder layer",
            f"  features: width {features}",
            f"  draft vocabulary: {drafts}",
            *(f"  {line}" for line in self.details),
        ]


def describe_head(path: str | Path) -> HeadInfo:
    """Read an ONNX head folder (genai_config.json of type eagle) or a published checkpoint folder."""
    folder = Path(path)
    if (folder / "genai_config.json").is_file():
        return _describe_onnx(folder)
    if (folder / "config.json").is_file() and any((folder / f).is_file() for f in WEIGHT_FILES):
        checkpoint = read_checkpoint(folder)
        dims = checkpoint.dims
        embeddings = "its own" if checkpoint.has_embeddings else "the target's"
        return HeadInfo(
            path=folder,
            kind="checkpoint",
            architecture=dims.architecture,
            hidden=dims.hidden,
            num_heads=dims.num_heads,
            num_kv_heads=dims.num_kv_heads,
            head_size=dims.head_size,
            intermediate=dims.intermediate,
            vocab=dims.vocab,
            draft_vocab=dims.draft_vocab,
            feature_size=dims.feature_size,
            target=str(checkpoint.config.get("target_model") or checkpoint.config.get("_name_or_path") or "not said"),
            details=(
                f"weights: {checkpoint.file.name} (layer spelled {checkpoint.spelling}.), embedding: {embeddings}",
                f"convert it: decoctl eagle import {folder} --target MODEL",
            ),
        )
    raise ConfigError(
        f"{folder} is neither an ONNX head (genai_config.json) nor a published head (config.json with "
        f"{' or '.join(WEIGHT_FILES)})"
    )


def _describe_onnx(folder: Path) -> HeadInfo:
    import onnx

    config = json.loads((folder / "genai_config.json").read_text(encoding="utf-8"))
    model = config["model"]
    decoder = model["decoder"]
    graph = onnx.load_model(str(folder / decoder.get("filename", "model.onnx")), load_external_data=False).graph
    inputs = {value.name: value for value in graph.input}
    if FEATURES not in inputs:
        raise ConfigError(f"{folder} is a model without a {FEATURES} input, not an EAGLE head")
    feature_size = int(inputs[FEATURES].type.tensor_type.shape.dim[-1].dim_value)
    hidden, vocab = int(decoder["hidden_size"]), int(model["vocab_size"])
    recorded: dict[str, Any] = config.get("decoctl") or {}
    architecture = recorded.get("architecture") or architecture_of(feature_size, hidden) or EAGLE1
    draft_vocab = int(recorded.get("draft_vocab_size") or _draft_rows(graph) or vocab)
    target = recorded.get("target")
    where = f" ({recorded['target_path']})" if recorded.get("target_path") else ""
    details = [f"source: {recorded['source']}"] if recorded.get("source") else []
    if not recorded.get("target"):
        details.append("the config does not say which target it was made for")
    return HeadInfo(
        path=folder,
        kind="onnx",
        architecture=architecture,
        hidden=hidden,
        num_heads=int(decoder["num_attention_heads"]),
        num_kv_heads=int(decoder.get("num_key_value_heads", decoder["num_attention_heads"])),
        head_size=int(decoder["head_size"]),
        intermediate=recorded.get("intermediate_size"),
        vocab=vocab,
        draft_vocab=draft_vocab,
        feature_size=feature_size,
        target=f"{target}{where}" if target else "not recorded",
        details=tuple(details),
    )


def _draft_rows(graph: Any) -> int | None:
    """The size of a draft vocabulary's id table (decoctl's writers call it draft_ids)."""
    for tensor in graph.initializer:
        if tensor.name in ("draft_ids", "model.draft_ids"):
            return int(np.prod(tensor.dims))
    return None


def info_lines(head: str | Path, target: str | Path | None, plugins: PluginRegistry) -> tuple[list[str], bool]:
    """``decoctl eagle info``'s lines, and whether the head fits the target (True without one)."""
    _, path = resolve_model(str(head), plugins)
    info = describe_head(path)
    lines = info.lines()
    if target is None:
        return lines, True
    target_name, target_path = resolve_model(str(target), plugins)
    target_model = read_target(target_path, name=target_name)
    lines.append(f"  --target {target_model.describe()}")
    head_shape = HeadShape(architecture=info.architecture, hidden=info.hidden, vocab=info.vocab)
    reasons = mismatches(head_shape, target_model.shape)
    lines.append(f"  matches {target_name}: " + ("yes" if not reasons else "no: " + "; ".join(reasons)))
    return lines, not reasons
