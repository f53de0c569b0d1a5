"""decoctl bench-serve's prefix workloads: one shared system prompt with short questions, and four-turn chats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decoctl.cli import main
from decoctl.serve._bench_workloads import SYSTEM_CHARS, TURNS, chat_questions, shared_system_prompts

from .conftest import API_KEY, Live

PROMPTS = ["def f(x):\n    return x\n", "import os\nimport sys\n", "class A:\n    pass\n"]


def test_shared_system_prompts_share_one_long_prefix_and_differ_after_it() -> None:
    prompts = shared_system_prompts(PROMPTS, 6)
    shared = next(i for i in range(len(prompts[0])) if len({p[i] for p in prompts}) > 1)
    assert shared >= SYSTEM_CHARS and len(set(prompts)) == 3  # the questions cycle through the file
    assert all(len(p) - shared < 80 for p in prompts)


def test_chat_conversations_hold_four_questions_each() -> None:
    conversations = chat_questions(PROMPTS, 2)
    assert [len(c) for c in conversations] == [TURNS, TURNS]
    assert conversations[0][0] == "Complete this line: def f(x):"


def _bench(live: Live, tmp_path: Path, workload: str) -> list[dict[str, object]]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS), encoding="utf-8")
    out = tmp_path / "levels.json"
    arguments = ["bench-serve", "--url", f"tiny={live.url}", "--api-key", API_KEY, "--prompts", str(prompts)]
    arguments += ["--concurrency", "1,2", "--requests", "2", "--max-tokens", "4", "--json", str(out)]
    arguments += ["--workload", workload, "--system-chars", "300"]  # the tiny tokenizer's tokens are short
    assert main(arguments) == 0
    levels = json.loads(out.read_text(encoding="utf-8"))
    assert isinstance(levels, list)
    return levels


def test_the_shared_system_workload_reports_each_level(live: Live, tmp_path: Path) -> None:
    levels = _bench(live, tmp_path, "shared-system")
    assert [level["concurrency"] for level in levels] == [1, 2]
    for level in levels:
        assert level["requests"] == 2 and 0 < level["tokens"] <= 8 and level["ttft_by_turn"] == []


def test_the_chat_workload_reports_every_turns_time_to_first_token(
    live: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    levels = _bench(live, tmp_path, "chat")
    for level in levels:
        turns = level["ttft_by_turn"]
        assert isinstance(turns, list) and len(turns) == TURNS and all(t > 0 for t in turns)
        assert level["requests"] == 2 * TURNS  # two conversations of four turns
    assert " turns " in capsys.readouterr().out
