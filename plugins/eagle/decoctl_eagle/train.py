"""``decoctl eagle train``: train an EAGLE head for an onnxruntime-genai target from the target's own features.

    decoctl eagle train --target MODEL --data FILE... --out DIR [--arch eagle3|eagle1] [--resume] ...
    python -m decoctl_eagle.train --target MODEL --data FILE... --out DIR ...      (the same, without decoctl's CLI)

The features come from the ONNX target through decoctl's runtime (no torch copy of the target); the head trains in
torch (the plugin's ``train`` extra: pip install 'decoctl-eagle[train]'), is exported to ONNX beside its
checkpoint in DIR/head, checked against torch, and registered as the target's default ``eagle`` role, so that
``decoctl generate -c eagle --model MODEL`` takes it. README.md (Training a head) tells the whole story.

``train_main(argv)`` is the entry point (decoctl's ``eagle train`` subcommand hands it its arguments);
``add_arguments(parser)`` and ``run(args)`` are its two halves.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

from decoctl import DecoctlError

__all__ = ["add_arguments", "run", "train_main"]

DESCRIPTION = (
    "Train an EAGLE draft head for an onnxruntime-genai target from the target's own features, export it to ONNX "
    "and make it the target's eagle head (decoctl generate -c eagle --model MODEL)."
)
#: what the trainer imports beyond decoctl's own dependencies, and the extra that brings them
NEEDS = ("torch", "tqdm", "onnx")
EXTRA = (
    "pip install 'decoctl-eagle[train]' (torch==2.13.0 from your machine's CPU wheel: --find-links or PyTorch's index)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options. Options that fix what is trained default to None here, so that ``--resume`` can
    tell an option given again from one left out (decoctl_eagle.training.run.FIXED holds the defaults)."""
    what = parser.add_argument_group("what to train")
    what.add_argument("--target", metavar="MODEL", help="the target: a registered name or an onnxruntime-genai folder")
    what.add_argument("--data", nargs="+", metavar="FILE", help="text files, or JSONL with a 'text' per line")
    what.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="the run's folder (features, checkpoint, head)"
    )
    what.add_argument(
        "--arch",
        choices=("eagle3", "eagle1"),
        help="eagle3 (default): fc over three taps, a decoder layer over [embedding; feature], its own draft "
        "vocabulary; eagle1: fc over [embedding; final hidden state], a Llama layer, the target's lm_head",
    )
    what.add_argument(
        "--distill-prompts",
        metavar="FILE",
        help="also train on the target's own greedy continuations of these prompts (one a line, or JSONL 'prompt')",
    )
    what.add_argument("--distill-tokens", type=int, metavar="N", help="tokens the target adds to each prompt (256)")
    how = parser.add_argument_group("the head and its training (fixed for the run's life)")
    how.add_argument("--seq-len", type=int, metavar="N", help="tokens per training window (256)")
    how.add_argument("--batch", type=int, metavar="N", help="windows per step (8)")
    how.add_argument("--lr", type=float, help="peak learning rate of AdamW (3e-4; warm-up, then cosine)")
    how.add_argument("--ttt-steps", type=int, metavar="N", help="training-time test steps: eagle3 3, eagle1 1")
    how.add_argument("--draft-vocab", type=int, metavar="N", help="eagle3: draft the N most frequent tokens (32768)")
    how.add_argument("--heads", type=int, help="attention heads (default: the target's)")
    how.add_argument("--kv-heads", type=int, help="key/value heads (default: the target's)")
    how.add_argument("--head-size", type=int, help="attention head size (default: the target's)")
    how.add_argument("--intermediate", type=int, metavar="N", help="the MLP's width (default: twice the hidden size)")
    how.add_argument("--label-topk", type=int, metavar="K", help="target tokens kept per position as the label (8)")
    how.add_argument(
        "--feature-dtype", choices=("bfloat16", "float16", "float32"), help="how features are stored (bfloat16)"
    )
    how.add_argument("--feature-noise", type=float, help="uniform noise on the target's features (eagle1 0.1)")
    how.add_argument("--shard-tokens", type=int, metavar="N", help="tokens per feature shard (65536)")
    how.add_argument("--heldout-every", type=int, metavar="N", help="every N-th window is held out (20)")
    how.add_argument("--seed", type=int, help="the seed of the head's initialisation, batch order and noise (0)")
    run_options = parser.add_argument_group("this invocation")
    run_options.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    run_options.add_argument("--epochs", type=int, help="passes over the training tokens (1)")
    run_options.add_argument("--max-tokens", type=int, metavar="N", help="train on at most N tokens in all")
    run_options.add_argument(
        "--max-steps", type=int, metavar="N", help="stop (checkpoint, export) at step N; --resume goes on"
    )
    run_options.add_argument(
        "--checkpoint-minutes", type=float, metavar="M", help="evaluate and checkpoint every M minutes (5)"
    )
    run_options.add_argument("--eval-tokens", type=int, metavar="N", help="held-out tokens per evaluation (8192)")
    run_options.add_argument("--threads", type=int, help="threads for torch and onnxruntime (default: cores/2)")
    run_options.add_argument(
        "--device", help="where the head trains: cpu (default), cuda or cuda:N (the target's features: onnxruntime)"
    )
    run_options.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp32"),
        help="the head's matrix products: bf16 (weights and losses stay float32) or fp32; auto (default): bf16 where "
        "the device computes it in hardware (a CPU with AVX-512 BF16 or AMX, a GPU that supports it)",
    )
    run_options.add_argument("--name", help="the name the head is registered under (default: TARGET-eagle-DIR)")
    run_options.add_argument(
        "--no-register", dest="register", action="store_false", default=None, help="do not make it the target's head"
    )
    run_options.add_argument(
        "--no-progress", dest="progress", action="store_false", default=None, help="no progress bar on stderr"
    )


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; 0 when training finished or stopped at --max-steps, 130 when a signal stopped it
    (either way after a checkpoint and an export)."""
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise DecoctlError(f"decoctl eagle train needs {', '.join(missing)}: {EXTRA}")
    from decoctl_eagle.training.run import train

    given = {key: value for key, value in vars(args).items() if key not in ("target", "out", "resume")}
    if args.threads is not None and args.threads < 1:
        raise DecoctlError(f"--threads {args.threads} must be at least 1")

    from tqdm import tqdm

    def say(line: str) -> None:
        tqdm.write(line, file=sys.stderr)  # above a progress bar, not through it

    result = train(args.target, args.out, given, resume=args.resume, say=say)
    metrics = result.metrics
    state = result.state
    print(
        f"head: {result.head} (step {state['step']}, {state['tokens']} tokens; held-out top-1 {metrics['top1']:.3f}, "
        f"acceptance length {metrics['tau']:.2f})"
    )
    if result.registry is not None:
        print(
            f"registered in {result.registry} as the eagle head of its target: decoctl generate -c eagle --model TARGET"
        )
    if result.reason != "finished":
        print(f"{result.reason} before the end of training: run the same command with --resume to go on")
    return 130 if result.reason == "interrupted" else 0


def train_main(argv: Sequence[str] | None = None) -> int:
    """``decoctl eagle train ARGS``: parse, run, and end every failure as one line on stderr and an exit status (2
    for what decoctl refuses, 1 for what the system refused, 130 for an interrupt), as decoctl's CLI does."""
    parser = argparse.ArgumentParser(prog="decoctl eagle train", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except DecoctlError as exc:
        print(f"decoctl: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"decoctl: error: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("decoctl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(train_main())
