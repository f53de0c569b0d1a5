"""Train an EAGLE-1 draft head for a demo target on the target's own features, resumably, on CPU.

    OMP_NUM_THREADS=1 .venv-tools/bin/python tools/train_eagle.py --target target --total-tokens 4000000
    .venv-tools/bin/python tools/train_eagle.py --export-weights     # latest head -> tools/checkpoints/eagle (fp16)
    .venv/bin/python tools/export_eagle.py eagle --target-onnx build/export/pycode --out build/export/pycode-eagle

The head (Li et al., EAGLE, ICML 2024), as decoctl.testing._eagle builds it in ONNX: at position i it takes the
target's feature f_i (the final RMSNorm's output, which is the lm_head's input and the ONNX target's hidden_states
output) and the embedding of the token after it, x = fc(concat(embed(x_{i+1}), f_i)); one Llama decoder layer (the
target's sizes) gives h; the predicted next feature is the target's final norm of h, and the draft logits are the
target's lm_head of that. The embedding, final norm and lm_head are the target's, frozen; fc and the layer train.

Loss per position: smooth L1 between the predicted feature and the true f_{i+1}, plus --ce-weight times the
cross-entropy of lm_head(predicted feature) against the target's own next-token distribution at i+1 (soft labels:
speculative decoding accepts what the target would produce, not what the corpus says). The frozen target
computes features and distributions on the fly for every batch of corpus windows. --feature-noise adds uniform
noise to the input features (EAGLE's trick: while drafting, the head reads its own, imperfect predictions).

A lean head for a shallow target (the demo target has 6 layers, so a head with the target's layer size and the
whole lm_head costs ~20% of a target step on a CPU): --head-intermediate narrows the head's MLP, and --draft-vocab N
lets it draft only the N most frequent training tokens (EAGLE-3's draft vocabulary): its logits are the target
lm_head's N columns, the cross-entropy uses the target's distribution renormalised over those N, and the ONNX head
scatters them into -inf rows of the full vocabulary (decoctl.testing._eagle).

Resumable like tools/train.py, with the same options (batches, schedule, --max-seconds, --ckpt-seconds, SIGTERM):
build/train/<name>/ (default name "eagle") holds model.safetensors (the head only), head_config.json and
state.json, which names the target checkpoint and its tokens seen. Every checkpoint also reports, on a fixed
held-out subset, how often the head's argmax equals the target's (teacher-forced top-1 agreement: the acceptance
rate of a one-token greedy draft) and the feature loss.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import train

HEAD_CONFIG = "head_config.json"


def head_config(target_config, intermediate: int | None = None, draft_ids: list[int] | None = None) -> dict:
    """The head's sizes: the target's layer sizes (EAGLE-1 reuses the target's decoder layer shape) unless a
    narrower MLP is asked for; ``draft_ids``: the draft vocabulary (None: the whole vocabulary)."""
    rope = getattr(target_config, "rope_parameters", None) or {}
    return {
        "hidden_size": target_config.hidden_size,
        "num_attention_heads": target_config.num_attention_heads,
        "num_key_value_heads": target_config.num_key_value_heads,
        "intermediate_size": intermediate or target_config.intermediate_size,
        "rms_norm_eps": target_config.rms_norm_eps,
        "rope_theta": float(rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))),
        "vocab_size": target_config.vocab_size,
        "draft_ids": draft_ids,
    }


def frequent_tokens(ids: np.ndarray, count: int, vocab: int) -> list[int]:
    """The ``count`` most frequent token ids of the training tokens, ascending (ties by lower id)."""
    frequency = np.bincount(ids, minlength=vocab)
    order = np.lexsort((np.arange(vocab), -frequency))
    return sorted(int(t) for t in order[:count])


def build_head(config: dict):
    """The head as a torch module (fc and one decoder layer), the same function as the ONNX graph."""
    import torch
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, size: int, eps: float):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(size))
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class EagleHead(nn.Module):
        def __init__(self, c: dict):
            super().__init__()
            h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
            self.heads, self.kv_heads, self.head_size = heads, kv, h // heads
            self.theta = c["rope_theta"]
            self.fc = nn.Linear(2 * h, h, bias=True)
            self.input_norm = RMSNorm(h, c["rms_norm_eps"])
            self.q_proj = nn.Linear(h, heads * self.head_size, bias=False)
            self.k_proj = nn.Linear(h, kv * self.head_size, bias=False)
            self.v_proj = nn.Linear(h, kv * self.head_size, bias=False)
            self.o_proj = nn.Linear(heads * self.head_size, h, bias=False)
            self.post_attention_norm = RMSNorm(h, c["rms_norm_eps"])
            self.gate_proj = nn.Linear(h, c["intermediate_size"], bias=False)
            self.up_proj = nn.Linear(h, c["intermediate_size"], bias=False)
            self.down_proj = nn.Linear(c["intermediate_size"], h, bias=False)
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, std=0.02)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)

        def rotate(self, x, positions):
            """Rotary embedding, half-split convention (GroupQueryAttention's rotary_interleaved=0)."""
            half = self.head_size // 2
            inv_freq = self.theta ** (-torch.arange(0, self.head_size, 2, dtype=torch.float64) / self.head_size)
            angles = (positions.to(torch.float64)[:, None] * inv_freq[None, :]).to(x.dtype)
            cos, sin = angles.cos(), angles.sin()
            first, second = x[..., :half], x[..., half:]
            return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)

        def forward(self, embeds, features):
            """embeds, features: float32[B, S, H] (token i+1's embedding, the target's feature at i) -> the layer's
            output float32[B, S, H], before the target's final norm."""
            b, s, _ = embeds.shape
            x = self.fc(torch.cat([embeds, features], dim=-1))
            h = self.input_norm(x)
            positions = torch.arange(s)
            q = self.q_proj(h).view(b, s, self.heads, self.head_size).transpose(1, 2)
            k = self.k_proj(h).view(b, s, self.kv_heads, self.head_size).transpose(1, 2)
            v = self.v_proj(h).view(b, s, self.kv_heads, self.head_size).transpose(1, 2)
            q, k = self.rotate(q, positions), self.rotate(k, positions)
            repeat = self.heads // self.kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
            context = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o_proj(context.transpose(1, 2).reshape(b, s, -1))
            h = self.post_attention_norm(x)
            return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))

    head = EagleHead(config)
    head.draft_ids = None if not config.get("draft_ids") else torch.tensor(config["draft_ids"], dtype=torch.long)
    return head


