"""Published EAGLE heads as their authors save them: config.json plus model.safetensors or pytorch_model.bin.

Two architectures, told apart by ``fc.weight`` (decoctl.model.eagle_graph describes both forwards):

* EAGLE-1 / EAGLE-2 (SafeAILab's EAGLE, cnets.py): ``embed_tokens.weight``, ``fc.weight`` [H, 2H] and ``fc.bias``,
  ``layers.0.*`` (a Llama decoder layer without input_layernorm); the target's lm_head drafts.
* EAGLE-3: ``fc.weight`` [H, 3H], ``midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight``,
  ``midlayer.self_attn.{q,k,v}_proj.weight`` over 2H inputs, ``o_proj``, ``midlayer.mlp.*``, ``norm.weight``,
  ``lm_head.weight`` [Vd, H], the buffers ``d2t`` [Vd] and ``t2d`` [V]; ``embed_tokens.weight`` when the head has
  its own (else the target's). Some tools write ``layers.0.`` for ``midlayer.``; both spellings are read.

Safetensors files are read without torch (float32, float16, bfloat16 and integer tensors); pytorch_model.bin
needs torch. Every check names the tensor: an unknown name, a missing one, a wrong shape, and, against the target,
a hidden size or vocabulary that differs.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from decoctl import ConfigError
from decoctl.model.eagle_graph import EAGLE1, EAGLE3, LAYER, HeadDims
from decoctl_eagle.fit import HeadShape, check_fits
from decoctl_eagle.target import Target

__all__ = ["WEIGHT_FILES", "HeadCheckpoint", "read_checkpoint", "read_tensors"]

#: the weight files a head folder may hold, in the order they are looked for
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
MIDLAYER = "midlayer."
_SAFETENSORS_DTYPES: dict[str, Any] = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def read_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors or a torch .bin file, as numpy arrays (bfloat16 widened to float32)."""
    file = Path(path)
    if file.suffix == ".safetensors":
        return _read_safetensors(file)
    return _read_torch(file)


def _read_safetensors(file: Path) -> dict[str, np.ndarray]:
    try:
        with file.open("rb") as stream:
            (length,) = struct.unpack("<Q", stream.read(8))
            header = json.loads(stream.read(length))
        data = np.memmap(file, dtype=np.uint8, mode="r", offset=8 + length) if file.stat().st_size > 8 + length else b""
    except (OSError, struct.error, ValueError) as exc:
        raise ConfigError(f"{file} is not a readable safetensors file ({exc})") from exc
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = entry["data_offsets"]
            shape, kind = [int(d) for d in entry["shape"]], entry["dtype"]
            raw = (
                np.frombuffer(data, dtype=np.uint8, count=end - start, offset=start)
                if end > start
                else np.empty(0, np.uint8)
            )
            if kind == "BF16":
                array = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif kind in _SAFETENSORS_DTYPES:
                array = raw.view(_SAFETENSORS_DTYPES[kind])
            else:
                raise ConfigError(f"tensor {name} in {file} has dtype {kind}, which decoctl does not read")
            tensors[name] = array.reshape(shape)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"tensor {name} in {file} has a broken header entry {entry!r} ({exc})") from exc
    return tensors


