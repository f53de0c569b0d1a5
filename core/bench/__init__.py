"""`decoctl bench`: contenders side by side in one process, interleaved, with equal thread settings.

Each repeat runs every prompt through every contender in turn, the order rotating from prompt to prompt (so drift
in machine load and the cost of running first hit all alike), then one calibration pass of the target's verify-cost
curve; tokens/s is the median over repeats of new tokens over decode seconds summed across prompts. Every
contender's tokens are compared with the baseline's.

Each contender also gets ``ideal_ratio``, the speedup over the baseline it would reach if the only costs were the
model forwards it made (its measured forwards by size priced on the measured curve, plus its draft/head roles'
measured onnxruntime seconds), and ``fraction_of_ideal = ratio_to_baseline / ideal_ratio``. The formula and where
each number comes from: decoctl.bench._ideal and docs/BENCHMARKS.md ("How ideal_ratio is computed").

``--batch 1,4,16,64`` runs a comparison of its own instead, of many sequences at once: decoctl's batched greedy and
beam search against onnxruntime-genai's, and the cost of a fork (decoctl.bench._batch).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from decoctl.bench._batch import run_batch_bench
from decoctl.bench._contenders import (
    ORT_GENAI_SPECULATIVE,
    Contender,
    ControllerContender,
    OrtGenaiContender,
    OrtGenaiSpeculativeContender,
    Outcome,
    RawOrtContender,
)
from decoctl.bench._ideal import CostCalibrator, CostCurve, ideal_ratio
from decoctl.bench._runs import run_in_processes
from decoctl.bench._speech import Prompt, SpeechPrompt, check_prompts, prompt_ids, speech_prompt, speech_source
from decoctl.bench._transformers import TRANSFORMERS_CONTENDERS, TransformersContender
from decoctl.errors import ConfigError
from decoctl.generation import Generator, read_prompt_records
from decoctl.model import _huge_pages as huge_pages_module
from decoctl.model._loader import default_threads
from decoctl.model._providers import CPU, ProviderChoice, add_provider_argument, providers_by_role
from decoctl.plugins import PluginRegistry, resolve_model
from decoctl.specs import normalise_name, parse_options

__all__ = [
    "BenchReport",
    "ContenderResult",
    "Difference",
    "SpeechPrompt",
    "add_bench_parser",
    "build_contenders",
    "bundle_roles",
    "difference_message",
    "first_difference",
    "load_prompts",
    "parse_contenders",
    "run",
    "run_bench",
]

DEFAULT_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n",
    "def read_config(path):\n    with open(path) as f:\n",
)
#: the contenders of a bench without --batch when --contenders is left out
DEFAULT_CONTENDERS = "greedy,raw-ort"
_CONTENDER = re.compile(r"^\s*(?:(?P<label>[\w.-]+)=)?(?P<name>[^()\s]+)\s*(?:\((?P<options>[^)]*)\))?\s*$")


@attrs.frozen(kw_only=True)
class ContenderSpec:
    label: str
    name: str
    options: dict[str, str]


def parse_contenders(text: str) -> list[ContenderSpec]:
    """``greedy,raw-ort,spec4=speculative(k=4;drafter=draft-model)`` -> specs (label=name(key=value;...))."""
    specs = []
    for item in _split_top_level(text):
        match = _CONTENDER.match(item)
        if not match:
            raise ConfigError(f"contender {item!r} must look like NAME, LABEL=NAME or NAME(key=value;key=value)")
        options = {}
        for pair in filter(None, (p.strip() for p in (match["options"] or "").split(";"))):
            key, sep, value = pair.partition("=")
            if not sep:
                raise ConfigError(f"contender {item!r}: option {pair!r} must be key=value")
            options[key.strip()] = value.strip()
        label = match["label"] or (item.strip() if options else match["name"])
        specs.append(ContenderSpec(label=label, name=match["name"], options=options))
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"contender labels repeat in {labels}: give each a LABEL=")
    return specs


def _split_top_level(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [i for i in items if i.strip()]


@attrs.frozen(kw_only=True)
class Difference:
    """Where a contender's output first leaves the baseline's: prompt index, new-token position, and the two
    tokens there (None where that output had already ended)."""

    prompt: int
    position: int
    baseline_token: int | None
    token: int | None


@attrs.frozen(kw_only=True)
class ContenderResult:
    """One contender's row. ``ideal_ratio``/``fraction_of_ideal`` are None without a calibrated curve;
    ``ideal_basis`` says where its forward counts came from (decoctl.bench._ideal)."""

    name: str
    tokens_per_s: float
    ratio_to_baseline: float
    identical_to_baseline: bool
    target_forwards: int
    tokens: int
    tokens_per_target_forward: float
    decode_seconds_median: float
    repeats_tokens_per_s: list[float]
    mismatches: list[int]
    first_difference: Difference | None
    ideal_ratio: float | None
    fraction_of_ideal: float | None
    ideal_basis: str
    extra: dict[str, Any]


@attrs.frozen(kw_only=True)
class BenchReport:
    """The whole bench. ``verify_cost``: the target's measured c(n) = t(forward over n tokens) / t(one-token
    forward); ``verify_cost_tree``: the same for tree forwards of T nodes; ``calibration``: its context length,
    pairs per size and pass, and the one-token forward in milliseconds."""

    model: str
    baseline: str
    threads: int
    max_new_tokens: int
    repeats: int
    prompts: int
    contenders: list[ContenderResult]
    rss_mb_after_warmup: float
    rss_mb_end: float
    verify_cost: dict[int, float]
    verify_cost_tree: dict[int, float]
    calibration: dict[str, float]


def resident_mb() -> float:
    """This process's resident set in MiB (Linux /proc; 0.0 where it is not available)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def load_prompts(path: str | None) -> list[Prompt]:
    """The bench's prompts: the built-in ones, or a JSONL file's (one ``{"prompt": "..."}`` per line, or for a speech
    model ``{"audio": "FILE.wav"}``, the path relative to the file: decoctl.bench._speech)."""
    if path is None:
        return list(DEFAULT_PROMPTS)
    prompts: list[Prompt] = []
    for where, record in read_prompt_records(path):
        if "audio" in record:
            prompts.append(speech_prompt(where, record, Path(path).parent))
            continue
        if "prompt" not in record:
            raise ConfigError(
                f"{where}: each line must be a JSON object with a 'prompt' (or a speech model's 'audio'), not "
                f"{json.dumps(record)[:40]}"
            )
        if not isinstance(record["prompt"], str):
            raise ConfigError(
                f"{where}: the prompt must be a JSON string, not {json.dumps(record['prompt'])[:40]}: "
                'quote it ("prompt": "...")'
            )
        prompts.append(record["prompt"])
    return prompts


