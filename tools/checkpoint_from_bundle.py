"""Rebuild a demo model's fp16 torch checkpoint from its bundled ONNX (the weights are the same float16 values).

    .venv-tools/bin/python tools/checkpoint_from_bundle.py pycode --config-from tools/checkpoints/target \
        --out build/train/target-from-bundle
    .venv-tools/bin/python tools/checkpoint_from_bundle.py pycode --compare tools/checkpoints/target

The bundle (plugins/models/decoctl_models/NAME) stores each big weight as float16 (tools/half_storage.py) in the
onnxruntime-genai builder's layout: MatMul weights transposed ([in, out]), q/k/v fused into one qkv_proj. This
undoes both and writes model.safetensors (float16, Hugging Face names) with the config and tokenizer files of
--config-from and a state.json naming the tokens the export saw, so tools/train_eagle.py and
tools/distill_draft.py can use a finished model whose torch checkpoint is not committed (docs/MODELS.md).
--compare checks the result tensor by tensor against an existing
checkpoint and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

BUNDLE = Path(__file__).resolve().parents[1] / "plugins" / "models" / "decoctl_models"
SUFFIX = "_fp16"
COPIED = ("config.json", "tokenizer.json", "tokenizer_config.json")


def hf_tensors(folder: Path, config: dict) -> dict[str, np.ndarray]:
    """float16 tensors under Hugging Face LlamaForCausalLM names, from the bundled model in ``folder``."""
    model = onnx.load(str(folder / "model.onnx"))
    raw = {i.name.removesuffix(SUFFIX): numpy_helper.to_array(i) for i in model.graph.initializer}
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head, config["num_key_value_heads"] * head
    out: dict[str, np.ndarray] = {"model.embed_tokens.weight": raw["model.embed_tokens.weight"]}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}"
        qkv = raw[f"{p}.attn.qkv_proj.MatMul.weight"].T
        out[f"{p}.self_attn.q_proj.weight"] = qkv[:q]
        out[f"{p}.self_attn.k_proj.weight"] = qkv[q : q + kv]
        out[f"{p}.self_attn.v_proj.weight"] = qkv[q + kv :]
        out[f"{p}.self_attn.o_proj.weight"] = raw[f"{p}.attn.o_proj.MatMul.weight"].T
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[f"{p}.mlp.{name}.weight"] = raw[f"{p}.mlp.{name}.MatMul.weight"].T
        out[f"{p}.input_layernorm.weight"] = raw[f"{p}.input_layernorm.weight"]
        out[f"{p}.post_attention_layernorm.weight"] = raw[f"{p}.post_attention_layernorm.weight"]
    final = f"model.layers.{config['num_hidden_layers']}.final_norm_layernorm.weight"
    out["model.norm.weight"] = raw[final]
    out["lm_head.weight"] = raw["lm_head.MatMul.weight"].T
    return {k: np.ascontiguousarray(v, dtype=np.float16) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="bundled model name (pycode, pycode-small, pycode-draft) or its folder")
    ap.add_argument("--config-from", type=Path, help="a checkpoint folder with the model's config.json")
    ap.add_argument("--out", type=Path, help="write the checkpoint here")
    ap.add_argument("--compare", type=Path, help="check against this checkpoint folder")
    args = ap.parse_args()
    folder = Path(args.name) if Path(args.name).is_dir() else BUNDLE / args.name
    source = args.config_from or args.compare
    if source is None:
        raise SystemExit("give --config-from (to write) or --compare (to check): the model's config.json is there")
    config = json.loads((source / "config.json").read_text())
    tensors = hf_tensors(folder, config)
    if args.compare:
        from safetensors.numpy import load_file

        reference = load_file(str(args.compare / "model.safetensors"))
        bad = sorted(set(reference) ^ set(tensors)) + [
            k for k in tensors if k in reference and not np.array_equal(reference[k].astype(np.float16), tensors[k])
        ]
        print(f"{len(tensors)} tensors, {len(bad)} differ or are missing: {bad[:5]}")
        if bad:
            sys.exit(1)
    if args.out:
        from safetensors.numpy import save_file

        args.out.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(args.out / "model.safetensors"))
        for name in COPIED:
            if (source / name).is_file():
                shutil.copyfile(source / name, args.out / name)
        report = json.loads((folder / "export_report.json").read_text())  # what the bundled export was made from
        state = {"tokens_seen": report.get("tokens_seen"), "heldout_bpb": report.get("heldout_bpb"), "step": 0}
        state["rebuilt_from"] = str(folder)
        (args.out / "state.json").write_text(json.dumps(state, indent=2) + "\n")
        print(f"wrote {args.out} ({state['tokens_seen']} tokens seen)")


if __name__ == "__main__":
    main()
