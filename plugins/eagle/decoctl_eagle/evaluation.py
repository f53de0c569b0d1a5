"""``decoctl eagle eval``: how well an ONNX head drafts for its target on given text, through decoctl's runtime.

The figures are the trainer's held-out ones (decoctl_eagle.training.loop.evaluate), computed here by the ONNX target
and the ONNX head as the eagle controller runs them, so that any head (one ``decoctl eagle train`` exported, an
imported one, the bundled demo head) is measured the same way on the same text, without torch:

- ``top1``: teacher-forced agreement. Head position p, fed the target's feature at p and the text's token p + 1,
  predicts token p + 2; it agrees where its argmax is the target's argmax at p + 1 (the target's greedy choice).
  Counted at every position of every window that has that label.
- ``agreement_by_step[j]``: step j of a chain from anchor p, the head at position p + j fed its own previous output
  and the text's token p + 1 + j, against the target's argmax at p + 1 + j (step 0 is ``top1``).
- ``tau``: the expected tokens per target step of greedy chain drafting with ``steps`` drafts, 1 + sum_j P(the
  first j + 1 drafts all agree), over the anchors whose whole chain has labels. A chain goes on past a draft only
  where the text's next token is the target's greedy choice (the head was fed the text), so on text that leaves the
  target's greedy path tau is a lower bound; on the target's own greedy continuations it is exact.

The text is read and cut into windows as the trainer cuts its data (decoctl_eagle.training.data); each window runs
through the target once, then through the head once teacher-forced; the chains then run anchor by anchor from the
last one down, each rewinding the head to its anchor (a chain overwrites only the cache rows after its anchor, which
the anchors below it do not read).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from decoctl import ConfigError, PluginRegistry, Sequence, load_model, resolve_model
from decoctl.logs import get_logger
from decoctl_eagle.fit import HeadShape, TargetShape, check_fits
from decoctl_eagle.training import data as text

__all__ = ["Evaluation", "evaluate_head"]

log = get_logger(__name__)


@attrs.frozen(kw_only=True)
class Evaluation:
    """What ``evaluate_head`` measured: the figures (module docstring) and what they were counted over."""

    head: str
    target: str
    data: tuple[str, ...]
    steps: int
    windows: int
    positions: int
    anchors: int
    top1: float
    tau: float
    agreement_by_step: tuple[float, ...]

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=False) | {
            "data": list(self.data),
            "agreement_by_step": list(self.agreement_by_step),
        }


def evaluate_head(
    target: str | Path,
    head: str | Path,
    data: Seq[str | Path],
    *,
    steps: int = 3,
    seq_len: int = 256,
    max_tokens: int | None = None,
    threads: int | None = None,
    plugins: PluginRegistry | None = None,
    report: Callable[[int], None] | None = None,
) -> Evaluation:
    """Measure ``head`` (a registered name or a folder) drafting for ``target`` on the text files ``data`` (plain
    text or JSONL, as ``decoctl eagle train --data`` reads them), in windows of ``seq_len`` tokens, with chains of
    ``steps`` drafts; ``max_tokens``: stop after the window that reaches that many tokens. ``report(n)`` is told
    each finished window's token count."""
    if steps < 1 or seq_len < steps + 2:
        raise ConfigError(f"steps {steps} must be at least 1 and seq_len {seq_len} at least steps + 2")
    registry = plugins or PluginRegistry()
    target_name, target_path = resolve_model(str(target), registry)
    head_name, head_path = resolve_model(str(head), registry)
    target_model = load_model(target_path, name=target_name, threads=threads)
    head_model = load_model(head_path, name=head_name, threads=threads)
    shape = _head_shape(target_model, head_model)
    bos = text.prompt_bos(target_model.tokenizer, target_model.spec.bos_token_id)
    windows = text.file_windows(data, target_model.tokenizer, seq_len, bos)
    if not windows:
        raise ConfigError(
            f"--data {' '.join(map(str, data))} holds no text: give text or JSONL files with text in them"
        )
    target_role = Sequence("target", target_model, max_length=seq_len + 1)
    head_role = Sequence("eagle", head_model, max_length=seq_len + steps + 1)
    counts = _Counts(steps)
    done = 0
    for window in windows:
        if max_tokens is not None and done >= max_tokens:
            break
        _window(np.asarray(window, np.int64), target_role, head_role, shape, steps, counts)
        done += len(window)
        if report is not None:
            report(len(window))
    result = Evaluation(
        head=str(head_path),
        target=str(target_path),
        data=tuple(str(Path(p)) for p in data),
        steps=steps,
        windows=counts.windows,
        positions=int(counts.valid[0]),
        anchors=counts.anchors,
        top1=float(counts.correct[0] / max(counts.valid[0], 1)),
        tau=float(1 + (counts.chain / max(counts.anchors, 1)).sum()),
        agreement_by_step=tuple(
            round(float(c / max(v, 1)), 4) for c, v in zip(counts.correct, counts.valid, strict=True)
        ),
    )
    log.info("decoctl.eagle_head_evaluated", head=head_name, target=target_name, top1=result.top1, tau=result.tau)
    return result