def target_outputs(target, ids):
    """The frozen target over ids int64[B, S]: its features (final-norm output) and logits, float32[B, S, *]."""
    import torch

    captured = {}
    hook = target.model.norm.register_forward_hook(lambda _m, _a, out: captured.__setitem__("h", out))
    try:
        with torch.no_grad():
            logits = target(input_ids=ids).logits.float()
    finally:
        hook.remove()
    return captured["h"].float(), logits


def head_outputs(head, target, ids, features):
    """The head over the pairs (features[:, i], ids[:, i + 1]): predicted features and draft logits [B, S-1, *]
    (over the draft vocabulary when the head has one: column j is token head.draft_ids[j])."""
    layer_out = head(target.model.embed_tokens(ids[:, 1:]), features[:, :-1])
    predicted = target.model.norm(layer_out)
    if head.draft_ids is None:
        return predicted, target.lm_head(predicted)
    return predicted, predicted @ target.lm_head.weight[head.draft_ids].T


def losses(head, target, batch, ce_weight: float, noise: float, generator=None):
    """(total, feature loss, cross-entropy, top-1 agreement) on one batch int64[B, S]."""
    import torch
    import torch.nn.functional as F

    features, logits = target_outputs(target, batch)
    inputs = features
    if noise > 0:
        inputs = features + (torch.rand(features.shape, generator=generator) * 2 - 1) * noise
    predicted, draft_logits = head_outputs(head, target, batch, inputs)
    regression = F.smooth_l1_loss(predicted, features[:, 1:])
    wanted = logits[:, 1:] if head.draft_ids is None else logits[:, 1:, head.draft_ids]
    soft = F.softmax(wanted, dim=-1)  # over a draft vocabulary: the target's distribution renormalised on it
    cross_entropy = -(soft * F.log_softmax(draft_logits, dim=-1)).sum(-1).mean()
    drafted = draft_logits.argmax(-1) if head.draft_ids is None else head.draft_ids[draft_logits.argmax(-1)]
    agreement = (drafted == logits[:, 1:].argmax(-1)).float().mean()
    return regression + ce_weight * cross_entropy, regression, cross_entropy, agreement


