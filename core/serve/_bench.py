"""``decoctl bench-serve``: a load generator for OpenAI-compatible servers (decoctl serve, llama.cpp's server, ...).

decoctl bench-serve --url http://127.0.0.1:8000 --prompts examples/code_prompts.jsonl --concurrency 1,4,16 \\
    --controllers greedy,speculative:drafter=prompt-lookup --max-tokens 64 --json build/serve.json

For each server, controller and concurrency level C, C clients send streamed completions (greedy: temperature 0)
one after another, ``--requests`` in all, and the run reports throughput (completion tokens over the level's wall
seconds), time to first token and inter-token latency (p50, p99). A chunk that carries several tokens (a verify
step that accepted drafts; decoctl says how many in the chunk's ``decoctl.tokens``) spreads its gap over them.
Controllers travel in decoctl's extension object, so they apply to decoctl servers only; another server (llama.cpp's)
runs the greedy level. Only the standard library talks HTTP here: the tool needs nothing the server does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import numpy as np

from decoctl.errors import ConfigError
from decoctl.generation import read_prompts

__all__ = ["WORKLOADS", "Level", "Timing", "add_bench_serve_parser", "measure", "run_bench_serve", "stream_completion"]

T = TypeVar("T")


#: what ``--workload`` takes (decoctl.serve._bench_workloads)
WORKLOADS = ("prompts", "shared-system", "chat")


@attrs.frozen(kw_only=True)
class Timing:
    """One streamed request: seconds to its first token, the gaps between its tokens, its completion tokens."""

    first_token: float
    gaps: tuple[float, ...]
    tokens: int


@attrs.frozen(kw_only=True)
class Level:
    """One server, controller and concurrency: what its requests measured."""

    server: str
    controller: str
    concurrency: int
    requests: int
    tokens: int
    seconds: float
    ttft: tuple[float, float]
    itl: tuple[float, float]
    #: the chat workload's time to first token (p50) of each turn, first turn first; empty for other workloads
    ttft_by_turn: tuple[float, ...] = ()

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            **attrs.asdict(self),
            "throughput": round(self.throughput, 3),
            "ttft": {"p50": self.ttft[0], "p99": self.ttft[1]},
            "itl": {"p50": self.itl[0], "p99": self.itl[1]},
            "ttft_by_turn": list(self.ttft_by_turn),
        }


def _events(response: Any) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a server-sent event stream, up to ``data: [DONE]``."""
    for raw in response:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def stream_completion(url: str, body: Mapping[str, Any], api_key: str | None = None) -> Timing:
    """Send one streamed completion to ``url`` (a server's base URL) and time its tokens."""
    return stream_timed(url, "/v1/completions", body, api_key, _completion_text)[0]


def _completion_text(chunk: Mapping[str, Any]) -> str | None:
    choices = chunk.get("choices") or []
    if not choices or choices[0].get("finish_reason"):
        return None
    return choices[0].get("text")


def stream_timed(
    url: str,
    path: str,
    body: Mapping[str, Any],
    api_key: str | None,
    piece_of: Callable[[Mapping[str, Any]], str | None],
) -> tuple[Timing, str]:
    """Send one streamed request to ``url`` + ``path`` and time the events that carry text (``piece_of`` reads an
    event's text, None or empty where it has none): the timing, and the text the events carried."""
    request = urllib.request.Request(
        url.rstrip("/") + path,
        data=json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode(),
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})},
        method="POST",
    )
    started = time.perf_counter()
    first, last, gaps, counted, usage, text = None, 0.0, [], 0, None, []
    try:
        with urllib.request.urlopen(request) as response:
            for chunk in _events(response):
                if "error" in chunk:
                    raise ConfigError(f"{url} refused a request: {chunk['error'].get('message')}")
                if chunk.get("usage"):
                    usage = int(chunk["usage"]["completion_tokens"])
                piece = piece_of(chunk)
                if not piece:
                    continue
                text.append(piece)
                now = time.perf_counter()
                count = int((chunk.get("decoctl") or {}).get("tokens", 1))
                if first is None:
                    first = now - started
                else:
                    gaps.extend([(now - last) / count] * count)
                last, counted = now, counted + count
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")
        raise ConfigError(f"{url} answered {exc.code}: {detail[:300]}") from None
    except urllib.error.URLError as exc:
        raise ConfigError(f"cannot reach {url} ({exc.reason}): start the server first (decoctl serve)") from None
    timing = Timing(first_token=first or 0.0, gaps=tuple(gaps), tokens=usage if usage is not None else counted)
    return timing, "".join(text)


