"""Batched prompts: many prompts' rows stepped together in one onnxruntime Run, refilled as prompts finish.

gen = Generator({"target": "pycode"}, "greedy")
results = gen.generate_batch(["def f(x):", "import os"], batch_size=8)   # in prompt order
for index, result in gen.stream_batch(prompts, batch_size=8): ...       # as each prompt finishes

The batch holds ``batch_size`` rows of the target in one KV buffer (decoctl.host.Rows). Each prompt takes a free
row: it is prefilled there (a multi-token forward on that row alone) and gets a Host of its own (its output, stop
rules, seeded rng). Every step, the controller picks each running prompt's next token from its row's logits
(``RowController.next_token``), the batch commits it to that prompt's output, and one ``rows.step`` feeds every
prompt still running. A prompt that finishes (EOS, a stop string, its own max_new_tokens) leaves its row, and the
next prompt is prefilled into it (continuous batching inside one process). Every prompt's output is the one it
gets alone: greedy token for token, sampling the same tokens for the same seed (each prompt draws from its own rng).

Controllers declare that they can do this (``ControllerSpec.batched``); any other controller, or one that holds
several rows per prompt (parallel samples, beams), or a processor chain that keeps state per sequence without a
``clone()`` runs the prompts one at a time, and each result's trace says why under "batched". A chain whose stateful
processors clone gives every prompt a clone of its own, reset with that prompt. On a model with a concatenated KV cache
(Optimum's layout) every row keeps a cache of its own and a step is one Run per row; an encoder-decoder model's row
runs its own encoder over its own prompt when the prompt is admitted (decoctl.host.Rows).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import numpy as np

from decoctl.controllers import RowController
from decoctl.errors import ConfigError
from decoctl.host import Host, Rows, Sequence
from decoctl.processing import ProcessorChain
from decoctl.specs import ControllerSpec

if TYPE_CHECKING:
    from decoctl.generation._results import GenerationResult

__all__ = [
    "BatchPrompt",
    "BatchSlot",
    "one_at_a_time",
    "read_prompt_records",
    "read_prompts",
    "result_record",
    "run_batch",
]

PROMPT_KEYS = ("prompt", "max_new_tokens", "seed", "stop", "source", "adapter")
"""The keys a line of a prompts file may hold; ``source`` is a note for people (where the prompt was cut from, as the
bundled prompt files say) that generation does not read."""

T = TypeVar("T")


def _stop_strings(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@attrs.frozen(kw_only=True)
class BatchPrompt:
    """One prompt of a batch and its own limits: ``max_new_tokens`` and ``seed`` (None: the batch call's) and
    ``stop`` strings (added to the call's); ``adapter``: the loaded LoRA adapter it runs (None: the base model)."""

    prompt: str
    max_new_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = attrs.field(default=(), converter=_stop_strings)
    adapter: str | None = None

    @classmethod
    def of(cls, item: str | Mapping[str, Any] | BatchPrompt, where: str) -> BatchPrompt:
        """A prompt from a string, a mapping with the keys of a prompts file's line, or a BatchPrompt; ConfigError
        naming ``where`` (e.g. "prompt 3" or "file.jsonl:3") for anything else."""
        if isinstance(item, BatchPrompt):
            return item
        if isinstance(item, str):
            return cls(prompt=item)
        if not isinstance(item, Mapping) or "prompt" not in item:
            raise ConfigError(f'{where}: give a prompt string or an object with a "prompt", not {_shown(item)}')
        unknown = sorted(set(item) - set(PROMPT_KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {unknown}: a prompt takes {list(PROMPT_KEYS)}")
        prompt = item["prompt"]
        if not isinstance(prompt, str):
            raise ConfigError(f'{where}: the prompt must be a string, not {_shown(prompt)}: quote it ("prompt": "...")')
        if not isinstance(item.get("source", ""), str):
            raise ConfigError(f"{where}: source is a note (a string), not {_shown(item['source'])}")
        limits = {}
        for key, least in (("max_new_tokens", 1), ("seed", 0)):
            value = item.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
                raise ConfigError(f"{where}: {key} must be a whole number from {least} up, not {_shown(value)}")
            limits[key] = int(value)
        stop = item.get("stop", ())
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
            raise ConfigError(f"{where}: stop must be a non-empty string or a list of them, not {_shown(stop)}")
        adapter = item.get("adapter")
        if adapter is not None and not isinstance(adapter, str):
            raise ConfigError(f"{where}: adapter is a loaded adapter's name (a string), not {_shown(adapter)}")
        return cls(prompt=prompt, stop=tuple(stop), adapter=adapter, **limits)


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_prompt_records(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """The JSON objects of a JSONL prompts file, one a line, each with where it stands ("FILE:LINE"); blank lines
    are skipped. ConfigError naming the file and line for a file that cannot be read, a line that is not a JSON
    object, or a file without any."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(
            f'--prompts {path}: no such file: give a JSONL file with one {{"prompt": ...}} per line'
        ) from exc
    except OSError as exc:
        raise ConfigError(f"--prompts {path}: cannot read it ({exc.strerror}): give a readable JSONL file") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"--prompts {path} is not UTF-8 text (byte {exc.start}: {exc.reason}): save it as UTF-8"
        ) from exc
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}:{number}: not JSON ({exc.msg}): each line must be a JSON object with a 'prompt'"
            ) from exc
        if not isinstance(record, dict):
            raise ConfigError(f"{path}:{number}: each line must be a JSON object with a 'prompt', not {_shown(record)}")
        records.append((f"{path}:{number}", record))
    if not records:
        raise ConfigError(f'--prompts {path} holds no prompts: one {{"prompt": ...}} per line')
    return records


def read_prompts(path: str | Path) -> list[BatchPrompt]:
    """The prompts of a JSONL file: one JSON object a line with a "prompt" string and optionally "max_new_tokens",
    "seed" and "stop". ConfigError naming the file and line for anything else."""
    return [BatchPrompt.of(record, where) for where, record in read_prompt_records(path)]


def result_record(index: int, result: GenerationResult) -> dict[str, Any]:
    """One prompt's result as ``decoctl generate --prompts`` writes it, one JSON object a line: its ``index`` in the
    file, the ``text``, the ``stats`` (prompt_tokens, new_tokens, stop_reason, seconds, tokens_per_second, batched)
    and, where the controller gave several, every ``completions`` entry (text, stop_reason, score)."""
    stats = result.stats
    record: dict[str, Any] = {
        "index": index,
        "text": result.text,
        "stats": {
            "prompt_tokens": stats.prompt_tokens,
            "new_tokens": stats.new_tokens,
            "stop_reason": stats.stop_reason,
            "seconds": round(stats.prefill_seconds + stats.decode_seconds, 6),
            "tokens_per_second": round(stats.tokens_per_second, 3),
            "batched": stats.trace.get("batched"),
        },
    }
    if len(result.completions) > 1:
        record["completions"] = [
            {"text": c.text, "stop_reason": c.stop_reason, "score": c.score} for c in result.completions
        ]
    return record


def one_at_a_time(
    spec: ControllerSpec, options: dict[str, Any], roles: tuple[str, ...], chain: ProcessorChain
) -> str | None:
    """Why a batch with this controller and chain must run its prompts one at a time (the trace's "batched"
    entry), or None when its prompts can share the rows of one role (any target model: a model with a concatenated
    KV cache steps them one Run per row)."""
    if not spec.batched:
        return f"one at a time: controller {spec.name} steps one row"
    if spec.rows(options) > 1:
        return f"one at a time: controller {spec.name} holds {spec.rows(options)} rows per prompt with these options"
    if roles != ("target",):
        return f"one at a time: controller {spec.name} drives the roles {list(roles)}, batches drive the target only"
    if chain.unclonable:
        names = ", ".join(chain.unclonable)
        return f"one at a time: the logits chain holds state per sequence ({names}) without clone()"
    return None


@attrs.define
class BatchSlot:
    """One prompt while it runs on a row: its index in the batch, its row, its Host and controller, and whatever the
    caller keeps with it (``run``)."""

    index: int
    row: int
    host: Host
    controller: RowController
    run: Any = None


def run_batch(
    rows: Rows,
    count: int,
    admit: Callable[[int, int, Sequence], BatchSlot],
    finish: Callable[[BatchSlot], T],
) -> Iterator[T]:
    """Run prompts 0..count-1 on the rows of ``rows``, every row at once; yield ``finish(slot)`` as each prompt
    finishes (in that order, not the prompts').

    ``admit(index, row, sequence)`` starts prompt ``index`` on row ``row`` (its Sequence, emptied): it prefills the
    prompt there, starts a controller on a Host built over that sequence, and returns the slot. Every step, each
    running prompt commits ``slot.controller.next_token(slot.host)``; a prompt whose output is then done is
    finished and its row takes the next prompt; one ``rows.step`` feeds every prompt still running.
    """
    rows[0].rewind(0)
    for _ in range(rows.capacity - len(rows)):
        rows.fork(0)  # an empty row forked from an empty row 0: nothing to copy
    waiting = iter(range(count))
    slots: dict[int, BatchSlot] = {}

    def fill(row: int) -> None:
        index = next(waiting, None)
        if index is not None:
            sequence = rows[row]
            sequence.rewind(0)
            slots[row] = admit(index, row, sequence)

    for row in rows.ids:
        fill(row)
    while slots:
        stepped, tokens = [], []
        for row, slot in sorted(slots.items()):
            host = slot.host
            token = slot.controller.next_token(host)
            host.commit((token,))
            if host.done:
                del slots[row]
                yield finish(slot)
                fill(row)
            else:
                stepped.append(row)
                tokens.append(token)
        if stepped:
            rows.step(tokens, rows=stepped)