def evaluate(head, target, windows: np.ndarray, batch: int = 4) -> dict:
    import torch

    was_training = head.training
    head.eval()
    totals = {"heldout_feature_loss": 0.0, "heldout_ce": 0.0, "heldout_top1_agreement": 0.0}
    count = 0
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            ids = torch.from_numpy(windows[i : i + batch])
            _, regression, cross_entropy, agreement = losses(head, target, ids, 0.0, 0.0)
            n = len(ids)
            totals["heldout_feature_loss"] += regression.item() * n
            totals["heldout_ce"] += cross_entropy.item() * n
            totals["heldout_top1_agreement"] += agreement.item() * n
            count += n
    head.train(was_training)
    return {k: v / count for k, v in totals.items()}


def save(head, config: dict, state: dict, folder: Path, dtype=None) -> None:
    """head weights (safetensors) + head_config.json + state.json (last, so it never names missing weights)."""
    from safetensors.torch import save as to_bytes

    folder.mkdir(parents=True, exist_ok=True)
    weights = {
        k: (v.detach().to(dtype) if dtype is not None else v.detach()).contiguous()
        for k, v in head.state_dict().items()
    }
    common._atomic_write_bytes(folder / "model.safetensors", to_bytes(weights, metadata={"format": "pt"}))
    common._atomic_write_bytes(folder / HEAD_CONFIG, (json.dumps(config, indent=2) + "\n").encode())
    common._atomic_write_bytes(folder / "state.json", (json.dumps(state, indent=2) + "\n").encode())


def latest(name: str) -> tuple[Path, dict] | None:
    """The head checkpoint with the most tokens seen: build/train/NAME, then tools/checkpoints/NAME."""
    best = None
    for folder in (common.run_dir(name), common.export_dir(name)):
        state = common.read_state(folder)
        if state is not None and (best is None or state["tokens_seen"] > best[1]["tokens_seen"]):
            best = (folder, state)
    return best


def load_head(name_or_folder: str | Path):
    """(head in fp32 eval mode, its config, its state, its folder) from a run name or a checkpoint folder."""
    import torch
    from safetensors.torch import load_file

    folder = Path(name_or_folder)
    if not (folder / HEAD_CONFIG).is_file():
        found = latest(str(name_or_folder))
        if found is None:
            raise SystemExit(f"no EAGLE head checkpoint named {name_or_folder!r}: train one (tools/train_eagle.py)")
        folder = found[0]
    config = json.loads((folder / HEAD_CONFIG).read_text())
    head = build_head(config)
    head.load_state_dict({k: v.to(torch.float32) for k, v in load_file(str(folder / "model.safetensors")).items()})
    return head.float().eval(), config, json.loads((folder / "state.json").read_text()), folder


def export_weights(name: str, log) -> None:
    import torch

    found = latest(name)
    if found is None:
        raise SystemExit(f"no checkpoint for {name!r} to export")
    head, config, state, folder = load_head(found[0])
    out = common.export_dir(name)
    if folder.resolve() == out.resolve():
        log(f"export: {out} is already the latest checkpoint ({state['tokens_seen']} tokens)")
        return
    save(head, config, dict(state, exported_from=str(folder.relative_to(common.REPO))), out, dtype=torch.float16)
    log(f"export: {state['tokens_seen']} tokens -> {out.relative_to(common.REPO)}")


