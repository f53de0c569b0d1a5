"""Ring caches against full-length KV on the same model: KV bytes at a long context and greedy decode speed after
a long prompt, side by side in one process (docs/BENCHMARKS.md, "Ring caches").

    python tools/bench_ring_cache.py --ring gemma3-270m --full gemma3-270m-fullkv --threads 1

Both models are loaded once; each repeat runs both contenders, alternating which goes first, on the same prompt
(cut from the Python standard library's source to ``--context`` tokens) and checks that their tokens are identical.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
from pathlib import Path

import decoctl
from decoctl.model import load_model
from decoctl.model._runner import Runner
from decoctl.model._tokenizer import Tokenizer
from decoctl.plugins import PluginRegistry, resolve_model


def long_prompt(tokenizer: Tokenizer, tokens: int) -> str:
    """About the first ``tokens`` tokens of the standard library's source, as text (BOS included in the count)."""
    added = len(tokenizer.encode(""))  # the BOS the tokenizer puts first, if it does
    text = ""
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text += path.read_text(encoding="utf-8", errors="replace")
        ids = tokenizer.encode(text)
        if len(ids) > tokens:
            return tokenizer.decode(ids[added:tokens])
    raise SystemExit(f"the standard library holds fewer than {tokens} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ring", required=True, help="the model with ring caches (a name or a folder)")
    parser.add_argument("--full", required=True, help="the same model with full-length KV")
    parser.add_argument("--context", type=int, default=2048, help="prompt tokens before decoding (default 2048)")
    parser.add_argument("--kv-context", type=int, default=8192, help="context the KV bytes are taken at")
    parser.add_argument("-n", "--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    registry = PluginRegistry()
    report: dict[str, dict[str, object]] = {}
    generators = {}
    for label, name in (("ring", args.ring), ("full", args.full)):
        shown, path = resolve_model(name, registry)
        model = load_model(path, name=shown, threads=args.threads)
        kv = Runner(model, max_length=args.kv_context).kv
        report[label] = {"model": shown, "kv_bytes": kv.nbytes, "kv_context": args.kv_context, "tok_s": []}
        generators[label] = decoctl.Generator(
            {"target": path}, "greedy", registry=registry, threads=args.threads, prefill_chunk=256
        )
    tokenizer = generators["ring"].models["target"].tokenizer
    prompt = long_prompt(tokenizer, args.context)
    for repeat in range(args.repeats):
        order = ("ring", "full") if repeat % 2 == 0 else ("full", "ring")
        tokens = {}
        for label in order:
            result = generators[label].generate(prompt, max_new_tokens=args.max_new_tokens)
            tokens[label] = list(result.tokens)
            report[label]["tok_s"].append(result.stats.tokens_per_second)  # type: ignore[union-attr]
            report[label]["prompt_tokens"] = result.stats.prompt_tokens
        if tokens["ring"] != tokens["full"]:
            raise SystemExit(f"repeat {repeat}: the ring model's tokens differ from the full-length model's")
    for label, figures in report.items():
        speeds = figures["tok_s"]
        figures["tok_s_median"] = statistics.median(speeds)  # type: ignore[arg-type]
        print(
            f"{label:>4} {figures['model']}: KV {figures['kv_bytes'] / 2**20:.1f} MiB at {args.kv_context} tokens; "
            f"greedy after {figures['prompt_tokens']} prompt tokens: {figures['tok_s_median']:.1f} tok/s "
            f"(median of {args.repeats}: {', '.join(f'{s:.1f}' for s in speeds)})"  # type: ignore[union-attr]
        )
    ratio_kv = report["ring"]["kv_bytes"] / report["full"]["kv_bytes"]  # type: ignore[operator]
    ratio_speed = report["ring"]["tok_s_median"] / report["full"]["tok_s_median"]  # type: ignore[operator]
    print(f"ring / full: KV bytes {ratio_kv:.3f}, greedy tok/s {ratio_speed:.3f}; tokens identical in every repeat")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