def build_contenders(
    specs: Sequence[ContenderSpec],
    *,
    model: str | None,
    roles: dict[str, str],
    threads: int,
    registry: PluginRegistry,
    huge_pages: bool = False,
    providers: ProviderChoice = None,
) -> list[tuple[str, Contender]]:
    """The contenders ``specs`` name, as (label, contender), over the bench's model and roles (the model's bundle's
    roles, then ``roles``); each model is loaded once, on ``providers`` (decoctl.model._providers)."""
    off_cpu = {p.name for p in providers_by_role(providers, ["target", *roles]).values()} != {CPU.name}
    roles = {**bundle_roles(model, registry), **roles}
    contenders: list[tuple[str, Contender]] = []
    loaded: dict[str | None, Any] = {}
    opened: dict[tuple[str, str | None], Any] = {}

    def onnx_model(own: str | None) -> Any:
        """The bench's model (None) or a contender's own folder, loaded once."""
        if own not in loaded:
            reference = own if own is not None else model
            loaded[own] = Generator(
                {"target": reference},
                "greedy",
                threads=threads,
                registry=registry,
                huge_pages=huge_pages,
                providers=providers_by_role(providers, ["target", *roles])["target"],
            ).models["target"]
        return loaded[own]

    for spec in specs:
        contender: Contender
        if off_cpu and spec.name in (*TRANSFORMERS_CONTENDERS, "raw-ort", "ort-genai", *ORT_GENAI_SPECULATIVE):
            raise ConfigError(
                f"contender {spec.name} runs on its own runtime's CPU device, not on the providers {providers}: "
                "bench decoctl's controllers there, or leave --provider out"
            )
        if spec.name in TRANSFORMERS_CONTENDERS:
            # model=DIR is the transformers weights; the bench's ONNX model gives the EOS ids and start token
            contender = TransformersContender(spec.name, onnx_model(None), threads, spec.options)
        elif spec.name in ("raw-ort", "ort-genai", *ORT_GENAI_SPECULATIVE):
            # model=PATH: another folder for this contender (a tree-enabled model needs none: these contenders
            # run its plain twin, decoctl.model.graph); the contender's label shows it
            options = {k: v for k, v in spec.options.items() if k != "model"}
            if options and spec.name in ("raw-ort", "ort-genai"):
                raise ConfigError(f"contender {spec.name} takes no options but model=PATH")
            target = onnx_model(spec.options.get("model"))
            if target.encoder is not None:
                raise ConfigError(
                    f"contender {spec.name} runs decoder-only models, and {target.name} is an encoder-decoder model: "
                    "bench it with decoctl's controllers (greedy, speculative with a draft or prompt lookup) and "
                    "transformers' (hf, hf-assisted, hf-lookup)"
                )
            if spec.name == "raw-ort":
                contender = RawOrtContender(target, threads)
            elif spec.name == "ort-genai":
                contender = OrtGenaiContender(target, threads)
            else:
                draft = _draft_folder(roles, registry) if spec.name == "ort-genai-draft" else None
                contender = OrtGenaiSpeculativeContender(spec.name, target, threads, options, draft=draft)
        else:
            # `processors` is the bench's own option, not the controller's: a logits chain for that contender
            options = {k: v for k, v in spec.options.items() if k != "processors"}
            processors = spec.options.get("processors")
            probe = registry.controllers().get(spec.name)
            wanted = probe.active_roles(parse_options(spec.name, probe.options, options)) if probe else ()
            references = {"target": model, **{r: roles[r] for r in wanted if r in roles and r != "target"}}
            # one session per model for every decoctl contender: sessions of the same model differ in speed by a
            # few percent (where their memory landed), which would otherwise show up as a difference of strategy
            role_models = {role: opened.get((role, ref), ref) for role, ref in references.items()}
            generator = Generator(
                role_models,
                spec.name,
                options=options,
                processors=processors,
                threads=threads,
                registry=registry,
                huge_pages=huge_pages,
                providers={
                    r: p for r, p in providers_by_role(providers, ["target", *roles]).items() if r in role_models
                },
            )
            for role, loaded_model in generator.models.items():
                opened.setdefault((role, references.get(role)), loaded_model)
            contender = ControllerContender(spec.label, generator)
        contenders.append((spec.label, contender))
    return contenders