def run(args, log: common.Log) -> None:
    import torch

    target, target_folder = common.load_model(args.target)
    for p in target.parameters():
        p.requires_grad_(False)
    target_state = common.read_state(target_folder) or {}
    ids = common.token_cache("train")
    draft_ids = frequent_tokens(ids, args.draft_vocab, target.config.vocab_size) if args.draft_vocab else None
    config = head_config(target.config, args.head_intermediate, draft_ids)
    folder = common.run_dir(args.name)
    torch.manual_seed(args.seed)
    found = None if args.fresh else latest(args.name)
    if args.fresh and common.read_state(folder) is not None:
        raise SystemExit(f"{folder} holds a checkpoint; move it away to start fresh")
    if found:
        head, config, state, _ = load_head(found[0])
        head.train()
        log(f"resume from {found[0]}: step {state['step']}, {state['tokens_seen']} tokens")
    else:
        head = build_head(config).float().train()
        state = {"step": 0, "tokens_seen": 0, "wall_seconds": 0.0, "data": {"epoch": 0, "index": 0}, "runs": 0}
        log(f"fresh head: {sum(p.numel() for p in head.parameters()) / 1e6:.2f}M trainable params, {config}")
    args.resumed = found is not None
    state["runs"] = state.get("runs", 0) + 1
    state.update(
        target=str(Path(target_folder).resolve()),
        target_tokens_seen=target_state.get("tokens_seen"),
        seq=args.seq,
        batch=args.batch,
        total_tokens=args.total_tokens,
        loss={"ce_weight": args.ce_weight, "feature_noise": args.feature_noise},
    )
    batches = train.Batches(ids, args.seq, args.batch, args.seed, **state["data"])
    decay = [p for p in head.parameters() if p.dim() >= 2]
    no_decay = [p for p in head.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    windows = common.heldout_windows(args.seq, n=16)
    noise_rng = torch.Generator().manual_seed(args.seed)
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    t0 = time.time()
    wall0 = state["wall_seconds"]
    last_ckpt = t0
    step_in_run = 0
    loss_ema = state.get("loss_ema")

    def checkpoint(reason: str) -> None:
        state["data"] = batches.position()
        state["wall_seconds"] = wall0 + (time.time() - t0)
        state["loss_ema"] = loss_ema
        state.update(evaluate(head, target, windows))
        save(head, config, state, folder)
        log(
            f"checkpoint ({reason}): step {state['step']} tokens {state['tokens_seen']} top-1 agreement "
            f"{state['heldout_top1_agreement']:.3f} feature loss {state['heldout_feature_loss']:.4f} "
            f"wall {state['wall_seconds']:.0f}s"
        )

    while state["tokens_seen"] < args.total_tokens:
        lr = train.lr_at(state["tokens_seen"], step_in_run, args)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = torch.from_numpy(batches.next())
        loss, regression, cross_entropy, agreement = losses(
            head, target, batch, args.ce_weight, args.feature_noise, noise_rng
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0).item()
        opt.step()
        value = loss.item()
        if not math.isfinite(value):
            raise SystemExit(f"loss is {value} at step {state['step']}; not saving (last checkpoint is intact)")
        loss_ema = value if loss_ema is None else 0.98 * loss_ema + 0.02 * value
        state["step"] += 1
        state["tokens_seen"] += args.seq * args.batch
        step_in_run += 1
        now = time.time()
        if state["step"] % args.log_every == 0:
            log(
                f"step {state['step']} tokens {state['tokens_seen']} loss {value:.4f} (feature {regression.item():.4f}"
                f" ce {cross_entropy.item():.3f}) top-1 {agreement.item():.3f} lr {lr:.2e} gnorm {gnorm:.2f} "
                f"elapsed {wall0 + now - t0:.0f}s"
            )
        if stop["signal"] is not None:
            checkpoint(f"signal {stop['signal']}")
            return
        if args.max_seconds is not None and now - t0 >= args.max_seconds:
            checkpoint("max-seconds")
            return
        if now - last_ckpt >= args.ckpt_seconds:
            checkpoint("periodic")
            last_ckpt = time.time()
    checkpoint("budget reached")
    export_weights(args.name, log)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    train.add_common_args(ap)
    ap.set_defaults(total_tokens=4_000_000, lr=1e-3, warmup=100, name="eagle")
    ap.add_argument("--target", default="target", help="run name or checkpoint folder of the target")
    ap.add_argument("--ce-weight", type=float, default=0.1, help="weight of the distribution loss (EAGLE: 0.1)")
    ap.add_argument("--feature-noise", type=float, default=0.1, help="uniform noise amplitude on input features")
    ap.add_argument("--head-intermediate", type=int, default=None, help="the head's MLP size (default: the target's)")
    ap.add_argument("--draft-vocab", type=int, default=None, help="draft only the N most frequent training tokens")
    args = ap.parse_args()
    log = common.Log(common.run_dir(args.name) / "train.log")
    if args.export_weights:
        export_weights(args.name, log)
        return
    common.set_threads(args.threads)
    log(f"train_eagle.py {' '.join(sys.argv[1:])}")
    run(args, log)


if __name__ == "__main__":
    main()
