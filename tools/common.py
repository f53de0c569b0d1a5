"""Shared pieces of the demo-model scripts: presets, tokenizer, token cache, checkpoints, bits per byte.

Dev-time only (tools/ is not part of the decoctl distribution). Every script imports this as ``common``
(tools/ is on sys.path when a script in it runs).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path

import numpy as np

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
BUILD = REPO / "build"
TOKENIZER_JSON = TOOLS / "artifacts" / "tokenizer.json"
CORPUS = BUILD / "corpus"
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
VOCAB = 4096

# Head dim 64 everywhere; intermediate ~ 8/3 * hidden rounded to a multiple of 32 (1024 for the target).
PRESETS: dict[str, dict] = {
    "target": dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=6, intermediate_size=1024),
    "small": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=704),
    "draft": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=352),
}


def llama_config(preset: str):
    from transformers import LlamaConfig

    p = PRESETS[preset]
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=p["hidden_size"],
        intermediate_size=p["intermediate_size"],
        num_hidden_layers=p["num_hidden_layers"],
        num_attention_heads=p["num_attention_heads"],
        num_key_value_heads=p["num_attention_heads"],
        hidden_act="silu",
        max_position_embeddings=2048,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        # Untied: the ONNX builder then exports a plain lm_head MatMul with no shared-initializer special case.
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        attention_bias=False,
        mlp_bias=False,
    )
    cfg.architectures = ["LlamaForCausalLM"]  # the ONNX builder dispatches on this
    return cfg


def set_threads(n: int = 1) -> None:
    """One thread: the machine has 2 cores shared with other work."""
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    torch.set_num_threads(n)
    torch.set_num_interop_threads(n)


def load_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER_JSON))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def token_cache(split: str) -> np.ndarray:
    """uint16 token ids of build/corpus/<split>.txt, cached under build/tokens/ (keyed by tokenizer+corpus)."""
    src = CORPUS / f"{split}.txt"
    key = f"{split}-{_sha(TOKENIZER_JSON)}-{_sha(src)}"
    out = BUILD / "tokens" / f"{key}.u16"
    if not out.exists():
        tok = load_tokenizer()
        ids = []
        # Encode file by file: the eos text is a special token, and smaller encode calls keep memory flat.
        for doc in src.read_text(encoding="utf-8").split("<|eos|>"):
            if doc:
                ids.extend(tok.encode(doc).ids)
                ids.append(EOS_ID)
        arr = np.asarray(ids, dtype=np.uint16)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        arr.tofile(tmp)
        os.replace(tmp, out)
    return np.memmap(out, dtype=np.uint16, mode="r")


def token_byte_lengths() -> np.ndarray:
    """int64[vocab]: bytes each token stands for (special tokens count 1: the file boundary)."""
    from tokenizers import pre_tokenizers  # noqa: F401  (import check only)

    # Invert GPT-2's bytes_to_unicode map used by the ByteLevel pre-tokenizer.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    char_to_byte = {chr(c): b for b, c in zip(bs, cs, strict=True)}
    tok = load_tokenizer()
    lengths = np.ones(tok.get_vocab_size(), dtype=np.int64)
    for piece, i in tok.get_vocab().items():
        if i > PAD_ID:
            lengths[i] = sum(1 for ch in piece if ch in char_to_byte)
    return lengths


def heldout_windows(seq: int = 256, n: int = 32) -> np.ndarray:
    """int64[n, seq+1]: fixed, evenly spaced windows over the held-out tokens (cheap eval subset)."""
    ids = token_cache("heldout")
    starts = np.linspace(0, len(ids) - seq - 2, n).astype(np.int64)
    return np.stack([np.asarray(ids[s : s + seq + 1], dtype=np.int64) for s in starts])


def bits_per_byte(model, windows: np.ndarray, byte_len: np.ndarray, batch: int = 8) -> float:
    import torch
    import torch.nn.functional as F

    was_training = model.training
    model.eval()
    nats = 0.0
    nbytes = 0
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            w = torch.from_numpy(windows[i : i + batch])
            logits = model(input_ids=w[:, :-1]).logits.float()
            nats += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum").item()
            nbytes += int(byte_len[windows[i : i + batch, 1:]].sum())
    model.train(was_training)
    return nats / math.log(2) / nbytes


# ---------------------------------------------------------------- checkpoints


def run_dir(preset: str) -> Path:
    return BUILD / "train" / preset


def export_dir(preset: str) -> Path:
    return TOOLS / "checkpoints" / preset


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(model, state: dict, folder: Path, dtype=None) -> None:
    """Weights (safetensors) + config.json + state.json + tokenizer files, each replaced atomically.

    state.json is written last, so it never names a step whose weights are not on disk.
    """
    import torch
    from safetensors.torch import save

    folder.mkdir(parents=True, exist_ok=True)
    sd = {
        k: (v.detach().to(dtype) if dtype is not None else v.detach()).contiguous()
        for k, v in model.state_dict().items()
    }
    _atomic_write_bytes(folder / "model.safetensors", save(sd, metadata={"format": "pt"}))
    cfg = model.config.to_dict()
    cfg["torch_dtype"] = cfg["dtype"] = str(dtype or torch.float32).removeprefix("torch.")
    _atomic_write_bytes(folder / "config.json", (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode())
    write_tokenizer_files(folder)
    _atomic_write_bytes(folder / "state.json", (json.dumps(state, indent=2) + "\n").encode())


def write_tokenizer_files(folder: Path) -> None:
    """tokenizer.json + tokenizer_config.json, so the folder loads with transformers' AutoTokenizer."""
    _atomic_write_bytes(folder / "tokenizer.json", TOKENIZER_JSON.read_bytes())
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    }
    _atomic_write_bytes(folder / "tokenizer_config.json", (json.dumps(tcfg, indent=2) + "\n").encode())