def _read_torch(file: Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError as exc:
        raise ConfigError(
            f"{file} is a torch pickle, which needs torch to read: pip install torch (the CPU wheel is enough), or "
            "convert the head to model.safetensors"
        ) from exc
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a file it cannot unpickle
        raise ConfigError(f"{file} cannot be read by torch.load ({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, Mapping):
        raise ConfigError(f"{file} holds a {type(state).__name__}, not a state dict of tensors")
    tensors = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise ConfigError(f"entry {name} of {file} is a {type(tensor).__name__}, not a tensor")
        tensor = tensor.detach()
        if tensor.is_floating_point():
            tensor = tensor.to(torch.float32)
        tensors[str(name)] = tensor.numpy()
    return tensors


@attrs.frozen(kw_only=True)
class HeadCheckpoint:
    """A published head read and checked on its own: its architecture, sizes (``dims``; its vocabulary the head's
    own), weights under decoctl's names (``layers.0.``), and where they came from."""

    folder: Path
    file: Path
    architecture: str
    dims: HeadDims
    weights: Mapping[str, np.ndarray]
    spelling: str
    config: Mapping[str, Any]

    @property
    def has_embeddings(self) -> bool:
        return "embed_tokens.weight" in self.weights

    def for_target(self, target: Target) -> tuple[HeadDims, dict[str, np.ndarray]]:
        """The dims and every weight the head graph takes, the target's shared ones filled in: its embedding
        where the head has none, its lm_head for an EAGLE-1 head. Refused (decoctl_eagle.fit.check_fits), naming the
        tensors, when the head does not fit the target."""
        dims = self.dims
        check_fits(
            HeadShape(architecture=dims.architecture, hidden=dims.hidden, vocab=dims.vocab),
            target.shape,
            what=f"the head in {self.folder}",
            hidden_from=f"tensor fc.weight {list(self.weights['fc.weight'].shape)}",
            vocab_from=self._vocab_tensor(),
        )
        weights = dict(self.weights)
        if "embed_tokens.weight" not in weights:
            weights["embed_tokens.weight"] = target.embeddings()
        if dims.architecture == EAGLE1:
            weights["lm_head.weight"] = target.lm_head()
        return dims, weights

    def _vocab_tensor(self) -> str:
        for name in ("t2d", "embed_tokens.weight"):
            if name in self.weights:
                return f"tensor {name} {list(self.weights[name].shape)}"
        return "config.json vocab_size"


def read_checkpoint(folder: str | Path) -> HeadCheckpoint:
    """Read and check a published head folder (config.json and one of WEIGHT_FILES)."""
    path = Path(folder)
    if not path.is_dir():
        raise ConfigError(f"{path} is not a folder: give the folder holding the head's config.json and weights")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ConfigError(
            f"{path} has no config.json: a published EAGLE head comes with its config next to its weights"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{config_path} cannot be read ({exc})") from exc
    file = next((path / name for name in WEIGHT_FILES if (path / name).is_file()), None)
    if file is None:
        found = ", ".join(sorted(p.name for p in path.iterdir())) or "nothing"
        raise ConfigError(
            f"{path} holds no {' or '.join(WEIGHT_FILES)} (found: {found}); a sharded head is not supported: merge it "
            "into one file"
        )
    raw = read_tensors(file)
    weights, spelling = _renamed(raw, file)
    architecture = _architecture(weights, file)
    dims = _dims(config, weights, architecture, config_path)
    _check_names_and_shapes(weights, dims, file, spelling)
    if architecture == EAGLE3:
        _check_vocabulary_maps(weights, dims, file)
    return HeadCheckpoint(
        folder=path,
        file=file,
        architecture=architecture,
        dims=dims,
        weights=weights,
        spelling=spelling,
        config=config,
    )


def _renamed(raw: Mapping[str, np.ndarray], file: Path) -> tuple[dict[str, np.ndarray], str]:
    """decoctl's names (``midlayer.`` -> ``layers.0.``) and which spelling the file used."""
    weights: dict[str, np.ndarray] = {}
    spellings = set()
    for name, array in raw.items():
        new = name
        if name.startswith(MIDLAYER):
            new = LAYER + name.removeprefix(MIDLAYER)
            spellings.add(MIDLAYER)
        elif name.startswith(LAYER):
            spellings.add(LAYER)
        if new in weights:
            raise ConfigError(f"{file} holds both {name} and {new.replace(LAYER, MIDLAYER)}: keep one spelling")
        weights[new] = array
    if len(spellings) > 1:
        raise ConfigError(f"{file} mixes the spellings midlayer. and layers.0.: write the layer under one of them")
    return weights, (spellings.pop() if spellings else LAYER).rstrip(".")


def _architecture(weights: Mapping[str, np.ndarray], file: Path) -> str:
    fc = weights.get("fc.weight")
    if fc is None:
        names = ", ".join(sorted(weights)[:8])
        raise ConfigError(f"{file} has no tensor fc.weight, so it is not an EAGLE head (its tensors: {names}, ...)")
    if fc.ndim == 2 and fc.shape[1] == 2 * fc.shape[0]:
        return EAGLE1
    if fc.ndim == 2 and fc.shape[1] == 3 * fc.shape[0]:
        return EAGLE3
    raise ConfigError(
        f"tensor fc.weight in {file} has shape {list(fc.shape)}: an EAGLE-1 head's is [H, 2H] and an EAGLE-3 head's "
        "[H, 3H]"
    )


def _dims(config: Mapping[str, Any], weights: Mapping[str, np.ndarray], architecture: str, path: Path) -> HeadDims:
    def number(key: str, default: Any = None) -> Any:
        value = config.get(key, default)
        if value is None:
            raise ConfigError(f"{path} gives no {key}, which the head's shapes depend on")
        return value

    try:
        hidden = int(number("hidden_size"))
        heads = int(number("num_attention_heads"))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_size = int(config.get("head_dim") or hidden // heads)
        vocab = int(number("vocab_size"))
        eps = float(config.get("rms_norm_eps") or 1e-6)
        theta = float(config.get("rope_theta") or 10000.0)
        intermediate = int(number("intermediate_size"))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path} has a size that is not a number ({exc})") from exc
    activation = config.get("hidden_act", "silu")
    if activation != "silu":
        raise ConfigError(f"{path} says hidden_act {activation!r}: EAGLE heads are converted with SiLU only")
    if heads % kv_heads or head_size % 2:
        raise ConfigError(
            f"{path}: num_attention_heads {heads} must be a multiple of num_key_value_heads {kv_heads}, and the head "
            f"size {head_size} even"
        )
    draft_vocab = vocab
    if architecture == EAGLE3:
        lm_head = weights.get("lm_head.weight")
        draft_vocab = int(config.get("draft_vocab_size") or (lm_head.shape[0] if lm_head is not None else vocab))
    return HeadDims(
        architecture=architecture,
        hidden=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_size=head_size,
        intermediate=intermediate,
        vocab=vocab,
        draft_vocab=draft_vocab,
        rms_eps=eps,
        rope_theta=theta,
        rope_scaling=config.get("rope_scaling") or None,
    )


def _check_names_and_shapes(weights: Mapping[str, np.ndarray], dims: HeadDims, file: Path, spelling: str) -> None:
    required = dims.shapes()
    optional = {**dims.optional_shapes(), "embed_tokens.weight": required.pop("embed_tokens.weight")}
    if dims.architecture == EAGLE1:
        required.pop("lm_head.weight")  # the target's
        optional["fc.bias"] = required.pop("fc.bias")
    else:
        optional["t2d"] = (dims.vocab,)
        if dims.draft_vocab == dims.vocab:
            optional["d2t"] = required.pop("d2t")  # a head drafting the whole vocabulary may leave the maps out
    known = {**required, **optional}

    def spelled(name: str) -> str:
        return name.replace(LAYER, spelling + ".") if name.startswith(LAYER) else name

    unknown = sorted(name for name in weights if name not in known)
    if unknown:
        listing = ", ".join(spelled(n) for n in unknown[:6]) + (", ..." if len(unknown) > 6 else "")
        raise ConfigError(
            f"{file} holds tensor(s) an {dims.architecture.upper()} head does not have: {listing}. Its tensors are "
            f"{', '.join(sorted(spelled(n) for n in known))}; a head of another architecture (or with more layers) "
            "cannot be converted"
        )
    missing = sorted(name for name in required if name not in weights)
    if missing:
        raise ConfigError(
            f"{file} lacks tensor(s) an {dims.architecture.upper()} head needs: "
            f"{', '.join(spelled(n) for n in missing)}"
        )
    for name, array in weights.items():
        want = known[name]
        if tuple(array.shape) != want:
            raise ConfigError(
                f"tensor {spelled(name)} in {file} has shape {list(array.shape)}, expected {list(want)} for "
                f"{_sizes(dims)} (config.json)"
            )


def _sizes(dims: HeadDims) -> str:
    return (
        f"hidden_size {dims.hidden}, {dims.num_heads} heads of {dims.head_size} ({dims.num_kv_heads} KV), "
        f"intermediate_size {dims.intermediate}, vocab_size {dims.vocab}, draft vocabulary {dims.draft_vocab}"
    )


def _check_vocabulary_maps(weights: Mapping[str, np.ndarray], dims: HeadDims, file: Path) -> None:
    d2t, t2d = weights.get("d2t"), weights.get("t2d")
    if d2t is not None and not np.issubdtype(d2t.dtype, np.integer):
        raise ConfigError(f"tensor d2t in {file} is {d2t.dtype}, not integer offsets (target id = d + d2t[d])")
    if d2t is None or t2d is None:
        return
    ids = np.arange(dims.draft_vocab) + d2t.astype(np.int64)
    inside = (ids >= 0) & (ids < dims.vocab)
    mask = t2d.astype(bool)
    if not inside.all() or int(mask.sum()) != dims.draft_vocab or not mask[ids[inside]].all():
        raise ConfigError(
            f"tensors d2t and t2d in {file} disagree: t2d marks {int(mask.sum())} target tokens, and d2t maps the "
            f"{dims.draft_vocab} draft tokens to target ids it should mark (d + d2t[d])"
        )
