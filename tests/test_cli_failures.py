"""`decoctl` as a user runs it, in a fresh process: bad input, a broken model, a closed pipe and Ctrl-C each end in
one `decoctl: ...` line and an exit status, never a traceback."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from decoctl.model._tokenizer import Tokenizer

COMMAND = [sys.executable, "-m", "decoctl.cli"]


def decoctl(*args: str | bytes, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*COMMAND, *args], input=stdin, capture_output=True, timeout=300, check=False)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def refused(done: subprocess.CompletedProcess[str], message: str, status: int = 2) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("decoctl: error: "), done.stderr
    assert message in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.returncode == status


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["-c", "sample", "-o", "temperature=nan"], "option temperature='nan' is not a float: not a finite number"),
        (["-p", "top_p=nan"], "option top_p='nan' is not a float: not a finite number"),
        (["-p", "temperature=inf"], "option temperature='inf' is not a float: not a finite number"),
    ],
)
def test_nan_and_infinity_are_refused(genai_model: Path, flags: list[str], message: str) -> None:
    refused(decoctl("generate", "x", "-m", str(genai_model), *flags), message)


def test_a_boolean_for_a_float_option_in_a_run_file_is_refused(genai_model: Path, tmp_path: Path) -> None:
    run = tmp_path / "run.toml"
    run.write_text(
        f'[roles]\ntarget = "{genai_model}"\n[controller]\nname = "sample"\noptions = {{ temperature = true }}\n'
    )
    refused(
        decoctl("generate", "x", "--config", str(run)), "temperature=True is not a float: a boolean is not a number"
    )


def test_a_prompt_argument_that_is_not_utf8_is_refused(genai_model: Path) -> None:
    done = decoctl("generate", b"ab\xffcd", "-m", str(genai_model))
    refused(done, "the prompt is not valid UTF-8 text (byte 0xff at character 2)")


def test_a_prompt_on_standard_input_that_is_not_utf8_is_refused(genai_model: Path) -> None:
    done = decoctl("generate", "-", "-m", str(genai_model), stdin=b"ab\xffcd")
    refused(done, "the prompt on standard input is not valid UTF-8 text (byte 0xff at character 2)")


def test_a_closed_pipe_ends_the_command_quietly(genai_model: Path) -> None:
    reader, writer = os.pipe()
    os.close(reader)  # like `| head` that has read what it wanted: the first write fails with EPIPE
    try:
        done = subprocess.run(
            [*COMMAND, "generate", "x", "-m", str(genai_model), "-n", "8"],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (1, "")


def test_an_unwritable_enable_tree_destination_is_refused(genai_model: Path, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    done = decoctl("models", "enable-tree", str(genai_model), str(tmp_path / "a-file" / "tree"))
    refused(done, "enable-tree cannot write")
    assert "give a destination in a folder you can write" in done.stderr


def test_a_truncated_weights_file_is_named_without_onnxruntimes_dump(genai_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(genai_model, folder)
    model = onnx.load_model(str(folder / "model.onnx"))
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    data = folder / "model.onnx.data"
    os.truncate(data, data.stat().st_size // 2)
    done = decoctl("generate", "x", "-m", str(folder))
    refused(done, f"its weights file {data} is {data.stat().st_size} bytes but the graph reads up to byte")
    assert "truncated" in done.stderr


def test_more_threads_than_cores_is_a_warning(genai_model: Path) -> None:
    cores = os.cpu_count() or 1
    done = decoctl("generate", "x", "-m", str(genai_model), "-n", "2", "--threads", str(cores + 1), "--stats", "none")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(f"decoctl: warning: decoctl.threads_above_cores cores={cores}")
    assert f"threads={cores + 1}" in done.stderr


def test_no_threads_is_refused(genai_model: Path) -> None:
    refused(decoctl("generate", "x", "-m", str(genai_model), "--threads", "0"), "threads=0 is not a thread count")


#: a controller that commits two tokens, says so on stderr, and then waits for a signal
WAITING_CONTROLLER = """
import signal
import sys


class CommitThenWait:
    roles = ("target",)

    def __init__(self, options):
        self.steps = 0

    def start(self, host):
        pass

    def step(self, host):
        if self.steps:
            print("waiting", file=sys.stderr, flush=True)
            signal.pause()
        self.steps += 1
        host.commit({tokens})
"""


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
def test_ctrl_c_prints_the_text_so_far_and_exits_130(genai_model: Path, tmp_path: Path, stream: bool) -> None:
    tokenizer = Tokenizer.from_file(genai_model / "tokenizer.json", bos_token_id=None, add_bos=False)
    tokens = tokenizer.encode("def")
    controller = tmp_path / "waiting.py"
    controller.write_text(WAITING_CONTROLLER.format(tokens=tokens))
    command = [*COMMAND, "generate", "x", "-m", str(genai_model), "-c", f"{controller}:CommitThenWait", "-n", "50"]
    process = subprocess.Popen(
        [*command, *([] if stream else ["--no-stream"]), "--stats", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a background job's shell ignores SIGINT, and a child would inherit that: give the CLI the terminal's default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stderr is not None
    assert process.stderr.readline() == "waiting\n"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=300)
    assert (process.returncode, out, err) == (130, tokenizer.decode(tokens) + "\n", "decoctl: interrupted\n")


def test_a_bug_in_a_controller_is_one_line_and_its_traceback_is_shown_on_request(
    genai_model: Path, tmp_path: Path
) -> None:
    controller = tmp_path / "broken.py"
    controller.write_text(
        "class Broken:\n    roles = ('target',)\n\n    def __init__(self, options):\n        1 / 0\n\n"
        "    def step(self, host):\n        pass\n"
    )
    args = ["generate", "x", "-m", str(genai_model), "-c", f"{controller}:Broken"]
    done = decoctl(*args)
    refused(done, "unexpected ZeroDivisionError: division by zero (a bug in decoctl or a plugin", status=1)
    assert "Traceback" in decoctl("-vv", *args).stderr