def read_state(folder: Path) -> dict | None:
    try:
        state = json.loads((folder / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return state if (folder / "model.safetensors").exists() else None


def latest_checkpoint(preset: str) -> tuple[Path, dict] | None:
    """The checkpoint with the most tokens seen: build/train/<preset> first, then tools/checkpoints/<preset>."""
    best = None
    for folder in (run_dir(preset), export_dir(preset)):
        state = read_state(folder)
        if state is not None and (best is None or state["tokens_seen"] > best[1]["tokens_seen"]):
            best = (folder, state)
    return best


def load_weights(model, folder: Path) -> None:
    import torch
    from safetensors.torch import load_file

    sd = {k: v.to(torch.float32) for k, v in load_file(str(folder / "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # lm_head may legitimately be absent only for tied models; anything else is a broken checkpoint.
    if unexpected or [m for m in missing if not m.startswith("lm_head") or not model.config.tie_word_embeddings]:
        raise RuntimeError(
            f"{folder}: checkpoint does not match the model (missing={missing}, unexpected={unexpected})"
        )


def load_model(preset_or_folder: str | Path):
    """A LlamaForCausalLM in fp32, eval mode: a checkpoint folder, or a run name (its latest checkpoint)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if Path(preset_or_folder).is_dir() and (Path(preset_or_folder) / "config.json").exists():
        folder = Path(preset_or_folder)
    else:
        found = latest_checkpoint(str(preset_or_folder))
        if found is None:
            raise SystemExit(f"no checkpoint named {preset_or_folder!r}: train it first (tools/train.py)")
        folder = found[0]
    cfg = LlamaConfig.from_pretrained(folder)
    cfg.torch_dtype = None
    model = LlamaForCausalLM(cfg)
    load_weights(model, folder)
    return model.float().eval(), folder


class Log:
    """Append-only progress log (also echoed to stdout, which nohup sends to <preset>.out)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path

    def __call__(self, msg: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        print(line, flush=True)
