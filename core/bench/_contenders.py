"""The contenders `decoctl bench` runs: decoctl controllers, a raw onnxruntime loop, onnxruntime-genai's greedy
loop and its two speculative decoders (n-gram lookup and a draft model), and for ``--batch`` onnxruntime-genai's
batched greedy loop and its beam search (decoctl.bench._batch).

Every contender has the same shape: ``run(prompt, prompt_ids, max_new_tokens) -> Outcome`` with the new tokens,
the decode seconds (after the prompt is in the cache), the target forwards it used and its ForwardLedger (what
it fed the models, for the ideal speedup; see decoctl.bench._ideal).

onnxruntime-genai (0.18 checked) exposes both speculative decoders from Python through
``GeneratorParams.set_speculative_options`` (``max_draft_tokens``, ``ngram_size``, ``ngram_chained_lookup``,
``min_adaptive_k``, ``cooldown``) and ``Generator.get_speculative_stats()``; the draft model is a ``model.draft``
decoder block in genai_config.json next to the target's ``model.decoder``, with paths under the config's folder.

A model with tree inputs (``decoctl models enable-tree``; the bundled demo models) takes ``position_ids`` and
``attention_bias``, which onnxruntime-genai never feeds: the raw loop and the onnxruntime-genai contenders run its
plain twin instead (the same weights without those inputs, derived once and cached: decoctl.model.graph).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import numpy as np
import onnxruntime as ort

from decoctl.bench._ideal import ForwardLedger, ledger_from_stats, spread
from decoctl.bench._speech import Prompt, SpeechPrompt
from decoctl.errors import ConfigError
from decoctl.generation import Generator
from decoctl.model._loader import LoadedModel, session_options
from decoctl.model._spec import ModelSpec
from decoctl.model.graph import plain_twin
from decoctl.specs import Option, parse_options

__all__ = [
    "ORT_GENAI_SPECULATIVE",
    "BatchRun",
    "Contender",
    "ControllerContender",
    "OrtGenaiBatchContender",
    "OrtGenaiBeamContender",
    "OrtGenaiContender",
    "OrtGenaiSpeculativeContender",
    "Outcome",
    "RawOrtContender",
]


@attrs.frozen(kw_only=True)
class Outcome:
    tokens: tuple[int, ...]
    decode_seconds: float
    total_seconds: float
    target_forwards: int
    ledger: ForwardLedger
    extra: Mapping[str, Any] = attrs.field(factory=dict)


class Contender(Protocol):
    name: str

    def run(self, prompt: Prompt, prompt_ids: list[int], max_new_tokens: int) -> Outcome: ...


class ControllerContender:
    """A decoctl controller (built-in or plugin) through the ordinary Generator; a speech prompt as ``decoctl generate
    --audio`` gives it (``generate("", audio=PATH, language=..., task=...)``)."""

    def __init__(self, name: str, generator: Generator) -> None:
        self.name = name
        self.generator = generator

    def run(self, prompt: Prompt, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        del prompt_ids
        started = time.perf_counter()
        if isinstance(prompt, SpeechPrompt):
            result = self.generator.generate(
                "",
                audio=str(prompt.audio),
                language=prompt.language,
                task=prompt.task,
                max_new_tokens=max_new_tokens,
                seed=0,
            )
        else:
            result = self.generator.generate(prompt, max_new_tokens=max_new_tokens, seed=0)
        total = time.perf_counter() - started
        stats = result.stats
        ledger = ledger_from_stats(forward_sizes=stats.forward_sizes, onnx_seconds=stats.onnx_seconds)
        return Outcome(
            tokens=result.tokens,
            decode_seconds=stats.decode_seconds,
            total_seconds=total,
            target_forwards=stats.forwards.get("target", 0),
            ledger=ledger,
            extra=dict(stats.controller),
        )


class RawOrtContender:
    """A minimal greedy loop written directly on onnxruntime with IOBinding: the floor decoctl's host is
    measured against. Shared-buffer (GroupQueryAttention) models only, as onnxruntime-genai's builder makes
    them; it reuses nothing of the host but the session options. A model with tree inputs runs as its plain
    twin; a graph that takes ``position_ids`` for its own use (rotary outside GroupQueryAttention) gets them."""

    name = "raw-ort"

    def __init__(self, model: LoadedModel, threads: int | None) -> None:
        if not model.spec.share_buffer:
            raise ConfigError(
                f"contender raw-ort runs shared-buffer (onnxruntime-genai layout) models; {model.name} is "
                f"{model.spec.layout} with a concat KV cache: leave raw-ort out for it"
            )
        spec = _plain(model.spec)
        self.spec = spec
        self.eos = set(spec.eos_token_ids)
        self.session = ort.InferenceSession(
            str(spec.onnx_file), session_options(threads), providers=["CPUExecutionProvider"]
        )
        self.names = [n for layer in range(spec.num_layers) for n in (*spec.past_names(layer),)]
        self.present = [n for layer in range(spec.num_layers) for n in (*spec.present_names(layer),)]
        self.kv: list[np.ndarray] = []
        self.capacity = 0
        self.extra_outputs = [o for o in self.session.get_outputs() if o.name not in (spec.logits_name, *self.present)]
        inputs = {i.name for i in self.session.get_inputs()}
        self.position_ids = spec.position_ids_name if spec.position_ids_name in inputs else None

    def _allocate(self, capacity: int) -> ort.IOBinding:
        spec = self.spec
        shape = (1, spec.num_kv_heads, capacity, spec.head_size)
        self.kv = [np.zeros(shape, np.float32) for _ in self.names]
        self.capacity = capacity
        binding = self.session.io_binding()
        for past, present, buffer in zip(self.names, self.present, self.kv, strict=True):
            binding.bind_input(past, "cpu", 0, np.float32, list(shape), buffer.ctypes.data)
            binding.bind_output(present, "cpu", 0, np.float32, list(shape), buffer.ctypes.data)
        return binding

    def run(self, prompt: Prompt, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        del prompt
        spec = self.spec
        capacity = len(prompt_ids) + max_new_tokens
        binding = self._allocate(capacity)
        mask = np.ones((1, capacity), np.int64)
        positions = np.arange(capacity, dtype=np.int64)
        logits = np.zeros((1, len(prompt_ids), spec.vocab_size), np.float32)
        extra = {o.name: np.zeros((1, len(prompt_ids), o.shape[-1]), np.float32) for o in self.extra_outputs}

        def step(ids: np.ndarray, past: int) -> np.ndarray:
            n = ids.shape[1]
            binding.bind_input(spec.input_ids_name, "cpu", 0, np.int64, [1, n], ids.ctypes.data)
            binding.bind_input(spec.attention_mask_name, "cpu", 0, np.int64, [1, past + n], mask.ctypes.data)
            if self.position_ids is not None:
                pointer = positions.ctypes.data + past * positions.itemsize
                binding.bind_input(self.position_ids, "cpu", 0, np.int64, [1, n], pointer)
            binding.bind_output(spec.logits_name, "cpu", 0, np.float32, [1, n, spec.vocab_size], logits.ctypes.data)
            for name, buffer in extra.items():
                binding.bind_output(name, "cpu", 0, np.float32, [1, n, buffer.shape[-1]], buffer.ctypes.data)
            self.session.run_with_iobinding(binding)
            return logits[0, n - 1]

        started = time.perf_counter()
        ids = np.asarray([prompt_ids], np.int64)
        row = step(ids, 0)
        decode_started = time.perf_counter()
        out: list[int] = []
        token_buffer = np.zeros((1, 1), np.int64)
        forwards = 0
        past = len(prompt_ids)
        while True:
            token = int(row.argmax())
            out.append(token)
            if token in self.eos or len(out) >= max_new_tokens:
                break
            token_buffer[0, 0] = token
            row = step(token_buffer, past)
            past += 1
            forwards += 1
        end = time.perf_counter()
        return Outcome(
            tokens=tuple(out),
            decode_seconds=end - decode_started,
            total_seconds=end - started,
            target_forwards=forwards,
            ledger=ForwardLedger.one_token(forwards),
        )


def _import_genai(contender: str) -> Any:
    try:
        import onnxruntime_genai as og
    except ImportError as exc:
        raise ConfigError(
            f"contender {contender} needs onnxruntime-genai: pip install 'decoctl[ort-genai]' or leave it out"
        ) from exc
    return og


def _plain(spec: ModelSpec) -> ModelSpec:
    """``spec``, or its plain twin's where its graph has tree inputs (which these contenders never feed)."""
    folder = plain_twin(spec.path, graph_file=str(spec.onnx_file.relative_to(spec.path)))
    return spec if folder == spec.path.resolve() else ModelSpec.from_folder(folder)