class _Counts:
    """Per-step agreement counts, and the chains' (how many anchors got past each step)."""

    def __init__(self, steps: int) -> None:
        self.correct = np.zeros(steps)
        self.valid = np.zeros(steps)
        self.chain = np.zeros(steps)
        self.anchors = 0
        self.windows = 0


def _window(ids: np.ndarray, target: Sequence, head: Sequence, shape: HeadShape, steps: int, counts: _Counts) -> None:
    """Count one window: ids int64[L]."""
    length = len(ids)
    target.rewind(0)
    greedy = np.asarray(target.forward(ids)).argmax(-1)  # greedy[i]: the target's choice for token i + 1
    fed = shape.target_rows(target)
    head.rewind(0)
    head.forward(ids[1:], features=fed[:-1])
    # drafted[j, p]: step j's argmax at anchor p (head position p + j), -1 where step j has no label
    drafted = np.full((steps, length), -1, np.int64)
    drafted[0, : length - 1] = np.asarray(head.logits()).argmax(-1)
    own = np.array(head.hidden_states())
    last = length - 3 if steps > 1 else -1  # the last anchor with a step 1
    for anchor in range(last, -1, -1):  # downwards: see the module docstring
        head.rewind(anchor + 1)
        feature = own[anchor]
        for step in range(1, steps):
            if anchor + 1 + step >= length:
                break
            row = head.forward([int(ids[anchor + 1 + step])], features=shape.own_rows(feature[None, :]))
            drafted[step, anchor] = int(np.argmax(row[-1]))
            feature = np.array(head.hidden_states()[-1])
    positions = np.arange(length)
    follows = np.ones(length, bool)
    running = positions + steps < length  # anchors whose whole chain has labels
    counts.anchors += int(running.sum())
    for step in range(steps):
        source = positions + 1 + step  # the target's row that holds this step's label
        valid = source < length
        label = greedy[np.minimum(source, length - 1)]
        correct = (drafted[step] == label) & valid
        counts.correct[step] += int(correct.sum())
        counts.valid[step] += int(valid.sum())
        running = running & follows & correct
        counts.chain[step] += int(running.sum())
        # the next step was fed the text's next token: the chain goes on only where it is the target's choice
        follows = ids[np.minimum(source + 1, length - 1)] == label
    counts.windows += 1


def _head_shape(target: Any, head: Any) -> HeadShape:
    """The head's shape, which says how its feature rows are laid out; refused, naming the fix, when the head does
    not fit the target or the target cannot be drafted for."""
    shape = HeadShape.of_model(head)
    if target.capabilities.hidden_states is None or not target.capabilities.logits_all_positions:
        raise ConfigError(
            f"target {target.name} needs a hidden_states output and logits at every position to be drafted for: "
            f"copy it with `decoctl models enable-taps {target.name} DST`"
        )
    check_fits(shape, TargetShape.of_model(target), what=f"head {head.name}")
    return shape
