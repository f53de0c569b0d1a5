"""Evaluate the demo models: held-out bits per byte, draft/target top-1 agreement, tokens per target call.

    OMP_NUM_THREADS=1 python tools/eval.py --target target --draft draft [--out build/eval/report.json]

- bits per byte: every held-out token (tools/heldout_files.txt), in non-overlapping windows of --seq tokens,
  summed nats / ln 2 / bytes (the file-separating eos counts as one byte).
- teacher-forced agreement: on those windows, how often argmax(draft) == argmax(target).
- greedy agreement: the target continues --prompts held-out prefixes greedily for --gen tokens; how often the
  draft's argmax (teacher-forced on that continuation) is the target's next token.
- tokens per target call, K = 1..8: greedy speculative decoding replayed exactly on those continuations. Each
  target call verifies up to K draft tokens, accepts the leading run that matches, and adds its own next
  token, so a call yields min(K, run of matches) + 1 tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common


def logits_of(model, windows: np.ndarray, batch: int = 8) -> list[np.ndarray]:
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            out.extend(model(input_ids=torch.from_numpy(windows[i : i + batch])).logits.float().numpy())
    return out


def bpb_and_argmax(model, windows: np.ndarray, byte_len: np.ndarray) -> tuple[float, np.ndarray]:
    """bits per byte predicting windows[:, 1:], and argmax int64[n, seq] over windows[:, :-1]."""
    nats, nbytes, argmax = 0.0, 0, []
    for row, lg in zip(windows, logits_of(model, windows[:, :-1]), strict=True):
        lg = lg - lg.max(-1, keepdims=True)
        logp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
        nats -= float(logp[np.arange(len(row) - 1), row[1:]].sum())
        nbytes += int(byte_len[row[1:]].sum())
        argmax.append(lg.argmax(-1))
    return nats / math.log(2) / nbytes, np.stack(argmax)


def accepted_per_call(match: np.ndarray, k: int) -> float:
    """Tokens per target call of greedy speculative decoding with K drafted tokens, given match[j]
    = (draft's greedy token at continuation position j == target's)."""
    i, calls, n = 0, 0, len(match)
    while i < n:
        a = 0
        while a < k and i + a < n and match[i + a]:
            a += 1
        i += a + 1
        calls += 1
    return n / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="target")
    ap.add_argument("--draft", default=None, help="run name or folder; omit for bits per byte of the target only")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--kmax", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    common.set_threads(args.threads)
    import torch

    held = np.asarray(common.token_cache("heldout"), dtype=np.int64)
    n = (len(held) - 1) // args.seq
    windows = np.stack([held[i * args.seq : i * args.seq + args.seq + 1] for i in range(n)])
    byte_len = common.token_byte_lengths()

    report: dict = {"heldout_tokens": int(n * args.seq)}
    target, tfolder = common.load_model(args.target)
    tstate = common.read_state(tfolder) or {}
    report["target"] = {
        "source": str(tfolder),
        "tokens_seen": tstate.get("tokens_seen"),
        "params": sum(p.numel() for p in target.parameters()),
    }
    report["target"]["bpb"], t_arg = bpb_and_argmax(target, windows, byte_len)
    print(f"target bpb {report['target']['bpb']:.4f}", flush=True)

    if args.draft:
        draft, dfolder = common.load_model(args.draft)
        dstate = common.read_state(dfolder) or {}
        report["draft"] = {
            "source": str(dfolder),
            "tokens_seen": dstate.get("tokens_seen"),
            "params": sum(p.numel() for p in draft.parameters()),
        }
        report["draft"]["bpb"], d_arg = bpb_and_argmax(draft, windows, byte_len)
        report["agreement_teacher_forced"] = float((t_arg == d_arg).mean())
        print(
            f"draft bpb {report['draft']['bpb']:.4f}  teacher-forced agreement "
            f"{report['agreement_teacher_forced']:.4f}",
            flush=True,
        )

        starts = np.linspace(0, len(held) - args.prompt_tokens - 1, args.prompts).astype(np.int64)
        prompts = torch.from_numpy(np.stack([held[s : s + args.prompt_tokens] for s in starts]))
        with torch.no_grad():
            seqs = target.generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts),
                max_new_tokens=args.gen,
                min_new_tokens=args.gen,
                do_sample=False,
                pad_token_id=common.PAD_ID,
                eos_token_id=None,
            ).numpy()
        d_logits = logits_of(draft, seqs[:, :-1])
        p = args.prompt_tokens
        matches = [lg[p - 1 :].argmax(-1) == row[p:] for lg, row in zip(d_logits, seqs, strict=True)]
        report["agreement_greedy"] = float(np.concatenate(matches).mean())
        report["tokens_per_target_call"] = {
            k: float(np.mean([accepted_per_call(m, k) for m in matches])) for k in range(1, args.kmax + 1)
        }
        print(f"greedy agreement {report['agreement_greedy']:.4f}")
        print("K  " + " ".join(f"{k:>5d}" for k in report["tokens_per_target_call"]))
        print("t/c" + " ".join(f"{v:5.2f}" for v in report["tokens_per_target_call"].values()))

    out = args.out or common.BUILD / "eval" / "report.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
