"""Export a trained EAGLE head (tools/train_eagle.py) to ONNX in the layout decoctl loads as role "eagle"; verify it.

    .venv/bin/python tools/export_eagle.py eagle --target-onnx build/export/pycode --out build/export/pycode-eagle

HEAD is a run name (its latest checkpoint: build/train/HEAD or tools/checkpoints/HEAD) or a head checkpoint folder.
--target-onnx is the exported target the head will run beside (onnxruntime-genai layout, with a hidden_states
output): the head copies its tokenizer files, special token ids and context length, and its hidden size and
vocabulary must match. The torch target the head was trained on (state.json's "target", or --target) gives the
shared weights: embedding, final norm and lm_head.

The graph is not traced: decoctl.testing._eagle builds it with onnx.helper from the weights (the same code that
builds the tests' random EAGLE-1 heads, whose decoder layer is this head's: with an input norm, and the target's
final norm) and decoctl.model.eagle_graph.save_head writes the folder, as it does every head's: GroupQueryAttention
over a shared past/present KV buffer, the extra input target_hidden_states, outputs logits and hidden_states (the
predicted features), and with tree inputs (the default; --no-tree-inputs leaves them out) position_ids and
attention_bias, which EAGLE-2 tree drafting needs.

Verification, on a few prompts, with the torch target's own features as input: the ONNX head run by decoctl's host
(Sequence.forward with features) as one pass and as one token at a time through its KV cache, against the torch
head; max |diff| of logits and predicted features is printed and written to OUT/export_report.json, and the
export fails above 1e-3. The exported target's hidden_states are compared with the torch features too, since
they are what the head will be fed. Runs in the environment that has decoctl (.venv) and needs torch and
transformers there (pip install torch==2.13.0 transformers, as for `decoctl models import`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import train_eagle

PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n",
    '    """Return the number of items."""\n    return len(self._items)\n',
    "for i, line in enumerate(lines):\n    if line.startswith('#'):\n",
]
TOLERANCE = 1e-3


def head_weights(head, target) -> dict[str, np.ndarray]:
    """The weights decoctl.testing._eagle.write_eagle_head takes, float32, projections laid out [in, out]."""

    def array(tensor) -> np.ndarray:
        return tensor.detach().to("cpu").float().numpy().copy()

    layer = "layers.0."
    weights = {
        "embed_tokens": array(target.model.embed_tokens.weight),
        "fc": array(head.fc.weight).T,
        "fc_bias": array(head.fc.bias),
        layer + "input_norm": array(head.input_norm.weight),
        layer + "post_attention_norm": array(head.post_attention_norm.weight),
        "final_norm": array(target.model.norm.weight),
        "lm_head": array(target.lm_head.weight).T,
    }
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        weights[layer + name] = array(getattr(head, name).weight).T
    if head.draft_ids is not None:  # the lm_head's columns of the draft vocabulary, and which tokens they are
        weights["lm_head"] = weights["lm_head"][:, head.draft_ids.numpy()]
        weights["draft_ids"] = head.draft_ids.numpy().astype(np.int64)
    return {name: np.ascontiguousarray(value) for name, value in weights.items()}


def _gap(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want|, where -inf must meet -inf (inf if the masked tokens differ)."""
    masked = np.isneginf(want)
    if (np.isneginf(got) != masked).any():
        return float("inf")
    return float(np.abs(got[~masked] - want[~masked]).max())


