"""decoctl.testing needs the onnx package, which only the decoctl[testing] extra installs: without it, importing
any part of decoctl.testing says so, and the rest of decoctl does not need it."""

from __future__ import annotations

import subprocess
import sys

WITHOUT_ONNX = "import sys; sys.modules['onnx'] = None\n"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_ONNX + code], capture_output=True, text=True, check=False)


def test_importing_decoctl_testing_without_onnx_names_the_extra() -> None:
    done = _run("import decoctl.testing._models")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: decoctl.testing builds its models with the onnx package")
    assert "pip install 'decoctl[testing]'" in last


def test_decoctl_itself_runs_without_onnx() -> None:
    done = _run("import decoctl, decoctl.generation, decoctl.cli, decoctl.abi; decoctl.Generator; print('ok')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
