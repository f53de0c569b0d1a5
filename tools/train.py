"""Train a demo model (transformers LlamaForCausalLM, from scratch) on the stdlib corpus, resumably, on CPU.

    OMP_NUM_THREADS=2 python tools/train.py --preset target --total-tokens 20000000 --threads 2
    python tools/train.py --preset target --export-weights      # latest weights -> tools/checkpoints/target (fp16)

Resumable by design (a session may end, or the machine may be fresh, at any time):
- every --ckpt-seconds (default 300) and on SIGTERM/SIGINT the fp32 weights and a small state.json (step,
  tokens seen, data position, schedule position, wall seconds used) are written atomically to
  build/train/<preset>/;
- on start, the latest checkpoint is found in build/train/<preset>/ or else tools/checkpoints/<preset>/
  (whichever has seen more tokens), and training goes on from its tokens/data position. Optimizer state is
  not kept, so the LR is ramped up again over --resume-warmup steps;
- --export-weights writes the latest weights as fp16 safetensors (+ config, tokenizer, state) to
  tools/checkpoints/<preset>/, the copy that is committed so a fresh machine can resume. This also happens
  automatically when the token budget is reached.

Schedule: linear warm-up over --warmup steps to --lr, then cosine to lr * --min-lr-ratio at --total-tokens.
Data: non-overlapping windows of seq+1 tokens, shuffled per epoch with a seed derived from (--seed, epoch).
Progress (step, tokens, loss, tokens/s, elapsed) goes to build/train/<preset>/train.log, with held-out bits
per byte on a fixed subset of the held-out files at every checkpoint.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common


class Batches:
    """Deterministic epoch-shuffled windows; the position (epoch, index) is all that resuming needs."""

    def __init__(self, ids: np.ndarray, seq: int, batch: int, seed: int, epoch: int = 0, index: int = 0):
        self.ids, self.seq, self.batch, self.seed = ids, seq, batch, seed
        self.epoch, self.index = epoch, index
        self._plan(epoch)

    def _plan(self, epoch: int) -> None:
        rng = np.random.default_rng([self.seed, epoch])
        self.offset = int(rng.integers(self.seq))
        n = (len(self.ids) - self.offset - 1) // self.seq
        self.order = rng.permutation(n)

    def position(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def next(self) -> np.ndarray:
        """int64[batch, seq+1]"""
        if self.index + self.batch > len(self.order):
            self.epoch, self.index = self.epoch + 1, 0
            self._plan(self.epoch)
        starts = self.offset + self.order[self.index : self.index + self.batch] * self.seq
        self.index += self.batch
        return np.stack([np.asarray(self.ids[s : s + self.seq + 1], dtype=np.int64) for s in starts])


def lr_at(tokens: int, step_in_run: int, args) -> float:
    """Warm-up + cosine over the token budget, times a short ramp after every resume (fresh optimizer)."""
    step = tokens // (args.seq * args.batch)
    if step < args.warmup:
        base = args.lr * (step + 1) / args.warmup
    else:
        total = max(args.total_tokens // (args.seq * args.batch), args.warmup + 1)
        p = min(1.0, (step - args.warmup) / (total - args.warmup))
        base = args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))
    ramp = min(1.0, (step_in_run + 1) / args.resume_warmup) if args.resumed else 1.0
    return base * ramp


def add_common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--total-tokens", type=int, default=20_000_000, help="planned budget (the cosine ends here)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=200, help="steps of warm-up at the very start")
    ap.add_argument("--resume-warmup", type=int, default=50, help="steps of LR ramp after a resume")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ckpt-seconds", type=float, default=300)
    ap.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop (with a checkpoint) after this long")
    ap.add_argument("--export-weights", action="store_true", help="export the latest checkpoint and exit")
    ap.add_argument(
        "--name", default=None, help="run name for build/train/NAME and tools/checkpoints/NAME (default: the preset)"
    )
    ap.add_argument("--fresh", action="store_true", help="ignore existing checkpoints (refuses to overwrite one)")


def export_weights(preset: str, log=print) -> None:
    import torch

    found = common.latest_checkpoint(preset)
    if found is None:
        raise SystemExit(f"no checkpoint for {preset!r} to export")
    model, folder = common.load_model(folder_or := found[0])
    state = dict(found[1], exported_from=str(folder_or.relative_to(common.REPO)))
    out = common.export_dir(preset)
    if folder.resolve() == out.resolve():
        log(f"export: {out} is already the latest checkpoint ({state['tokens_seen']} tokens)")
        return
    common.save_checkpoint(model, state, out, dtype=torch.float16)
    size = (out / "model.safetensors").stat().st_size / 1e6
    log(f"export: {state['tokens_seen']} tokens -> {out.relative_to(common.REPO)} ({size:.1f} MB fp16)")


def run(
    args,
    preset: str,
    loss_fn: Callable,
    ids: np.ndarray,
    log: common.Log,
    extra_state: dict | None = None,
    make_batches: Callable[[dict], Batches] | None = None,
) -> None:
    """The resumable loop shared by train.py and distill_draft.py. loss_fn(model, batch int64[b, seq+1]) -> loss.

    make_batches(position) replaces the default corpus sampler; what it returns needs next() and position().
    """
    import torch
    from transformers import LlamaForCausalLM

    folder = common.run_dir(args.name)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(common.llama_config(preset)).float()
    found = None if args.fresh else common.latest_checkpoint(args.name)
    if args.fresh and common.read_state(folder) is not None:
        raise SystemExit(f"{folder} holds a checkpoint; move it away to start fresh")
    if found:
        common.load_weights(model, found[0])
        state = found[1]
        log(
            f"resume from {found[0].relative_to(common.REPO)}: step {state['step']}, {state['tokens_seen']} tokens, "
            f"{state['wall_seconds']:.0f}s used"
        )
    else:
        state = {"step": 0, "tokens_seen": 0, "wall_seconds": 0.0, "data": {"epoch": 0, "index": 0}, "runs": 0}
        log(f"fresh start: {preset} {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params")
    args.resumed = found is not None
    state["runs"] = state.get("runs", 0) + 1
    state.update(preset=preset, seq=args.seq, batch=args.batch, total_tokens=args.total_tokens, **(extra_state or {}))

    if make_batches is None:
        batches = Batches(ids, args.seq, args.batch, args.seed, **state["data"])
    else:
        batches = make_batches(state["data"])
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    windows = common.heldout_windows(args.seq)
    byte_len = common.token_byte_lengths()
    model.train()

    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def checkpoint(reason: str) -> None:
        state["data"] = batches.position()
        state["wall_seconds"] = wall0 + (time.time() - t0)
        state["heldout_bpb"] = common.bits_per_byte(model, windows, byte_len)
        state["loss_ema"] = loss_ema
        common.save_checkpoint(model, state, folder)
        log(
            f"checkpoint ({reason}): step {state['step']} tokens {state['tokens_seen']} "
            f"heldout_bpb {state['heldout_bpb']:.4f} wall {state['wall_seconds']:.0f}s"
        )

    t0 = time.time()
    wall0 = state["wall_seconds"]
    last_ckpt = t0
    tokens_run = 0
    loss_ema = state.get("loss_ema")
    step_in_run = 0
    tick = time.time()
    tick_tokens = 0
    per_step = args.seq * args.batch
    while state["tokens_seen"] < args.total_tokens:
        lr = lr_at(state["tokens_seen"], step_in_run, args)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = torch.from_numpy(batches.next())
        loss = loss_fn(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        lv = loss.item()
        if not math.isfinite(lv):
            raise SystemExit(f"loss is {lv} at step {state['step']}; not saving (last checkpoint is intact)")
        loss_ema = lv if loss_ema is None else 0.98 * loss_ema + 0.02 * lv
        state["step"] += 1
        state["tokens_seen"] += per_step
        tokens_run += per_step
        tick_tokens += per_step
        step_in_run += 1
        now = time.time()
        if state["step"] % args.log_every == 0:
            log(
                f"step {state['step']} tokens {state['tokens_seen']} loss {lv:.4f} ema {loss_ema:.4f} "
                f"lr {lr:.2e} gnorm {gnorm:.2f} tok/s {tick_tokens / (now - tick):.0f} "
                f"elapsed {wall0 + now - t0:.0f}s data {batches.position()}"
            )
            tick, tick_tokens = now, 0
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
    ap.add_argument("--preset", choices=sorted(common.PRESETS), required=True)
    add_common_args(ap)
    args = ap.parse_args()
    args.name = args.name or args.preset
    log = common.Log(common.run_dir(args.name) / "train.log")
    if args.export_weights:
        export_weights(args.name, log)
        return
    common.set_threads(args.threads)
    import torch.nn.functional as F

    def lm_loss(model, batch):
        logits = model(input_ids=batch[:, :-1]).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    log(f"train.py {' '.join(sys.argv[1:])}")
    run(args, args.preset, lm_loss, common.token_cache("train"), log)


if __name__ == "__main__":
    main()
