"""Plugin subcommands (hook decoctl_commands): `decoctl eagle` is found, listed with its distribution, and a
command name two plugins give is an error naming both."""

from __future__ import annotations

import argparse
import re

import pytest
from decoctl_eagle import plugin

import decoctl.cli as cli_module
from decoctl import CommandSpec, DecoctlError, PluginError, hookimpl
from decoctl.cli import build_parser, main
from decoctl.plugins import PluginRegistry


def _command(name: str, run: object = None) -> CommandSpec:
    return CommandSpec(
        name=name,
        summary=f"the rival {name}",
        add_arguments=lambda parser: parser.add_argument("--flag", action="store_true"),
        run=run or (lambda args: 0),
    )


class Rival:
    def __init__(self, name: str, run: object = None) -> None:
        self.spec = _command(name, run)

    @hookimpl
    def decoctl_commands(self) -> list[CommandSpec]:
        return [self.spec]


def _registry(*rivals: Rival) -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    registry.register(plugin, "eagle")
    for index, rival in enumerate(rivals):
        registry.register(rival, f"rival{index}")
    return registry


def test_decoctl_help_lists_the_eagle_command_with_its_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])  # the installed plugins, through their entry points
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help to the terminal's width
    assert re.search(r" eagle EAGLE draft heads: [^[]* \[decoctl-eagle\]", text), text


def test_the_eagle_command_has_train_import_and_info() -> None:
    registry = _registry()
    parser = build_parser(registry.commands(), registry)
    args = parser.parse_args(["eagle", "info", "head", "--target", "model"])
    assert (args.eagle_command, args.head, args.target) == ("info", "head", "model")
    args = parser.parse_args(["eagle", "import", "src", "--target", "model", "--out", "dst"])
    assert (args.eagle_command, args.source, args.out) == ("import", "src", "dst")
    args = parser.parse_args(["eagle", "train", "--target", "model", "--data", "a.txt"])  # the trainer's own options
    assert args.train_arguments == ["--target", "model", "--data", "a.txt"]


def test_a_command_name_two_plugins_give_is_an_error_naming_both() -> None:
    registry = _registry(Rival("eagle"))
    with pytest.raises(PluginError, match=r"command name: 'eagle' from eagle and rival0"):
        registry.commands()


def test_a_plugin_command_may_not_take_a_builtin_name() -> None:
    registry = _registry(Rival("generate"))
    with pytest.raises(PluginError, match=r"plugin 'rival0' provides the command 'generate'.*plugin 'decoctl'"):
        build_parser(registry.commands(), registry)


def test_a_command_conflict_ends_as_one_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_module, "PluginRegistry", lambda: _registry(Rival("eagle")))
    assert main(["plugins"]) == 2
    assert capsys.readouterr().err.startswith("decoctl: error: two plugins provide the same command name: 'eagle'")


def test_an_error_in_a_plugin_command_gets_the_usual_treatment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(args: argparse.Namespace) -> int:
        raise DecoctlError(f"refused with flag={args.flag}")

    monkeypatch.setattr(cli_module, "PluginRegistry", lambda: _registry(Rival("refuse", refuse)))
    assert main(["refuse", "--flag"]) == 2
    err = capsys.readouterr().err
    assert err == "decoctl: error: refused with flag=True\n"


def test_a_missing_trainer_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("decoctl_eagle.commands.TRAINER", "decoctl_eagle.no_such_trainer")
    assert main(["eagle", "train", "--help"]) == 2
    assert "decoctl eagle train is not in this version" in capsys.readouterr().err


def test_plugins_lists_the_commands(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_module, "PluginRegistry", _registry)
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "commands:" in out and "  eagle " in out
