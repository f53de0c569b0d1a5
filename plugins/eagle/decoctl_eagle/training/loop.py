"""Training a head on stored features: batches, losses, held-out evaluation, checkpoints and resuming.

Losses, per unrolled step j (decoctl_eagle.training.model): the cross-entropy of the head's draft distribution
against the target's, renormalised over the target's stored top-k tokens that the draft vocabulary holds; an
EAGLE-1 head also regresses its output feature on the target's next one (smooth L1, EAGLE-1's loss, with the
cross-entropy weighted 0.1). Step j weighs 0.8^j, as EAGLE-3 weighs its test steps.

Evaluation on the held-out windows, step by step as drafting runs: ``top1`` is step 0's agreement with the
target's greedy token (teacher forced), and ``tau`` the expected tokens per target step of a greedy chain of
``steps`` drafts, 1 + sum_j P(the first j drafts all agree), each anchor's chain counted as greedy verification
counts it. A chain goes on past a draft only where the text's next token is the target's greedy choice (the head
was fed the text), so on text that leaves the target's greedy path tau is a lower bound; on distilled text it is
exact.

A checkpoint (``checkpoint.pt``: the head, the optimizer, the run's counters) is written every
``checkpoint_minutes``, on a stop (SIGINT/SIGTERM, ``max_steps``) and at the end; resuming restores it and goes on
from the same batch of the same epoch (batch order and feature noise are drawn from the seed, the epoch and the
step, so a resumed run trains on what an uninterrupted one would have).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from decoctl.logs import get_logger
from decoctl.model.eagle_graph import EAGLE1
from decoctl_eagle.training.features import FeatureStore, Window
from decoctl_eagle.training.model import Head

__all__ = ["Batch", "Budget", "Trainer", "autocast", "bf16_native", "evaluate"]

log = get_logger(__name__)

CHECKPOINT = "checkpoint.pt"
STEP_WEIGHT = 0.8
EAGLE1_CE_WEIGHT = 0.1


@attrs.frozen
class Batch:
    """Windows padded to the longest: ids int64[B, L], features float[B, L, W], label ids int64[B, L, K], label
    logits float[B, L, K], lengths int64[B]."""

    ids: torch.Tensor
    features: torch.Tensor
    label_ids: torch.Tensor
    label_logits: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def of(cls, store: FeatureStore, windows: Sequence[Window]) -> Batch:
        rows = [store.read(w) for w in windows]
        length = max(len(r[0]) for r in rows)

        def padded(index: int, dtype: Any) -> torch.Tensor:
            first = rows[0][index]
            out = np.zeros((len(rows), length, *first.shape[1:]), dtype)
            for b, r in enumerate(rows):
                out[b, : len(r[index])] = r[index]
            return torch.from_numpy(out)

        return cls(
            padded(0, np.int64),
            padded(1, np.float32),
            padded(2, np.int64),
            padded(3, np.float32),
            torch.tensor([len(r[0]) for r in rows]),
        )

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    def to(self, device: torch.device) -> Batch:
        """The batch on ``device`` (itself on the CPU)."""
        if device.type == "cpu":
            return self
        return Batch(*(t.to(device, non_blocking=True) for t in attrs.astuple(self, recurse=False)))


def autocast(device: torch.device, bf16: bool) -> Any:
    """The forward's precision: bfloat16 matrix products where ``bf16`` (weights, optimizer state, softmax and losses
    stay float32), else float32 throughout."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16)


