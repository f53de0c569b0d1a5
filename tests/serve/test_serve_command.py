"""decoctl serve as a user runs it: a process on 127.0.0.1 that answers the openai client and drains on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from .conftest import MODEL, openai


def test_decoctl_serve_binds_localhost_answers_and_stops_on_sigterm(tiny_model: Path) -> None:
    command = [sys.executable, "-m", "decoctl.cli", "serve", "-m", str(tiny_model), "--name", MODEL]
    command += ["--port", "0", "--max-rows", "2", "--api-key", "secret", "--no-huge-pages"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        banner = process.stderr.readline()  # printed once the socket is bound
        found = re.search(r"on http://(127\.0\.0\.1):(\d+)", banner)
        assert found, banner
        assert "2 rows" in banner and "with a chat template" in banner
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{found.group(2)}/v1", api_key="secret", max_retries=0)
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0
        )
        assert answer.usage.completion_tokens == 5
    finally:
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=60)
    # uvicorn shuts down gracefully (the engine drained) and then re-raises the signal it caught, as a process
    # ended by SIGTERM reports it to its parent
    assert process.returncode in (0, -signal.SIGTERM)
    assert "Traceback" not in rest
