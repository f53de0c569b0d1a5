"""Random-weight Llama models for the host benchmark (docs/BENCHMARKS.md), exported with onnxruntime-genai's
model builder. Dev-time only; runs in .venv-tools (torch + transformers + onnxruntime-genai + onnx-ir).

    .venv-tools/bin/python tools/make_random_llama.py small        # ~5M params:   4 layers, hidden 256
    .venv-tools/bin/python tools/make_random_llama.py 100m         # ~100M params: 12 layers, hidden 768
    .venv-tools/bin/python tools/make_random_llama.py small 100m --out build/bench-models

Each size goes to OUT/SIZE (onnxruntime-genai layout: genai_config.json, model.onnx[.data], tokenizer.json).
The weights come from a fixed seed, so the same command gives the same model.

Two choices keep greedy decoding well defined on random weights:
- initializer_range 0.2 (instead of 0.02) spreads the logits (std ~ 0.2 * sqrt(hidden)), so the top two
  logits of a step are far apart compared with the float differences between implementations (torch,
  onnxruntime, onnxruntime-genai); the script checks the smallest top-1/top-2 margin along greedy paths and
  that onnxruntime's greedy tokens equal torch's.
- the EOS rows of lm_head are zero, so EOS logits are exactly 0 while the maximum over 4096 logits is far
  above 0: greedy never stops early and every contender generates the full length.

The tokenizer is the demo tokenizer (tools/artifacts/tokenizer.json: vocab 4096, <|bos|>=0, <|eos|>=1,
<|pad|>=2) when it exists, so generated ids decode; without it the models use vocab 4096 and no tokenizer
training is attempted (the script stops with a message).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_JSON = ROOT / "tools" / "artifacts" / "tokenizer.json"
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
SEED = 1234
INIT_RANGE = 0.2
CONTEXT = 4096

SIZES = {
    # ~5.0M parameters
    "small": dict(
        num_hidden_layers=4, hidden_size=256, intermediate_size=704, num_attention_heads=4, num_key_value_heads=2
    ),
    # ~99.5M parameters
    "100m": dict(
        num_hidden_layers=12, hidden_size=768, intermediate_size=2688, num_attention_heads=12, num_key_value_heads=4
    ),
}

CHECK_PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n",
    "def read_config(path):\n    with open(path) as f:\n",
]


def build_torch_model(size: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=4096,
        max_position_embeddings=CONTEXT,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        initializer_range=INIT_RANGE,
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        attention_bias=False,
        mlp_bias=False,
        **SIZES[size],
    )
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        # draw the weights here so the model depends only on the seed, not on transformers' init code
        generator = torch.Generator().manual_seed(SEED)
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * INIT_RANGE)
            elif "norm" in name:
                param.fill_(1.0)
        model.lm_head.weight[EOS_ID].zero_()
    return model


def write_hf_folder(model, folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copyfile(TOKENIZER_JSON, folder / "tokenizer.json")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": CONTEXT,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def run_builder(hf: Path, out: Path) -> None:
    cache = out.parent / (out.name + "-cache")
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out)]
    cmd += ["-p", "fp32", "-e", "cpu", "-c", str(cache)]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    shutil.rmtree(cache, ignore_errors=True)


def encode(prompt: str) -> list[int]:
    from tokenizers import Tokenizer

    return [BOS_ID, *Tokenizer.from_file(str(TOKENIZER_JSON)).encode(prompt, add_special_tokens=False).ids]


def torch_greedy(model, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """n greedy tokens with torch's KV cache, and the logits row float32[n, vocab] that chose each."""
    import torch

    out: list[int] = []
    rows = []
    with torch.no_grad():
        result = model(input_ids=torch.tensor([ids]), use_cache=True)
        for _ in range(n):
            row = result.logits[0, -1].float()
            rows.append(row.numpy().copy())
            token = int(row.argmax())
            out.append(token)
            result = model(input_ids=torch.tensor([[token]]), past_key_values=result.past_key_values, use_cache=True)
    return out, np.stack(rows)


