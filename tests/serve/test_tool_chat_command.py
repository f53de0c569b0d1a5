"""decoctl chat --tools: the tools rendered into the prompt, each call shown, its result typed in, and the model
answering again with it."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from decoctl.cli import main

from .tool_families import FAMILIES, TOOLS, model_folder

jsonschema = pytest.importorskip("jsonschema")
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_folder(tmp_path_factory.mktemp("chat-qwen"), FAMILIES["qwen2.5"])


def test_chat_shows_each_call_takes_its_result_and_answers_again(
    qwen_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS), encoding="utf-8")
    monkeypatch.setattr("sys.stdin", io.StringIO('What is the weather in Oslo?\n{"temperature": 3}\n'))
    argv = ["chat", "-m", str(qwen_model), "-n", "96", "--no-huge-pages", "--tools", str(tools)]
    assert main([*argv, "--tool-choice", "required", "--no-parallel-tool-calls"]) == 0
    calls = re.findall(r"^\[tool call (\w+)\((.*)\)\]$", capsys.readouterr().out, re.MULTILINE)
    # required: the first answer calls, its result is typed in, the answer to it calls again (and input ends)
    assert len(calls) == 2
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_chat_with_a_tools_file_that_is_not_a_list_says_what_to_give(
    qwen_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text('{"name": "f"}', encoding="utf-8")
    assert main(["chat", "-m", str(qwen_model), "--no-huge-pages", "--tools", str(tools)]) == 2
    assert f"--tools {tools}: give a JSON list of tools" in capsys.readouterr().err


def test_chat_with_a_tool_choice_naming_no_tool_is_refused(
    qwen_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS), encoding="utf-8")
    argv = ["chat", "-m", str(qwen_model), "--no-huge-pages", "--tools", str(tools), "--tool-choice", "send_mail"]
    assert main(argv) == 2
    assert "--tool-choice 'send_mail' names no function" in capsys.readouterr().err
