"""``decoctl eagle data``: training text for a head, in the target's own words.

A head is worth what the target accepts of its drafts, and the target accepts what it would have said itself: so the
best training text is the target's own greedy continuations of prompts like the ones it will serve. This command cuts
diverse prompts (decoctl_eagle.prompts: code, prose, instructions, edits) from text the machine has offline, or takes
the user's own (``--prompt-file``), and has the target continue each one with decoctl's batched greedy decoding
(``Generator.stream_batch``: ``--batch`` rows stepped together).

Everything lives in ``--out DIR``:

- ``data.json``: the settings that fix the data (target, prompts, new tokens, seed, the prompt file);
- ``prompts.jsonl``: the prompts, written once (``{"prompt", "kind", "source"}`` a line);
- ``data.jsonl``: one ``{"index", "kind", "prompt", "completion"}`` a line, appended as each prompt finishes: what
  ``decoctl eagle train --data DIR/data.jsonl`` reads (prompt followed by completion).

Run the same command again after an interruption (Ctrl-C, a crash, a reboot) and it goes on with the prompts not yet
in data.jsonl; a last line cut short by a crash is dropped first. Greedy continuations are deterministic, so a resumed
run writes what an uninterrupted one would have (in the order prompts finish).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from decoctl import ConfigError, Generator, PluginRegistry, resolve_model

__all__ = ["DATA", "PROMPTS", "SETTINGS", "Summary", "make_data"]

SETTINGS = "data.json"
PROMPTS = "prompts.jsonl"
DATA = "data.jsonl"


@attrs.frozen(kw_only=True)
class Summary:
    """What a ``make_data`` call did: prompts in all, done before it and now, the tokens it generated and in how many
    seconds, whether it finished, and the file the data is in."""

    prompts: int
    done_before: int
    done: int
    new_tokens: int
    seconds: float
    finished: bool
    data: Path


def make_data(
    target: str,
    out: Path,
    *,
    prompts: int = 3000,
    new_tokens: int = 256,
    batch: int = 16,
    seed: int = 0,
    threads: int | None = None,
    prompt_file: Path | None = None,
    registry: PluginRegistry | None = None,
    say: Callable[[str], None] = lambda _: None,
    report: Callable[[int], None] = lambda _: None,
) -> Summary:
    """Generate (or go on generating) ``out``'s data: the target's greedy continuations of ``new_tokens`` tokens of
    ``prompts`` prompts cut with ``seed`` (or those of ``prompt_file``), ``batch`` at a time. ``say``: a line for the
    user; ``report(n)``: n more tokens were generated. A KeyboardInterrupt leaves every finished prompt written."""
    if batch < 1 or new_tokens < 1 or prompts < 1:
        raise ConfigError(f"--batch {batch}, --new-tokens {new_tokens} and --prompts {prompts} must be at least 1")
    folder = out.expanduser().resolve()
    registry = registry or PluginRegistry()
    name, path = resolve_model(target, registry)
    settings = {
        "target": str(Path(path).expanduser().resolve()),
        "prompts": None if prompt_file else prompts,
        "prompt_file": str(prompt_file.expanduser().resolve()) if prompt_file else None,
        "new_tokens": new_tokens,
        "seed": seed,
    }
    _check_settings(folder, settings)
    cut = _prompts(folder, settings, say)
    done = _finished(folder / DATA)
    todo = [i for i in range(len(cut)) if i not in done]
    say(
        f"{len(cut)} prompts, {len(done)} done before: the target ({name}) continues {len(todo)} more, "
        f"{batch} at a time"
    )
    began = time.monotonic()
    generated = finished = 0
    if todo:
        generator = Generator({"target": path}, "greedy", threads=threads, registry=registry)
        stream = generator.stream_batch(
            [cut[i]["prompt"] for i in todo], batch_size=batch, max_new_tokens=new_tokens, seed=0
        )
        with (folder / DATA).open("a", encoding="utf-8") as data:
            try:
                for position, result in stream:
                    index = todo[position]
                    record = {"index": index, "kind": cut[index]["kind"], **_text(cut[index], result.text)}
                    data.write(json.dumps(record, ensure_ascii=False) + "\n")
                    data.flush()
                    generated += len(result.tokens)
                    finished += 1
                    report(len(result.tokens))
            finally:
                data.flush()
                os.fsync(data.fileno())
                stream.close()
    return Summary(
        prompts=len(cut),
        done_before=len(done),
        done=len(done) + finished,
        new_tokens=generated,
        seconds=time.monotonic() - began,
        finished=len(done) + finished == len(cut),
        data=folder / DATA,
    )


def _text(prompt: dict[str, Any], completion: str) -> dict[str, str]:
    return {"prompt": prompt["prompt"], "completion": completion}


def _check_settings(folder: Path, settings: dict[str, Any]) -> None:
    """Write ``data.json`` for a new folder; for one that has it, refuse other settings, naming them."""
    path = folder / SETTINGS
    if path.is_file():
        stored = json.loads(path.read_text(encoding="utf-8"))
        differing = {k: (stored.get(k), v) for k, v in settings.items() if stored.get(k) != v}
        if differing:
            shown = "; ".join(f"{k} {v[1]} (the data has {v[0]})" for k, v in differing.items())
            raise ConfigError(
                f"{folder} holds data made with other settings: {shown}. Give the same ones to go on, or another --out"
            )
        return
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def _prompts(folder: Path, settings: dict[str, Any], say: Callable[[str], None]) -> list[dict[str, Any]]:
    """The prompts: read back from prompts.jsonl, or made (cut, or read from the prompt file) and written once."""
    path = folder / PROMPTS
    if path.is_file():
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if settings["prompt_file"]:
        from decoctl_eagle.training.data import read_prompts

        made = [
            {"prompt": p, "kind": "given", "source": settings["prompt_file"]}
            for p in read_prompts(settings["prompt_file"])
        ]
    else:
        from decoctl_eagle.prompts import cut_prompts

        say("cutting prompts from this machine's Python standard library, /usr/share/doc and manual pages")
        made = [p.as_dict() for p in cut_prompts(int(settings["prompts"]), seed=int(settings["seed"]))]
    if not made:
        raise ConfigError(f"no prompts to continue in {settings['prompt_file']}: give one a line, or JSONL 'prompt'")
    staging = path.with_name(PROMPTS + ".tmp")
    staging.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in made), encoding="utf-8")
    os.replace(staging, path)
    return made


def _finished(path: Path) -> set[int]:
    """The indices data.jsonl holds; a last line cut short (no newline at its end) is removed first."""
    if not path.is_file():
        return set()
    raw = path.read_bytes()
    keep = raw.rfind(b"\n") + 1
    if keep < len(raw):
        with path.open("r+b") as file:
            file.truncate(keep)
    done = set()
    for line in raw[:keep].decode("utf-8").splitlines():
        if line.strip():
            done.add(int(json.loads(line)["index"]))
    return done
