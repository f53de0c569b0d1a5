"""Logging: as a library decoctl prints nothing unless the application configures logging; the CLI shows its events
on stderr (-v, -vv); tests capture them with structlog.testing.capture_logs()."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from decoctl.cli import main
from decoctl.logs import LOGGER, get_logger, logger_name
from decoctl.model import load_model

LIBRARY_CALL = """
import sys
import decoctl
print(decoctl.generate("x", model=sys.argv[1], max_new_tokens=4, threads=int(sys.argv[2])).text)
"""


def test_the_library_writes_only_what_the_program_prints(genai_model: Path) -> None:
    threads = (os.cpu_count() or 1) + 1  # a warning too stays silent
    command = [sys.executable, "-c", LIBRARY_CALL, str(genai_model), str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert len(done.stdout.splitlines()) == 1  # the text, and nothing else


def test_an_application_that_configures_logging_sees_the_events(
    genai_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    load_model(genai_model, threads=1)
    loaded = [r for r in caplog.records if r.getMessage().startswith("decoctl.model_loaded ")]
    assert len(loaded) == 1
    assert loaded[0].name == "decoctl.model._loader"
    assert loaded[0].levelno == logging.DEBUG
    assert "layout=genai" in loaded[0].getMessage()
    assert "threads=1" in loaded[0].getMessage()


def test_events_below_the_loggers_level_are_dropped(genai_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    load_model(genai_model, threads=1)
    assert not [r for r in caplog.records if r.name.startswith(LOGGER) and r.levelno < logging.INFO]


def test_capture_logs_sees_every_event(genai_model: Path) -> None:
    with capture_logs() as logs:
        load_model(genai_model, threads=1)
    loaded = [e for e in logs if e["event"] == "decoctl.model_loaded"]
    assert loaded and loaded[0]["log_level"] == "debug" and loaded[0]["threads"] == 1


def test_a_plugins_events_go_under_the_decoctl_logger(caplog: pytest.LogCaptureFixture) -> None:
    assert logger_name("decoctl.generate") == "decoctl.generate"
    assert logger_name("decoctl_eagle.controller") == "decoctl.decoctl_eagle.controller"
    caplog.set_level(logging.WARNING, logger=LOGGER)
    get_logger("decoctl_someplugin.module").warning("decoctl.something", value="two words")
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("decoctl.decoctl_someplugin.module", "decoctl.something value='two words'")
    ]


def test_the_cli_shows_debug_events_with_vv_and_restores_logging(
    genai_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logger = logging.getLogger(LOGGER)
    handlers, level = list(logger.handlers), logger.level
    assert main(["-vv", "generate", "x", "-m", str(genai_model), "-n", "2", "--threads", "1"]) == 0
    assert "decoctl: debug: decoctl.model_loaded " in capsys.readouterr().err
    assert (logger.handlers, logger.level) == (handlers, level)


def test_the_cli_shows_no_debug_events_by_default(genai_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "x", "-m", str(genai_model), "-n", "2", "--threads", "1"]) == 0
    assert "decoctl: debug:" not in capsys.readouterr().err
