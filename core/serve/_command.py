"""``decoctl serve`` (the OpenAI-compatible server) and ``decoctl chat`` (a chat in the terminal).

The server loads its models once, at start, as the operator names them (a target, and the roles its bundle or the
flags give): requests choose among those and the installed plugins only. It binds 127.0.0.1 unless ``--host`` says
otherwise.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from decoctl._runfile import key_values
from decoctl.errors import ConfigError
from decoctl.generation._tool_formats import TOOL_FORMATS
from decoctl.model._image_processor import MAX_IMAGES, MAX_PIXELS
from decoctl.model._providers import add_provider_argument
from decoctl.plugins import PluginRegistry
from decoctl.serve._join_rule import PREFILL_SHARE, JoinRule

#: how long a drain (SIGTERM, Ctrl-C) lets the running completions finish before it cuts them
DRAIN_SECONDS = 30.0

__all__ = ["add_serve_parsers", "load_roles", "run_chat", "run_serve"]

HUGE_PAGES_HELP = "leave the weights on ordinary pages (no malloc or madvise tuning)"


def add_prefix_cache_argument(parser: argparse.ArgumentParser) -> None:
    """``--prefix-cache-mb`` (serve, chat, generate)."""
    parser.add_argument(
        "--prefix-cache-mb",
        type=float,
        metavar="MB",
        help="keep prompts and answers in a prefix cache of this many MiB: a prompt that starts with a kept one (a "
        "shared system prompt, the conversation so far) copies its KV instead of computing it again; outputs are the "
        "same with it on and off (default: off)",
    )


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", help="registered model name or folder (default: the demo model 'pycode')")
    parser.add_argument("--draft", help="model for the 'draft' role")
    parser.add_argument("--role", action="append", default=[], metavar="ROLE=MODEL", help="model for any other role")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: cores/2, as onnxruntime-genai)")
    parser.add_argument("--chat-template", metavar="FILE", help="a Jinja chat template instead of the model's own")
    parser.add_argument("--no-huge-pages", action="store_true", help=HUGE_PAGES_HELP)
    add_provider_argument(parser)


def add_serve_parsers(commands: Any) -> None:
    """The ``serve``, ``chat`` and ``bench-serve`` subcommands."""
    from decoctl.serve._bench import add_bench_serve_parser

    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (needs pip install 'decoctl[serve]')")
    _add_model_arguments(serve)
    serve.add_argument(
        "--lazy-weights",
        action="store_true",
        help="leave the weights file's pages to be read as the load first touches them (default: all resident at "
        "start, so memory is flat and no token's first use waits on a page fault)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    serve.add_argument("--max-rows", type=int, default=8, help="completions running at once (rows of the KV buffer)")
    serve.add_argument("--max-queue", type=int, default=64, help="requests waiting for rows; more get 429")
    serve.add_argument("--max-length", type=int, help="positions per row, prompt and completion (default: the model's)")
    serve.add_argument(
        "--prefill-chunk",
        type=int,
        help="feed prompts this many tokens an engine step, so a long prompt delays the other rows by one chunk",
    )
    add_prefix_cache_argument(serve)
    serve.add_argument(
        "--prefill-share",
        type=float,
        default=PREFILL_SHARE,
        help=f"prompt work a step may add while rows decode, a share of the batched step (default {PREFILL_SHARE}): "
        "more admits prompts sooner and keeps the batch fuller, less keeps the decoding rows' inter-token latency low",
    )
    serve.add_argument(
        "--deterministic",
        action="store_true",
        help="every answer bitwise decoctl generate's under any load: prompts in generate's forwards (whole, or "
        "--prefill-chunk C at positions 0, C, 2C, ... as generate --prefill-chunk C), no joined speculation, rows "
        "stepped alone where a model's batched step differs (costs: docs/BENCHMARKS.md, Serving)",
    )
    serve.add_argument(
        "--api-key", help="require 'Authorization: Bearer KEY' on /v1/ (default: $DECOCTL_API_KEY, else none)"
    )
    serve.add_argument("--name", help="the model id clients send (default: the model's name)")
    serve.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=FILE.onnx_adapter",
        help="a LoRA adapter of the target (repeatable): requests name it as model BASE:NAME, and rows of different "
        "adapters decode in one batched Run (docs/ADAPTERS.md)",
    )
    serve.add_argument(
        "--max-images",
        type=int,
        default=MAX_IMAGES,
        help=f"images one chat request may carry (default {MAX_IMAGES}); more are a 400",
    )
    serve.add_argument(
        "--max-image-pixels",
        type=int,
        default=MAX_PIXELS,
        help=f"pixels an image may have, as sent and once resized (default {MAX_PIXELS:,}); more are a 400, "
        "checked before the image is decoded",
    )
    serve.add_argument(
        "--tool-parser",
        choices=tuple(TOOL_FORMATS),
        help="the format the model writes tool calls in (default: the one its chat template shows)",
    )
    serve.add_argument(
        "--max-audio-mb",
        type=float,
        default=25.0,
        help="a speech model's uploads: the largest audio file taken, in MiB (default 25); more are a 413",
    )
    serve.add_argument(
        "--max-audio-seconds",
        type=float,
        default=600.0,
        help="a speech model's uploads: the longest audio taken, in seconds (default 600); more are a 400",
    )
    serve.add_argument(
        "--drain-seconds",
        type=float,
        default=DRAIN_SECONDS,
        help=f"on SIGTERM or Ctrl-C, how long the running completions may take to finish (default {DRAIN_SECONDS:g}); "
        "new requests get 503 meanwhile, and what still runs after it is cut (finish_reason 'shutdown')",
    )
    chat = commands.add_parser("chat", help="chat with a model in the terminal (needs pip install 'decoctl[chat]')")
    _add_model_arguments(chat)
    chat.add_argument("--controller", "-c", default="greedy", help="an installed controller (default greedy)")
    chat.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE", help="controller option")
    chat.add_argument("--processors", "-p", help='logits chain, e.g. "temperature=0.7,top_p=0.9"')
    chat.add_argument("--max-new-tokens", "-n", type=int, default=512, help="longest answer (default 512)")
    chat.add_argument("--seed", type=int, default=0)
    chat.add_argument("--system", help="a system message to start every conversation with")
    add_prefix_cache_argument(chat)
    chat.add_argument(
        "--tools", metavar="FILE.json", help="OpenAI tools (a JSON list) the model may call; you type each result"
    )
    chat.add_argument(
        "--tool-parser", choices=tuple(TOOL_FORMATS), help="the model's tool-call format (default: its template's)"
    )
    chat.add_argument(
        "--tool-choice", default="auto", help="auto (default), required, none, or the one function to call"
    )
    chat.add_argument("--no-parallel-tool-calls", action="store_true", help="at most one call an answer")
    add_bench_serve_parser(commands)


def load_roles(args: argparse.Namespace, registry: PluginRegistry) -> dict[str, Any]:
    """The models the command's flags name, loaded: the target, its bundle's other roles, --draft and --role."""
    from decoctl.model._adapters import with_adapters
    from decoctl.model._loader import load_model
    from decoctl.model._providers import providers_by_role
    from decoctl.plugins import resolve_model
    from decoctl.specs import normalise_name

    name, path = resolve_model(args.model, registry)
    references: dict[str, Any] = {}
    bundle = registry.models().get(normalise_name(name)) if args.model is None or "/" not in str(args.model) else None
    if bundle is not None:
        references.update(bundle.roles)
    if args.draft:
        references["draft"] = args.draft
    references.update(key_values(args.role, "--role"))
    huge = not args.no_huge_pages
    providers = providers_by_role(args.provider or None, ["target", *references])
    adapters = key_values(getattr(args, "adapter", None) or [], "--adapter")
    target = load_model(
        path, name=name, threads=args.threads, huge_pages=huge, provider=providers["target"], lora_stacks=bool(adapters)
    )
    models = {"target": with_adapters(target, adapters) if adapters else target}
    for role, reference in references.items():
        role_name, role_path = resolve_model(reference, registry)
        models[role] = load_model(
            role_path, name=role_name, threads=args.threads, huge_pages=huge, provider=providers[role]
        )
    if not getattr(args, "lazy_weights", True):
        from decoctl.model._resident import populate

        for model in models.values():
            populate(model.spec.path)
    return models


def _chat_template(args: argparse.Namespace, folder: Path, *, required: bool) -> Any:
    from decoctl.generation import ChatTemplate

    try:
        return ChatTemplate.from_folder(folder, template=args.chat_template)
    except ConfigError:
        if required or args.chat_template:
            raise
        return None


def run_serve(args: argparse.Namespace, registry: PluginRegistry) -> int:
    try:
        from decoctl.serve._app import create_app
        from decoctl.serve._engine import Engine
        from decoctl.serve._server import Server
    except ImportError as exc:
        raise ConfigError(
            f"decoctl serve needs the serve extra ({exc.name} is missing): pip install 'decoctl[serve]'"
        ) from None
    from decoctl.serve._transcriber import Transcriber, is_speech_model, transcriber_from_args

    models = load_roles(args, registry)
    target = models["target"]
    speech = is_speech_model(target)  # served by a transcription worker: the engine steps decoder-only rows
    template = None if speech else _chat_template(args, target.spec.path, required=False)
    engine: Engine | Transcriber = (
        transcriber_from_args(args, models, registry)
        if speech
        else Engine(
            models,
            registry=registry,
            max_rows=args.max_rows,
            max_queue=args.max_queue,
            max_length=args.max_length,
            prefill_chunk=args.prefill_chunk,
            join_rule=JoinRule(prefill_share=args.prefill_share),
            deterministic=args.deterministic,
            prefix_cache_mb=args.prefix_cache_mb,
        )
    )
    api_key = args.api_key or os.environ.get("DECOCTL_API_KEY") or None
    name = args.name or target.name
    app = create_app(
        engine,
        model_name=name,
        chat_template=template,
        api_key=api_key,
        max_images=args.max_images,
        max_image_pixels=args.max_image_pixels,
        tool_parser=args.tool_parser,
        max_audio_bytes=int(args.max_audio_mb * (1 << 20)),
        max_audio_seconds=args.max_audio_seconds,
    )
    # the socket is bound here, so the address printed is the one bound (--port 0 picks a free port)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
        sock.listen(2048)  # clients may connect from now on: the kernel queues them until the server accepts
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {args.host}:{args.port} ({exc.strerror}): pick another --port") from None
    port = sock.getsockname()[1]
    chat = "with" if template is not None else "without"
    serving = f"{engine.max_rows} rows of {engine.max_length} positions; {chat} a chat template"
    if speech:
        serving = "speech: POST /v1/audio/transcriptions, one at a time"
    print(
        f"decoctl: serving {name} ({', '.join(sorted(models))}; {serving}) on http://{args.host}:{port}",
        file=sys.stderr,
        flush=True,
    )
    server = Server(app, engine, drain_seconds=args.drain_seconds)
    server.run(sockets=[sock])
    if engine.failure is not None:  # ended non-zero, so that a supervisor starts it again
        print(f"decoctl: error: {engine.failure}: the server stopped", file=sys.stderr, flush=True)
        return 1
    return 0


def run_chat(
    args: argparse.Namespace, registry: PluginRegistry, *, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> int:
    """A conversation in the terminal: each line the user types is a message, the answer streams (Ctrl-C stops it
    where it is); ``/reset`` starts over, ``/quit`` (or end of input) leaves."""
    from decoctl.generation import Generator

    given_in, out = stdin or sys.stdin, stdout or sys.stdout
    roles: dict[str, Any] = {"target": args.model}
    if args.draft:
        roles["draft"] = args.draft
    roles.update(key_values(args.role, "--role"))
    options: Mapping[str, Any] = key_values(args.option, "--option")
    generator = Generator(
        roles,
        args.controller,
        options=options,
        processors=args.processors,
        registry=registry,
        threads=args.threads,
        huge_pages=not args.no_huge_pages,
        providers=args.provider or None,
        prefix_cache_mb=args.prefix_cache_mb,
    )
    target = generator.models["target"]
    template = _chat_template(args, target.spec.path, required=True)
    tools = None
    if args.tools:
        from decoctl.serve._tool_chat import ToolChat

        tools = ToolChat.of(
            args.tools,
            template,
            tool_parser=args.tool_parser,
            choice=args.tool_choice,
            parallel=not args.no_parallel_tool_calls,
        )
        grammar = tools.processors(generator)
        if grammar:  # the same models, the tools' grammar first in the chain
            chain = [*grammar, *([args.processors] if args.processors else [])]
            generator = Generator(
                dict(generator.models),
                args.controller,
                options=options,
                processors=chain,
                registry=registry,
                prefix_cache_mb=args.prefix_cache_mb,
            )
    start = [{"role": "system", "content": args.system}] if args.system else []
    history = list(start)
    interactive = given_in.isatty()
    out.write(f"decoctl chat with {target.name} ({generator.spec.name}): /reset starts over, /quit leaves\n")
    while True:
        if interactive:
            out.write("> ")
        out.flush()
        line = given_in.readline()
        if not line:
            break
        text = line.rstrip("\n")
        if text.strip() == "/quit":
            break
        if text.strip() == "/reset":
            history = list(start)
            out.write("(conversation reset)\n")
            continue
        if not text.strip():
            continue
        history.append({"role": "user", "content": text})
        while True:  # with tools: again after each answer whose calls got their results
            if tools is not None:
                prompt = tools.prompt(generator, history, template)
            else:
                prompt = generator.chat_prompt(history, template=template)
            pieces = []
            stream = generator.stream(prompt, max_new_tokens=args.max_new_tokens, seed=args.seed)
            try:
                for piece in stream:
                    pieces.append(piece)
                    out.write(piece)
                    out.flush()
            except KeyboardInterrupt:  # Ctrl-C ends this answer (kept as far as it got), not the conversation
                stream.close()
                out.write(" [stopped]")
            out.write("\n")
            history.append({"role": "assistant", "content": "".join(pieces)})
            if tools is None or not tools.answered(generator, history, given_in, out, interactive):
                break
    return 0
