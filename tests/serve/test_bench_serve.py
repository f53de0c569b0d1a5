"""decoctl bench-serve: a bounded load on a live server, each level's throughput and latencies reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decoctl.cli import main

from .conftest import API_KEY, Live


def test_bench_serve_reports_every_controller_and_level(
    live: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "import os"}\n', encoding="utf-8")
    out = tmp_path / "levels.json"
    arguments = ["bench-serve", "--url", f"tiny={live.url}", "--api-key", API_KEY, "--prompts", str(prompts)]
    arguments += ["--concurrency", "1,2", "--requests", "4", "--max-tokens", "6", "--json", str(out)]
    arguments += ["--controllers", "greedy,speculative:drafter=prompt-lookup"]
    assert main(arguments) == 0
    levels = json.loads(out.read_text(encoding="utf-8"))
    assert [(level["controller"], level["concurrency"]) for level in levels] == [
        ("greedy", 1),
        ("greedy", 2),
        ("speculative:drafter=prompt-lookup", 1),
        ("speculative:drafter=prompt-lookup", 2),
    ]
    for level in levels:
        assert level["server"] == "tiny" and level["requests"] == 4 and 0 < level["tokens"] <= 24
        assert level["ttft"]["p50"] <= level["ttft"]["p99"] and level["itl"]["p50"] <= level["itl"]["p99"]
        assert level["throughput"] > 0
    assert "speculative:drafter=prompt-lookup" in capsys.readouterr().out


def test_bench_serve_names_a_server_it_cannot_reach(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "x"}\n', encoding="utf-8")
    assert main(["bench-serve", "--url", "http://127.0.0.1:9", "--prompts", str(prompts)]) == 2
    assert "http://127.0.0.1:9" in capsys.readouterr().err
