"""One generation: prompt in, committed tokens out, stop conditions, streaming, statistics.

gen = Generator(models={"target": "pycode"}, controller="greedy")
result = gen.generate("def fibonacci(n):", max_new_tokens=64)
for piece in gen.stream("import os"):
    ...
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any, cast

import attrs
import numpy as np

from decoctl.controllers import Controller, RowController, start_controller
from decoctl.errors import (
    ConfigError,
    ControllerError,
    DecoctlError,
    GenerationError,
    GeneratorInUseError,
)
from decoctl.generation._batch import BatchPrompt, BatchSlot, one_at_a_time, run_batch
from decoctl.generation._chat_template import ChatPrompt, ChatTemplate, encode_prompt
from decoctl.generation._opening import check_choice, check_models, make_controller, open_host
from decoctl.generation._prefix_cache import PrefixCache, prefill_cached
from decoctl.generation._results import GenerationResult, GenerationStats
from decoctl.generation._speech import speech_request, suppress_rules
from decoctl.generation._tool_answers import marked_text, parse_answer
from decoctl.generation._tool_formats import template_messages, tool_format_for
from decoctl.host import ForwardSizes, Host, Output, Rows, Sequence, role_flag
from decoctl.importers._registry import role_defaults
from decoctl.logs import get_logger
from decoctl.model._adapters import Adapter, read_adapter, with_adapters
from decoctl.model._loader import LoadedModel, load_model
from decoctl.model._providers import Provider, ProviderChoice, providers_by_role
from decoctl.model._vision import ImageFeatures, no_images
from decoctl.plugins import (
    PluginRegistry,
    Processors,
    resolve_controller,
    resolve_model,
)
from decoctl.processing import ProcessorChain, processor_name
from decoctl.specs import ControllerSpec, normalise_name

__all__ = ["Generator", "generate", "stream"]

log = get_logger(__name__)

MIN_KV_LENGTH = 256

BUSY = (
    "Generator is already running a generation in another thread: use one Generator per thread (they can share "
    "models: Generator({'target': other.models['target']}))"
)
SUPERSEDED = (
    "this stream's generation was ended by a newer generation on the same Generator, which took its models over: "
    "finish (or close) a stream before starting another generation on its Generator, or give each stream its own "
    "Generator (they can share models: Generator({'target': other.models['target']}))"
)
#: what next() on a generation's steps gives once it has ended
_ENDED = object()


@attrs.frozen(eq=False)
class _Request:
    """One prompt, checked and encoded: what a generation, a stream and each prompt of a batch start from."""

    #: the prompt as given (a string, or a ChatPrompt with its own ids), for the start hook
    prompt: Any
    #: the decoder's prompt: the prompt's tokens, or an encoder-decoder target's start token
    ids: np.ndarray
    max_new_tokens: int
    stop: tuple[str, ...]
    seed: int | None
    #: an encoder-decoder target's source (the prompt's tokens), which every role's encoder reads; None otherwise
    source: np.ndarray | None = None
    #: a vision-language target's image features, in the order of the prompt's image tokens; None without images
    images: ImageFeatures | None = None
    #: the table of the target's stacked LoRA slots the prompt runs (0: the base model; decoctl.model._adapters)
    adapter: int = 0


class _Run:
    """The mutable state of one generation while it runs: its request, host, output and controller, and the
    counters its stats start from."""

    def __init__(self, request: _Request, host: Host, output: Output, controller: Controller, started: float) -> None:
        self.request = request
        self.host = host
        self.output = output
        self.controller = controller
        self.started = started
        self.prefill_seconds = 0.0
        self.decode_started = started
        self.counters_at_decode: dict[str, tuple[int, int, float]] = {}
        self.sizes_at_decode: dict[str, ForwardSizes] = {}
        #: its result is made (finished, failed, closed or superseded): nothing may end it again
        self.ended = False


class Generator:
    """Loads models once and runs generations with one controller and one processor chain.

    One generation at a time: a Generator holds one KV cache per role, which its generations reuse. A generation
    started from another thread while one runs raises GeneratorInUseError at once (use one Generator per thread;
    Generators can share models, ``Generator({"target": other.models["target"]})``: each keeps its own KV caches,
    and onnxruntime runs a shared session from several threads at once). A stream is a generation that runs while
    it is read: starting another generation before a stream is exhausted ends that stream's generation, and the
    stream raises GeneratorInUseError on its next item, never another generation's text.

    ``last`` is the GenerationResult of the latest generation that ended, also one that did not finish: after a
    KeyboardInterrupt it holds the text and tokens committed so far (``stats.stop_reason == "interrupted"``).

    How the work divides: the set-up (``_load_roles``, ``_check_roles``) runs once; every generation, stream and
    batched prompt is a ``_Request`` (``_request``: checked and encoded), opened on its sequences by ``_open`` (stop
    rules, output, host, controller) and started by ``_start`` (prefill, the controller's start); ``_steps`` runs it,
    ``_finish`` ends it, and ``_fail`` ends whatever an exception stopped.

    :param models: role -> registered model name, folder path, or a LoadedModel another Generator opened (its
        session is shared; this Generator keeps its own KV caches). ``{"target": ...}`` at least; a missing
        target takes the default model.
    :param controller: a registered name, ``file.py:Class``, ``module:Class``, ``lib.so:name``, a controller class
        (built for each generation with its checked ``options``, as a named one is) or a ready controller object
        (used as it is for every generation; it takes no options). Anything but a name or a library needs only a
        ``step(host)`` method (decoctl.Controller).
    :param options: the controller's options (checked against its schema).
    :param processors: a chain string ``"top_k=40,temperature=0.8"``, or a list mixing chain strings, registered
        processors with options (``{"name": "top_k", "top_k": 40}`` or ``("top_k", {"top_k": 40})``) and processor
        objects (decoctl.LogitsProcessor; transformers' through ``decoctl.from_transformers``).
    :param threads: intra-op threads for every model (default: onnxruntime-genai's cores/2).
    :param prefill_chunk: feed the prompt in chunks of this many tokens (None: one pass).
    :param prefix_cache_mb: keep the target's prompts and answers in a prefix cache of this many MiB
        (decoctl.generation._prefix_cache): a prompt that starts with a kept one (a shared system prompt, the next
        turn of a chat) copies its KV instead of prefilling it; outputs are the same with it on and off. None: off.
        ConfigError where the budget holds no block or the model's cache cannot be copied.
    :param huge_pages: load the models with ``load_model(huge_pages=True)``: their weights on 2 MiB pages, through
        process-wide malloc and madvise settings (off by default; the command line turns it on).
    :param registry: the plugin registry (default: entry points autoloaded).
    :param providers: the execution provider of every role (``"openvino"``, ``"openvino:device_type=CPU"``), a
        mapping role -> provider, or a list of ``[ROLE=]PROVIDER`` (decoctl.model._providers; default CPU). A model
        given already loaded keeps its own.
    :param adapters: LoRA adapters of the target, name -> an ``.onnx_adapter`` file or a read Adapter
        (decoctl.model._adapters), each checked against the target's LoRA slots now; a generation picks one with
        ``adapter=NAME`` (none: the base model).
    """

    def __init__(
        self,
        models: Mapping[str, str | Path | LoadedModel | None] | None = None,
        controller: str | type | object = "greedy",
        *,
        options: Mapping[str, Any] | None = None,
        processors: Processors = None,
        threads: int | None = None,
        prefill_chunk: int | None = None,
        registry: PluginRegistry | None = None,
        debug: bool | None = None,
        huge_pages: bool = False,
        providers: ProviderChoice = None,
        adapters: Mapping[str, str | Path | Adapter] | None = None,
        prefix_cache_mb: float | None = None,
    ) -> None:
        self.registry = registry or PluginRegistry()
        self.spec: ControllerSpec = resolve_controller(controller, self.registry, options=options)
        choice = check_choice(self.spec, options, processors, self.registry)
        self.options = choice.options
        self.chain: ProcessorChain = choice.chain
        self.processors_text = _shown_processors(processors, self.chain)
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ConfigError(f"prefill_chunk={prefill_chunk} must be at least 1 token (or None for one pass)")
        self.prefill_chunk = prefill_chunk
        self.debug = debug
        self.roles = self.spec.active_roles(self.options)
        self.models = self._load_roles(
            dict(models or {}), threads, huge_pages, providers_by_role(providers, self.roles), stacked=bool(adapters)
        )
        rules = suppress_rules(self.models["target"])
        if rules is not None:  # a speech model's token rules first, as transformers' Whisper generate has them
            self.chain = ProcessorChain((rules, *self.chain.processors), names=(rules.name, *self.chain.names))
        #: the target's prompts and answers kept for the prompts that continue them (None: off)
        self.prefix_cache = (
            None if prefix_cache_mb is None else PrefixCache.for_model(self.models["target"], prefix_cache_mb)
        )
        self._sequences: dict[str, Sequence] = {}
        self._rows: dict[str, Rows] = {}
        #: the target's rows for batched prompts (decoctl.generation), kept for the next batch of the same size
        self._batch_rows: Rows | None = None
        #: held while a generation runs: a whole generate(), a stream's start and each of its steps
        self._lock = threading.Lock()
        #: the generation whose state the KV caches hold (an unfinished stream's between its items), or None
        self._active: _Run | None = None
        #: the target's LoRA adapters (decoctl.model._adapters), in its stacked slots' tables 1.. in this order
        self.adapters = self._load_adapters(dict(adapters or {}))

    # -- set-up -----------------------------------------------------------------------------------------
    def _load_roles(
        self,
        given: dict[str, str | Path | LoadedModel | None],
        threads: int | None,
        huge_pages: bool,
        providers: Mapping[str, Provider],
        *,
        stacked: bool = False,
    ) -> dict[str, LoadedModel]:
        given.setdefault("target", None)
        unused = sorted(set(given) - set(self.roles))
        if unused:
            raise ConfigError(
                f"role(s) {unused} were given but controller {self.spec.name!r} uses only {list(self.roles)} with "
                "these options: remove them or pick a controller (or options) that uses them"
            )
        # a bundled target (the default, or one named) brings its own models for the other roles, and so does a
        # target the user registered models for (`decoctl eagle import` registers a head for its target)
        target = given["target"]
        named = resolve_model(None, self.registry)[0] if target is None else target
        bundle = self.registry.models().get(normalise_name(named)) if isinstance(named, str) else None
        defaults = dict(bundle.roles) if bundle else {}
        if any(role not in given for role in self.roles):  # a user's defaults override the bundle's
            folder = named.spec.path if isinstance(named, LoadedModel) else resolve_model(named, self.registry)[1]
            defaults |= role_defaults(folder)
        missing = [r for r in self.roles if r not in given and r not in defaults]
        if missing:
            raise ConfigError(
                f"controller {self.spec.name!r} needs the role(s) {missing}: pass a model for each "
                f"(e.g. {role_flag(missing[0])})"
            )
        loaded: dict[str, LoadedModel] = {}
        for role in self.roles:
            reference = given[role] if role in given else defaults[role]
            lora = stacked and role == "target"  # the target takes adapters: its LoRA slots stacked (row by row)
            if isinstance(reference, LoadedModel) and (not lora or reference.adapters is not None):
                loaded[role] = reference  # already open: share its session (each Generator keeps its KV)
                continue
            if isinstance(reference, LoadedModel):  # open as exported: opened again with its slots stacked
                log.info("decoctl.adapters_reload", model=reference.name, reason="LoRA slots stacked")
                loaded[role] = load_model(
                    reference.spec.path,
                    name=reference.name,
                    threads=reference.threads,
                    provider=reference.provider,
                    lora_stacks=True,
                )
                continue
            name, path = resolve_model(reference, self.registry)
            loaded[role] = load_model(
                path, name=name, threads=threads, huge_pages=huge_pages, provider=providers[role], lora_stacks=lora
            )
        self._check_roles(loaded)
        return loaded

    def _load_adapters(self, given: dict[str, str | Path | Adapter]) -> dict[str, Adapter]:
        """The adapters read and checked against the target's LoRA slots (ModelLoadError naming what does not fit)."""
        if not given:
            return {}
        adapters = {
            name: source if isinstance(source, Adapter) else read_adapter(source, name=name)
            for name, source in given.items()
        }
        self.models["target"] = with_adapters(self.models["target"], adapters)
        return adapters

    def _adapter_index(self, name: str | None) -> int:
        """The target's LoRA table for adapter ``name`` (0: None, the base model); ConfigError naming those loaded."""
        tables = self.models["target"].adapters
        if name is None:
            return 0
        if tables is None or not self.adapters:
            raise ConfigError(
                f"adapter {name!r} is not loaded (loaded: none): load it with Generator(adapters={{{name!r}: path}}) "
                "or --adapter NAME=FILE.onnx_adapter"
            )
        return tables.index(name)

    def _check_roles(self, loaded: Mapping[str, LoadedModel]) -> None:
        check_models(self.spec, self.options, loaded)

    def _decoder_prompt(self, source: np.ndarray) -> np.ndarray:
        """An encoder-decoder target's decoder prompt (its start token), once ``source`` fits every role's encoder."""
        for role, model in self.models.items():
            if model.encoder is not None and len(source) > model.encoder.parts.source_length:
                limit = model.encoder.parts.source_length
                raise ConfigError(
                    f"the prompt has {len(source)} tokens but the encoder of role {role!r} (model {model.name}) takes "
                    f"at most {limit} (config.json's max_position_embeddings, or the tokenizer's model_max_length): "
                    "shorten the prompt, or split the text and generate for each part"
                )
        encoder = self.models["target"].encoder
        assert encoder is not None  # only called for an encoder-decoder target
        return np.array([encoder.parts.decoder_start_token_id], np.int64)

    def _sequence(self, role: str, length: int) -> Sequence:
        """The role's row 0 (its Sequence), with room for ``length`` positions; its other rows released."""
        sequence = self._sequences.get(role)
        rows = self._rows.get(role)
        model = self.models[role]
        if sequence is None or rows is None or sequence.max_length < min(length, model.spec.max_length):
            capacity = max(MIN_KV_LENGTH, 1 << (length - 1).bit_length())
            rows = Rows(
                role,
                model,
                capacity=self.spec.rows(self.options),
                max_length=min(capacity, model.spec.max_length),
                debug=self.debug,
            )
            sequence = rows[0]
            self._rows[role] = rows
            self._sequences[role] = sequence
        else:
            for row in rows.ids[1:]:
                rows.release(row)
            sequence.rewind(0)
            sequence.stats = type(sequence.stats)()
        return sequence

    @property
    def tokenizer(self) -> Any:
        return self.models["target"].tokenizer

    def chat_prompt(
        self, messages: Seq[Mapping[str, Any]], *, template: ChatTemplate | str | Path | None = None, **variables: Any
    ) -> ChatPrompt:
        """``messages`` rendered by the target's chat template (or ``template``: a ChatTemplate or a template file)
        and tokenized as transformers' apply_chat_template does (decoctl.generation): a prompt for generate()
        and stream()."""
        chosen = template if isinstance(template, ChatTemplate) else None
        if chosen is None:
            chosen = ChatTemplate.from_folder(self.models["target"].spec.path, template=template)
        return chosen.prompt(messages, **variables)

    def chat(
        self,
        messages: Seq[Mapping[str, Any]],
        *,
        template: ChatTemplate | str | Path | None = None,
        max_new_tokens: int = 128,
        stop: tuple[str, ...] | list[str] = (),
        seed: int | None = 0,
        tools: Seq[Mapping[str, Any]] | None = None,
        tool_parser: str | None = None,
    ) -> GenerationResult:
        """The assistant's answer to ``messages`` (dicts with "role" and "content"): generate() on chat_prompt().

        ``tools``: functions as OpenAI's ``tools`` lists them (``{"type": "function", "function": {"name": ...,
        "parameters": {...}}}``), rendered by the template (``tools=``, as apply_chat_template takes them); the
        answer is then read for calls in the template family's format (``tool_parser`` names it: hermes,
        llama3_json, mistral, granite) into ``result.tool_calls``, and ``result.tool_call_error`` says why output
        that started a call did not parse. Assistant messages may carry OpenAI's ``tool_calls`` (arguments as JSON
        text) and tool messages their ``tool_call_id``. The calls are not constrained here: for calls that always
        parse, give the Generator the grammar processor with ``tool_grammar(...)`` (decoctl.generation)."""
        if tools is None:
            return self.generate(
                self.chat_prompt(messages, template=template), max_new_tokens=max_new_tokens, stop=stop, seed=seed
            )
        chosen = template if isinstance(template, ChatTemplate) else None
        if chosen is None:
            chosen = ChatTemplate.from_folder(self.models["target"].spec.path, template=template)
        fmt = tool_format_for(chosen.source, tool_parser, origin=f"the chat template from {chosen.origin}")
        prompt = chosen.prompt(template_messages(messages), tools=list(tools))
        result = self.generate(prompt, max_new_tokens=max_new_tokens, stop=stop, seed=seed)
        names = {str(tool["function"]["name"]) for tool in tools}
        text = marked_text(self.models["target"].tokenizer, result.tokens, fmt, result.text)
        answer = parse_answer(fmt, text, names=names)
        return attrs.evolve(result, tool_calls=answer.calls, tool_call_error=answer.error)

    # -- running ----------------------------------------------------------------------------------------
    def stream(
        self,
        prompt: str,
        *,
        max_new_tokens: int = 128,
        stop: tuple[str, ...] | list[str] = (),
        seed: int | None = 0,
        adapter: str | None = None,
        images: Seq[Any] = (),
        audio: Any = None,
        language: str | None = None,
        task: str | None = None,
        timestamps: bool = False,
    ) -> Iterator[str]:
        """Yield text pieces as they are committed. ``self.last`` holds the GenerationResult afterwards.
        ``images`` (paths, bytes or PIL images): a vision-language target's images, one per image token of the
        prompt, in order. ``audio`` (a PCM WAV path or its bytes, or float32 samples at the model's rate, up to one
        30 s window; the prompt empty): a speech model's input, ``language`` and ``task`` its prompt tokens
        (a multilingual model given no language detects it), ``timestamps`` whether it writes timestamp tokens
        (longer audio, and the timestamps read into segments: decoctl.generation.transcribe).

        The generation starts at the first item and runs while the stream is read. On a GenerationError the stream
        first yields what it has not yet given of the error's ``text`` (the pieces always join to it), then raises.
        A newer generation on this Generator before the stream's end takes the models over: this stream then raises
        GeneratorInUseError on its next item. Closing the stream early (or letting go of it) ends its generation
        (``stop_reason`` "closed").
        """
        pieces: list[str] = []
        chosen = self._adapter_index(adapter)
        self._acquire()
        try:
            request = self._request(
                prompt, max_new_tokens, stop, seed, images, (audio, language, task, timestamps), chosen
            )
            run = self._begin(request, lambda _tokens, text: pieces.append(text))
        finally:
            self._lock.release()
        steps = self._steps(run)
        given = 0  # characters of the text yielded so far
        try:
            while True:
                self._acquire()
                try:
                    if self._active is not run:
                        raise GeneratorInUseError(SUPERSEDED)
                    ended = next(steps, _ENDED) is _ENDED
                finally:
                    self._lock.release()
                if pieces:
                    piece = "".join(pieces)
                    pieces.clear()
                    given += len(piece)
                    yield piece
                if ended:
                    return
        except GenerationError as exc:
            if exc.text[given:]:  # what the failing step committed, and text held back for a stop string
                yield exc.text[given:]
            raise
        except GeneratorExit:
            self._close(run)
            raise

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int = 128,
        stop: tuple[str, ...] | list[str] = (),
        seed: int | None = 0,
        adapter: str | None = None,
        images: Seq[Any] = (),
        audio: Any = None,
        language: str | None = None,
        task: str | None = None,
        timestamps: bool = False,
    ) -> GenerationResult:
        """Run one generation to its end and return its text, tokens and stats. Nothing streams, so the text is
        decoded once at the end (unless stop strings or commit observers need it as it grows). ``images``,
        ``audio``, ``language``, ``task`` and ``timestamps``: as :meth:`stream`'s.

        An error inside raises GenerationError, which keeps the text so far; a KeyboardInterrupt propagates as it
        is, after the end hook, with the text so far in ``self.last``."""
        chosen = self._adapter_index(adapter)
        self._acquire()
        try:
            request = self._request(
                prompt, max_new_tokens, stop, seed, images, (audio, language, task, timestamps), chosen
            )
            for _ in self._steps(self._begin(request, None)):
                pass
        finally:
            self._lock.release()
        return self.last

    # -- batched prompts (decoctl.generation) --------------------------------------------------------------------
    def generate_batch(
        self,
        prompts: Seq[str | Mapping[str, Any] | BatchPrompt],
        *,
        batch_size: int = 8,
        max_new_tokens: int = 128,
        stop: tuple[str, ...] | list[str] = (),
        seed: int | None = 0,
    ) -> list[GenerationResult]:
        """Generate every prompt, up to ``batch_size`` of them at once on the rows of one KV buffer; the results in
        prompt order. See stream_batch."""
        results = dict(
            self.stream_batch(prompts, batch_size=batch_size, max_new_tokens=max_new_tokens, stop=stop, seed=seed)
        )
        return [results[index] for index in range(len(results))]

    def stream_batch(
        self,
        prompts: Seq[str | Mapping[str, Any] | BatchPrompt],
        *,
        batch_size: int = 8,
        max_new_tokens: int = 128,
        stop: tuple[str, ...] | list[str] = (),
        seed: int | None = 0,
    ) -> Iterator[tuple[int, GenerationResult]]:
        """Yield (prompt index, GenerationResult) as each prompt finishes (continuous batching; decoctl.generation).

        A prompt is a string, or a mapping / BatchPrompt with its own ``max_new_tokens`` and ``seed`` (else these
        arguments') and ``stop`` strings (added to these). Each prompt's output is the one it gets alone: greedy
        token for token, sampling the same tokens for the same seed (every prompt draws from its own seeded rng, so
        with one ``seed`` for all each prompt samples as ``generate(prompt, seed=seed)`` does). Controllers that
        cannot step rows for several prompts (ControllerSpec.batched) run the prompts one at a time; either way
        ``stats.trace["batched"]`` says how the prompt ran. The Generator is busy until the iterator ends or is
        closed. An error inside raises GenerationError with the text so far of the first prompt that was running.
        """
        items = [BatchPrompt.of(p, f"prompt {index}") for index, p in enumerate(prompts)]
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise ConfigError(f"batch_size={batch_size!r} must be a whole number, at least 1")
        shared_stop = (stop,) if isinstance(stop, str) else tuple(stop)
        requests = []
        for index, item in enumerate(items):
            limit = max_new_tokens if item.max_new_tokens is None else item.max_new_tokens
            own_seed = seed if item.seed is None else item.seed
            try:
                chosen = self._adapter_index(item.adapter)
                requests.append(self._request(item.prompt, limit, shared_stop + item.stop, own_seed, adapter=chosen))
            except ConfigError as exc:
                raise ConfigError(f"prompt {index}: {exc}") from None
        if not requests:
            return
        self._acquire()
        try:
            if self._active is not None:
                self._unfinished(self._active, "superseded", None)
            reason = one_at_a_time(self.spec, self.options, self.roles, self.chain)
            if reason is None:
                yield from self._batched(requests, min(int(batch_size), len(requests)))
                return
            for index, request in enumerate(requests):
                for _ in self._steps(self._begin(request, None)):
                    pass
                stats = attrs.evolve(self.last.stats, trace={**self.last.stats.trace, "batched": reason})
                yield index, attrs.evolve(self.last, stats=stats)
        finally:
            self._lock.release()

    def _batched(self, requests: list[_Request], size: int) -> Iterator[tuple[int, GenerationResult]]:
        """Run ``requests`` on ``size`` rows of the target (the lock held): each prompt opened on its row as it is
        admitted, with a chain of its own where the chain keeps state per sequence (a clone)."""
        model = self.models["target"]
        needed = max(len(r.ids) + r.max_new_tokens for r in requests) + self.spec.scratch(self.options)
        length = min(max(MIN_KV_LENGTH, 1 << (needed - 1).bit_length()), model.spec.max_length)
        rows = self._batch_rows
        if rows is None or rows.capacity != size or rows[0].max_length < min(length, model.spec.context_length):
            rows = self._batch_rows = Rows("target", model, capacity=size, max_length=length, debug=self.debug)
        for index, request in enumerate(requests):  # every prompt is checked before any runs
            _check_fits(request, rows[0].max_length, f"prompt {index}")
        held = "in one buffer" if rows.batched else f"stepped {rows.stepping}"
        trace = f"{size} row{'s' if size > 1 else ''} {held}, refilled as prompts finish"
        running: dict[int, _Run] = {}

        def admit(index: int, row: int, sequence: Sequence) -> BatchSlot:
            chain = self.chain.clone() if self.chain.stateful else self.chain
            run = running[index] = self._open(requests[index], {"target": sequence}, chain=chain, batched=True)
            self._start(run)
            controller = cast(RowController, run.controller)  # _open checked it is one
            return BatchSlot(index=index, row=row, host=run.host, controller=controller, run=run)

        def finish(slot: BatchSlot) -> tuple[int, GenerationResult]:
            del running[slot.index]
            return slot.index, self._finish(slot.run, batched=trace)

        try:
            yield from run_batch(rows, len(requests), admit, finish)
        except GeneratorExit:
            raise
        except BaseException as exc:
            self._batch_rows = None  # a step may have stopped half-way: the next batch starts on fresh rows
            self._fail(running, exc, batch=True)
            raise

    # -- one request's life: opened, started, stepped, finished or failed -------------------------------------
    def _request(
        self,
        prompt: str,
        max_new_tokens: int,
        stop: Any,
        seed: int | None,
        images: Seq[Any] = (),
        speech: tuple[Any, str | None, str | None, bool] = (None, None, None, False),
        adapter: int = 0,
    ) -> _Request:
        """``prompt`` and its limits checked and encoded (ConfigError otherwise): the same for a generation, a
        stream and each prompt of a batch. A vision-language target's images run through its vision encoder here,
        once each, and each image token of the prompt becomes as many as its image gave features."""
        stop = _checked_request(max_new_tokens, stop, seed)
        target = self.models["target"]
        audio, language, task, timestamps = speech
        if audio is not None or (target.encoder is not None and target.encoder.audio is not None):
            heard = speech_request(target, prompt, audio, language=language, task=task, timestamps=timestamps)
            return _Request(
                prompt=prompt,
                ids=heard.ids,
                max_new_tokens=max_new_tokens,
                stop=stop,
                seed=seed,
                source=heard.source,
                adapter=adapter,
            )
        ids = np.asarray(encode_prompt(target.tokenizer, prompt), np.int64)  # a ChatPrompt keeps its ids
        if ids.size == 0:
            raise ConfigError("the prompt is empty and the model adds no BOS token: give some prompt text")
        source = None
        if target.encoder is not None:  # the prompt is the encoder's; the decoder starts from its start token
            source, ids = ids, self._decoder_prompt(ids)
        features = None
        if target.vision is not None:
            vision = target.vision
            if self.prefix_cache is None:
                features = vision.encode(list(images))
            else:  # the same images as a kept prompt's (a chat about a picture): their features kept too
                features = self.prefix_cache.image_features(images, vision.encode)
            chat = isinstance(prompt, ChatPrompt)  # its ids were encoded without adding special tokens
            expanded = target.vision.prompt_ids(
                target.tokenizer, prompt, ids.tolist(), features, add_special_tokens=not chat
            )
            ids = np.asarray(expanded, np.int64)
        elif images:
            raise no_images(target.name)
        return _Request(
            prompt=prompt,
            ids=ids,
            max_new_tokens=max_new_tokens,
            stop=stop,
            seed=seed,
            source=source,
            images=features,
            adapter=adapter,
        )

    def _begin(self, request: _Request, sink: Callable[[list[int], str], None] | None) -> _Run:
        """Open and start ``request`` on this Generator's own sequences (with the lock held), taking the models over
        from an unfinished stream; ``sink`` receives each commit (a stream's pieces)."""
        if self._active is not None:
            self._unfinished(self._active, "superseded", None)
        needed = len(request.ids) + request.max_new_tokens + self.spec.scratch(self.options)
        sequences = {role: self._sequence(role, needed) for role in self.roles}
        rows = {role: self._rows[role] for role in sequences}
        run = self._active = self._open(request, sequences, chain=self.chain, rows=rows, sink=sink)
        try:
            self._start(run)
        except BaseException as exc:
            self._fail({0: run}, exc)
            raise
        return run

    def _open(
        self,
        request: _Request,
        sequences: Mapping[str, Sequence],
        *,
        chain: ProcessorChain,
        rows: Mapping[str, Rows] | None = None,
        sink: Callable[[list[int], str], None] | None = None,
        batched: bool = False,
    ) -> _Run:
        """The per-request set-up, written once for generations, streams and batched prompts: the stop rules, the
        output (``sink`` and commit observers see each commit), the chain reset with the prompt, the host over
        ``sequences`` (with ``rows``: beams and parallel samples may start other completions) and a controller
        (``batched``: one that can step one row among many)."""
        started = time.perf_counter()
        _check_fits(request, sequences["target"].max_length, "the prompt")
        host, output = open_host(
            self.models["target"],
            sequences,
            request.ids,
            max_new_tokens=request.max_new_tokens,
            stop=request.stop,
            seed=request.seed,
            chain=chain,
            sink=self._commit_hook(sink),
            rows=rows,
            prefill_chunk=self.prefill_chunk,
            source=request.source,
        )
        controller = make_controller(self.spec, self.options, batched=batched)
        return _Run(request, host, output, controller, started)

    def _commit_hook(self, sink: Callable[[list[int], str], None] | None) -> Callable[[list[int], str], None] | None:
        """What an output calls with each commit: ``sink`` and the commit observers, or None when neither is there
        (then the text is decoded once, at the end)."""
        observe = self.registry.commit_observed()
        if not observe:
            return sink

        def on_commit(tokens: list[int], text: str) -> None:
            if sink is not None:
                sink(tokens, text)
            self.registry.notify_commit(tokens=tokens, text=text)

        return on_commit

    def _start(self, run: _Run) -> None:
        """Start an opened request: the start hook, every role's encoder over an encoder-decoder source, the prompt's
        prefill, the controller's start; the decode counters begin after."""
        host, request = run.host, run.request
        self.registry.notify_start(
            prompt=request.prompt, controller=self.spec.name, roles={r: m.name for r, m in self.models.items()}
        )
        sequences = [host[role] for role in host.roles]
        for sequence in sequences:
            sequence.stats = type(sequence.stats)()
        if request.source is not None:  # every role's encoder reads the source once per generation
            for sequence in sequences:
                if self.prefix_cache is not None and sequence is host.target:  # a source kept before: no encoder run
                    self.prefix_cache.encode(sequence, request.source)
                else:
                    sequence.encode(request.source)
        if self.adapters:  # every generation names its LoRA table (0: the base model): none stays from the last
            host.target.runner.adapter = request.adapter
        if request.images is not None:
            host.target.attach_images(request.images)
        if self.prefix_cache is None:
            host.target.prefill(request.ids, self.prefill_chunk)
        else:
            prefill_cached(self.prefix_cache, host.target, request.ids, self.prefill_chunk)
            if request.source is not None:  # the encoder's output kept for the same source next time
                self.prefix_cache.keep_source(host.target, request.source)
        run.prefill_seconds = time.perf_counter() - run.started
        start_controller(run.controller, host)
        run.decode_started = time.perf_counter()
        run.counters_at_decode = {
            role: (s.stats.forwards, s.stats.tokens_fed, s.stats.seconds)
            for role, s in zip(host.roles, sequences, strict=True)
        }
        run.sizes_at_decode = {role: s.stats.sizes() for role, s in zip(host.roles, sequences, strict=True)}

    def _acquire(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise GeneratorInUseError(BUSY)

    def _close(self, run: _Run) -> None:
        """End a stream's generation that its reader closed or let go of before its end."""
        # a stream let go of is closed by the garbage collector, at any time and in any thread: never wait here
        if not self._lock.acquire(blocking=False):
            return  # another generation is starting, and ends this one as it takes the models over
        try:
            if self._active is run:
                self._unfinished(run, "closed", None)
        finally:
            self._lock.release()

    def _steps(self, run: _Run) -> Iterator[None]:
        """Step ``run`` to its end, pausing after every step; ``self.last`` holds its result at the end. An error
        inside becomes a GenerationError that keeps the text so far."""
        # the loop runs once a token on the greedy path, with onnxruntime's run in between evicting Python's
        # working set from the caches: what it touches is bound to locals once
        host, output, step = run.host, run.output, run.controller.step
        tokens = output.tokens
        try:
            while output.stop_reason is None or (host.outputs > 1 and not host.done):
                if host.outputs > 1:  # several completions (parallel samples): a step may commit to any of them
                    self._multi_step(host, step)
                    yield
                    continue
                before = len(tokens)
                step(host)
                if len(tokens) == before and output.stop_reason is None:
                    raise ControllerError(
                        f"controller {self.spec.name!r} made a step that committed no token and did not finish: "
                        "every step must commit at least one token"
                    )
                yield
        except GeneratorExit:  # the stream that reads these steps was closed: it ends the generation
            raise
        except BaseException as exc:
            self._fail({0: run}, exc)
            raise
        self.last = self._finish(run)

    def _multi_step(self, host: Host, step: Any) -> None:
        before = host.committed
        step(host)
        if host.committed == before and not host.done:
            raise ControllerError(
                f"controller {self.spec.name!r} made a step that committed no token to any of its "
                f"{host.outputs} completions and did not finish them: every step must commit at least one token"
            )

    def _stats(self, run: _Run) -> GenerationStats:
        now = time.perf_counter()
        decode_seconds = now - run.decode_started
        forwards, fed, seconds, sizes = {}, {}, {}, {}
        for role in run.host.roles:
            stats = run.host[role].stats
            f0, t0, s0 = run.counters_at_decode.get(role, (0, 0, 0.0))
            forwards[role], fed[role], seconds[role] = stats.forwards - f0, stats.tokens_fed - t0, stats.seconds - s0
            sizes[role] = stats.sizes().since(run.sizes_at_decode.get(role, ForwardSizes()))
        new = len(run.output.tokens)
        controller_stats = getattr(run.controller, "stats", None)
        trace = {
            "controller": self.spec.name,
            "plugin": self.spec.plugin,
            "options": dict(self.options),
            "roles": {r: m.name for r, m in self.models.items()},
            "processors": self.processors_text,
            "degraded": [],
            **run.host.trace,
        }
        return GenerationStats(
            prompt_tokens=len(run.host.source_tokens) or len(run.host.prompt_tokens),
            new_tokens=new,
            stop_reason=run.output.stop_reason,
            prefill_seconds=run.prefill_seconds,
            decode_seconds=decode_seconds,
            tokens_per_second=new / decode_seconds if decode_seconds > 0 else 0.0,
            forwards=forwards,
            tokens_fed=fed,
            onnx_seconds=seconds,
            tokens_per_target_forward=new / forwards["target"] if forwards.get("target") else float(new),
            controller=dict(controller_stats()) if callable(controller_stats) else {},
            trace=trace,
            forward_sizes=sizes,
        )

    def _finish(self, run: _Run, **trace: Any) -> GenerationResult:
        """The result of a run its stop rules ended, with ``trace`` added to its stats' trace; the end hook sees it.
        The prefix cache keeps what the target's row holds: the prompt and the answer, the next chat turn's prefix."""
        run.ended = True
        if self.prefix_cache is not None:
            self.prefix_cache.store(run.host.target)
        if self._active is run:
            self._active = None
        stats = self._stats(run)
        if trace:
            stats = attrs.evolve(stats, trace={**stats.trace, **trace})
        self.registry.notify_end(stats=stats, error=None)
        log.debug("decoctl.generation_end", new_tokens=stats.new_tokens, stop_reason=stats.stop_reason)
        return GenerationResult.of(run.host, stats)

    def _fail(self, runs: Mapping[int, _Run], exc: BaseException, *, batch: bool = False) -> None:
        """The one failure path: end the runs ``exc`` stopped (a generation as {0: run}; with ``batch``, the prompts
        a batch was running, by index) with what each committed (``self.last``). An error becomes a GenerationError
        that keeps the first run's text so far (and names the prompts a batch was running); an interrupt
        (KeyboardInterrupt, SystemExit) and another generation's GenerationError propagate as they are: the caller
        re-raises them. A run that has ended already (a stream superseded or closed) is left as it is."""
        live = sorted((index, run) for index, run in runs.items() if not run.ended)
        if not live:
            return
        if not isinstance(exc, Exception):
            # an interrupt may land between a forward and its bookkeeping (or a buffer and its binding): the next
            # generation starts on fresh KV caches
            self._sequences.clear()
            for _, run in live:
                self._unfinished(run, "interrupted", exc)
            return
        ended = [(index, self._unfinished(run, "error", exc)) for index, run in live]
        if isinstance(exc, GenerationError):  # another generation's, raised inside this one: it keeps its own text
            return
        first, result = ended[0]
        log.warning("decoctl.generation_failed", controller=self.spec.name, error=str(exc))
        detail = f"{type(exc).__name__}: {exc}" if not isinstance(exc, DecoctlError) else str(exc)
        where = f"after {len(result.tokens)} token(s)"
        if batch:
            where = f"in a batch, with prompt(s) {[i for i, _ in ended]} running (prompt {first} {where})"
        raise GenerationError(
            f"controller {self.spec.name!r} failed {where}: {detail}",
            text=result.text,
            tokens=list(result.tokens),
            stats=result.stats,
        ) from exc

    def _unfinished(self, run: _Run, reason: str, error: BaseException | None) -> GenerationResult:
        """End ``run`` before its stop rules did: ``self.last`` becomes what it committed (stop_reason ``reason``),
        the end hook sees it with ``error``, and the models are free for the next generation."""
        run.ended = True
        if self._active is run:
            self._active = None
        stats = attrs.evolve(self._stats(run), stop_reason=reason)
        self.last = GenerationResult.of(run.host, stats)
        self.registry.notify_end(stats=stats, error=error)
        return self.last


def _check_fits(request: _Request, max_length: int, what: str) -> None:
    """ConfigError when ``request``'s prompt leaves no room for a new token in a sequence of ``max_length``."""
    if len(request.ids) >= max_length:
        raise ConfigError(
            f"{what} has {len(request.ids)} tokens, which fills the target's {max_length} positions: shorten it"
        )


def _shown_processors(processors: Processors, chain: ProcessorChain) -> str | list[Any]:
    """``processors`` as the trace shows them: as given where that is text and tables, a processor object by its
    name."""
    if processors is None or isinstance(processors, str):
        return processors or ""
    if isinstance(processors, ProcessorChain):
        return ",".join(chain.names)
    shown: list[Any] = []
    for entry in processors:
        if isinstance(entry, str):
            shown.append(entry)
        elif isinstance(entry, Mapping):
            shown.append(dict(entry))
        elif isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], Mapping):
            shown.append({"name": entry[0], **entry[1]})
        else:
            shown.append(processor_name(entry))
    return shown


def _checked_request(max_new_tokens: int, stop: Any, seed: int | None) -> tuple[str, ...]:
    """The stop strings as a tuple, once a generation's limits are checked (ConfigError otherwise)."""
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens} must be at least 1")
    if isinstance(stop, str):
        stop = (stop,)
    if any(not s for s in stop):
        raise ConfigError("an empty stop string would stop at once: remove it")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0):
        raise ConfigError(
            f"seed={seed!r} is not a valid seed: give a whole number from 0 up (or None for a different random "
            "draw every generation)"
        )
    return tuple(stop)


