"""What decoctl refuses about Ray before anything loads: Ray not installed (the extra named), options out of place,
an address nobody answers at, more actors than the cluster has CPUs, a mistake in the controller. One line each, no
traceback. Importing decoctl.ray never imports Ray."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import MODEL, run_cli


def test_importing_decoctl_ray_imports_neither_ray_nor_a_model() -> None:
    code = (
        "import sys, decoctl, decoctl.ray, decoctl.ray._batch, decoctl.ray._command, decoctl.ray._cluster; "
        "import decoctl.ray._serve; "
        "decoctl.ray.generate_dataset; "
        "print(sorted(m for m in ('ray', 'pyarrow', 'onnxruntime') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() in ("[]", "['onnxruntime']")  # decoctl.generate loads onnxruntime, never Ray
    assert "ray" not in done.stdout
    assert done.stderr == ""


def test_without_ray_the_command_names_the_extra(
    prompts_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails, as where it is not installed
    status, out, err = run_cli(capsys, "generate", "-m", MODEL, "--prompts", str(prompts_file), "--ray-actors", "2")
    assert status == 2
    assert err.strip() == (
        "decoctl: error: decoctl generate --ray-actors needs Ray (ray is missing): pip install 'decoctl[ray]'"
    )
    assert out == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["def f():", "--ray-actors", "2"], "--ray-actors needs --prompts FILE.jsonl"),
        (["--prompts", "{file}", "--ray-address", "auto"], "--ray-address needs --ray-actors N"),
        (["--prompts", "{file}", "--ray-actors", "0"], "--ray-actors 0 must be at least 1"),
    ],
)
def test_ray_options_out_of_place_are_refused(
    args: list[str], message: str, prompts_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = [a.replace("{file}", str(prompts_file)) for a in args]
    status, _, err = run_cli(capsys, "generate", "-m", MODEL, *given)
    assert status == 2
    assert message in err
    assert "Traceback" not in err


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_address_nobody_answers_at_is_refused_naming_it(
    ray_cluster: Any, prompts_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    status, _, err = run_cli(
        capsys, "generate", "-m", MODEL, "--prompts", str(prompts_file), "--ray-actors", "1", "--ray-address", address
    )
    assert status == 2
    assert f"decoctl: error: cannot reach the Ray cluster at {address} (Connection refused)" in err
    assert "ray start --head" in err


def test_more_actors_than_the_cluster_has_cpus_are_refused(
    ray_cluster: Any, prompts_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run_cli(capsys, "generate", "-m", MODEL, "--prompts", str(prompts_file), "--ray-actors", "3")
    assert status == 2
    assert "decoctl: error: 3 Ray actors of 1 thread need 3 CPUs, and the Ray cluster has 2" in err
    status, _, err = run_cli(
        capsys, "generate", "-m", MODEL, "--prompts", str(prompts_file), "--ray-actors", "2", "--threads", "2"
    )
    assert status == 2
    assert "2 Ray actors of 2 threads need 4 CPUs" in err


def test_an_unknown_controller_is_refused_before_any_actor_starts(
    ray_cluster: Any, prompts_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run_cli(
        capsys, "generate", "-m", MODEL, "--prompts", str(prompts_file), "--ray-actors", "1", "-c", "nosuch"
    )
    assert status == 2
    assert "decoctl: error: unknown controller 'nosuch'" in err


def test_a_model_no_replica_can_load_fails_the_serve_command_with_the_loading_error(
    ray_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-model-here"
    status, _, err = run_cli(capsys, "serve", "-m", str(missing), "--ray-replicas", "1", "--port", str(_closed_port()))
    assert status == 2
    assert f"decoctl: error: model folder {missing} does not exist" in err
    assert "Traceback" not in err