def bundle_roles(model: str | None, registry: PluginRegistry) -> dict[str, str]:
    """The models a bundled target brings for other roles (the demo model: its draft and EAGLE head), as
    ``decoctl generate`` takes them: for the default model (None) or a registered name, never for a folder."""
    named = resolve_model(None, registry)[0] if model is None else model
    bundle = registry.models().get(normalise_name(named))
    return dict(bundle.roles) if bundle else {}


def _draft_folder(roles: dict[str, str], registry: PluginRegistry) -> Path:
    """The draft model of ort-genai-draft: --draft, else the bundled target's draft."""
    reference = roles.get("draft")
    if reference is None:
        raise ConfigError("contender ort-genai-draft needs a draft model: pass --draft MODEL")
    return resolve_model(reference, registry)[1]


def warm_up(
    contenders: Sequence[tuple[str, Contender]],
    prompts: Sequence[Prompt],
    encode: Callable[[Prompt], list[int]],
    *,
    max_new_tokens: int,
) -> dict[str, Outcome]:
    """One run per contender on the longest prompt at full length: first runs allocate KV and output buffers
    and page the weights in, so the resident set measured after this must stay flat for the rest of a bench.
    ``encode``: a prompt's ids (decoctl.bench._speech.prompt_ids on the target)."""
    encoded = [encode(p) for p in prompts]
    longest = max(range(len(encoded)), key=lambda i: len(encoded[i]))
    return {label: contender.run(prompts[longest], encoded[longest], max_new_tokens) for label, contender in contenders}