def verify(head, target, out: Path, target_onnx: Path) -> dict:
    import torch

    from decoctl.host import Sequence
    from decoctl.model import load_model

    tokenizer = common.load_tokenizer()
    eagle = Sequence("eagle", load_model(out, threads=1))
    onnx_target = load_model(target_onnx, threads=1)
    diffs = {
        "logits_one_pass": 0.0,
        "logits_step_by_step": 0.0,
        "features_one_pass": 0.0,
        "target_features_onnx_vs_torch": None,
        "argmax_mismatches": 0,
        "positions": 0,
    }
    for prompt in PROMPTS:
        ids = [common.BOS_ID, *tokenizer.encode(prompt).ids]
        batch = torch.tensor([ids])
        features, _ = train_eagle.target_outputs(target, batch)
        with torch.no_grad():
            predicted, logits = train_eagle.head_outputs(head, target, batch, features)
        f, want_logits, want_features = features[0].numpy(), logits[0].numpy(), predicted[0].numpy()
        if head.draft_ids is not None:  # the ONNX head scatters its columns into -inf rows of the full vocabulary
            wide = np.full((len(want_logits), onnx_target.spec.vocab_size), -np.inf, np.float32)
            wide[:, head.draft_ids.numpy()] = want_logits
            want_logits = wide
        eagle.rewind(0)
        got = np.array(eagle.forward(ids[1:], features=f[:-1]))
        diffs["logits_one_pass"] = max(diffs["logits_one_pass"], _gap(got, want_logits))
        got_features = np.array(eagle.hidden_states())
        diffs["features_one_pass"] = max(diffs["features_one_pass"], float(np.abs(got_features - want_features).max()))
        diffs["argmax_mismatches"] += int((got.argmax(-1) != want_logits.argmax(-1)).sum())
        diffs["positions"] += len(ids) - 1
        half = (len(ids) - 1) // 2
        eagle.rewind(0)
        eagle.forward(ids[1 : half + 1], features=f[:half])
        for i in range(half, len(ids) - 1):
            row = eagle.forward([ids[i + 1]], features=f[i : i + 1])[0]
            diffs["logits_step_by_step"] = max(diffs["logits_step_by_step"], _gap(row, want_logits[i]))
        if onnx_target.capabilities.hidden_states is not None:
            sequence = Sequence("target", onnx_target)
            sequence.forward(ids)
            gap = float(np.abs(np.array(sequence.hidden_states()) - f).max())
            diffs["target_features_onnx_vs_torch"] = max(gap, diffs["target_features_onnx_vs_torch"] or 0.0)
    return diffs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("head", help="run name (eagle, ...) or head checkpoint folder")
    ap.add_argument("--target-onnx", type=Path, required=True, help="the exported target (genai layout) folder")
    ap.add_argument("--target", default=None, help="torch target checkpoint (default: the one the head names)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--no-tree-inputs", action="store_true", help="leave out position_ids/attention_bias")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SystemExit("export_eagle.py needs torch beside decoctl: pip install torch==2.13.0 transformers") from None
    from decoctl.testing._eagle import write_eagle_head
    from decoctl.testing._models import RMS_EPS, ROPE_THETA

    common.set_threads(args.threads)
    head, config, state, folder = train_eagle.load_head(args.head)
    target, target_folder = common.load_model(args.target or state["target"])
    if (config["rope_theta"], config["rms_norm_eps"]) != (ROPE_THETA, RMS_EPS):
        raise SystemExit(
            f"the head uses rope theta {config['rope_theta']} and RMS eps {config['rms_norm_eps']}, but the ONNX head "
            f"builder writes theta {ROPE_THETA} and eps {RMS_EPS}"
        )
    onnx_config = json.loads((args.target_onnx / "genai_config.json").read_text())["model"]
    found = (onnx_config["decoder"]["hidden_size"], onnx_config["vocab_size"])
    if found != (config["hidden_size"], config["vocab_size"]):
        raise SystemExit(
            f"{args.target_onnx} has hidden size and vocabulary {found}, the head {config['hidden_size']} and "
            f"{config['vocab_size']}: export the head beside the target it was trained for"
        )
    out = args.out.resolve()
    write_eagle_head(
        out,
        head_weights(head, target),
        args.target_onnx,
        num_heads=config["num_attention_heads"],
        num_kv_heads=config["num_key_value_heads"],
        tree_inputs=not args.no_tree_inputs,
    )
    diffs = verify(head, target, out, args.target_onnx)
    report = {
        "source": str(folder),
        "tokens_seen": state.get("tokens_seen"),
        "heldout_top1_agreement": state.get("heldout_top1_agreement"),
        "target": str(target_folder),
        "target_onnx": str(args.target_onnx.resolve()),
        "tree_inputs": not args.no_tree_inputs,
        "head_config": config,
        "max_abs_diff": diffs,
    }
    (out / "export_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(diffs, indent=2))
    if max(diffs["logits_one_pass"], diffs["logits_step_by_step"]) > TOLERANCE:
        raise SystemExit(f"ONNX head logits differ from torch by more than {TOLERANCE}")


if __name__ == "__main__":
    main()