def _forced_threads(decoder: dict[str, Any], threads: int) -> dict[str, Any]:
    options = decoder.setdefault("session_options", {})
    options["intra_op_num_threads"] = threads
    options["inter_op_num_threads"] = 1
    return decoder


def _link_folder(source: Path, destination: Path) -> None:
    destination.mkdir(exist_ok=True)
    for item in source.iterdir():
        if item.name != "genai_config.json":
            (destination / item.name).symlink_to(item.resolve())


class OrtGenaiContender:
    """onnxruntime-genai's own greedy loop (the optional extra ``decoctl[ort-genai]``), with the intra-op
    thread count forced to the bench's so the comparison is fair."""

    name = "ort-genai"

    def __init__(self, model: LoadedModel, threads: int) -> None:
        og = _import_genai(self.name)
        if model.spec.layout != "genai":
            raise ConfigError(
                f"contender {self.name} runs onnxruntime-genai models; {model.name} is {model.spec.layout}"
            )
        spec = _plain(model.spec)
        self._folder = tempfile.TemporaryDirectory(prefix="decoctl-genai-")
        folder = Path(self._folder.name)
        _link_folder(spec.path, folder)
        config = json.loads((spec.path / "genai_config.json").read_text())
        _forced_threads(config["model"]["decoder"], threads)
        self._configure(config, folder)
        (folder / "genai_config.json").write_text(json.dumps(config))
        self.og = og
        self.model = og.Model(str(folder))
        self.eos = set(model.spec.eos_token_ids)

    def _configure(self, config: dict[str, Any], folder: Path) -> None:
        """Subclasses add to the composed config (a draft decoder, speculative options) here."""

    def run(self, prompt: Prompt, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        del prompt
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(prompt_ids) + max_new_tokens)
        started = time.perf_counter()
        generator = og.Generator(self.model, params)
        generator.append_tokens(np.asarray(prompt_ids, np.int32))
        decode_started = time.perf_counter()
        forwards = 0
        while not generator.is_done():
            generator.generate_next_token()
            forwards += 1
        end = time.perf_counter()
        sequence = self._with_final_eos([int(t) for t in generator.get_sequence(0)][len(prompt_ids) :], max_new_tokens)
        return Outcome(
            tokens=tuple(sequence[:max_new_tokens]),
            decode_seconds=end - decode_started,
            total_seconds=end - started,
            target_forwards=max(0, forwards - 1),
            ledger=ForwardLedger.one_token(max(0, forwards - 1)),
        )

    def _with_final_eos(self, sequence: list[int], max_new_tokens: int) -> list[int]:
        """onnxruntime-genai leaves the EOS it stopped on out of the sequence; decoctl's outputs end with it. Put it
        back when it is unambiguous (the model has one EOS id), so outputs compare token for token."""
        stopped_early = len(sequence) < max_new_tokens and (not sequence or sequence[-1] not in self.eos)
        if stopped_early and len(self.eos) == 1:
            return [*sequence, *self.eos]
        return sequence

    def close(self) -> None:
        shutil.rmtree(self._folder.name, ignore_errors=True)