def bf16_native(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 products in hardware: a CUDA GPU that supports it, a CPU with AVX-512
    BF16 or AMX (elsewhere autocast would emulate them, slower than float32)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's, since torch 2.2
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


@attrs.frozen(kw_only=True)
class Budget:
    """When training stops: after ``epochs`` passes over the training windows or ``max_tokens`` trained tokens
    (whichever comes first), or at step ``max_steps`` (a stop, to be resumed)."""

    epochs: int
    max_tokens: int | None
    max_steps: int | None
    checkpoint_minutes: float


def _losses(
    head: Head,
    batch: Batch,
    steps: int,
    draft_index: torch.Tensor,
    draft_ids: torch.Tensor,
    noise: float,
    seed: int,
    *,
    measured: int | None = None,
) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    """The loss to minimise and, per step, the masks and correctness that evaluation counts; correctness (an argmax
    over the draft vocabulary) only for the first ``measured`` steps (all: None)."""
    features = batch.features
    if noise > 0:  # EAGLE-1's trick: drafting feeds the head its own imperfect features
        generator = torch.Generator().manual_seed(seed)  # drawn on the CPU: the same noise on every device
        draw = torch.rand(features.shape, generator=generator).to(features.device)
        features = features + (draw * 2 - 1) * noise
    outputs = head.unrolled(batch.ids, features, steps)
    length = batch.ids.shape[1]
    positions = torch.arange(length, device=batch.ids.device)
    total = torch.zeros((), device=batch.ids.device)
    weights = 0.0
    per_step = []
    for step, out in enumerate(outputs):
        source = positions + 1 + step  # the target's row whose next-token distribution this step learns
        valid = source[None, :] < batch.lengths[:, None]
        clamped = source.clamp(max=length - 1)
        label_ids = batch.label_ids[:, clamped]
        index = draft_index[label_ids]
        drafted = index >= 0
        target = torch.softmax(batch.label_logits[:, clamped].masked_fill(~drafted, -1e30), dim=-1)
        usable = valid & drafted.any(-1)
        log_q = torch.log_softmax(out.logits, dim=-1, dtype=torch.float32)
        cross_entropy = -(target * log_q.gather(-1, index.clamp(min=0))).sum(-1)
        loss = cross_entropy[usable].mean() if usable.any() else torch.zeros((), device=total.device)
        if head.dims.architecture == EAGLE1:
            regression = F.smooth_l1_loss(out.features[valid].float(), batch.features[:, clamped][valid])
            loss = regression + EAGLE1_CE_WEIGHT * loss
        total = total + STEP_WEIGHT**step * loss
        weights += STEP_WEIGHT**step
        entry = {"valid": valid, "loss": loss.detach()}
        if measured is None or step < measured:
            with torch.no_grad():
                entry["correct"] = (draft_ids[out.logits.argmax(-1)] == label_ids[..., 0]) & valid
                # the next step was fed the text's next token: a chain goes on only where that is the target's choice
                entry["follows"] = batch.ids[:, (source + 1).clamp(max=length - 1)] == label_ids[..., 0]
        per_step.append(entry)
    return total / weights, per_step


def evaluate(
    head: Head,
    store: FeatureStore,
    windows: Sequence[Window],
    *,
    steps: int,
    batch: int,
    device: torch.device | None = None,
    bf16: bool = False,
) -> dict[str, float]:
    """Held-out ``top1`` (step 0's agreement), ``tau`` (expected tokens per target step of a greedy chain of
    ``steps`` drafts), per-step agreement and the loss, over ``windows``, on ``device`` (the CPU) with bfloat16
    products where ``bf16``."""
    device = device or torch.device("cpu")
    was_training = head.training
    head.eval()
    draft_index, draft_ids = head.draft_index(), head.draft_ids()
    counts = np.zeros(steps)
    valid_counts = np.zeros(steps)
    chain = np.zeros(steps)
    anchors = 0
    loss_sum = 0.0
    batches = 0
    with torch.no_grad():
        for start in range(0, len(windows), batch):
            data = Batch.of(store, windows[start : start + batch]).to(device)
            with autocast(device, bf16):
                loss, per_step = _losses(head, data, steps, draft_index, draft_ids, 0.0, 0)
            loss_sum += float(loss)
            batches += 1
            # an anchor counts towards tau where every step's label exists
            full = per_step[-1]["valid"]
            running = full.clone()
            for step, entry in enumerate(per_step):
                counts[step] += float(entry["correct"].sum())
                valid_counts[step] += float(entry["valid"].sum())
                running = running & entry["correct"]
                chain[step] += float(running.sum())
                running = running & entry["follows"]
            anchors += int(full.sum())
    head.train(was_training)
    agreement = counts / np.maximum(valid_counts, 1)
    return {
        "top1": float(agreement[0]),
        "tau": float(1 + (chain / max(anchors, 1)).sum()),
        "agreement_by_step": [round(float(a), 4) for a in agreement],
        "loss": loss_sum / max(batches, 1),
    }


class Trainer:
    """One run's training state over a feature store, written to and resumed from ``folder/checkpoint.pt``. The head
    trains on ``device`` (the CPU unless given), with bfloat16 products where ``bf16``."""

    def __init__(
        self,
        head: Head,
        store: FeatureStore,
        folder: Path,
        *,
        steps: int,
        batch: int,
        lr: float,
        seed: int,
        noise: float,
        eval_tokens: int,
        device: torch.device | None = None,
        bf16: bool = False,
    ) -> None:
        self.device = device or torch.device("cpu")
        self.bf16 = bf16
        self.head = head.to(self.device)
        self.store = store
        self.folder = folder
        self.steps = steps
        self.batch = batch
        self.lr = lr
        self.seed = seed
        self.noise = noise
        self.train_windows = store.windows(heldout=False)
        held = store.windows(heldout=True) or self.train_windows[-1:]
        self.eval_windows = _first_tokens(held, eval_tokens)
        decay = [p for p in head.parameters() if p.requires_grad and p.dim() >= 2]
        flat = [p for p in head.parameters() if p.requires_grad and p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.01}, {"params": flat, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95)
        )
        self.state: dict[str, Any] = {"step": 0, "epoch": 0, "batch": 0, "tokens": 0, "seconds": 0.0, "evals": []}
        self._draft_index, self._draft_ids = head.draft_index(), head.draft_ids()

    @property
    def batches_per_epoch(self) -> int:
        return max(1, math.ceil(len(self.train_windows) / self.batch))

    def planned_tokens(self, budget: Budget) -> int:
        tokens = budget.epochs * sum(w.length for w in self.train_windows)
        return min(tokens, budget.max_tokens) if budget.max_tokens else tokens

    # -- checkpoints ------------------------------------------------------------------------------------------
    def resume(self) -> bool:
        """Load ``checkpoint.pt`` when there is one; True if it was."""
        path = self.folder / CHECKPOINT
        if not path.is_file():
            return False
        saved = torch.load(path, map_location=self.device, weights_only=False)
        self.head.load_state_dict(saved["head"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.state = saved["state"]
        return True

    def checkpoint(self) -> Path:
        path = self.folder / CHECKPOINT
        staging = path.with_name(CHECKPOINT + ".tmp")
        torch.save(
            {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(), "state": self.state}, staging
        )
        os.replace(staging, path)
        return path

    # -- training -------------------------------------------------------------------------------------------------
    def _lr(self, total_steps: int) -> float:
        """Linear warm-up over the first 5% of the steps (at most 200), then a cosine down to a tenth."""
        step = self.state["step"]
        warmup = max(1, min(200, total_steps // 20))
        if step < warmup:
            return self.lr * (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    def _next_windows(self) -> list[Window]:
        order = np.random.default_rng([self.seed, self.state["epoch"]]).permutation(len(self.train_windows))
        start = self.state["batch"] * self.batch
        return [self.train_windows[i] for i in order[start : start + self.batch]]

    def done(self, budget: Budget) -> bool:
        """Whether the budget (epochs or tokens) is spent: training is finished, not stopped."""
        return self.state["epoch"] >= budget.epochs or (
            budget.max_tokens is not None and self.state["tokens"] >= budget.max_tokens
        )

    def train(
        self,
        budget: Budget,
        *,
        stop: Callable[[], bool],
        progress: Callable[[int, dict[str, float]], None],
        on_eval: Callable[[dict[str, Any]], None],
    ) -> str:
        """Train until the budget is spent ("finished"), ``max_steps`` is reached or ``stop()`` says so
        ("stopped"); evaluate and checkpoint every ``checkpoint_minutes`` and at the end. Returns why it ended."""
        self.head.train()
        total_steps = math.ceil(self.planned_tokens(budget) / max(1, self._tokens_per_batch()))
        last_checkpoint = time.monotonic()
        began = time.monotonic() - self.state["seconds"]
        reason = "finished"
        while not self.done(budget):
            if budget.max_steps is not None and self.state["step"] >= budget.max_steps:
                reason = "stopped"
                break
            if stop():
                reason = "stopped"
                break
            batch = Batch.of(self.store, self._next_windows()).to(self.device)
            for group in self.optimizer.param_groups:
                group["lr"] = self._lr(total_steps)
            with autocast(self.device, self.bf16):
                loss, per_step = _losses(
                    self.head,
                    batch,
                    self.steps,
                    self._draft_index,
                    self._draft_ids,
                    self.noise,
                    self.seed * 1_000_003 + self.state["step"],
                    measured=1,  # the progress bar's top-1; evaluation measures every step
                )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.head.parameters(), 0.5)
            self.optimizer.step()
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(
                    f"the loss became {value} at step {self.state['step']}: lower --lr and resume (the last "
                    "checkpoint is intact)"
                )
            first = per_step[0]
            top1 = float(first["correct"].sum()) / max(1.0, float(first["valid"].sum()))
            self.state["step"] += 1
            self.state["tokens"] += batch.tokens
            self.state["batch"] += 1
            if self.state["batch"] >= self.batches_per_epoch:
                self.state["epoch"] += 1
                self.state["batch"] = 0
            self.state["seconds"] = time.monotonic() - began
            progress(batch.tokens, {"loss": value, "top1": top1})
            if time.monotonic() - last_checkpoint >= budget.checkpoint_minutes * 60:
                self.evaluate_and_save(on_eval)
                last_checkpoint = time.monotonic()
        self.evaluate_and_save(on_eval)
        return reason

    def _tokens_per_batch(self) -> float:
        mean = sum(w.length for w in self.train_windows) / max(1, len(self.train_windows))
        return mean * min(self.batch, len(self.train_windows))

    def evaluate_and_save(self, on_eval: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        metrics = evaluate(
            self.head,
            self.store,
            self.eval_windows,
            steps=self.steps,
            batch=self.batch,
            device=self.device,
            bf16=self.bf16,
        )
        entry = {"step": self.state["step"], "tokens": self.state["tokens"], **metrics}
        evals = [e for e in self.state["evals"] if e["step"] != entry["step"]]
        self.state["evals"] = [*evals, entry]
        self.checkpoint()
        log.info("decoctl.eagle_evaluated", **{k: v for k, v in entry.items() if k != "agreement_by_step"})
        on_eval(entry)
        return entry


def _first_tokens(windows: Sequence[Window], tokens: int) -> list[Window]:
    """The first windows holding about ``tokens`` tokens (at least one)."""
    chosen, total = [], 0
    for window in windows:
        if chosen and total >= tokens:
            break
        chosen.append(window)
        total += window.length
    return chosen
