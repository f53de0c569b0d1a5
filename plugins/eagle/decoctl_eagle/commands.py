"""``decoctl eagle train|data|import|info|eval``: the subcommand the eagle plugin adds to decoctl (decoctl_commands).

Only argparse is set up here, since decoctl builds every plugin's parser on each run; the work, and its imports
(onnx, torch), happen in ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from decoctl import CommandSpec, ConfigError, PluginRegistry

__all__ = ["COMMAND", "add_arguments", "run"]

#: the module ``decoctl eagle train`` hands its arguments to, through its ``train_main(argv) -> int``
TRAINER = "decoctl_eagle.train"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="eagle_command", required=True, metavar="{train,data,import,info,eval}")
    train = commands.add_parser(
        "train",
        help="train a head for a target from its own features (decoctl eagle train --help for its options)",
        add_help=False,
    )
    # the trainer parses its own arguments (and imports torch) only when it runs: argparse hands it them all,
    # options included, which a REMAINDER positional would not when the first one is an option
    train.__class__ = _Verbatim
    data = commands.add_parser(
        "data",
        help="training text in the target's own words: its greedy continuations of diverse prompts (resumable)",
        description="Cut diverse prompts (code, prose, instructions, edits) from text this machine has offline (the "
        "Python standard library, /usr/share/doc, manual pages), or take your own, and have the target continue each "
        "with batched greedy decoding. Writes DIR/data.jsonl, which decoctl eagle train --data reads. Run the same "
        "command again to go on after an interruption.",
    )
    data.add_argument("--target", required=True, metavar="MODEL", help="the target: registered name or folder")
    data.add_argument("--out", required=True, type=Path, metavar="DIR", help="where the prompts and the data go")
    data.add_argument("--prompts", type=int, default=3000, metavar="N", help="prompts to cut (3000)")
    data.add_argument(
        "--prompt-file", type=Path, metavar="FILE", help="your own prompts instead: one a line, or JSONL 'prompt'"
    )
    data.add_argument("--new-tokens", type=int, default=256, metavar="N", help="tokens the target adds to each (256)")
    data.add_argument("--batch", type=int, default=16, metavar="N", help="prompts generated together (16)")
    data.add_argument("--seed", type=int, default=0, help="the seed the prompts are cut with (0)")
    data.add_argument("--threads", type=int, help="onnxruntime's intra-op threads (default: its own choice)")
    data.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    imports = commands.add_parser(
        "import",
        help="convert a published EAGLE-1/2 or EAGLE-3 head (config.json + model.safetensors or pytorch_model.bin)",
        description="Convert a published EAGLE head into the ONNX head the eagle controller runs, and register it "
        "as the target's default head (decoctl generate -c eagle --model TARGET then takes it).",
    )
    imports.add_argument("source", metavar="DIR", help="the head's folder (config.json and its weights)")
    imports.add_argument(
        "--target", required=True, metavar="MODEL", help="the target: registered name or onnxruntime-genai folder"
    )
    imports.add_argument("--out", metavar="DIR2", help="where to write the head (default: decoctl's models folder)")
    imports.add_argument("--name", help="the name to register it under (default: TARGET-DIRNAME)")
    imports.add_argument("--no-register", action="store_true", help="write the head only")
    info = commands.add_parser(
        "info", help="a head's architecture, target, sizes and draft vocabulary; whether it fits --target"
    )
    info.add_argument(
        "head", metavar="HEAD", help="an ONNX head (folder or registered name) or a published head's folder"
    )
    info.add_argument("--target", metavar="MODEL", help="check the head against this target")
    evaluate = commands.add_parser(
        "eval",
        help="a head's top-1 agreement with its target and chain acceptance length on given text",
        description="Run the target and an ONNX head through decoctl's runtime over text, as the trainer measures "
        "its held-out figures: teacher-forced top-1 agreement of the head's draft with the target's greedy token, "
        "agreement at each step of a chain, and the acceptance length of greedy chain drafting (a lower bound on "
        "text that leaves the target's greedy path, exact on the target's own continuations).",
    )
    evaluate.add_argument(
        "--target", required=True, metavar="MODEL", help="the target: registered name or onnxruntime-genai folder"
    )
    evaluate.add_argument("--head", required=True, metavar="HEAD", help="the ONNX head: registered name or folder")
    evaluate.add_argument(
        "--data", required=True, nargs="+", metavar="FILE", help="text files, or JSONL with a 'text' per line"
    )
    evaluate.add_argument("--steps", type=int, default=3, metavar="K", help="drafts per chain (3)")
    evaluate.add_argument("--seq-len", type=int, default=256, metavar="N", help="tokens per window (256)")
    evaluate.add_argument("--max-tokens", type=int, metavar="N", help="stop after the window that reaches N tokens")
    evaluate.add_argument("--threads", type=int, help="onnxruntime's intra-op threads (default: its own choice)")
    evaluate.add_argument("--json", type=Path, metavar="FILE", help="also write the figures to FILE as JSON")


class _Verbatim(argparse.ArgumentParser):
    """A subparser that takes every remaining argument as they are, into ``train_arguments``."""

    def parse_known_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        namespace = namespace if namespace is not None else argparse.Namespace()
        namespace.train_arguments = list(args or ())
        return namespace, []


def run(args: argparse.Namespace) -> int:
    command = args.eagle_command
    if command == "train":
        return _train(list(args.train_arguments))
    if command == "eval":
        return _evaluate(args)
    if command == "data":
        return _data(args)
    if importlib.util.find_spec("onnx") is None:
        raise ConfigError(f"decoctl eagle {command} reads and writes ONNX graphs: pip install 'decoctl-eagle[import]'")
    plugins = PluginRegistry()
    if command == "import":
        from decoctl_eagle.heads import import_head

        head = import_head(
            args.source, args.target, out=args.out, name=args.name, register=not args.no_register, plugins=plugins
        )
        dims = head.dims
        drafts = f", draft vocabulary {dims.draft_vocab}" if dims.draft_vocab != dims.vocab else ""
        print(f"{head.name}: {head.folder} ({dims.architecture.upper()}, hidden {dims.hidden}{drafts})")
        if args.no_register:
            print(f"try: decoctl generate -c eagle --model {args.target} --role eagle={head.folder} 'def f(x):'")
        else:
            print(f"registered in {head.registry} as the eagle head of {head.target}")
            print(f"try: decoctl generate -c eagle --model {args.target} 'def f(x):'")
        return 0
    from decoctl_eagle.heads import info_lines

    lines, fits = info_lines(args.head, args.target, plugins)
    print("\n".join(lines))
    return 0 if fits else 1


def _evaluate(args: argparse.Namespace) -> int:
    from decoctl_eagle.evaluation import evaluate_head

    result = evaluate_head(
        args.target,
        args.head,
        args.data,
        steps=args.steps,
        seq_len=args.seq_len,
        max_tokens=args.max_tokens,
        threads=args.threads,
    )
    by_step = ", ".join(f"{a:.3f}" for a in result.agreement_by_step)
    print(
        f"{args.head} on {args.target}: top-1 {result.top1:.3f}, acceptance length {result.tau:.2f} (chain of "
        f"{result.steps}; agreement by step {by_step}) over {result.positions} positions in {result.windows} windows"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.as_dict(), indent=2) + "\n", encoding="utf-8")
    return 0


def _data(args: argparse.Namespace) -> int:
    from decoctl_eagle.distilled import make_data

    bar = _progress(args.progress, args.prompts * args.new_tokens if not args.prompt_file else None)
    try:
        summary = make_data(
            args.target,
            args.out,
            prompts=args.prompts,
            new_tokens=args.new_tokens,
            batch=args.batch,
            seed=args.seed,
            threads=args.threads,
            prompt_file=args.prompt_file,
            say=lambda line: print(line, file=sys.stderr),
            report=bar,
        )
    except KeyboardInterrupt:
        print(f"interrupted: run the same command again to go on ({args.out / 'data.jsonl'} keeps what is done)")
        return 130
    finally:
        bar(None)
    rate = summary.new_tokens / summary.seconds if summary.seconds else 0.0
    print(
        f"{summary.data}: {summary.done} of {summary.prompts} prompts continued ({summary.new_tokens} tokens "
        f"generated now, {rate:.1f} tokens/s)"
    )
    if summary.finished:
        print(f"train a head on it: decoctl eagle train --target {args.target} --data {summary.data} --out DIR")
    return 0


def _progress(enabled: bool, total: int | None) -> Any:
    """``advance(n)`` for a tqdm bar of generated tokens on stderr when tqdm is there and ``enabled``;
    ``advance(None)`` closes it."""
    try:
        from tqdm import tqdm
    except ModuleNotFoundError:
        return lambda n: None
    bar = tqdm(
        total=total, desc="data", unit="tok", unit_scale=True, file=sys.stderr, disable=None if enabled else True
    )

    def advance(n: int | None) -> None:
        if n is None:
            bar.close()
        else:
            bar.update(n)

    return advance


def _train(argv: list[str]) -> int:
    try:
        trainer: Any = importlib.import_module(TRAINER)
    except ModuleNotFoundError as exc:
        if exc.name != TRAINER:
            raise ConfigError(
                f"decoctl eagle train needs {exc.name}: pip install 'decoctl-eagle[train]' (torch from the CPU wheel "
                "is enough)"
            ) from exc
        raise ConfigError(
            "decoctl eagle train is not in this version of decoctl-eagle: convert a published head with decoctl "
            "eagle import, or train one for the demo models with tools/train_eagle.py"
        ) from exc
    status = trainer.train_main(argv)
    sys.stdout.flush()
    return int(status or 0)


COMMAND = CommandSpec(
    name="eagle",
    summary="EAGLE draft heads: train one for a target, import, inspect or measure one",
    add_arguments=add_arguments,
    run=run,
)
