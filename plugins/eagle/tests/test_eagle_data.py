"""``decoctl eagle data``: the target's greedy continuations of diverse offline prompts, batched, in the JSONL that
``decoctl eagle train --data`` reads, resumable after an interruption; and the prompts it cuts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from decoctl_eagle.distilled import DATA, make_data
from decoctl_eagle.prompts import KINDS, cut_prompts, sources
from decoctl_eagle.training.data import documents

from decoctl import ConfigError, Generator
from decoctl.cli import main
from decoctl.testing import build_genai_model

PROMPTS = ["def add(a, b):", "The quick brown fox", "class Stack:\n    def push(self, item):", "import os\n"] * 3


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("target"), seed=31, num_layers=2)


@pytest.fixture
def prompt_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS), encoding="utf-8")
    return path


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / DATA).read_text(encoding="utf-8").splitlines()]


def test_the_data_is_the_targets_greedy_continuation_of_each_prompt_in_what_train_reads(
    target: Path, prompt_file: Path, tmp_path: Path
) -> None:
    summary = make_data(str(target), tmp_path / "data", new_tokens=12, batch=4, prompt_file=prompt_file)
    assert summary.finished and summary.done == len(PROMPTS)
    greedy = Generator({"target": target}, "greedy")
    got = sorted(records(tmp_path / "data"), key=lambda r: r["index"])
    assert [r["index"] for r in got] == list(range(len(PROMPTS)))
    for record, prompt in zip(got, PROMPTS, strict=True):
        assert record["prompt"] == prompt
        assert record["completion"] == greedy.generate(prompt, max_new_tokens=12).text
    texts = list(documents([summary.data]))
    assert sorted(texts) == sorted(r["prompt"] + r["completion"] for r in got)


def test_an_interrupted_run_goes_on_where_it_stopped_and_drops_a_line_cut_short(
    target: Path, prompt_file: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "data"
    seen = []

    def interrupt_after_three(tokens: int) -> None:
        seen.append(tokens)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        make_data(str(target), folder, new_tokens=12, batch=4, prompt_file=prompt_file, report=interrupt_after_three)
    assert len(records(folder)) == 3
    with (folder / DATA).open("a", encoding="utf-8") as data:
        data.write('{"index": 11, "kind": "given", "prompt": "import')  # a crash in the middle of a line
    summary = make_data(str(target), folder, new_tokens=12, batch=4, prompt_file=prompt_file)
    assert summary.done_before == 3 and summary.finished
    resumed = sorted(records(folder), key=lambda r: r["index"])
    make_data(str(target), tmp_path / "whole", new_tokens=12, batch=4, prompt_file=prompt_file)
    assert resumed == sorted(records(tmp_path / "whole"), key=lambda r: r["index"])


def test_going_on_with_other_settings_is_refused_naming_them(target: Path, prompt_file: Path, tmp_path: Path) -> None:
    make_data(str(target), tmp_path / "data", new_tokens=4, batch=4, prompt_file=prompt_file)
    with pytest.raises(ConfigError, match=r"new_tokens 8 \(the data has 4\)"):
        make_data(str(target), tmp_path / "data", new_tokens=8, batch=4, prompt_file=prompt_file)


def test_the_command_writes_the_data_and_names_the_training_command(
    target: Path, prompt_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "data"
    argv = ["eagle", "data", "--target", str(target), "--out", str(out), "--prompt-file", str(prompt_file)]
    assert main([*argv, "--new-tokens", "6", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"{len(PROMPTS)} of {len(PROMPTS)} prompts continued" in printed
    assert f"decoctl eagle train --target {target} --data {out / DATA}" in printed


@pytest.fixture
def offline(tmp_path: Path) -> dict[str, Path]:
    """A small standard library, a documentation folder and a manual page, as the machine's would be."""
    stdlib, doc, man = tmp_path / "lib", tmp_path / "doc" / "tool", tmp_path / "man" / "man1"
    for folder in (stdlib, doc, man):
        folder.mkdir(parents=True)
    import decoctl_eagle.prompts

    import decoctl.verify

    for module in (decoctl.verify, decoctl_eagle.prompts):
        source = Path(module.__file__ or "").read_text(encoding="utf-8")
        (stdlib / Path(module.__file__ or "").name).write_text(source, encoding="utf-8")
    words = " ".join(f"word{i}" for i in range(60))
    (doc / "README").write_text(
        f"Tool\n\n{words} and more words.\n\nline one\nline two\nline three\n", encoding="utf-8"
    )
    page = f".TH TOOL 1\n.SH NAME\ntool \\- does things\n.SH DESCRIPTION\n\\fBtool\\fR {words}\n.PP\n{words}\n"
    (man / "tool.1.gz").write_bytes(gzip.compress(page.encode()))
    return {"stdlib": tmp_path / "lib", "doc": tmp_path / "doc", "man": tmp_path / "man"}


def test_prompts_of_every_kind_are_cut_from_offline_text_the_same_for_a_seed(offline: dict[str, Path]) -> None:
    text = sources(offline)
    assert text.commands == [("tool", "tool - does things")]
    prompts = cut_prompts(80, seed=3, text=text)
    assert len(prompts) == 80
    assert {p.kind for p in prompts} == set(KINDS)
    assert all(20 <= len(p.text) <= 1600 for p in prompts)
    assert [p.text for p in cut_prompts(80, seed=3, text=text)] == [p.text for p in prompts]
    assert [p.text for p in cut_prompts(80, seed=4, text=text)] != [p.text for p in prompts]
    assert any("\\f" not in p.text and "word5" in p.text for p in prompts if p.source.endswith(".gz"))


def test_no_python_source_is_refused_naming_what_is_needed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="standard library"):
        sources({"stdlib": tmp_path, "doc": tmp_path, "man": tmp_path})