#: contender name -> its options (onnxruntime-genai's speculative options, under shorter names)
ORT_GENAI_SPECULATIVE: dict[str, tuple[Option, ...]] = {
    "ort-genai-ngram": (
        Option(name="k", type="int", default=4, minimum=1, maximum=16, help="max_draft_tokens"),
        Option(name="ngram", type="int", default=3, minimum=2, maximum=16, help="ngram_size: match the last N-1"),
        Option(name="chained", type="bool", default=False, help="ngram_chained_lookup"),
        Option(name="min_adaptive_k", type="int", default=0, minimum=0, maximum=16, help="0: fixed k"),
    ),
    "ort-genai-draft": (
        Option(name="k", type="int", default=4, minimum=1, maximum=16, help="max_draft_tokens"),
        Option(name="min_adaptive_k", type="int", default=0, minimum=0, maximum=16, help="0: fixed k"),
    ),
}


class OrtGenaiSpeculativeContender(OrtGenaiContender):
    """onnxruntime-genai's own speculative decoding, greedy, with the same forced thread settings as ort-genai:
    ``ort-genai-ngram`` (n-gram lookup in the committed tokens) or ``ort-genai-draft`` (a draft model, composed
    as a ``model.draft`` decoder block next to the target's in a temporary folder of links)."""

    def __init__(
        self, kind: str, model: LoadedModel, threads: int, options: Mapping[str, str], *, draft: Path | None = None
    ) -> None:
        if kind not in ORT_GENAI_SPECULATIVE:
            raise ConfigError(f"no contender {kind!r}: onnxruntime-genai's are {sorted(ORT_GENAI_SPECULATIVE)}")
        self.name = kind
        self.options = parse_options(f"contender {kind}", ORT_GENAI_SPECULATIVE[kind], options)
        og = _import_genai(kind)
        if not hasattr(og.GeneratorParams, "set_speculative_options"):
            raise ConfigError(
                f"contender {kind}: onnxruntime-genai {getattr(og, '__version__', '?')} has no "
                "GeneratorParams.set_speculative_options, so its speculative decoding cannot be driven from Python: "
                "pip install 'onnxruntime-genai>=0.18' or leave the contender out"
            )
        if kind == "ort-genai-draft" and draft is None:
            raise ConfigError("contender ort-genai-draft needs a draft model: pass --draft MODEL")
        if kind == "ort-genai-ngram" and draft is not None:
            raise ConfigError("contender ort-genai-ngram uses no draft model (onnxruntime-genai refuses both at once)")
        self._draft = draft
        self._threads = threads
        super().__init__(model, threads)
        self.speculative = {
            "max_draft_tokens": self.options["k"],
            "min_adaptive_k": self.options["min_adaptive_k"],
            **(
                {"ngram_size": self.options["ngram"], "ngram_chained_lookup": self.options["chained"]}
                if kind == "ort-genai-ngram"
                else {}
            ),
        }

    def _configure(self, config: dict[str, Any], folder: Path) -> None:
        if self._draft is None:
            return
        spec = ModelSpec.from_folder(self._draft)
        if spec.layout != "genai":
            raise ConfigError(
                f"contender {self.name}: the draft {self._draft} is {spec.layout}; onnxruntime-genai composes only "
                "onnxruntime-genai models"
            )
        spec = _plain(spec)
        if (folder / "draft").exists():
            raise ConfigError(
                f"contender {self.name}: the target folder has an entry named 'draft', where the draft's links go"
            )
        _link_folder(spec.path, folder / "draft")
        decoder = json.loads((spec.path / "genai_config.json").read_text())["model"]["decoder"]
        decoder["filename"] = f"draft/{decoder['filename']}"
        config["model"]["draft"] = _forced_threads(decoder, self._threads)

    def run(self, prompt: Prompt, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        del prompt
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(prompt_ids) + max_new_tokens)
        params.set_speculative_options(**self.speculative)
        started = time.perf_counter()
        generator = og.Generator(self.model, params)
        generator.append_tokens(np.asarray(prompt_ids, np.int32))
        decode_started = time.perf_counter()
        generator.generate_next_token()
        # the first token read the prefill's logits when onnxruntime-genai made it a standard step
        first_was_standard = generator.get_speculative_stats()["standard_fallback_steps"] == 1
        while not generator.is_done():
            generator.generate_next_token()
        end = time.perf_counter()
        stats = dict(generator.get_speculative_stats())
        sequence = self._with_final_eos([int(t) for t in generator.get_sequence(0)][len(prompt_ids) :], max_new_tokens)
        ledger = self._ledger(stats, first_was_standard)
        numbers = {k: v for k, v in stats.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        return Outcome(
            tokens=tuple(sequence[:max_new_tokens]),
            decode_seconds=end - decode_started,
            total_seconds=end - started,
            target_forwards=sum(ledger.chain.values()),
            ledger=ledger,
            extra={k: numbers[k] for k in _REPORTED_STATS if k in numbers},
        )

    def _ledger(self, stats: Mapping[str, Any], first_was_standard: bool) -> ForwardLedger:
        verify = int(stats["target_verify_forward_passes"])
        standard = int(stats["standard_fallback_steps"]) - first_was_standard
        single = int(stats["target_reanchor_forward_passes"]) + int(stats["target_reconciliation_forward_passes"])
        chain = spread(int(stats["draft_tokens_proposed"]) + verify, verify)
        chain[1] = chain.get(1, 0) + single + standard
        drafted = int(stats["draft_forward_passes"]) > 0
        return ForwardLedger(
            chain={n: c for n, c in chain.items() if c},
            other_seconds=float(stats["total_draft_ms"]) / 1000 if drafted else 0.0,
            basis="onnxruntime-genai stats",
        )


#: onnxruntime-genai speculative counters carried into the bench's per-contender extra (means over prompts)
_REPORTED_STATS = (
    "acceptance_rate",
    "rounds",
    "draft_tokens_proposed",
    "draft_tokens_accepted",
    "draft_forward_passes",
    "target_verify_forward_passes",
    "standard_fallback_steps",
    "ngram_lookup_hits",
    "effective_k",
    "total_draft_ms",
    "total_verify_ms",
)


@attrs.frozen(kw_only=True)
class BatchRun:
    """One run of a many-sequences contender (decoctl.bench._batch): each prompt's new tokens (ending with the EOS
    that ended it, as decoctl's do) and the seconds of the whole run, prompts' prefills included."""

    outputs: tuple[tuple[int, ...], ...]
    seconds: float


class OrtGenaiBatchContender(OrtGenaiContender):
    """onnxruntime-genai's greedy loop over a batch: ``batch`` prompts at a time in one generator
    (``set_search_options(batch_size=...)``, the prompts appended as one [batch, length] array), the next batch
    when every row of this one is done (onnxruntime-genai 0.18 has no continuous batching in its Python API).

    The prompts must have the same length in tokens: onnxruntime-genai takes a batch as one array, and a prompt
    left-padded with its pad token to fit one does not continue as it does alone (on the demo model, two pad tokens
    in front of "def fibonacci(n):" change its fifth new token), so ragged prompts would not compare."""

    name = "ort-genai"

    def run_batch(self, prompts: Sequence[Sequence[int]], batch: int, max_new_tokens: int) -> BatchRun:
        og = self.og
        length = len(prompts[0])
        if any(len(p) != length for p in prompts):
            raise ConfigError(
                f"contender {self.name} takes a batch of prompts of one length in tokens, not "
                f"{sorted({len(p) for p in prompts})}: cut them to the shortest (decoctl.bench._batch does)"
            )
        outputs: list[tuple[int, ...]] = []
        started = time.perf_counter()
        for first in range(0, len(prompts), batch):
            chunk = prompts[first : first + batch]
            params = og.GeneratorParams(self.model)
            params.set_search_options(do_sample=False, max_length=length + max_new_tokens, batch_size=len(chunk))
            generator = og.Generator(self.model, params)
            generator.append_tokens(np.asarray(chunk, np.int32))
            while not generator.is_done():
                generator.generate_next_token()
            outputs += [self._row(generator.get_sequence(row)[length:], max_new_tokens) for row in range(len(chunk))]
        return BatchRun(outputs=tuple(outputs), seconds=time.perf_counter() - started)

    def _row(self, sequence: np.ndarray, max_new_tokens: int) -> tuple[int, ...]:
        """A row's new tokens up to and with its first EOS (the row is padded after it while others run on)."""
        tokens = [int(t) for t in sequence]
        ended = next((i for i, token in enumerate(tokens) if token in self.eos), None)
        if ended is not None:
            return tuple(tokens[: ended + 1])
        return tuple(self._with_final_eos(tokens, max_new_tokens)[:max_new_tokens])


class OrtGenaiBeamContender(OrtGenaiContender):
    """onnxruntime-genai's beam search on one prompt at a time, greedy (no sampling), returning its best
    hypothesis. ``length_penalty`` 0 and ``early_stopping`` true by default: onnxruntime-genai 0.18 normalises a
    hypothesis by the whole sequence's length (the prompt counted), so its ranking agrees with transformers' and
    decoctl's only where lengths do not count (tests/builder/test_beam.py)."""

    name = "ort-genai-beam"

    def __init__(
        self, model: LoadedModel, threads: int, *, num_beams: int, length_penalty: float = 0.0, early: bool = True
    ) -> None:
        super().__init__(model, threads)
        self.num_beams, self.length_penalty, self.early = num_beams, length_penalty, early

    def run_beam(self, prompt: Sequence[int], max_new_tokens: int) -> BatchRun:
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(
            do_sample=False,
            num_beams=self.num_beams,
            length_penalty=self.length_penalty,
            early_stopping=self.early,
            num_return_sequences=1,
            max_length=len(prompt) + max_new_tokens,
        )
        started = time.perf_counter()
        generator = og.Generator(self.model, params)
        generator.append_tokens(np.asarray(prompt, np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        seconds = time.perf_counter() - started
        tokens = self._with_final_eos([int(t) for t in generator.get_sequence(0)][len(prompt) :], max_new_tokens)
        return BatchRun(outputs=(tuple(tokens[:max_new_tokens]),), seconds=seconds)
