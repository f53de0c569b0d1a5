"""Distil the draft preset from the trained target, resumably, on CPU.

    # optional, once: target greedy continuations of corpus prefixes (resumable, appends)
    OMP_NUM_THREADS=1 python tools/distill_draft.py --make-greedy 1000000
    # distillation (same checkpoint/resume/export rules as tools/train.py, run name "draft")
    OMP_NUM_THREADS=1 python tools/distill_draft.py --total-tokens 8000000 [--greedy-mix 0.5]
    python tools/train.py --preset draft --export-weights

Loss: T^2 * KL(target || draft) on temperature-T softmaxes of the target's logits, computed on the fly by a
frozen copy of the target (the latest checkpoint of --teacher), plus --ce-weight times the plain next-token
loss on the data. Data: corpus windows, and with --greedy-mix > 0 that fraction of batches comes from the
target's own greedy continuations (build/distill/greedy.u16, made by --make-greedy): speculative decoding
proposes on exactly that distribution, so matching the target there raises acceptance most.
The teacher's identity (its tokens seen) is recorded in state.json; resuming with a newer teacher is allowed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import train

GREEDY = common.BUILD / "distill" / "greedy.u16"
PROMPT_TOKENS = 32


class MixedBatches:
    """Corpus windows, or (with probability mix, decided per batch by a seeded draw) greedy sequences."""

    def __init__(
        self,
        corpus: train.Batches,
        greedy: np.ndarray | None,
        seq: int,
        batch: int,
        seed: int,
        mix: float,
        position: dict,
    ):
        self.corpus, self.seq, self.batch, self.seed, self.mix = corpus, seq, batch, seed, mix
        self.greedy = None if greedy is None else greedy[: len(greedy) // (seq + 1) * (seq + 1)].reshape(-1, seq + 1)
        self.count = position.get("count", 0)
        self.g_epoch, self.g_index = position.get("g_epoch", 0), position.get("g_index", 0)
        self._plan()

    def _plan(self) -> None:
        if self.greedy is not None:
            self.g_order = np.random.default_rng([self.seed, 7, self.g_epoch]).permutation(len(self.greedy))

    def position(self) -> dict:
        return {**self.corpus.position(), "count": self.count, "g_epoch": self.g_epoch, "g_index": self.g_index}

    def next(self) -> np.ndarray:
        self.count += 1
        use_greedy = self.greedy is not None and np.random.default_rng([self.seed, 11, self.count]).random() < self.mix
        if not use_greedy:
            return self.corpus.next()
        if self.g_index + self.batch > len(self.g_order):
            self.g_epoch, self.g_index = self.g_epoch + 1, 0
            self._plan()
        rows = self.g_order[self.g_index : self.g_index + self.batch]
        self.g_index += self.batch
        return np.asarray(self.greedy[rows], dtype=np.int64)


def make_greedy(teacher, n_tokens: int, seq: int, seed: int, batch: int, log) -> None:
    """Append target greedy sequences (PROMPT_TOKENS corpus tokens + continuation, seq+1 in all) to GREEDY."""
    import torch

    ids = common.token_cache("train")
    GREEDY.parent.mkdir(parents=True, exist_ok=True)
    have = GREEDY.stat().st_size // 2 // (seq + 1) if GREEDY.exists() else 0
    with open(GREEDY, "r+b" if GREEDY.exists() else "wb") as f:
        f.truncate(have * (seq + 1) * 2)  # drop a partial row left by an interrupted run
    want = n_tokens // (seq + 1)
    t0 = time.time()
    while have < want:
        rng = np.random.default_rng([seed, 3, have])
        starts = rng.integers(0, len(ids) - PROMPT_TOKENS, size=batch)
        prompts = torch.tensor(np.stack([ids[s : s + PROMPT_TOKENS] for s in starts]).astype(np.int64))
        with torch.no_grad():
            out = teacher.generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts),
                max_new_tokens=seq + 1 - PROMPT_TOKENS,
                min_new_tokens=seq + 1 - PROMPT_TOKENS,
                do_sample=False,
                pad_token_id=common.PAD_ID,
                eos_token_id=None,
            )
        rows = out[:, : seq + 1].numpy().astype(np.uint16)
        with open(GREEDY, "ab") as f:
            rows.tofile(f)
        have += len(rows)
        log(f"greedy: {have}/{want} sequences, {have * (seq + 1) / (time.time() - t0 + 1e-9):.0f} tok/s this run")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    train.add_common_args(ap)
    ap.set_defaults(total_tokens=8_000_000, lr=2e-3, name="draft")
    ap.add_argument("--teacher", default="target", help="run name or checkpoint folder of the target")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--ce-weight", type=float, default=0.1)
    ap.add_argument("--greedy-mix", type=float, default=0.0, help="fraction of batches from greedy continuations")
    ap.add_argument(
        "--make-greedy",
        type=int,
        default=None,
        metavar="TOKENS",
        help="generate this many tokens of target greedy continuations, then exit",
    )
    ap.add_argument("--greedy-batch", type=int, default=16)
    args = ap.parse_args()
    log = common.Log(common.run_dir(args.name) / "train.log")
    if args.export_weights:
        train.export_weights(args.name, log)
        return
    common.set_threads(args.threads)
    import torch
    import torch.nn.functional as F

    teacher, teacher_folder = common.load_model(args.teacher)
    for p in teacher.parameters():
        p.requires_grad_(False)
    teacher_state = common.read_state(teacher_folder) or {}
    if args.make_greedy is not None:
        make_greedy(teacher, args.make_greedy, args.seq, args.seed, args.greedy_batch, log)
        return

    T = args.temperature

    def distill_loss(model, batch):
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.no_grad():
            t_logits = teacher(input_ids=x).logits
        s_logits = model(input_ids=x).logits
        v = s_logits.shape[-1]
        s_logp = F.log_softmax(s_logits.reshape(-1, v) / T, dim=-1)
        t_logp = F.log_softmax(t_logits.reshape(-1, v) / T, dim=-1)
        kl = F.kl_div(s_logp, t_logp, log_target=True, reduction="batchmean") * T * T
        if args.ce_weight == 0:
            return kl
        return kl + args.ce_weight * F.cross_entropy(s_logits.reshape(-1, v), y.reshape(-1))

    greedy = None
    if args.greedy_mix > 0:
        if not GREEDY.exists():
            raise SystemExit(f"--greedy-mix needs {GREEDY}: run with --make-greedy first")
        greedy = np.memmap(GREEDY, dtype=np.uint16, mode="r")
    ids = common.token_cache("train")

    def make_batches(position: dict):
        corpus = train.Batches(
            ids, args.seq, args.batch, args.seed, epoch=position.get("epoch", 0), index=position.get("index", 0)
        )
        return MixedBatches(corpus, greedy, args.seq, args.batch, args.seed, args.greedy_mix, position)

    teacher_tokens = teacher_state.get("tokens_seen")
    log(f"distill_draft.py {' '.join(sys.argv[1:])} (teacher {teacher_folder}, {teacher_tokens} tokens)")
    extra = {
        "teacher": str(Path(teacher_folder).resolve().relative_to(common.REPO)),
        "teacher_tokens_seen": teacher_state.get("tokens_seen"),
        "distill": {"temperature": T, "ce_weight": args.ce_weight, "greedy_mix": args.greedy_mix},
    }
    train.run(args, "draft", distill_loss, ids, log, extra_state=extra, make_batches=make_batches)


if __name__ == "__main__":
    main()
