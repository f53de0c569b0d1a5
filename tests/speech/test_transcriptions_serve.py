"""POST /v1/audio/transcriptions: a tiny random Whisper served on 127.0.0.1, asked with the official openai client,
answers what decoctl.generation.transcribe answers offline; the limits, formats and refusals name themselves."""

from __future__ import annotations

import io
import re
import signal
import socket
import subprocess
import sys
import threading
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from decoctl import Generator, load_model
from decoctl.generation import transcribe
from decoctl.plugins import PluginRegistry

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("multipart", reason="the transcriptions endpoint parses forms with python-multipart")
openai = pytest.importorskip("openai")

MODEL = "whisper-tiny"
API_KEY = "test-key"


def _audio(seed: int, seconds: float) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)


def _wav(audio: np.ndarray, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


@attrs.frozen
class Served:
    url: str
    folder: Path
    transcriber: Any

    def client(self) -> Any:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0)


def _registry() -> PluginRegistry:
    """The built-ins and the logits chain (its temperature processor samples at a request's temperature)."""
    registry = PluginRegistry(autoload=False)
    registry.register(pytest.importorskip("decoctl_logits_chain.plugin"), "logits-chain")
    return registry


def _serve(folder: Path, **limits: Any) -> tuple[Served, Any, threading.Thread]:
    import uvicorn

    from decoctl.serve._app import create_app
    from decoctl.serve._transcriber import Transcriber

    max_queue = limits.pop("max_queue", 8)
    transcriber = Transcriber(
        {"target": load_model(folder, name=MODEL, threads=1)},
        registry=_registry(),
        max_queue=max_queue,
        prefix_cache_mb=limits.pop("prefix_cache_mb", None),
    )
    app = create_app(transcriber, model_name=MODEL, api_key=API_KEY, **limits)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return Served(f"http://127.0.0.1:{sock.getsockname()[1]}", folder, transcriber), server, thread


@pytest.fixture(scope="module")
def served(whisper: Any) -> Iterator[Served]:
    live, server, thread = _serve(whisper.folder("whisper"), max_audio_bytes=2 << 20, max_audio_seconds=40.0)
    yield live
    server.should_exit = True
    thread.join()


def _offline(folder: Path, audio: np.ndarray, **options: Any) -> Any:
    generator = Generator({"target": str(folder)}, "greedy", threads=1)
    positions = generator.models["target"].spec.max_length
    return transcribe(generator, audio, max_new_tokens=positions, **options)


def test_the_openai_client_gets_offline_transcribe_s_text(served: Served, tmp_path: Path) -> None:
    audio = np.concatenate([_audio(1, 30), _audio(2, 4)])  # two windows
    path = tmp_path / "speech.wav"
    path.write_bytes(_wav(audio))
    with path.open("rb") as file:
        answer = served.client().audio.transcriptions.create(model=MODEL, file=file, language="en")
    expected = _offline(served.folder, path, language="en")
    assert len(expected.windows) == 2
    assert answer.text == expected.text
    assert len(set(answer.text)) > 3


def test_response_format_text_is_the_text_alone(served: Served) -> None:
    audio = _wav(_audio(3, 5))
    text = served.client().audio.transcriptions.create(
        model=MODEL, file=("a.wav", audio), language="en", response_format="text"
    )
    assert text == _offline(served.folder, audio, language="en").text


def test_verbose_json_says_the_language_and_duration(served: Served) -> None:
    audio = _wav(_audio(3, 5))
    answer = served.client().audio.transcriptions.create(
        model=MODEL, file=("a.wav", audio), language="en", response_format="verbose_json"
    )
    assert answer.text == _offline(served.folder, audio, language="en").text
    assert answer.language == "en"
    assert answer.duration == pytest.approx(5.0)
    assert answer.segments == []  # this model's vocabulary has no timestamp tokens


