"""A bounded load: 64 requests from 16 concurrent clients, mixed controllers (greedy, seeded sampling, prompt lookup,
lookahead, chats), each answer equal to its offline twin."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from decoctl import Generator

from .conftest import MODEL, Live

PROMPTS = [
    "def fibonacci(n):",
    "class Stack:\n    def push(self, item):",
    "import os\nimport sys\n",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n",
    "café = 'naïve'",
    "def read_lines(path):\n    with open(path) as f:",
    "x = [1, 2, 3]\ny = [",
    "# 日本語のコメント\n",
]
CHAT = [{"role": "user", "content": "def mean(values):"}]


def request(number: int) -> dict[str, Any]:
    """Request ``number`` of the load: greedy, seeded sampling, prompt lookup, a chat or lookahead, by turns."""
    prompt = PROMPTS[number % len(PROMPTS)]
    max_tokens = 8 + number % 13
    kind = ("greedy", "sample", "lookup", "chat", "lookahead")[number % 5]
    if kind == "greedy":
        return {"kind": kind, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if kind == "sample":
        return {"kind": kind, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.9, "seed": number}
    if kind == "lookup":
        extension = {"controller": "speculative", "options": {"drafter": "prompt-lookup"}}
        return {"kind": kind, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "decoctl": extension}
    if kind == "lookahead":
        extension = {"controller": "lookahead"}
        return {"kind": kind, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "decoctl": extension}
    return {"kind": kind, "messages": CHAT, "max_tokens": max_tokens, "temperature": 0}


def served(client: Any, number: int) -> str:
    spec = request(number)
    kind = spec.pop("kind")
    extension = spec.pop("decoctl", None)
    extra = {"extra_body": {"decoctl": extension}} if extension else {}
    if kind == "chat":
        answer = client.chat.completions.create(model=MODEL, **spec, **extra)
        return str(answer.choices[0].message.content)
    answer = client.completions.create(model=MODEL, **spec, **extra)
    return str(answer.choices[0].text)


def twin(live: Live, number: int, generators: dict[str, Generator]) -> str:
    spec = request(number)
    greedy = generators.setdefault("greedy", Generator({"target": str(live.folder)}, "greedy", registry=live.registry))
    if spec["kind"] == "sample":
        sample = generators.setdefault(
            "sample",
            Generator(
                {"target": greedy.models["target"]},
                "sample",
                processors=[{"name": "temperature", "temperature": 0.9}],
                registry=live.registry,
            ),
        )
        return sample.generate(spec["prompt"], max_new_tokens=spec["max_tokens"], seed=spec["seed"]).text
    if spec["kind"] == "chat":
        return greedy.chat(CHAT, max_new_tokens=spec["max_tokens"]).text
    return greedy.generate(spec["prompt"], max_new_tokens=spec["max_tokens"]).text


def test_64_requests_from_16_clients_each_equal_their_offline_twin(client: Any, live: Live) -> None:
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda number: served(client, number), range(64)))
    generators: dict[str, Generator] = {}
    expected = [twin(live, number, generators) for number in range(64)]
    assert [number for number in range(64) if answers[number] != expected[number]] == []
    engine: Any = live.engine
    assert engine.live_rows == 0 and engine.queued == 0  # every row came back


def resident_bytes() -> int:
    """This process's resident memory (the server runs in it)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_500_requests_leave_no_row_and_memory_flat(client: Any, live: Live) -> None:
    def one(number: int) -> int:
        spec = request(number)
        spec.pop("kind")
        extension = spec.pop("decoctl", None)
        if "messages" in spec:
            spec["prompt"] = "def mean(values):"
            spec.pop("messages")
        spec["max_tokens"] = 4
        extra = {"extra_body": {"decoctl": extension}} if extension else {}
        return int(client.completions.create(model=MODEL, **spec, **extra).usage.completion_tokens)

    with ThreadPoolExecutor(8) as pool:
        assert all(1 <= n <= 4 for n in pool.map(one, range(100)))  # warm: buffers, plans, allocator arenas
        warm = resident_bytes()
        assert all(1 <= n <= 4 for n in pool.map(one, range(100, 500)))
    grown = resident_bytes() - warm
    engine: Any = live.engine
    assert engine.live_rows == 0 and engine.queued == 0
    assert grown < 16 << 20, f"resident memory grew by {grown >> 20} MiB over 400 requests"