def _percentiles(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    p50, p99 = np.percentile(np.asarray(values, np.float64), [50, 99])
    return round(float(p50), 6), round(float(p99), 6)


def run_clients(concurrency: int, count: int, work: Callable[[int], T]) -> tuple[list[T], float]:
    """``work(0)`` .. ``work(count - 1)`` from ``concurrency`` client threads, each taking the next index when its
    work ends: the results in the order they ended, and the wall seconds. The first failure is raised once every
    client has stopped (the others take no more work)."""
    pending = iter(range(count))
    lock = threading.Lock()
    results: list[T] = []
    failures: list[BaseException] = []

    def client() -> None:
        while True:
            with lock:
                index = next(pending, None)
            if index is None or failures:
                return
            try:
                result = work(index)
            except BaseException as exc:  # reported once every client has stopped
                failures.append(exc)
                return
            with lock:
                results.append(result)

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if failures:
        raise failures[0]
    return results, seconds


def measure(
    url: str,
    bodies: Sequence[Mapping[str, Any]],
    concurrency: int,
    *,
    api_key: str | None = None,
    server: str = "",
    controller: str = "greedy",
) -> Level:
    """Send ``bodies`` from ``concurrency`` clients, each taking the next body when its request ends."""
    timings, seconds = run_clients(
        concurrency, len(bodies), lambda index: stream_completion(url, bodies[index], api_key)
    )
    return Level(
        server=server or url,
        controller=controller,
        concurrency=concurrency,
        requests=len(timings),
        tokens=sum(t.tokens for t in timings),
        seconds=round(seconds, 6),
        ttft=_percentiles([t.first_token for t in timings]),
        itl=_percentiles([gap for t in timings for gap in t.gaps]),
    )


def _served(url: str, api_key: str | None) -> tuple[str, bool]:
    """The model a server serves (the first /v1/models lists) and whether it is a decoctl server."""
    request = urllib.request.Request(
        url.rstrip("/") + "/v1/models", headers={"Authorization": f"Bearer {api_key}"} if api_key else {}
    )
    try:
        with urllib.request.urlopen(request) as response:
            entry = json.loads(response.read())["data"][0]
    except (urllib.error.URLError, KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"{url}/v1/models did not name a model ({exc}): is it an OpenAI-compatible server?") from None
    return str(entry["id"]), "decoctl" in entry


def _controller(text: str) -> tuple[str, dict[str, str]]:
    """``name`` or ``name:key=value:key=value`` as a controller and its options."""
    name, *pairs = text.split(":")
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--controllers: {text!r}: write options as name:key=value")
        options[key] = value
    return name, options


def add_bench_serve_parser(commands: Any) -> None:
    bench = commands.add_parser(
        "bench-serve", help="load an OpenAI-compatible server: throughput, time to first token, inter-token latency"
    )
    bench.add_argument("--url", action="append", required=True, metavar="[NAME=]URL", help="a server (repeatable)")
    bench.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    bench.add_argument("--prompts", default="examples/code_prompts.jsonl", help="prompts, one JSON object a line")
    bench.add_argument("--concurrency", default="1,4,16", help="clients at once, per level (default 1,4,16)")
    bench.add_argument("--requests", type=int, help="requests per level (default: 2 x concurrency, at least 8)")
    bench.add_argument("--max-tokens", type=int, default=64, help="completion tokens per request (default 64)")
    bench.add_argument(
        "--controllers", default="greedy", help="decoctl controllers: greedy,speculative:drafter=prompt-lookup"
    )
    bench.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="prompts",
        help="prompts: one prompt of the file a request (default); shared-system: a ~1,000-token system prompt made "
        "from the file, then a short question; chat: four-turn conversations, each turn's time to first token reported",
    )
    bench.add_argument(
        "--system-chars",
        type=int,
        default=4000,
        help="the shared-system workload's system prompt in characters (default 4000: about 1,000 tokens of code)",
    )
    bench.add_argument(
        "--models",
        help="the model names requests give, round-robin (base:sql,base:doc: a server's LoRA adapters, "
        "docs/ADAPTERS.md); default: the first the server's /v1/models lists",
    )
    bench.add_argument("--json", help="write the levels to this file")