def test_without_a_language_the_model_detects_it(served: Served) -> None:
    t = np.arange(16000 * 3) / 16000
    tone = _wav((0.3 * np.sin(2 * np.pi * 3000 * t)).astype(np.float32))
    answer = served.client().audio.transcriptions.create(
        model=MODEL, file=("tone.wav", tone), response_format="verbose_json"
    )
    assert answer.language == "en"
    assert answer.text == _offline(served.folder, tone).text


def test_verbose_json_gives_the_segments_of_offline_transcribe(whisper: Any, tmp_path: Path) -> None:
    import json
    import shutil

    folder = tmp_path / "stamped"
    shutil.copytree(whisper.folder("whisper"), folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "no_timestamps_token_id": 300}))
    live, server, thread = _serve(folder)
    try:
        audio = _wav(np.concatenate([_audio(1, 30), _audio(2, 5)]))
        answer = live.client().audio.transcriptions.create(
            model=MODEL, file=("a.wav", audio), language="en", response_format="verbose_json"
        )
    finally:
        server.should_exit = True
        thread.join()
    expected = _offline(folder, audio, language="en", timestamps=True)
    assert expected.segments
    assert answer.text == expected.text
    got = [(s.start, s.end, s.text, list(s.tokens)) for s in answer.segments]
    assert got == [(s.start, s.end, s.text, list(s.tokens)) for s in expected.segments]
    assert [s.seek for s in answer.segments] == [round(s.seek * 100) for s in expected.segments]


def _refused(served: Served, status: int, **create: Any) -> str:
    with pytest.raises(openai.APIStatusError) as caught:
        served.client().audio.transcriptions.create(model=MODEL, **create)
    assert caught.value.status_code == status
    message = caught.value.body["message"]
    assert "Traceback" not in message
    return str(message)


def test_a_file_that_is_not_wav_is_refused_naming_the_format(served: Served) -> None:
    message = _refused(served, 400, file=("song.mp3", b"ID3\x04\x00 not a wave file at all" * 8), language="en")
    assert "song.mp3 is not a PCM WAV file" in message and "16000 Hz" in message


def test_a_wav_at_another_rate_is_refused_naming_the_rate(served: Served) -> None:
    message = _refused(served, 400, file=("a.wav", _wav(_audio(1, 1), rate=8000)), language="en")
    assert "8000 Hz" in message and "ffmpeg" in message


def test_audio_longer_than_the_limit_is_refused_naming_it(served: Served) -> None:
    message = _refused(served, 400, file=("long.wav", _wav(_audio(1, 41))), language="en")
    assert "over the server's limit of 40 s" in message and "--max-audio-seconds" in message


def test_an_upload_over_the_byte_limit_is_refused_naming_it(served: Served) -> None:
    message = _refused(served, 413, file=("big.wav", b"\x00" * (3 << 20)), language="en")
    assert "2 MiB" in message and "--max-audio-mb" in message


def test_a_prompt_and_other_formats_are_refused_by_name(served: Served) -> None:
    audio = ("a.wav", _wav(_audio(1, 1)))
    assert "startofprev" in _refused(served, 400, file=audio, language="en", prompt="previously")
    assert "'srt' is not implemented" in _refused(served, 400, file=audio, language="en", response_format="srt")
    assert "out of range" in _refused(served, 400, file=audio, language="en", temperature=1.5)
    assert "has no language 'de'" in _refused(served, 400, file=audio, language="de")


def test_an_unknown_form_field_is_refused_naming_it(served: Served) -> None:
    audio = ("a.wav", _wav(_audio(1, 1)))
    message = _refused(served, 400, file=audio, language="en", extra_body={"speed": "2"})
    assert "form field 'speed' is not implemented" in message


def test_chat_on_a_speech_model_names_the_transcriptions_endpoint(served: Served) -> None:
    with pytest.raises(openai.BadRequestError, match="/v1/audio/transcriptions"):
        served.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="/v1/audio/transcriptions"):
        served.client().completions.create(model=MODEL, prompt="hi")


