"""Export a trained demo model to the onnxruntime-genai layout (fp32, CPU) and verify it against torch.

    python tools/export.py target --out build/export/pycode            # target: hidden states + aux taps
    python tools/export.py draft  --out build/export/pycode-draft --no-hidden-states

MODEL is a run name (its latest checkpoint: build/train/NAME or tools/checkpoints/NAME) or a checkpoint folder.
Steps: write a Hugging Face folder (fp32 weights, config.json with architectures, tokenizer.json and
tokenizer_config.json) under OUT/hf-src; run onnxruntime-genai's model builder as a module; put our
tokenizer.json back over the builder's re-serialised copy (byte-identical to tools/artifacts/tokenizer.json);
then run the ONNX graph with onnxruntime on a few prompts, both as one prefill and as prefill + one-token
decode steps through the KV cache, and report max |logit diff| (and hidden-state diffs) against torch.
The graph's inputs/outputs and the diffs are written to OUT/export_report.json.

Aux taps: the builder's entry i is the residual stream entering decoder layer i (Hugging Face
hidden_states[i]); valid entries are 1..L-1. The default is EAGLE-3's low/middle/high choice scaled to L
layers and made distinct: (2, L//2, L-1), which is 2,3,5 for the 6-layer target.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n",
    '    """Return the number of items."""\n    return len(self._items)\n',
    "for i, line in enumerate(lines):\n    if line.startswith('#'):\n",
]


def default_aux_layers(num_layers: int) -> list[int]:
    return sorted({min(max(1, x), num_layers - 1) for x in (2, num_layers // 2, num_layers - 1)})


def write_hf_folder(model, folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(folder, safe_serialization=True)
    common.write_tokenizer_files(folder)


def run_builder(hf: Path, out: Path, extra: dict[str, str], threads: int) -> None:
    cmd = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(hf),
        "-o",
        str(out),
        "-p",
        "fp32",
        "-e",
        "cpu",
        "-c",
        str(out.parent / (out.name + "-cache")),
    ]
    if extra:
        cmd += ["--extra_options", *(f"{k}={v}" for k, v in extra.items())]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)
    shutil.rmtree(out.parent / (out.name + "-cache"), ignore_errors=True)


def torch_reference(model, ids: list[int], taps: list[int]):
    """logits float32[n, vocab], final hidden float32[n, h], aux float32[n, h * len(taps)] for one prompt."""
    import torch

    entering: dict[int, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):

        def pre(_mod, args, kwargs, i=i):
            entering[i] = (args[0] if args else kwargs["hidden_states"]).detach()

        hooks.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
    final = {}
    hooks.append(model.model.norm.register_forward_hook(lambda _m, _a, out: final.__setitem__("h", out.detach())))
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float().numpy()
    finally:
        for h in hooks:
            h.remove()
    aux = np.concatenate([entering[i][0].numpy() for i in taps], axis=-1) if taps else None
    return logits, final["h"][0].numpy(), aux


class OrtRunner:
    """Minimal driver for a genai-layout graph: past_key_values.N.key/value in, present.N.* out."""

    def __init__(self, onnx_path: Path, threads: int):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.sess.get_inputs()}
        self.outputs = [o.name for o in self.sess.get_outputs()]
        decoder = json.loads((onnx_path.parent / "genai_config.json").read_text())["model"]["decoder"]
        self.kv_heads, self.head_size = decoder["num_key_value_heads"], decoder["head_size"]

    def empty_past(self) -> dict[str, np.ndarray]:
        # The builder leaves the head dim symbolic ("kv_cache_dim"), so take both sizes from genai_config.json.
        shape = (1, self.kv_heads, 0, self.head_size)
        return {name: np.zeros(shape, dtype=np.float32) for name in self.inputs if name.startswith("past_key_values")}

    def run(self, ids: list[int], past: dict[str, np.ndarray], past_len: int) -> dict[str, np.ndarray]:
        n = len(ids)
        feed = dict(past)
        feed["input_ids"] = np.array([ids], dtype=np.int64)
        if "attention_mask" in self.inputs:
            feed["attention_mask"] = np.ones((1, past_len + n), dtype=np.int64)
        if "position_ids" in self.inputs:
            feed["position_ids"] = np.arange(past_len, past_len + n, dtype=np.int64)[None]
        out = dict(zip(self.outputs, self.sess.run(None, feed), strict=True))
        out["_past"] = {k.replace("present", "past_key_values"): v for k, v in out.items() if k.startswith("present")}
        return out


def verify(model, out: Path, taps: list[int], threads: int) -> dict:
    tok = common.load_tokenizer()
    runner = OrtRunner(out / "model.onnx", threads)
    diffs = {
        "logits_prefill": 0.0,
        "logits_decode": 0.0,
        "hidden_states": 0.0,
        "aux_hidden_states": 0.0,
        "argmax_mismatches": 0,
        "positions": 0,
    }
    for prompt in PROMPTS:
        ids = [common.BOS_ID, *tok.encode(prompt).ids]
        ref_logits, ref_hidden, ref_aux = torch_reference(model, ids, taps)
        full = runner.run(ids, runner.empty_past(), 0)
        lg = full["logits"][0]
        diffs["logits_prefill"] = max(diffs["logits_prefill"], float(np.abs(lg - ref_logits).max()))
        diffs["argmax_mismatches"] += int((lg.argmax(-1) != ref_logits.argmax(-1)).sum())
        diffs["positions"] += len(ids)
        if "hidden_states" in full:
            diffs["hidden_states"] = max(
                diffs["hidden_states"], float(np.abs(full["hidden_states"][0] - ref_hidden).max())
            )
        if "aux_hidden_states" in full:
            diffs["aux_hidden_states"] = max(
                diffs["aux_hidden_states"], float(np.abs(full["aux_hidden_states"][0] - ref_aux).max())
            )
        # Prefill half, then decode one token at a time through the KV cache.
        half = len(ids) // 2
        step = runner.run(ids[:half], runner.empty_past(), 0)
        for pos in range(half, len(ids)):
            step = runner.run([ids[pos]], step["_past"], pos)
            diffs["logits_decode"] = max(
                diffs["logits_decode"], float(np.abs(step["logits"][0, -1] - ref_logits[pos]).max())
            )
    return diffs


def graph_io(path: Path) -> dict:
    import onnx

    m = onnx.load(str(path), load_external_data=False)

    def desc(v):
        t = v.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in t.shape.dim]
        return {"name": v.name, "dtype": onnx.TensorProto.DataType.Name(t.elem_type).lower(), "shape": dims}

    return {"inputs": [desc(v) for v in m.graph.input], "outputs": [desc(v) for v in m.graph.output]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="run name (target, small, draft, ...) or checkpoint folder")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--no-hidden-states", action="store_true", help="omit hidden_states and aux taps")
    ap.add_argument("--aux-layers", default=None, help="comma-separated builder aux entries (default: 2,L//2,L-1)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-build", action="store_true", help="only verify an existing OUT")
    args = ap.parse_args()
    common.set_threads(args.threads)

    model, folder = common.load_model(args.model)
    L = model.config.num_hidden_layers
    extra: dict[str, str] = {}
    taps: list[int] = []
    if not args.no_hidden_states:
        taps = [int(x) for x in args.aux_layers.split(",")] if args.aux_layers else default_aux_layers(L)
        extra = {"include_hidden_states": "1", "aux_hidden_state_layers": ",".join(map(str, taps))}
    out = args.out.resolve()
    if not args.skip_build:
        if out.exists():
            shutil.rmtree(out)
        hf = out.parent / (out.name + "-hf")
        write_hf_folder(model, hf)
        run_builder(hf, out, extra, args.threads)
        shutil.rmtree(hf)
        shutil.copyfile(common.TOKENIZER_JSON, out / "tokenizer.json")

    io = graph_io(out / "model.onnx")
    diffs = verify(model, out, taps, args.threads)
    state = common.read_state(folder) or {}
    report = {
        "source": str(folder),
        "tokens_seen": state.get("tokens_seen"),
        "heldout_bpb": state.get("heldout_bpb"),
        "num_layers": L,
        "hidden_size": model.config.hidden_size,
        "aux_hidden_state_layers": taps,
        "max_abs_diff": diffs,
        **io,
    }
    (out / "export_report.json").write_text(json.dumps(report, indent=2) + "\n")
    for kind in ("inputs", "outputs"):
        for v in io[kind]:
            print(f"{kind[:-1]:6s} {v['name']:28s} {v['dtype']:8s} {v['shape']}")
    print(json.dumps(diffs, indent=2))
    tol = 1e-3
    if max(diffs["logits_prefill"], diffs["logits_decode"]) > tol:
        raise SystemExit(f"ONNX logits differ from torch by more than {tol}")


if __name__ == "__main__":
    main()