def generate(
    prompt: str,
    *,
    model: str | Path | None = None,
    controller: str | type | object = "greedy",
    max_new_tokens: int = 128,
    stop: tuple[str, ...] | list[str] = (),
    seed: int | None = 0,
    roles: Mapping[str, str | Path] | None = None,
    images: Seq[Any] = (),
    **generator_options: Any,
) -> GenerationResult:
    """One-shot generation: ``decoctl.generate("def f(x):", model="path/or/name", controller="greedy")``;
    ``controller`` takes what Generator takes (a name, a path, a class or an instance), and so do the other
    Generator arguments (``options``, ``processors``, ...); ``images``: a vision-language model's images, one per image
    token of the prompt."""
    models: dict[str, str | Path | None] = {"target": model, **(roles or {})}
    generator = Generator(models, controller, **generator_options)
    return generator.generate(prompt, max_new_tokens=max_new_tokens, stop=stop, seed=seed, images=images)


def stream(
    prompt: str,
    *,
    model: str | Path | None = None,
    controller: str | type | object = "greedy",
    max_new_tokens: int = 128,
    stop: tuple[str, ...] | list[str] = (),
    seed: int | None = 0,
    roles: Mapping[str, str | Path] | None = None,
    images: Seq[Any] = (),
    **generator_options: Any,
) -> Iterator[str]:
    """Streaming one-shot generation: yields text pieces as they are committed."""
    models: dict[str, str | Path | None] = {"target": model, **(roles or {})}
    generator = Generator(models, controller, **generator_options)
    yield from generator.stream(prompt, max_new_tokens=max_new_tokens, stop=stop, seed=seed, images=images)
