"""transformers' own generation as bench contenders, on the transformers weights the bench's ONNX model came from:

- ``hf``: greedy ``generate()``;
- ``hf-assisted``: assisted decoding with a draft model, ``generate(assistant_model=...)`` (greedy, so its tokens
  are greedy's);
- ``hf-lookup``: prompt lookup, ``generate(prompt_lookup_num_tokens=...)``. On an encoder-decoder model transformers
  looks up the decoder's own tokens (the output so far), not the source.

Options: ``model=DIR`` (every one; a folder from ``save_pretrained``), ``draft=DIR`` (hf-assisted), and the decoding
settings under short names (TRANSFORMERS_CONTENDERS). The weights load in float32, the generation runs under
``torch.inference_mode()`` with a generation config of its own: greedy, the EOS ids and decoder start token of the
bench's ONNX model, and nothing else (a checkpoint's own ``no_repeat_ngram_size``, ``forced_eos_token_id`` or
``min_length`` would make its tokens differ from greedy's). torch runs on the bench's intra-op thread count and one
inter-op thread, set for the whole process (torch has no per-model setting).

On a speech model (Whisper) every contender reads the bench's recordings (decoctl.bench._speech): the samples as
decoctl reads them, WhisperFeatureExtractor's features with the ONNX model's preprocessor_config.json, and
WhisperForConditionalGeneration.generate (AutoModelForSpeechSeq2Seq) with the language and task of the decoder prompt
decoctl built for the same recording, so both start from the same tokens. The generation config then also takes the
Whisper settings decoctl applies from the ONNX model's generation_config.json (the language and task tables,
``no_timestamps_token_id``, ``suppress_tokens``, ``begin_suppress_tokens``), and no ``forced_decoder_ids`` and no
timestamps, as decoctl's bench runs them.

Timing is the other contenders': loading is left out, and the decode seconds start once the prompt is in. For
``hf`` that is after the target's first forward (the encoder and the start token's pass, or the prompt's), as for
decoctl's greedy. The speculative ones verify their first draft in that first forward, so their decode seconds
start after the encoders (the target's, and the draft's for hf-assisted), or on a decoder-only model at the call
(transformers feeds the prompt with the first draft: its prefill is counted as decode time there).

torch and transformers are optional: ``pip install 'decoctl[bench-transformers]'``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from decoctl.bench._contenders import Outcome
from decoctl.bench._ideal import ForwardLedger
from decoctl.bench._speech import Prompt, SpeechPrompt, is_speech_model
from decoctl.errors import ConfigError
from decoctl.generation._speech import read_audio
from decoctl.model._loader import LoadedModel
from decoctl.model._spec import GENERATION_CONFIG
from decoctl.specs import Option, parse_options

__all__ = ["TRANSFORMERS_CONTENDERS", "TransformersContender"]

_MODEL = Option(name="model", type="str", help="the target's transformers weights: a folder from save_pretrained")

#: the Whisper settings of the ONNX model's generation_config.json that a speech model's generation config takes
WHISPER_SETTINGS = (
    "is_multilingual",
    "lang_to_id",
    "task_to_id",
    "no_timestamps_token_id",
    "suppress_tokens",
    "begin_suppress_tokens",
)

#: contender name -> its options (transformers' generation settings under shorter names; its own defaults)
TRANSFORMERS_CONTENDERS: dict[str, tuple[Option, ...]] = {
    "hf": (_MODEL,),
    "hf-assisted": (
        _MODEL,
        Option(name="draft", type="str", help="the draft's transformers weights: a folder from save_pretrained"),
        Option(name="k", type="int", default=20, minimum=1, maximum=64, help="num_assistant_tokens"),
        Option(
            name="schedule",
            type="str",
            default="constant",
            choices=("constant", "heuristic_transient"),
            help="num_assistant_tokens_schedule: constant, or heuristic_transient (+2 after a fully accepted "
            "draft, -1 otherwise, from k again at each prompt)",
        ),
        Option(
            name="confidence",
            type="float",
            default=0.4,
            minimum=0.0,
            maximum=1.0,
            help="assistant_confidence_threshold: the draft stops below this probability (0: never)",
        ),
    ),
    "hf-lookup": (
        _MODEL,
        Option(name="k", type="int", default=10, minimum=1, maximum=64, help="prompt_lookup_num_tokens"),
        Option(name="ngram", type="int", default=2, minimum=1, maximum=16, help="max_matching_ngram_size"),
    ),
}


def _import_torch(contender: str) -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ConfigError(
            f"contender {contender} needs torch and transformers ({exc.name} is missing): install torch's build for "
            "your machine (the CPU one is enough), then pip install 'decoctl[bench-transformers]'; or leave the "
            "contender out"
        ) from exc
    return torch, transformers


def _set_threads(torch: Any, threads: int, contender: str) -> None:
    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != 1:
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError as exc:  # torch takes it once, before its first parallel work
            raise ConfigError(
                f"contender {contender}: torch already runs {torch.get_num_interop_threads()} inter-op threads and "
                "cannot change them now; every contender runs one: start a fresh process for the bench"
            ) from exc


class TransformersContender:
    """``hf``, ``hf-assisted`` or ``hf-lookup`` (see the module docstring) beside the bench's ONNX model
    ``target``, whose EOS ids (and decoder start token) its generation config takes."""

    def __init__(self, kind: str, target: LoadedModel, threads: int, options: Mapping[str, str]) -> None:
        if kind not in TRANSFORMERS_CONTENDERS:
            raise ConfigError(f"no contender {kind!r}: transformers' are {sorted(TRANSFORMERS_CONTENDERS)}")
        self.name = kind
        self.options = parse_options(f"contender {kind}", TRANSFORMERS_CONTENDERS[kind], options)
        torch, transformers = _import_torch(kind)
        _set_threads(torch, threads, kind)
        self.torch = torch
        self.encoder_decoder = target.encoder is not None
        self.speech = is_speech_model(target)
        start = target.encoder.parts.decoder_start_token_id if target.encoder is not None else None
        major = int(transformers.__version__.split(".")[0])
        if kind == "hf-lookup" and start in target.spec.eos_token_ids and major < 5:
            # 4.x stops a step that found nothing to look up when the sequence so far ends in an EOS, as a decoder
            # that starts from one does at once (4.57 checked; 5.23 does not): its output would be empty
            raise ConfigError(
                f"contender hf-lookup: transformers {transformers.__version__} ends prompt lookup before the first "
                f"token on a model whose decoder starts from its EOS token ({start}, BART's convention): install "
                "transformers 5 or leave hf-lookup out"
            )
        self.model = self._load(transformers, "model", target)
        self.draft = self._load(transformers, "draft", target) if kind == "hf-assisted" else None
        eos = list(target.spec.eos_token_ids)
        pad = getattr(self.model.config, "pad_token_id", None)
        common = {
            "do_sample": False,
            "num_beams": 1,
            "eos_token_id": eos,
            "pad_token_id": pad if pad is not None else eos[0],
            "bos_token_id": getattr(self.model.config, "bos_token_id", None),
            **({"decoder_start_token_id": start} if start is not None else {}),
        }
        self.whisper: dict[str, Any] = {}
        self.extractor: Any = None
        self.audio = target.encoder.audio if target.encoder is not None else None
        if self.speech:
            self.whisper = _whisper_settings(target)
            common.update(self.whisper, forced_decoder_ids=None, return_timestamps=False)
            self.extractor = _feature_extractor(transformers, target, kind)
        self.config = transformers.GenerationConfig(**common)
        if kind == "hf-lookup":
            self.config.prompt_lookup_num_tokens = self.options["k"]
            self.config.max_matching_ngram_size = self.options["ngram"]
        self.draft_config = None
        if kind == "hf-assisted":
            self.draft_config = transformers.GenerationConfig(
                num_assistant_tokens=self.options["k"],
                num_assistant_tokens_schedule=self.options["schedule"],
                assistant_confidence_threshold=self.options["confidence"],
                **common,
            )

    def _load(self, transformers: Any, option: str, target: LoadedModel) -> Any:
        folder = self.options[option]
        if folder is None:
            raise ConfigError(
                f"contender {self.name} needs the {'target' if option == 'model' else 'draft'}'s transformers "
                f"weights: {self.name}({option}=DIR), DIR a folder from save_pretrained (config.json and the weights)"
            )
        path = Path(folder)
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"contender {self.name}: {option}={folder} holds no config.json: give a folder from save_pretrained"
            )
        config = transformers.AutoConfig.from_pretrained(path)
        if bool(getattr(config, "is_encoder_decoder", False)) != self.encoder_decoder:
            kinds = {True: "an encoder-decoder model", False: "a decoder-only model"}
            raise ConfigError(
                f"contender {self.name}: {option}={folder} is {kinds[not self.encoder_decoder]} but the bench's model "
                f"{target.name} is {kinds[self.encoder_decoder]}: give the weights it was exported from"
            )
        auto = transformers.AutoModelForSeq2SeqLM if self.encoder_decoder else transformers.AutoModelForCausalLM
        if self.speech:
            auto = transformers.AutoModelForSpeechSeq2Seq
        try:
            return auto.from_pretrained(path, dtype=self.torch.float32).eval()
        except (OSError, ValueError) as exc:
            raise ConfigError(f"contender {self.name}: cannot load {option}={folder}: {exc}") from exc

    def run(self, prompt: Prompt, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        torch = self.torch
        config = copy.deepcopy(self.config)
        config.max_new_tokens = max_new_tokens
        extra: dict[str, Any] = {}
        if self.draft is not None:
            # transformers keeps the draft's schedule state in its generation config between calls: every prompt
            # (and repeat) starts from the same settings
            self.draft.generation_config = copy.deepcopy(self.draft_config)
            extra["assistant_model"] = self.draft
        if isinstance(prompt, SpeechPrompt):
            inputs = self._speech_inputs(prompt, prompt_ids)
        else:
            ids = torch.tensor([prompt_ids], dtype=torch.long)
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        with _Probe(self) as probe, torch.inference_mode():
            out = self.model.generate(**inputs, generation_config=config, **extra)
            end = time.perf_counter()
        sequence = [int(t) for t in out[0]]
        if probe.target_encodes > 1:
            raise ConfigError(
                f"contender {self.name}: transformers' Whisper generate went over {prompt} {probe.target_encodes} "
                "times (it reads a timestamp token in the output as a segment's end and goes on from there), where "
                "decoctl generates once a window: the times would not compare. Suppress the timestamp tokens in the "
                f"model's {GENERATION_CONFIG} (suppress_tokens), as tools/whisper_bench_model.py does"
            )
        if isinstance(prompt, SpeechPrompt):
            tokens = self._after_speech_prompt(sequence, prompt_ids, probe.first_fed)
        else:
            tokens = sequence[1 if self.encoder_decoder else len(prompt_ids) :]
        greedy = self.name == "hf"
        decode_started = probe.first_forward_end if greedy else probe.prefill_end
        sizes = probe.sizes[1:] if greedy else probe.sizes
        chain: dict[int, int] = {}
        for size in sizes:
            chain[size] = chain.get(size, 0) + 1
        return Outcome(
            tokens=tuple(tokens[:max_new_tokens]),
            decode_seconds=end - decode_started,
            total_seconds=end - probe.started,
            target_forwards=len(sizes),
            ledger=ForwardLedger(chain=chain, other_seconds=probe.draft_seconds, basis="transformers forward hooks"),
        )

    def _speech_inputs(self, prompt: SpeechPrompt, prompt_ids: list[int]) -> dict[str, Any]:
        """generate()'s inputs for a recording: WhisperFeatureExtractor's features of decoctl's samples, and the
        language and task of ``prompt_ids`` (the decoder prompt decoctl built: start, language, task,
        ``<|notimestamps|>``)."""
        if self.audio is None:
            raise ConfigError(f"{prompt.shown}: an audio prompt, and contender {self.name} runs a text model")
        samples = read_audio(str(prompt.audio), self.audio)
        rate = self.audio.sampling_rate
        features = self.extractor(samples, sampling_rate=rate, return_tensors="pt")["input_features"]
        inputs: dict[str, Any] = {"input_features": features}
        languages = {int(v): k.strip("<|>") for k, v in (self.whisper.get("lang_to_id") or {}).items()}
        tasks = {int(v): k for k, v in (self.whisper.get("task_to_id") or {}).items()}
        for token in prompt_ids[1:]:
            if token in languages:
                inputs["language"] = languages[token]
            elif token in tasks:
                inputs["task"] = tasks[token]
        return inputs

    def _after_speech_prompt(self, sequence: list[int], prompt_ids: list[int], first_fed: Any) -> list[int]:
        """The tokens generate() made after the decoder prompt (transformers 4 returns the prompt with them, 5 leaves
        it out); ConfigError where its first forward did not start from decoctl's prompt (the outputs would not
        compare)."""
        fed = [int(t) for t in first_fed[0, : len(prompt_ids)]] if first_fed is not None else []
        if fed != list(prompt_ids):
            raise ConfigError(
                f"contender {self.name}: transformers' Whisper generate fed its decoder {fed}, not decoctl's decoder "
                f"prompt {list(prompt_ids)}: check the language and task tables of the model's {GENERATION_CONFIG}"
            )
        if sequence[: len(prompt_ids)] == list(prompt_ids):
            return sequence[len(prompt_ids) :]
        return sequence


def _whisper_settings(target: LoadedModel) -> dict[str, Any]:
    """The Whisper settings (WHISPER_SETTINGS) of the ONNX model's generation_config.json, as decoctl applies them."""
    path = target.spec.path / GENERATION_CONFIG
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return {key: config[key] for key in WHISPER_SETTINGS if config.get(key) is not None}


