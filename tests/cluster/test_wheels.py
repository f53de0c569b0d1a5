"""What Ray's workers run decoctl from (test_batch and test_serve check that each actor and replica imports the
package Ray's runtime environment unpacked from the wheels): a wheels folder whose wheel is missing, broken or of
another version is refused before anything starts, naming it; a node that cannot set up the environment fails the
command with the reason, in one line."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from decoctl.errors import ConfigError
from decoctl.ray import generate_dataset, prompt_dataset

from .conftest import MODEL, run_cli

WHERE = Path(__file__).with_name("where.py")


def _decoctl_wheel(folder: Path) -> Path:
    return next(folder.glob("decoctl-*.whl"))


def _rewritten(source: Path, target: Path, change: Any) -> None:
    """``source`` as a wheel at ``target``, each member's bytes passed through ``change(name, data)`` and its RECORD
    written again to match (so that only what ``change`` did is wrong with it)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as new:
        rows = []
        record = next(n for n in old.namelist() if n.endswith(".dist-info/RECORD"))
        for info in old.infolist():
            if info.filename == record:
                continue
            data = change(info.filename, old.read(info))
            new.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{info.filename},sha256={digest},{len(data)}")
        new.writestr(record, "\n".join([*rows, f"{record},,"]) + "\n")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("decoctl-0.0.1-py3-none-any.whl", "has decoctl 0.0.1 only, and the decoctl installed here is"),
        ("missing", "has no wheel of decoctl, and the decoctl installed here is"),
    ],
)
def test_a_folder_without_a_wheel_of_the_installed_version_is_refused_naming_both(
    ray_cluster: Any, wheels: Path, tmp_path: Path, name: str, message: str
) -> None:
    folder = tmp_path / "wheels"
    folder.mkdir()
    shutil.copy(next(wheels.glob("decoctl_models-*.whl")), folder)
    if name != "missing":
        shutil.copy(_decoctl_wheel(wheels), folder / name)
    with pytest.raises(ConfigError) as refused:
        generate_dataset(prompt_dataset(["x"]), {"target": MODEL}, wheels=folder)
    assert message in str(refused.value)
    assert "--ray-wheels DIR" in str(refused.value)


def test_a_broken_wheel_fails_the_command_before_any_actor_starts_naming_it(
    ray_cluster: Any, wheels: Path, prompts_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "wheels"
    shutil.copytree(wheels, folder)
    broken = _decoctl_wheel(folder)
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])
    status, out, err = run_cli(
        capsys,
        "generate",
        "-m",
        MODEL,
        "--prompts",
        str(prompts_file),
        "--ray-actors",
        "1",
        "--ray-wheels",
        str(folder),
    )
    assert status == 2
    assert out == ""
    assert err.strip() == (
        f"decoctl: error: the wheel {broken} cannot be installed on Ray's workers: it is not a zip file (File is not "
        "a zip file); build it again"
    )


def test_a_wheel_changed_after_its_build_is_refused(ray_cluster: Any, wheels: Path, tmp_path: Path) -> None:
    folder = tmp_path / "wheels"
    shutil.copytree(wheels, folder)
    wheel = _decoctl_wheel(folder)
    with zipfile.ZipFile(wheels / wheel.name) as source, zipfile.ZipFile(wheel, "w") as changed:
        for info in source.infolist():
            data = source.read(info)
            changed.writestr(info, data + b"\n" if info.filename == "decoctl/errors.py" else data)
    with pytest.raises(ConfigError, match=r"decoctl/errors\.py does not match its RECORD"):
        generate_dataset(prompt_dataset(["x"]), {"target": MODEL}, wheels=folder)


def test_a_node_that_cannot_install_what_the_wheels_require_fails_the_command_with_the_reason(
    ray_cluster: Any, wheels: Path, prompts_file: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "wheels"
    folder.mkdir()
    shutil.copy(next(wheels.glob("decoctl_models-*.whl")), folder)

    def needing_more(name: str, data: bytes) -> bytes:
        if name.endswith(".dist-info/METADATA"):
            return data.replace(b"Requires-Dist: ", b"Requires-Dist: decoctl-no-such-dependency>=1\nRequires-Dist: ", 1)
        return data

    _rewritten(_decoctl_wheel(wheels), folder / _decoctl_wheel(wheels).name, needing_more)
    address = ray_cluster.get_runtime_context().gcs_address
    ray_args = ["--ray-actors", "1", "--ray-wheels", str(folder), "--ray-address", address]
    done = subprocess.run(
        [sys.executable, "-m", "decoctl.cli", "generate", "-m", MODEL, "--prompts", str(prompts_file), *ray_args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = [line for line in done.stderr.splitlines() if line.startswith("decoctl: error:")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("decoctl: error: a Ray worker could not set up decoctl's runtime environment: ")
    assert "decoctl-no-such-dependency" in lines[0]
    assert "Traceback" not in done.stderr


def test_ray_wheels_without_actors_or_replicas_is_refused(
    prompts_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run_cli(capsys, "generate", "-m", MODEL, "--prompts", str(prompts_file), "--ray-wheels", "dist")
    assert status == 2
    assert "--ray-wheels needs --ray-actors N" in err
    status, _, err = run_cli(capsys, "serve", "-m", MODEL, "--ray-wheels", "dist")
    assert status == 2
    assert "--ray-wheels needs --ray-replicas N" in err


def test_the_reason_a_node_gives_is_taken_from_the_message_serve_keeps_for_a_failed_deployment() -> None:
    from decoctl.ray._runtime_env import setup_error

    message = (  # as Ray Serve 2.60 keeps it
        "The deployment failed to start 3 times in a row. This may be due to a problem with its constructor or initial "
        "health check failing. See controller logs for details. Error:\nException when allocating "
        "Replica(id='x9nyvr7i', deployment='decoctl', app='decoctl'): Failed to set up runtime environment.\n"
        "Could not create the actor "
        "because its associated runtime env failed to be created.\n[Node 192.0.2.2] Traceback (most recent call last):"
        '\n  File "/ray/_private/runtime_env/pip.py", line 394, in create\n    pip_dir_bytes = await task\n'
        "ray._private.runtime_env.utils.SubprocessCalledProcessError: Run cmd[3] failed with the following details.\n"
        "Last 50 lines of stdout:\n    Requirement already satisfied: attrs>=23.2 in /tmp/ray/session/virtualenv\n"
        "    ERROR: Could not find a version that satisfies the requirement onnxruntime>=1.20 (from versions: none)\n"
        "    ERROR: No matching distribution found for onnxruntime>=1.20\n"
    )
    error = setup_error(RuntimeError(message))
    assert error is not None
    assert str(error).startswith(
        "a Ray worker could not set up decoctl's runtime environment: ERROR: No matching distribution found for "
        "onnxruntime>=1.20 (the whole log: "
    )
    assert setup_error(RuntimeError("the deployment failed: its constructor raised")) is None
