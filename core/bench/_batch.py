"""`decoctl bench --batch 1,4,16,64`: many sequences at once (issue 22), against onnxruntime-genai.

For each batch size B, every contender generates greedily from the same B x ``--batch-rounds`` prompts, B at a time:

- ``greedy``: decoctl's batched prompts (Generator.generate_batch with batch_size=B: B rows of one KV buffer stepped
  in one onnxruntime Run, a finished prompt's row refilled with the next prompt);
- ``ort-genai``: onnxruntime-genai's batched greedy loop (B prompts appended as one [B, length] array, the next B
  when all of them are done).

``tokens_per_s`` is every prompt's new tokens over the seconds of the whole run (prefills included), the median over
``--repeats``; ``per_row_tokens_per_s`` is that over B; ``vs_batch_1`` compares it with the same contender at batch 1;
``ratio_to_baseline`` with decoctl's greedy at the same B. onnxruntime-genai's outputs are compared with decoctl's,
prompt by prompt. The prompts (the bench's own or ``--prompts``) are cut to the length in tokens of the shortest, since
onnxruntime-genai takes a batch as one array and its left padding changes what a prompt generates
(decoctl.bench._contenders.OrtGenaiBatchContender); one that does not encode back to the same tokens after the cut is
left out. Prompt i of a run is prompt i modulo their number.

Then beam search, one prompt at a time: ``beam`` (decoctl's, ``num_beams=--beams``) against ``ort-genai-beam``
(onnxruntime-genai's), both with length_penalty 0 and early_stopping true (where onnxruntime-genai 0.18 ranks
hypotheses as transformers does), the same max_length, outputs compared.

Last, the cost of forking a row that holds a ``--fork-prefix``-token prefix (its KV copied into another row of the
buffer) against one decode step at that length: the issue's target is a fork cheaper than a step.

onnxruntime-genai's contenders are skipped, with the reason in the report, when it is not installed or cannot run the
model (an Optimum export); they run a tree-enabled model's plain twin (decoctl.model.graph).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np

from decoctl.bench._contenders import BatchRun, OrtGenaiBatchContender, OrtGenaiBeamContender
from decoctl.errors import CapabilityError, ConfigError
from decoctl.generation import Generator
from decoctl.host import ONE_RUN_PER_ROW, Rows
from decoctl.logs import get_logger
from decoctl.model import _huge_pages as huge_pages
from decoctl.model._kv_cache import kv_dtype
from decoctl.model._loader import LoadedModel, default_threads
from decoctl.model._tokenizer import Tokenizer
from decoctl.plugins import PluginRegistry

__all__ = [
    "BATCH_CONTENDERS",
    "BatchBenchReport",
    "BatchResult",
    "ForkCost",
    "equal_length_prompts",
    "fork_cost",
    "parse_batch_sizes",
    "run_batch_bench",
]

log = get_logger(__name__)

#: the contenders of a batch bench, in the order they are reported
BATCH_CONTENDERS = ("greedy", "ort-genai", "beam", "ort-genai-beam")
#: what each onnxruntime-genai contender is compared with
_BASELINES = {"greedy": "greedy", "ort-genai": "greedy", "beam": "beam", "ort-genai-beam": "beam"}


@attrs.frozen(kw_only=True)
class BatchResult:
    """One contender at one batch size (``batch`` 1 for beam search, which runs a prompt at a time)."""

    name: str
    batch: int
    prompts: int
    tokens: int
    tokens_per_s: float
    per_row_tokens_per_s: float
    vs_batch_1: float | None
    ratio_to_baseline: float | None
    identical_to_baseline: bool | None
    mismatches: list[int]
    repeats_tokens_per_s: list[float]


@attrs.frozen(kw_only=True)
class ForkCost:
    """fork() of a row holding ``prefix_tokens`` tokens against one decode step at that length (medians)."""

    prefix_tokens: int
    fork_ms: float
    decode_step_ms: float
    fork_per_step: float
    copied_mib: float


@attrs.frozen(kw_only=True)
class BatchBenchReport:
    model: str
    threads: int
    max_new_tokens: int
    repeats: int
    prompt_tokens: int
    prompts: int
    rounds: int
    batches: list[int]
    num_beams: int
    results: list[BatchResult]
    beam: list[BatchResult]
    fork: ForkCost | None
    rss_mb: dict[int, float]
    skipped: dict[str, str]
    notes: dict[str, str]


def parse_batch_sizes(text: str) -> list[int]:
    """``"1,4,16,64"`` -> [1, 4, 16, 64]: whole numbers from 1 up, each once, in the order given."""
    sizes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        if not item.isdigit() or int(item) < 1:
            raise ConfigError(f"--batch {text!r}: {item!r} is not a batch size; give whole numbers from 1, e.g. 1,4,16")
        sizes.append(int(item))
    if not sizes:
        raise ConfigError(f"--batch {text!r} names no batch size; give whole numbers from 1, e.g. 1,4,16")
    if len(set(sizes)) != len(sizes):
        raise ConfigError(f"--batch {text!r} names a batch size twice")
    return sizes


def equal_length_prompts(tokenizer: Tokenizer, prompts: Sequence[str]) -> tuple[list[str], list[list[int]]]:
    """The prompts cut to the shortest one's length in tokens, as texts and their tokens; a prompt whose cut text
    does not encode back to the same tokens is left out (its text then means something else to the tokenizer)."""
    encoded = [tokenizer.encode(p) for p in prompts]
    length = min(len(ids) for ids in encoded)
    if length == 0:
        raise ConfigError("a bench prompt encodes to no tokens: give prompts with some text")
    texts, kept = [], []
    for prompt, ids in zip(prompts, encoded, strict=True):
        cut = list(ids[:length])
        text = tokenizer.decode(cut)
        if tokenizer.encode(text) == cut:
            texts.append(text)
            kept.append(cut)
        else:
            log.info("decoctl.bench_prompt_left_out", prompt=prompt[:40], tokens=length)
    if not kept:
        raise ConfigError(
            f"no bench prompt cut to {length} tokens encodes back to the same tokens: give prompts (--prompts) whose "
            "shortest is a few tokens longer"
        )
    return texts, kept


def fork_cost(model: LoadedModel, prefix: int, *, repeats: int = 15) -> ForkCost:
    """The median fork() of a row holding ``prefix`` tokens (at most the model's context less one), against the
    median one-token forward of that row at the same length (a decode step)."""
    length = min(prefix, model.spec.context_length - 1)
    rows = Rows("fork-cost", model, capacity=2, max_length=length + 1)
    rng = np.random.default_rng(0)
    rows[0].prefill(rng.integers(0, model.spec.vocab_size, length))
    forks, steps = [], []
    for _ in range(repeats + 1):  # the first of each is a warm-up: the second row's pages are touched once
        started = time.perf_counter()
        child = rows.fork(0)
        forks.append(time.perf_counter() - started)
        rows.release(child)
        started = time.perf_counter()
        rows[0].forward((int(rng.integers(model.spec.vocab_size)),))
        steps.append(time.perf_counter() - started)
        rows[0].rewind(length)
    fork, step = statistics.median(forks[1:]), statistics.median(steps[1:])
    spec = model.spec
    itemsize = np.dtype(kv_dtype(model.session, spec)).itemsize
    copied = 2 * spec.num_layers * spec.num_kv_heads * spec.head_size * length * itemsize
    return ForkCost(
        prefix_tokens=length,
        fork_ms=fork * 1000,
        decode_step_ms=step * 1000,
        fork_per_step=fork / step if step else 0.0,
        copied_mib=copied / 2**20,
    )


class _Contenders:
    """The batch bench's contenders over one loaded target model, with those that cannot run and why."""

    def __init__(
        self,
        names: Sequence[str],
        model: str | None,
        *,
        threads: int,
        num_beams: int,
        registry: PluginRegistry,
        huge: bool,
    ) -> None:
        self.skipped: dict[str, str] = {}
        #: what the bench should say beside a contender's figures (a batch run one prompt at a time)
        self.notes: dict[str, str] = {}
        self.greedy = Generator({"target": model}, "greedy", threads=threads, registry=registry, huge_pages=huge)
        self.target = self.greedy.models["target"]
        self.beam: Generator | None = None
        if "beam" in names:
            beam = {"num_beams": num_beams, "length_penalty": 0.0, "early_stopping": "true"}
            self.beam = Generator({"target": self.target}, "beam", options=beam, registry=registry)
        self.og_batch: OrtGenaiBatchContender | None = None
        self.og_beam: OrtGenaiBeamContender | None = None
        for name in ("ort-genai", "ort-genai-beam"):
            if name not in names:
                continue
            try:
                if name == "ort-genai":
                    self.og_batch = OrtGenaiBatchContender(self.target, threads)
                else:
                    self.og_beam = OrtGenaiBeamContender(self.target, threads, num_beams=num_beams)
            except ConfigError as exc:
                self.skipped[name] = str(exc)
                log.warning("decoctl.bench_contender_skipped", contender=name, reason=str(exc))
        self.names = [n for n in names if n not in self.skipped]

    def batched(self) -> list[tuple[str, Callable[[list[str], list[list[int]], int, int], BatchRun]]]:
        runs: list[tuple[str, Callable[[list[str], list[list[int]], int, int], BatchRun]]] = []
        if "greedy" in self.names:
            runs.append(("greedy", self._greedy))
        if self.og_batch is not None:
            og = self.og_batch
            runs.append(("ort-genai", lambda texts, ids, batch, n: og.run_batch(ids, batch, n)))
        return runs

    def beams(self) -> list[tuple[str, Callable[[str, list[int], int], BatchRun]]]:
        runs: list[tuple[str, Callable[[str, list[int], int], BatchRun]]] = []
        if self.beam is not None:
            runs.append(("beam", self._beam))
        if self.og_beam is not None:
            og = self.og_beam
            runs.append(("ort-genai-beam", lambda text, ids, n: og.run_beam(ids, n)))
        return runs

    def _greedy(self, texts: list[str], ids: list[list[int]], batch: int, max_new_tokens: int) -> BatchRun:
        del ids
        started = time.perf_counter()
        results = self.greedy.generate_batch(texts, batch_size=batch, max_new_tokens=max_new_tokens, seed=0)
        seconds = time.perf_counter() - started
        how = str(results[0].stats.trace.get("batched", ""))
        if how.startswith("one at a time") or ONE_RUN_PER_ROW in how:
            self.notes["greedy"] = how
        return BatchRun(outputs=tuple(r.tokens for r in results), seconds=seconds)

    def _beam(self, text: str, ids: list[int], max_new_tokens: int) -> BatchRun:
        del ids
        assert self.beam is not None
        started = time.perf_counter()
        result = self.beam.generate(text, max_new_tokens=max_new_tokens, seed=0)
        if "rows" in result.stats.trace:
            self.notes["beam"] = f"beams stepped {result.stats.trace['rows']}"
        return BatchRun(outputs=(result.tokens,), seconds=time.perf_counter() - started)


def _rate(runs: Sequence[BatchRun]) -> float:
    tokens = sum(len(o) for run in runs for o in run.outputs)
    seconds = sum(run.seconds for run in runs)
    return tokens / seconds if seconds > 0 else 0.0


def _results(runs: dict[str, list[list[BatchRun]]], batch: int, prompts: int) -> list[BatchResult]:
    """runs[name][repeat] -> one BatchResult per contender (its repeats' runs pooled per repeat)."""
    rates = {name: [_rate(repeat) for repeat in repeats] for name, repeats in runs.items()}
    medians = {name: statistics.median(values) for name, values in rates.items()}
    outputs = {name: [o for run in repeats[0] for o in run.outputs] for name, repeats in runs.items()}
    results = []
    for name in runs:
        baseline = _BASELINES[name]
        same = baseline in outputs and baseline != name
        mismatches = (
            [i for i, (a, b) in enumerate(zip(outputs[name], outputs[baseline], strict=True)) if a != b] if same else []
        )
        base_rate = medians.get(baseline, 0.0)
        results.append(
            BatchResult(
                name=name,
                batch=batch,
                prompts=prompts,
                tokens=sum(len(o) for o in outputs[name]),
                tokens_per_s=medians[name],
                per_row_tokens_per_s=medians[name] / batch,
                vs_batch_1=None,
                ratio_to_baseline=medians[name] / base_rate if baseline in medians and base_rate else None,
                identical_to_baseline=not mismatches if same else None,
                mismatches=mismatches,
                repeats_tokens_per_s=rates[name],
            )
        )
    return results


def run_batches(
    contenders: _Contenders,
    texts: list[str],
    ids: list[list[int]],
    batches: Sequence[int],
    *,
    rounds: int,
    max_new_tokens: int,
    repeats: int,
    resident: Callable[[], float] = lambda: 0.0,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[BatchResult], dict[int, float]]:
    """Every batched contender at every batch size: a warm-up run, then ``repeats`` runs in rotating order;
    ``resident()`` (the process's resident MiB) is read after each batch size."""
    results: list[BatchResult] = []
    rss: dict[int, float] = {}
    runs_of = contenders.batched()
    for batch in batches:
        count = batch * rounds
        chosen = [i % len(texts) for i in range(count)]
        prompt_texts, prompt_ids = [texts[i] for i in chosen], [ids[i] for i in chosen]
        active = []
        for name, run in runs_of:  # warm-up: the rows of this batch size are allocated and touched
            try:
                run(prompt_texts, prompt_ids, batch, max_new_tokens)
            except RuntimeError as exc:  # onnxruntime-genai refuses some batch sizes (its limit is 32 rows)
                if not name.startswith("ort-genai"):
                    raise
                contenders.skipped[f"{name} at batch {batch}"] = str(exc)
                continue
            active.append((name, run))
        runs: dict[str, list[list[BatchRun]]] = {name: [] for name, _ in active}
        for repeat in range(repeats):
            shift = repeat % max(1, len(active))
            for name, run in (*active[shift:], *active[:shift]):
                runs[name].append([run(prompt_texts, prompt_ids, batch, max_new_tokens)])
        results += _results(runs, batch, count)
        rss[batch] = resident()
        if progress:
            progress(f"batch {batch} done")
    first = {r.name: r.tokens_per_s for r in results if r.batch == 1}
    return [
        attrs.evolve(r, vs_batch_1=r.tokens_per_s / first[r.name] if first.get(r.name) else None) for r in results
    ], rss


def run_beams(
    contenders: _Contenders, texts: list[str], ids: list[list[int]], *, max_new_tokens: int, repeats: int
) -> list[BatchResult]:
    """Every beam contender on every prompt, one at a time: a warm-up pass, then ``repeats`` passes."""
    runs_of = contenders.beams()
    if not runs_of:
        return []
    runs: dict[str, list[list[BatchRun]]] = {name: [] for name, _ in runs_of}
    for _, run in runs_of:
        run(texts[0], ids[0], max_new_tokens)
    for repeat in range(repeats):
        for name, _ in runs_of:
            runs[name].append([])
        for index, (text, prompt) in enumerate(zip(texts, ids, strict=True)):
            shift = (repeat * len(texts) + index) % len(runs_of)
            for name, run in (*runs_of[shift:], *runs_of[:shift]):
                runs[name][repeat].append(run(text, prompt, max_new_tokens))
    return _results(runs, 1, len(texts))


def format_batch_table(report: BatchBenchReport) -> str:
    lines = [
        f"model {report.model}  threads {report.threads}  prompts of {report.prompt_tokens} tokens (cut to one "
        f"length; {report.prompts} distinct)  max_new_tokens {report.max_new_tokens}  repeats {report.repeats}",
        f"{'batch':>5}  {'contender':<16}{'tok/s':>10}{'per row':>10}{'vs batch 1':>12}{'ratio':>8}{'identical':>11}"
        f"{'RSS MiB':>9}",
    ]

    def row(result: BatchResult, rss: str) -> str:
        versus = f"{result.vs_batch_1:>12.2f}" if result.vs_batch_1 is not None else f"{'-':>12}"
        ratio = f"{result.ratio_to_baseline:>8.3f}" if result.ratio_to_baseline is not None else f"{'-':>8}"
        same = {None: "-", True: "yes"}.get(result.identical_to_baseline, f"NO {result.mismatches[:4]}")
        return (
            f"{result.batch:>5}  {result.name:<16}{result.tokens_per_s:>10.1f}{result.per_row_tokens_per_s:>10.1f}"
            f"{versus}{ratio}{same:>11}{rss:>9}"
        )

    for result in report.results:
        lines.append(row(result, f"{report.rss_mb.get(result.batch, 0.0):.0f}"))
    if report.beam:
        lines.append(
            f"beam search, {report.num_beams} beams (length_penalty 0, early_stopping true), one prompt at a time:"
        )
        lines += [row(result, "") for result in report.beam]
    if report.fork is not None:
        fork = report.fork
        lines.append(
            f"fork of a {fork.prefix_tokens}-token prefix ({fork.copied_mib:.2f} MiB of KV copied): "
            f"{fork.fork_ms:.2f} ms; one decode step at that length: {fork.decode_step_ms:.2f} ms "
            f"({fork.fork_per_step:.2f} of a step)"
        )
    for name, note in report.notes.items():
        lines.append(f"{name}: {note}")
    for name, reason in report.skipped.items():
        lines.append(f"skipped {name}: {reason}")
    return "\n".join(lines)


def batch_contender_names(text: str | None) -> list[str]:
    """``--contenders`` under ``--batch``: a subset of BATCH_CONTENDERS (default: all of them)."""
    if text is None:
        return list(BATCH_CONTENDERS)
    names = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [n for n in names if n not in BATCH_CONTENDERS]
    if unknown or not names:
        raise ConfigError(
            f"--batch runs the contenders {', '.join(BATCH_CONTENDERS)} (no options: --beams sets the beams), not "
            f"{unknown or text!r}: name some of those, or leave --contenders out for all"
        )
    return [n for n in BATCH_CONTENDERS if n in names]


def check_batch_args(args: argparse.Namespace) -> list[int]:
    """The batch sizes, once every option a batch bench cannot honour is refused."""
    sizes = parse_batch_sizes(args.batch)
    refused = [
        flag
        for flag, given in (
            ("--runs", args.runs != 1),
            ("--plot", args.plot is not None),
            ("--draft", args.draft is not None),
            ("--role", bool(args.role)),
            ("--baseline", args.baseline != "greedy"),
        )
        if given
    ]
    if refused:
        raise ConfigError(
            f"--batch runs its own comparison (decoctl's batched greedy and beam search against onnxruntime-genai's), "
            f"which takes no {', '.join(refused)}: leave {'them' if len(refused) > 1 else 'it'} out"
        )
    if args.batch_rounds < 1:
        raise ConfigError(f"--batch-rounds {args.batch_rounds}: give 1 or more (prompts per batch size: B x rounds)")
    if args.beams < 1:
        raise ConfigError(f"--beams {args.beams}: give 1 or more (leave beam out of --contenders for none)")
    if args.fork_prefix < 0:
        raise ConfigError(f"--fork-prefix {args.fork_prefix}: give a prefix length in tokens, or 0 for no fork measure")
    return sizes


def run_batch_bench(
    args: argparse.Namespace, registry: PluginRegistry, prompts: list[str], *, resident: Callable[[], float]
) -> int:
    """``decoctl bench --batch ...`` (see the module docstring) over ``prompts``; ``resident()``: the process's
    resident MiB. Returns 3 when --require-identical and an output differs, else 0."""
    sizes = check_batch_args(args)
    names = batch_contender_names(args.contenders)
    threads = args.threads or default_threads()
    huge = not args.no_huge_pages
    contenders = _Contenders(names, args.model, threads=threads, num_beams=args.beams, registry=registry, huge=huge)
    if huge:
        huge_pages.collapse()
    texts, ids = equal_length_prompts(contenders.target.tokenizer, prompts)

    def progress(message: str) -> None:
        print(message, file=sys.stderr)

    results, rss = run_batches(
        contenders,
        texts,
        ids,
        sizes,
        rounds=args.batch_rounds,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        resident=resident,
        progress=progress,
    )
    beams = run_beams(contenders, texts, ids, max_new_tokens=args.max_new_tokens, repeats=args.repeats)
    fork = None
    if args.fork_prefix:
        try:
            fork = fork_cost(contenders.target, args.fork_prefix)
        except CapabilityError as exc:
            contenders.skipped["fork"] = str(exc)
    report = BatchBenchReport(
        model=contenders.target.name,
        threads=threads,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        prompt_tokens=len(ids[0]),
        prompts=len(texts),
        rounds=args.batch_rounds,
        batches=sizes,
        num_beams=args.beams,
        results=results,
        beam=beams,
        fork=fork,
        rss_mb=rss,
        skipped=contenders.skipped,
        notes=contenders.notes,
    )
    print(format_batch_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(attrs.asdict(report), indent=2))
    differing = [r for r in (*results, *beams) if r.identical_to_baseline is False]
    if args.require_identical and differing:
        for r in differing:
            print(
                f"contender {r.name!r} at batch {r.batch} differs from {_BASELINES[r.name]!r} on prompt(s) "
                f"{r.mismatches}",
                file=sys.stderr,
            )
        return 3
    return 0