def _feature_extractor(transformers: Any, target: LoadedModel, kind: str) -> Any:
    """transformers' WhisperFeatureExtractor with the ONNX model's preprocessor_config.json (decoctl's features read
    the same file)."""
    try:
        return transformers.WhisperFeatureExtractor.from_pretrained(target.spec.path)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"contender {kind}: cannot read WhisperFeatureExtractor's settings from {target.spec.path} ({exc}): the "
            "speech model's folder needs its preprocessor_config.json"
        ) from exc


class _Probe:
    """Forward hooks over one generate() call: when it started, when the encoders finished (the last of them),
    when the target's first forward finished, how many tokens each target forward was fed, and the seconds the
    draft's forwards took."""

    def __init__(self, contender: TransformersContender) -> None:
        self.contender = contender
        self.sizes: list[int] = []
        #: how many times the target's encoder ran (more than once: generate() went over its input again)
        self.target_encodes = 0
        #: the ids of the target's first forward (the decoder prompt, and a first draft), int64[1, n]
        self.first_fed: Any = None
        self.draft_seconds = 0.0
        self.started = self.prefill_end = self.first_forward_end = 0.0
        self._draft_entered = 0.0
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> _Probe:
        contender = self.contender
        hooks = [contender.model.register_forward_pre_hook(self._target_fed, with_kwargs=True)]
        hooks.append(contender.model.register_forward_hook(self._target_done))
        for model in (contender.model, contender.draft):
            if model is not None and contender.encoder_decoder:
                hooks.append(model.get_encoder().register_forward_hook(self._encoded))
        if contender.encoder_decoder:
            hooks.append(contender.model.get_encoder().register_forward_hook(self._target_encoded))
        if contender.draft is not None:
            hooks.append(contender.draft.register_forward_pre_hook(self._draft_in))
            hooks.append(contender.draft.register_forward_hook(self._draft_out))
        for hook in hooks:
            self._stack.callback(hook.remove)
        self.started = self.prefill_end = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _target_fed(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        del module
        key = "decoder_input_ids" if self.contender.encoder_decoder else "input_ids"
        ids = kwargs.get(key, args[0] if args else None)
        if not self.sizes:
            self.first_fed = ids
        self.sizes.append(int(ids.shape[-1]) if ids is not None else 0)

    def _target_done(self, *_: Any) -> None:
        if not self.first_forward_end:
            self.first_forward_end = time.perf_counter()

    def _encoded(self, *_: Any) -> None:
        self.prefill_end = time.perf_counter()

    def _target_encoded(self, *_: Any) -> None:
        self.target_encodes += 1

    def _draft_in(self, *_: Any) -> None:
        self._draft_entered = time.perf_counter()

    def _draft_out(self, *_: Any) -> None:
        self.draft_seconds += time.perf_counter() - self._draft_entered
