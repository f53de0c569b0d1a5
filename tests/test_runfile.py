"""Run files are validated strictly: nothing in them is parsed and then silently ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl import ConfigError
from decoctl._runfile import RunFile
from decoctl.cli import main


def write(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_complete_run_file_is_read(tmp_path: Path) -> None:
    run = RunFile.load(
        write(
            tmp_path,
            """
[roles]
target = "some/model"
[controller]
name = "sample"
options = { temperature = 0.7 }
[generation]
max_new_tokens = 9
seed = 3
stop = ["\\n\\n"]
[runtime]
threads = 1
prefill_chunk = 64
""",
        )
    )
    assert run.roles == {"target": "some/model"}
    assert (run.controller, run.options, run.max_new_tokens, run.seed) == ("sample", {"temperature": 0.7}, 9, 3)
    assert (run.stop, run.threads, run.prefill_chunk) == (("\n\n",), 1, 64)


def test_an_unknown_block_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"block\(s\) \['speculative'\] are not consumed"):
        RunFile.load(write(tmp_path, "[speculative]\nk = 4\n"))


def test_an_unknown_key_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[generation\] has no key 'max_tokens'"):
        RunFile.load(write(tmp_path, "[generation]\nmax_tokens = 4\n"))


def test_a_wrongly_typed_value_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="wrong type"):
        RunFile.load(write(tmp_path, '[generation]\nseed = "zero"\n'))


def test_json_run_files_are_read_too(tmp_path: Path) -> None:
    run = RunFile.load(write(tmp_path, '{"controller": {"name": "greedy"}}', "run.json"))
    assert run.controller == "greedy"


def test_a_role_the_controller_does_not_use_fails_the_command(
    tmp_path: Path, genai_model: Path, genai_draft: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, f'[roles]\ntarget = "{genai_model}"\ndraft = "{genai_draft}"\n[generation]\nprompt = "x"\n')
    assert main(["generate", "--config", str(path)]) == 2
    assert "were given but controller 'greedy' uses only ['target']" in capsys.readouterr().err


def test_controller_options_in_a_run_file_are_checked(
    tmp_path: Path, genai_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, f'[roles]\ntarget = "{genai_model}"\n[controller]\nname = "greedy"\noptions = {{ k = 4 }}\n')
    assert main(["generate", "x", "--config", str(path)]) == 2
    assert "controller 'greedy' has no option 'k'" in capsys.readouterr().err


def test_a_run_file_that_is_not_utf8_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_bytes(b'[generation]\nprompt = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(invalid continuation byte at byte 26\): save it as"):
        RunFile.load(path)