def calibrator_for(
    baseline: ControllerContender, prompts: Sequence[Prompt], *, max_new_tokens: int, pairs: int
) -> CostCalibrator:
    """A verify-cost calibrator on the baseline's target model, its context at the middle of a generation from
    the longest prompt (the average context a decode step sees)."""
    model = baseline.generator.models["target"]
    longest = max(prompts, key=lambda p: len(prompt_ids(model, p)))
    encoded = prompt_ids(model, longest)
    if isinstance(longest, SpeechPrompt):
        # a speech model's decoder holds its prompt (start, language, task) and the output; its encoder the audio
        source = speech_source(model, longest)
        return CostCalibrator(model, encoded, context=len(encoded) + max_new_tokens // 2, pairs=pairs, source=source)
    # an encoder-decoder model's decoder holds its start token and the output; the prompt is its encoder's
    prompt = 1 if model.encoder else len(encoded)
    return CostCalibrator(model, encoded, context=prompt + max_new_tokens // 2, pairs=pairs)


def calibrate(calibrator: CostCalibrator, outcomes: Iterable[Outcome]) -> None:
    """One calibration pass over every forward size these outcomes used."""
    chain: set[int] = set()
    tree: set[int] = set()
    for outcome in outcomes:
        chain.update(outcome.ledger.chain)
        tree.update(outcome.ledger.tree)
    calibrator.measure(chain, tree)


def run_contenders(
    contenders: Sequence[tuple[str, Contender]],
    prompts: Sequence[Prompt],
    encode: Callable[[Prompt], list[int]],
    *,
    max_new_tokens: int,
    repeats: int,
    progress: Any = None,
    warm: bool = True,
    calibrator: CostCalibrator | None = None,
) -> dict[str, list[list[Outcome]]]:
    """outcomes[label][repeat][prompt], every repeat running all contenders on each prompt in turn, in an order
    that rotates from one prompt to the next.

    ``warm``: run warm_up() first; pass False when the caller has (to measure memory after it).
    ``calibrator``: after each repeat, one calibration pass over every forward size seen so far.
    """
    encoded = [encode(p) for p in prompts]
    outcomes: dict[str, list[list[Outcome]]] = {label: [] for label, _ in contenders}
    if warm:
        warm_up(contenders, prompts, encode, max_new_tokens=max_new_tokens)
    for repeat in range(repeats):
        for label, _ in contenders:
            outcomes[label].append([])
        for index, (prompt, ids) in enumerate(zip(prompts, encoded, strict=True)):
            # the order rotates from one (repeat, prompt) to the next: running first after another contender
            # measurably costs (caches, the previous session's memory traffic), so no contender always pays it
            shift = (repeat * len(prompts) + index) % len(contenders)
            for label, contender in (*contenders[shift:], *contenders[:shift]):
                outcomes[label][repeat].append(contender.run(prompt, ids, max_new_tokens))
        if calibrator is not None:
            calibrate(calibrator, (o for runs in outcomes.values() for r in runs for o in r))
        if progress:
            progress(repeat + 1, repeats)
    return outcomes


def first_difference(outputs: Sequence[Sequence[int]], baseline: Sequence[Sequence[int]]) -> Difference | None:
    """The first prompt whose output differs from the baseline's, and the first new-token position there."""
    for prompt, (got, expected) in enumerate(zip(outputs, baseline, strict=True)):
        if tuple(got) == tuple(expected):
            continue
        position = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
        if position is None:
            position = min(len(got), len(expected))
        return Difference(
            prompt=prompt,
            position=position,
            baseline_token=expected[position] if position < len(expected) else None,
            token=got[position] if position < len(got) else None,
        )
    return None


def summarise(
    outcomes: dict[str, list[list[Outcome]]], baseline: str, curve: CostCurve | None = None
) -> list[ContenderResult]:
    base = outcomes[baseline]
    base_rate = _median_rate(base)
    results = []
    for label, runs in outcomes.items():
        rates = [_rate(repeat) for repeat in runs]
        first = runs[0]
        mismatches = [i for i, (o, b) in enumerate(zip(first, base[0], strict=True)) if o.tokens != b.tokens]
        ratio = statistics.median(rates) / base_rate if base_rate else 0.0
        every = [o for repeat in runs for o in repeat]
        ideal = ideal_ratio(((len(o.tokens), o.ledger) for o in every), curve) if curve else None
        bases = sorted({o.ledger.basis for o in every})
        tokens = sum(len(o.tokens) for o in first)
        forwards = sum(o.target_forwards for o in first)
        extra: dict[str, Any] = {}
        for outcome in first:
            for key, value in outcome.extra.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    extra.setdefault(key, []).append(value)
        results.append(
            ContenderResult(
                name=label,
                tokens_per_s=statistics.median(rates),
                ratio_to_baseline=ratio,
                identical_to_baseline=not mismatches,
                target_forwards=forwards,
                tokens=tokens,
                tokens_per_target_forward=tokens / forwards if forwards else float(tokens),
                decode_seconds_median=statistics.median(sum(o.decode_seconds for o in r) for r in runs),
                repeats_tokens_per_s=rates,
                mismatches=mismatches,
                first_difference=first_difference([o.tokens for o in first], [b.tokens for b in base[0]]),
                ideal_ratio=ideal,
                fraction_of_ideal=ratio / ideal if ideal else None,
                ideal_basis=", ".join(bases),
                extra={k: statistics.fmean(v) for k, v in extra.items()},
            )
        )
    return results


def _rate(outcomes: Sequence[Outcome]) -> float:
    seconds = sum(o.decode_seconds for o in outcomes)
    # the first token comes from the prefill, so decode time covers len(tokens) - 1 forwards' worth of work
    tokens = sum(max(0, len(o.tokens) - 1) for o in outcomes)
    return tokens / seconds if seconds > 0 else 0.0


def _median_rate(runs: Sequence[Sequence[Outcome]]) -> float:
    return statistics.median(_rate(r) for r in runs)


def format_table(report: BenchReport) -> str:
    lines = [
        f"model {report.model}  threads {report.threads}  prompts {report.prompts}  max_new_tokens "
        f"{report.max_new_tokens}  repeats {report.repeats}  baseline {report.baseline}  RSS after warm-up "
        f"{report.rss_mb_after_warmup:.1f} MiB, at the end {report.rss_mb_end:.1f} MiB",
        f"{'contender':<28}{'tok/s':>10}{'ratio':>8}{'ideal':>8}{'of ideal':>9}{'identical':>11}{'tok/fwd':>9}"
        f"{'target fwd':>12}",
    ]
    for c in report.contenders:
        same = "yes" if c.identical_to_baseline else f"NO {c.mismatches}"
        ideal = f"{c.ideal_ratio:>8.3f}" if c.ideal_ratio is not None else f"{'-':>8}"
        share = f"{c.fraction_of_ideal:>9.0%}" if c.fraction_of_ideal is not None else f"{'-':>9}"
        lines.append(
            f"{c.name:<28}{c.tokens_per_s:>10.1f}{c.ratio_to_baseline:>8.3f}{ideal}{share}{same:>11}"
            f"{c.tokens_per_target_forward:>9.2f}{c.target_forwards:>12}"
        )
    if report.verify_cost:
        curve = "  ".join(f"{n}:{c:.2f}" for n, c in sorted(report.verify_cost.items()))
        lines.append(f"verify cost c(n) at {report.calibration['context']:.0f} cached tokens: {curve}")
    if report.verify_cost_tree:
        curve = "  ".join(f"{n}:{c:.2f}" for n, c in sorted(report.verify_cost_tree.items()))
        lines.append(f"tree verify cost c_tree(T): {curve}")
    return "\n".join(lines)


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib: pip install 'decoctl[bench]', or leave --plot out") from exc
    return plt


def plot(report: BenchReport, path: str) -> None:
    plt = _pyplot()
    names = [c.name for c in report.contenders]
    rates = [c.tokens_per_s for c in report.contenders]
    figure, axis = plt.subplots(figsize=(max(5, 1.3 * len(names)), 3.5))
    bars = axis.bar(names, rates, color=["#888" if n == report.baseline else "#3a7" for n in names])
    for bar, c in zip(bars, report.contenders, strict=True):
        axis.annotate(
            f"{c.ratio_to_baseline:.2f}x",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    axis.set_ylabel("tokens/s (median)")
    axis.set_title(f"{report.model}, {report.threads} thread(s), {report.max_new_tokens} new tokens")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


#: the command line's --no-huge-pages (generate and bench): what the default does to the process, and the way out
HUGE_PAGES_HELP = (
    "leave the process's memory settings alone. By default the command puts the models' weights on 2 MiB pages "
    "(glibc's mmap threshold raised while a model loads, then madvise(MADV_HUGEPAGE/MADV_COLLAPSE) over the "
    "process's large resident memory), for faster and steadier steps on CPU. The Python API does neither "
    "unless asked (load_model(huge_pages=True), Generator(huge_pages=True))"
)


def add_bench_parser(commands: Any) -> None:
    """Add ``decoctl bench`` and its options to the command line's subparsers ``commands``."""
    bench = commands.add_parser("bench", help="run contenders side by side and compare tokens/s")
    bench.add_argument("--model", "-m", help="registered model name or folder (default: the demo model)")
    bench.add_argument("--draft", help="model for the 'draft' role of contenders that use one")
    bench.add_argument("--role", action="append", default=[], metavar="ROLE=MODEL", help="model for another role")
    bench.add_argument(
        "--contenders",
        help="NAME, LABEL=NAME(key=value;...), comma-separated; option processors=CHAIN: that contender's logits "
        f"chain (default: {DEFAULT_CONTENDERS}; with --batch, some of greedy,ort-genai,beam,ort-genai-beam: all)",
    )
    bench.add_argument("--baseline", default="greedy", help="the contender label ratios are taken against")
    bench.add_argument(
        "--prompts",
        help='JSONL file, one {"prompt": ...} per line, or for a speech model {"audio": "FILE.wav"} (the path '
        'relative to the file; "language" and "task" optional) (default: built-in code prompts)',
    )
    bench.add_argument("--max-new-tokens", "-n", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=5)
    bench.add_argument("--threads", type=int, help="intra-op threads for every contender (default: cores/2)")
    add_provider_argument(bench)
    bench.add_argument("--json", help="write the report as JSON here")
    bench.add_argument("--plot", help="write a PNG bar chart here")
    bench.add_argument("--require-identical", action="store_true", help="exit 3 if a contender's tokens differ")
    bench.add_argument(
        "--runs",
        type=int,
        default=1,
        help="repeat the whole bench in this many fresh processes (contender order rotating) and report each "
        "ratio's geometric mean with a 95%% confidence interval (decoctl.bench._runs)",
    )
    bench.add_argument(
        "--calibration-pairs",
        type=int,
        default=3,
        help="verify-cost calibration: (1-token, n-token) forward pairs per size, per repeat (default 3)",
    )
    bench.add_argument("--no-huge-pages", action="store_true", help=HUGE_PAGES_HELP)
    many = bench.add_argument_group(
        "many sequences (--batch)",
        "decoctl's batched greedy and beam search against onnxruntime-genai's, and the cost of a fork "
        "(decoctl.bench._batch); the prompts are cut to one length in tokens",
    )
    many.add_argument("--batch", metavar="B,B,...", help="batch sizes to compare, e.g. 1,4,16,64")
    many.add_argument(
        "--batch-rounds", type=int, default=1, help="prompts per batch size: B x this many (default 1: one full batch)"
    )
    many.add_argument("--beams", type=int, default=4, help="num_beams of the beam search contenders (default 4)")
    many.add_argument(
        "--fork-prefix",
        type=int,
        default=1024,
        help="measure a fork of a row holding this many tokens against one decode step (default 1024; 0: skip)",
    )


def run(
    *,
    model: str | None = None,
    contenders: str = DEFAULT_CONTENDERS,
    baseline: str = "greedy",
    prompts: Sequence[Prompt] | None = None,
    max_new_tokens: int = 128,
    repeats: int = 5,
    threads: int | None = None,
    roles: Mapping[str, str] | None = None,
    calibration_pairs: int = 3,
    huge_pages: bool = False,
    registry: PluginRegistry | None = None,
    progress: Callable[[int, int], None] | None = None,
    providers: ProviderChoice = None,
) -> BenchReport:
    """Run the bench in this process and return its report (``decoctl bench`` without ``--runs``, ``--batch``,
    ``--json`` or ``--plot``, from Python): every contender on every prompt ``repeats`` times, in rotating order,
    after a warm-up and the verify-cost calibration. Prints nothing; ``progress(done, total)`` hears of each repeat.

    :param contenders: as ``--contenders``: ``NAME`` or ``LABEL=NAME(key=value;...)``, comma-separated.
    :param prompts: the prompt texts, or for a speech model its recordings (decoctl.bench._speech.SpeechPrompt;
        ``load_prompts`` reads both from a JSONL file); None: the built-in code prompts.
    :param roles: models for roles beyond the target (``{"draft": "pycode-draft"}``).
    :param huge_pages: put every contender's weights on 2 MiB pages (process-wide; the command line's default).
    :param providers: as ``--provider``: the execution providers (decoctl.model._providers; default CPU).
    """
    if repeats < 1 or max_new_tokens < 1 or calibration_pairs < 1:
        raise ConfigError("repeats, max_new_tokens and calibration_pairs must be at least 1")
    specs = parse_contenders(contenders)
    labels = [s.label for s in specs]
    if baseline not in labels:
        raise ConfigError(f"baseline {baseline!r} is not among the contenders {labels}: add it or pick another")
    texts = list(prompts) if prompts is not None else list(DEFAULT_PROMPTS)
    registry = registry if registry is not None else PluginRegistry()
    count = threads or default_threads()
    built = build_contenders(
        specs,
        model=model,
        roles=dict(roles or {}),
        threads=count,
        registry=registry,
        huge_pages=huge_pages,
        providers=providers,
    )
    if huge_pages:
        # every contender's weights on huge pages alike, onnxruntime-genai's and raw-ort's sessions included
        huge_pages_module.collapse()
    base = dict(built)[baseline]
    if not isinstance(base, ControllerContender):
        raise ConfigError("the baseline must be a decoctl controller (greedy by default)")
    target = base.generator.models["target"]
    check_prompts(target, texts)

    def encode(prompt: Prompt) -> list[int]:
        return prompt_ids(target, prompt)

    calibrator = calibrator_for(base, texts, max_new_tokens=max_new_tokens, pairs=calibration_pairs)
    # the calibration's first pass belongs to the warm-up: its KV cache is allocated before memory is measured
    calibrate(calibrator, warm_up(built, texts, encode, max_new_tokens=max_new_tokens).values())
    rss_after_warmup = resident_mb()
    outcomes = run_contenders(
        built,
        texts,
        encode,
        max_new_tokens=max_new_tokens,
        repeats=repeats,
        progress=progress,
        warm=False,
        calibrator=calibrator,
    )
    curve = calibrator.curve()
    return BenchReport(
        model=base.generator.models["target"].name,
        baseline=baseline,
        threads=count,
        max_new_tokens=max_new_tokens,
        repeats=repeats,
        prompts=len(texts),
        contenders=summarise(outcomes, baseline, curve),
        rss_mb_after_warmup=rss_after_warmup,
        rss_mb_end=resident_mb(),
        verify_cost=dict(curve.chain),
        verify_cost_tree=dict(curve.tree),
        calibration={
            "context": curve.context,
            "pairs": curve.pairs,
            "one_token_forward_ms": curve.one_token_seconds * 1000,
        },
    )


def run_bench(args: argparse.Namespace, registry: PluginRegistry) -> int:
    """Run ``decoctl bench`` with its parsed arguments; the command's exit status."""
    if args.repeats < 1 or args.max_new_tokens < 1:
        raise ConfigError("--repeats and --max-new-tokens must be at least 1")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(
            f"--threads {args.threads}: give 1 or more intra-op threads, or leave it out for the default "
            f"({default_threads()}, one per two cores)"
        )
    if args.batch is not None and args.provider:
        raise ConfigError("--provider goes with the single-sequence bench; --batch runs on the CPU provider")
    if args.batch is not None:  # many sequences at once: a comparison of its own (decoctl.bench._batch)
        texts = _text_prompts(load_prompts(args.prompts))
        _prepare_output("--json", args.json)
        return run_batch_bench(args, registry, texts, resident=resident_mb)
    contenders_text = args.contenders or DEFAULT_CONTENDERS
    specs = parse_contenders(contenders_text)
    labels = [s.label for s in specs]
    if args.baseline not in labels:
        raise ConfigError(f"baseline {args.baseline!r} is not among the contenders {labels}: add it or pick another")
    if args.calibration_pairs < 1:
        raise ConfigError("--calibration-pairs must be at least 1")
    if args.runs < 1:
        raise ConfigError("--runs must be at least 1")
    # everything that can be refused is, before the bench runs: its results must not be lost at the end
    malformed = [r for r in args.role if "=" not in r]
    if malformed:
        raise ConfigError(f"--role {malformed[0]!r} must be written ROLE=MODEL (e.g. --role eagle=pycode-eagle)")
    prompts = load_prompts(args.prompts)
    _prepare_output("--json", args.json)
    _prepare_output("--plot", args.plot)
    if args.runs > 1:
        return run_in_processes(args, _split_top_level(contenders_text))
    if args.plot:
        _pyplot()
    roles = dict(r.split("=", 1) for r in args.role)
    if args.draft:
        roles["draft"] = args.draft

    def progress(done: int, total: int) -> None:
        print(f"repeat {done}/{total}", file=sys.stderr)

    report = run(
        model=args.model,
        contenders=contenders_text,
        baseline=args.baseline,
        prompts=prompts,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        threads=args.threads,
        roles=roles,
        calibration_pairs=args.calibration_pairs,
        huge_pages=not args.no_huge_pages,
        registry=registry,
        progress=progress,
        providers=args.provider or None,
    )
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(attrs.asdict(report), indent=2))
    if args.plot:
        plot(report, args.plot)
    differing = [c for c in report.contenders if not c.identical_to_baseline]
    if args.require_identical and differing:
        for c in differing:
            print(difference_message(c, report.baseline, prompts), file=sys.stderr)
        return 3
    return 0


def _text_prompts(prompts: Sequence[Prompt]) -> list[str]:
    """``--batch``'s prompts: text alone (ConfigError naming the first audio prompt's line)."""
    for prompt in prompts:
        if isinstance(prompt, SpeechPrompt):
            raise ConfigError(
                f"{prompt.shown}: an audio prompt, and --batch benches text prompts: leave --batch out to bench "
                "speech, one recording at a time"
            )
    return [p for p in prompts if isinstance(p, str)]


def _prepare_output(flag: str, path: str | None) -> None:
    """Create the folder ``path`` will be written in; refuse a path that is a folder or cannot be made."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        example = target / ("bench.json" if flag == "--json" else "bench.png")
        raise ConfigError(f"{flag} {path} is a folder: give a file path (e.g. {example})")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {path}: cannot create its folder {target.parent} ({exc.strerror}): give a writable path"
        ) from exc


def difference_message(result: ContenderResult, baseline: str, prompts: Sequence[Prompt]) -> str:
    """--require-identical's explanation: the contender, the first differing prompt and new-token position."""
    where = result.first_difference
    if where is None:
        return f"contender {result.name!r} differs from baseline {baseline!r}"
    prompt = str(prompts[where.prompt])
    shown = prompt if len(prompt) <= 40 else prompt[:37] + "..."

    def token(value: int | None) -> str:
        return "end of output" if value is None else f"token {value}"

    return (
        f"contender {result.name!r} differs from baseline {baseline!r} on {len(result.mismatches)} of "
        f"{len(prompts)} prompt(s); first on prompt {where.prompt} ({shown!r}) at new token {where.position}: "
        f"{baseline} has {token(where.baseline_token)}, {result.name} has {token(where.token)}"
    )
