"""The transcription worker: one thread that owns a speech model's Generator and transcribes queued audio in turn.

transcriber = Transcriber({"target": load_model(whisper_folder)}, max_queue=64)
transcriber.start()
future = transcriber.submit(TranscriptionJob(samples=samples, language="en"))   # concurrent.futures.Future
text = future.result().text
transcriber.close()                                                              # drains, then stops

The serving engine (decoctl.serve._engine) steps decoder-only rows; a speech model (an encoder-decoder Whisper)
runs its windows here instead, one request at a time, with the engine's admission rules: at most ``max_queue``
requests wait (one more is QueueFullError: HTTP 429), none is taken while it shuts down (EngineClosedError: 503), a
request whose client left before its turn is skipped. A transcription that started runs to its end (its windows are
short: 30 s of audio each, at most the decoder's positions of tokens).

It answers the questions the server's service endpoints ask an engine (``running``, ``failure``, ``draining``,
``queued``, ``live_rows``, ``max_rows``, ...), so /health, /metrics and the drain on SIGTERM work as they do for
an engine.
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from decoctl.errors import ConfigError
from decoctl.generation import Generator
from decoctl.generation._speech import Transcription, transcribe
from decoctl.logs import get_logger
from decoctl.model._loader import LoadedModel
from decoctl.plugins import PluginRegistry
from decoctl.serve._requests import EngineClosedError
from decoctl.serve._worker import Worker

__all__ = ["Transcriber", "TranscriptionJob", "is_speech_model", "transcriber_from_args"]

log = get_logger(__name__)

#: temperatures whose sampling Generators are kept (each holds its own KV buffers over the same loaded models)
KEPT_SAMPLERS = 4


def is_speech_model(model: LoadedModel) -> bool:
    """Whether ``model`` takes audio (an encoder-decoder model whose encoder reads log-mel features)."""
    return model.encoder is not None and model.encoder.audio is not None


@attrs.frozen(kw_only=True)
class TranscriptionJob:
    """One request: ``samples`` (float32[samples] at the model's rate, any length: it goes window by window),
    ``language`` (None: detected, or the model's only one), ``temperature`` (0: greedy; more: sampled at it, seeded
    with ``seed``), ``timestamps`` (segments with their times, where the model writes timestamp tokens)."""

    samples: np.ndarray = attrs.field(eq=False)
    language: str | None = None
    temperature: float = 0.0
    seed: int = 0
    timestamps: bool = False


@attrs.define(eq=False)
class _Queued:
    job: TranscriptionJob
    future: concurrent.futures.Future[Transcription]


class Transcriber(Worker):
    """A thread that owns a speech model's Generator and runs queued transcriptions one at a time (see the module
    docstring).

    :param models: role -> LoadedModel; "target" a speech model (Whisper).
    :param registry: where the sample controller and temperature processor are found (default: entry points).
    :param max_queue: requests that may wait; one more is refused with QueueFullError.
    :param prefix_cache_mb: keep the encoder's output for audio heard before, within this many MiB (None: off).
    """

    thread_name = "decoctl-transcriber"
    stopped = "the transcription worker failed"
    failed_event = "transcriber_failed"

    def __init__(
        self,
        models: Mapping[str, LoadedModel],
        *,
        registry: PluginRegistry | None = None,
        max_queue: int = 64,
        prefix_cache_mb: float | None = None,
    ) -> None:
        if "target" not in models:
            raise ConfigError("the transcriber needs a 'target' model")
        target = models["target"]
        if not is_speech_model(target):
            raise ConfigError(f"model {target.name} does not take audio: transcriptions need a speech model (Whisper)")
        if max_queue < 0:
            raise ConfigError(f"max_queue={max_queue} must be at least 0")
        super().__init__(max_queue)
        self.models = dict(models)
        self.registry = registry or PluginRegistry()
        self.max_rows = 1
        self._prefix_cache_mb = prefix_cache_mb
        self._greedy = Generator(self.models, "greedy", registry=self.registry, prefix_cache_mb=prefix_cache_mb)
        self._samplers: collections.OrderedDict[float, Generator] = collections.OrderedDict()
        #: a window's new tokens at most: the decoder's positions (the prompt's tokens come off them)
        self.max_length = target.spec.max_length
        self.prefix_cache = self._greedy.prefix_cache
        self._queue: collections.deque[_Queued] = collections.deque()
        self._busy = False
        #: counters for /metrics and /health (read from any thread)
        self.completions = 0
        self.cancelled = 0
        self.audio_seconds = 0.0
        self.steps = 0
        self.joined = 0
        self.resumed = 0
        self.preempted = 0

    # -- the caller's side (any thread) ----------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def live_rows(self) -> int:
        return int(self._busy)

    @property
    def sampling_rate(self) -> int:
        encoder = self.models["target"].encoder
        assert encoder is not None and encoder.audio is not None
        return encoder.audio.sampling_rate

    def submit(self, job: TranscriptionJob) -> concurrent.futures.Future[Transcription]:
        """Queue ``job``; its future gives the Transcription (or the exception that ended it). Cancel the future to
        drop a job that has not started. QueueFullError when ``max_queue`` wait already, EngineClosedError while
        shutting down."""
        future: concurrent.futures.Future[Transcription] = concurrent.futures.Future()
        with self._wake:
            self._refuse_unless_open(
                len(self._queue),
                full=f"{len(self._queue)} transcriptions are waiting (--max-queue {self.max_queue}): retry later",
            )
            self._queue.append(_Queued(job, future))
            self._wake.notify()
        return future

    def _cancel_all(self) -> None:
        """``close(drain=False)``: the transcriptions still waiting fail (the running one ends first)."""
        self._deadline = time.monotonic()

    # -- the worker thread -----------------------------------------------------------------------------------------
    def _fail_everything(self, reason: str) -> None:
        self._fail_waiting(EngineClosedError(reason))

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closing:
                    self._wake.wait()
                late = self._deadline is not None and time.monotonic() >= self._deadline
                if not self._queue or late:
                    break
                queued = self._queue.popleft()
                self._busy = queued.future.set_running_or_notify_cancel()
            if not self._busy:  # its client left while it waited
                self.cancelled += 1
                continue
            try:
                queued.future.set_result(self._transcribe(queued.job))
            except Exception as exc:  # the request fails alone; the worker goes on
                log.warning("decoctl.serve.transcription_failed", error=f"{type(exc).__name__}: {exc}")
                queued.future.set_exception(exc)
            finally:
                self._busy = False
                self.completions += 1
        self._fail_waiting(EngineClosedError("the server shut down before this transcription's turn: send it again"))

    def _transcribe(self, job: TranscriptionJob) -> Transcription:
        generator = self._greedy if job.temperature == 0 else self._sampler(job.temperature)
        result = transcribe(
            generator,
            job.samples,
            language=job.language,
            max_new_tokens=self.max_length,
            seed=job.seed,
            timestamps=job.timestamps,
        )
        self.audio_seconds += job.samples.size / self.sampling_rate
        self.steps += len(result.windows)
        return result

    def _sampler(self, temperature: float) -> Generator:
        """The sampling Generator at ``temperature`` over the same loaded models (the last few kept)."""
        sampler = self._samplers.pop(temperature, None)
        if sampler is None:
            sampler = Generator(
                self.models,
                "sample",
                processors=f"temperature={temperature}",
                registry=self.registry,
                prefix_cache_mb=self._prefix_cache_mb,
            )
        self._samplers[temperature] = sampler
        while len(self._samplers) > KEPT_SAMPLERS:
            self._samplers.popitem(last=False)
        return sampler

    def _fail_waiting(self, exc: Exception) -> None:
        with self._wake:
            waiting, self._queue = list(self._queue), collections.deque()
        for queued in waiting:
            if queued.future.set_running_or_notify_cancel():
                queued.future.set_exception(exc)


def transcriber_from_args(args: Any, models: Mapping[str, LoadedModel], registry: PluginRegistry) -> Transcriber:
    """``decoctl serve``'s worker for a speech model; ConfigError naming the flags that do not apply to it."""
    given = [
        flag
        for flag, value in (
            ("--deterministic", args.deterministic),
            ("--prefill-chunk", args.prefill_chunk),
            ("--draft/--role", len(models) > 1),
            ("--tool-parser", args.tool_parser),
            ("--chat-template", args.chat_template),
        )
        if value
    ]
    if given:
        raise ConfigError(
            f"model {models['target'].name} is a speech model, served one transcription at a time with greedy "
            f"decoding (or sampling at a request's temperature): {', '.join(given)} do not apply to it; leave them out"
        )
    return Transcriber(models, registry=registry, max_queue=args.max_queue, prefix_cache_mb=args.prefix_cache_mb)