def ort_greedy(onnx_file: Path, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """n greedy tokens with plain onnxruntime feeds (no IOBinding), the export's own check."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    decoder = json.loads((onnx_file.parent / "genai_config.json").read_text())["model"]["decoder"]
    empty = np.zeros((1, decoder["num_key_value_heads"], 0, decoder["head_size"]), np.float32)
    past = {name: empty for name in inputs if name.startswith("past_key_values")}
    feed_ids, length, out, rows = list(ids), 0, [], []
    for _ in range(n):
        feed = dict(past, input_ids=np.asarray([feed_ids], np.int64))
        feed["attention_mask"] = np.ones((1, length + len(feed_ids)), np.int64)
        result = dict(zip(outputs, session.run(None, feed), strict=True))
        length += len(feed_ids)
        past = {k.replace("present", "past_key_values"): v for k, v in result.items() if k.startswith("present")}
        rows.append(result["logits"][0, -1].copy())
        token = int(rows[-1].argmax())
        out.append(token)
        feed_ids = [token]
    return out, np.stack(rows)


def top2_margin(rows: np.ndarray) -> float:
    top = np.sort(rows, axis=-1)[:, -2:]
    return float((top[:, 1] - top[:, 0]).min())


def make(size: str, out_root: Path, check_tokens: int) -> dict:
    model = build_torch_model(size)
    params = sum(p.numel() for p in model.parameters())
    out = (out_root / size).resolve()
    hf = out.parent / (out.name + "-hf")
    if out.exists():
        shutil.rmtree(out)
    write_hf_folder(model, hf)
    run_builder(hf, out)
    shutil.copyfile(hf / "tokenizer.json", out / "tokenizer.json")
    shutil.copyfile(hf / "tokenizer_config.json", out / "tokenizer_config.json")
    shutil.rmtree(hf)

    margins, diffs, identical = [], [], True
    for prompt in CHECK_PROMPTS:
        ids = encode(prompt)
        reference, reference_rows = torch_greedy(model, ids, check_tokens)
        tokens, rows = ort_greedy(out / "model.onnx", ids, check_tokens)
        same = tokens == reference
        identical &= same
        agree = next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b), len(tokens)) + 1
        margins.append(top2_margin(reference_rows))
        diffs.append(float(np.abs(rows[:agree] - reference_rows[:agree]).max()))
        print(
            f"{size}: {prompt!r:56} logit std {reference_rows.std():6.2f}  min top-2 margin {margins[-1]:.4f}  "
            f"max |onnxruntime - torch| {diffs[-1]:.2e}  greedy tokens equal: {same}"
        )
        if EOS_ID in reference:
            print(f"{size}: WARNING greedy emitted EOS for {prompt!r}")
    report = {
        "size": size,
        "params": params,
        "config": {k: getattr(model.config, k) for k in ("vocab_size", "max_position_embeddings", *SIZES[size])},
        "seed": SEED,
        "initializer_range": INIT_RANGE,
        "check_tokens": check_tokens,
        "min_top2_margin": min(margins),
        "max_abs_logit_diff_onnxruntime_torch": max(diffs),
        "onnxruntime_greedy_equals_torch": identical,
    }
    (out / "random_llama.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    if not identical:
        raise SystemExit(f"{size}: onnxruntime's greedy tokens differ from torch's")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="+", choices=sorted(SIZES))
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench-models")
    parser.add_argument("--check-tokens", type=int, default=64, help="greedy tokens compared torch vs onnxruntime")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    if not TOKENIZER_JSON.exists():
        raise SystemExit(f"{TOKENIZER_JSON} is missing: run tools/train_tokenizer.py first")
    import torch

    torch.set_num_threads(args.threads)
    for size in args.sizes:
        make(size, args.out, args.check_tokens)


if __name__ == "__main__":
    main()