def run_bench_serve(args: argparse.Namespace, registry: Any = None) -> int:
    from decoctl.serve._bench_workloads import chat_questions, measure_conversations, shared_system_prompts

    prompts = [p.prompt for p in read_prompts(args.prompts)]
    levels = [int(part) for part in str(args.concurrency).split(",") if part.strip()]
    if not levels or min(levels) < 1:
        raise ConfigError(f"--concurrency {args.concurrency}: give client counts from 1 up, e.g. 1,4,16")
    controllers = [_controller(part.strip()) for part in args.controllers.split(",") if part.strip()]
    spread = [part.strip() for part in (getattr(args, "models", None) or "").split(",") if part.strip()]
    if len(spread) > 1 and args.workload == "chat":
        raise ConfigError(f"--models {args.models}: the chat workload's conversations take one model; give one name")
    results: list[Level] = []
    print(f"{'server':<16} {'controller':<36} {'C':>3} {'tok/s':>9} {'TTFT p50/p99 s':>17} {'ITL p50/p99 ms':>17}")
    for given in args.url:
        name, sep, url = given.partition("=")
        name, url = (name, url) if sep and "://" not in name else (given, given)
        model, is_decoctl = _served(url, args.api_key)
        names = spread or [model]
        for controller, options in controllers if is_decoctl else [("greedy", {})]:
            label = controller + "".join(f":{k}={v}" for k, v in options.items())
            for concurrency in levels:
                count = args.requests or max(8, 2 * concurrency)
                extra = {"decoctl": {"controller": controller, "options": options}}
                extra = extra if is_decoctl and controller != "greedy" else {}
                if args.workload == "chat":
                    level = measure_conversations(
                        url,
                        chat_questions(prompts, count),
                        concurrency,
                        model=names[0],
                        max_tokens=args.max_tokens,
                        extra=extra,
                        api_key=args.api_key,
                        server=name,
                        controller=label,
                    )
                else:
                    texts = (
                        shared_system_prompts(prompts, count, args.system_chars)
                        if args.workload == "shared-system"
                        else prompts
                    )
                    bodies = [
                        {
                            "model": names[number % len(names)],
                            "prompt": texts[number % len(texts)],
                            "max_tokens": args.max_tokens,
                            "temperature": 0,
                            **extra,
                        }
                        for number in range(count)
                    ]
                    level = measure(url, bodies, concurrency, api_key=args.api_key, server=name, controller=label)
                results.append(level)
                ttft = f"{level.ttft[0]:.3f}/{level.ttft[1]:.3f}"
                itl = f"{level.itl[0] * 1e3:.1f}/{level.itl[1] * 1e3:.1f}"
                turns = " turns " + "/".join(f"{t:.3f}" for t in level.ttft_by_turn) if level.ttft_by_turn else ""
                print(f"{name:<16} {label:<36} {concurrency:>3} {level.throughput:>9.1f} {ttft:>17} {itl:>17}{turns}")
                sys.stdout.flush()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps([level.as_dict() for level in results], indent=2) + "\n")
    return 0
