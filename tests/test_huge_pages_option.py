"""Huge pages and the heap placement of weights act on the whole process: the library leaves them off unless a
load option asks, and the command line (generate, bench) turns them on, with --no-huge-pages to keep them off."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from decoctl.bench._runs import child_command
from decoctl.cli import build_parser, main
from decoctl.generation import Generator
from decoctl.model import _huge_pages as huge_pages
from decoctl.model import load_model
from decoctl.plugins import PluginRegistry


class Calls:
    """The two process-wide calls, replaced by mocks."""

    def __init__(self, placement: mock.MagicMock, collapse: mock.MagicMock) -> None:
        self.placement = placement
        self.collapse = collapse

    @property
    def made(self) -> bool:
        return self.placement.called or self.collapse.called


@pytest.fixture
def calls() -> Iterator[Calls]:
    with (
        mock.patch.object(huge_pages, "contiguous_allocations") as placement,
        mock.patch.object(huge_pages, "collapse") as collapse,
    ):
        yield Calls(placement, collapse)


def test_a_library_load_leaves_malloc_and_madvise_alone(genai_model: Path, calls: Calls) -> None:
    load_model(genai_model, threads=1)
    assert not calls.made


def test_the_load_option_places_the_weights_on_huge_pages(genai_model: Path, calls: Calls) -> None:
    load_model(genai_model, threads=1, huge_pages=True)
    calls.placement.assert_called_once_with()
    calls.collapse.assert_called_once_with()


def test_a_generator_leaves_them_alone_unless_asked(genai_model: Path, registry: PluginRegistry, calls: Calls) -> None:
    Generator({"target": genai_model}, threads=1, registry=registry)
    assert not calls.made
    Generator({"target": genai_model}, threads=1, registry=registry, huge_pages=True)
    assert calls.placement.called and calls.collapse.called


def test_generate_on_the_command_line_turns_them_on(genai_model: Path, calls: Calls) -> None:
    assert main(["generate", "x", "-m", str(genai_model), "-n", "2", "--threads", "1", "--stats", "none"]) == 0
    assert calls.placement.called and calls.collapse.called


def test_generate_with_no_huge_pages_leaves_them_alone(genai_model: Path, calls: Calls) -> None:
    args = ["generate", "x", "-m", str(genai_model), "-n", "2", "--threads", "1", "--stats", "none"]
    assert main([*args, "--no-huge-pages"]) == 0
    assert not calls.made


@pytest.mark.parametrize("flag", [[], ["--no-huge-pages"]], ids=["default", "no-huge-pages"])
def test_bench_turns_them_on_unless_told_not_to(
    genai_model: Path, tmp_path: Path, calls: Calls, flag: list[str]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    args = ["bench", "-m", str(genai_model), "--contenders", "greedy", "--prompts", str(prompts), "-n", "2"]
    assert main([*args, "--repeats", "1", "--threads", "1", "--calibration-pairs", "1", *flag]) == 0
    assert calls.made == (not flag)


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_the_help_says_what_the_default_does_and_how_to_turn_it_off(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--no-huge-pages" in text
    assert "2 MiB pages" in text and "madvise" in text and "load_model(huge_pages=True)" in text


def test_bench_runs_pass_no_huge_pages_to_each_run(tmp_path: Path) -> None:
    args: argparse.Namespace = build_parser().parse_args(["bench", "--runs", "3", "--no-huge-pages"])
    assert "--no-huge-pages" in child_command(args, "greedy", tmp_path / "run.json")
    args = build_parser().parse_args(["bench", "--runs", "3"])
    assert "--no-huge-pages" not in child_command(args, "greedy", tmp_path / "run.json")