def test_metrics_count_the_endpoint_and_the_audio(served: Served) -> None:
    import urllib.request

    served.client().audio.transcriptions.create(model=MODEL, file=("a.wav", _wav(_audio(4, 2))), language="en")
    with urllib.request.urlopen(f"{served.url}/metrics") as answer:
        text = answer.read().decode()
    assert re.search(r'decoctl_requests_total\{endpoint="/v1/audio/transcriptions",status="200"\} [1-9]', text)
    seconds = re.search(r"^decoctl_transcription_audio_seconds_total (\S+)$", text, re.M)
    assert seconds is not None and float(seconds.group(1)) >= 2.0
    assert "decoctl_transcription_seconds_count" in text


def test_a_full_queue_answers_429(whisper: Any) -> None:
    live, server, thread = _serve(whisper.folder("whisper"), max_queue=0)
    try:
        with pytest.raises(openai.RateLimitError, match="--max-queue 0"):
            live.client().audio.transcriptions.create(model=MODEL, file=("a.wav", _wav(_audio(1, 1))), language="en")
    finally:
        server.should_exit = True
        thread.join()


def test_decoctl_serve_starts_for_a_whisper_folder_and_transcribes(whisper: Any) -> None:
    folder = whisper.folder("whisper")
    command = [sys.executable, "-m", "decoctl.cli", "serve", "-m", str(folder), "--name", MODEL, "--port", "0"]
    command += ["--api-key", API_KEY, "--no-huge-pages", "--threads", "1"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        banner = process.stderr.readline()
        found = re.search(r"on http://127\.0\.0\.1:(\d+)", banner)
        assert found, banner
        assert "POST /v1/audio/transcriptions" in banner
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{found.group(1)}/v1", api_key=API_KEY, max_retries=0)
        audio = _wav(_audio(2, 3))
        answer = client.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en")
        assert answer.text == _offline(folder, audio, language="en").text
    finally:
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=60)
    assert process.returncode in (0, -signal.SIGTERM)
    assert "Traceback" not in rest


def test_a_speech_model_refuses_serve_flags_that_do_not_apply(whisper: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from decoctl.cli import main

    code = main(["serve", "-m", str(whisper.folder("whisper")), "--deterministic", "--port", "0"])
    assert code != 0
    err = capsys.readouterr().err
    assert "is a speech model" in err and "--deterministic do not apply to it" in err


def test_the_engine_names_the_transcriber_for_a_speech_model(whisper: Any) -> None:
    from decoctl import ConfigError
    from decoctl.serve._engine import Engine

    with pytest.raises(ConfigError, match="Transcriber"):
        Engine({"target": load_model(whisper.folder("whisper"), threads=1)}, registry=PluginRegistry(autoload=False))


def test_the_worker_with_a_prefix_cache_encodes_repeated_audio_once(whisper: Any) -> None:
    from decoctl.serve._transcriber import Transcriber, TranscriptionJob

    folder = whisper.folder("whisper")
    transcriber = Transcriber({"target": load_model(folder, threads=1)}, prefix_cache_mb=16)
    transcriber.start()
    try:
        audio = _audio(5, 4)
        texts = [transcriber.submit(TranscriptionJob(samples=audio, language="en")).result().text for _ in range(2)]
    finally:
        transcriber.close()
    assert texts == [_offline(folder, audio, language="en").text] * 2
    assert transcriber._greedy._sequences["target"]._runner.encoder_runs == 1
    assert transcriber.prefix_cache is not None and transcriber.prefix_cache.stats().source_hits == 1


def test_a_temperature_samples_as_offline_sampling_at_it(served: Served) -> None:
    audio = _wav(_audio(6, 3))
    answer = served.client().audio.transcriptions.create(
        model=MODEL, file=("a.wav", audio), language="en", temperature=0.7
    )
    sampler = Generator(
        {"target": str(served.folder)},
        "sample",
        processors="temperature=0.7",
        registry=_registry(),
        threads=1,
    )
    positions = sampler.models["target"].spec.max_length
    expected = transcribe(sampler, audio, language="en", max_new_tokens=positions, seed=0)
    assert answer.text == expected.text
    assert answer.text != _offline(served.folder, audio, language="en").text  # sampled, not greedy
