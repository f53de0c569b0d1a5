"""``decoctl serve`` as Ray Serve replicas behind one OpenAI-compatible endpoint.

Each replica is what ``decoctl serve`` is on one machine: its models loaded once, one Engine whose thread owns them,
the same Starlette app (decoctl.serve.create_app) as the replica's ASGI ingress. Ray Serve does the rest: its proxy
takes the HTTP requests and routes each to a replica with room (``max_ongoing_requests`` = the replica's rows, so a
replica gets as many requests as it can batch), streams the answers back, cancels a request in its replica when the
client leaves (the app then frees its rows), restarts a replica that dies and scales between ``min_replicas`` and
``max_replicas`` under an ``autoscaling_config``.

    decoctl serve --ray-replicas 2 --threads 1 --max-rows 8          # a local cluster, or --ray-address HOST:6379
    serve run decoctl.ray:build_app model=pycode replicas=2 threads=1 max_rows=8

``application(...)`` gives the same application to a program of one's own (``serve.run(application(...))``), and
``build_app`` to ``serve run`` and to Serve's config files (``import_path: decoctl.ray:build_app`` with ``args``).
The replicas of ``decoctl serve --ray-replicas`` and ``application`` run decoctl from its wheels, shipped through
Ray's runtime environment (decoctl.ray._runtime_env); those of ``build_app`` run the decoctl the cluster has (its
image, or the runtime_env of ``serve run`` or of the config file), since Serve builds them on the cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Mapping
from typing import Any

from decoctl import errors
from decoctl.errors import ConfigError, DecoctlError
from decoctl.model._image_processor import MAX_IMAGES, MAX_PIXELS
from decoctl.plugins import PluginRegistry, resolve_model
from decoctl.ray._cluster import connect, joined, require_cpus, require_ray
from decoctl.ray._command import decoctl_error
from decoctl.ray._runtime_env import setup_error, worker_runtime_env
from decoctl.serve._join_rule import PREFILL_SHARE, JoinRule

__all__ = ["APP_NAME", "REPLICA_HEADER", "Replica", "application", "build_app", "run_replicas"]

#: the Serve application's name (``serve status`` lists it so)
APP_NAME = "decoctl"
#: the response header naming the replica that answered
REPLICA_HEADER = "x-decoctl-replica"
#: how often Serve builds a replica again after its constructor failed (a model that does not load) before the
#: deployment fails (Serve's default is 20)
CONSTRUCTOR_RETRIES = 3

#: what each replica loads and how it serves (build_app's arguments), with their types and defaults
REPLICA_ARGS: dict[str, tuple[type, Any]] = {
    "model": (str, None),
    "draft": (str, None),
    "threads": (int, 1),
    "max_rows": (int, 8),
    "max_queue": (int, 64),
    "max_length": (int, None),
    "prefill_chunk": (int, None),
    "prefill_share": (float, PREFILL_SHARE),
    "chat_template": (str, None),
    "name": (str, None),
    "api_key": (str, None),
    "huge_pages": (bool, False),
    #: every weight page resident at start (decoctl.model._resident); False: as the load first touches them
    "resident_weights": (bool, True),
    "deterministic": (bool, False),
    "max_images": (int, MAX_IMAGES),
    "max_image_pixels": (int, MAX_PIXELS),
    "tool_parser": (str, None),
    #: the execution provider of every role, as one --provider value ("openvino:num_of_threads=1", "draft=cpu")
    "provider": (str, None),
    #: LoRA adapters of the target, name -> .onnx_adapter file (each replica loads them; requests name BASE:NAME)
    "adapters": (dict, None),
}
#: build_app's arguments about the deployment rather than a replica
DEPLOYMENT_ARGS: dict[str, tuple[type, Any]] = {
    "replicas": (int, 1),
    "autoscaling": (dict, None),
    "roles": (dict, None),
}


class Replica:
    """One replica: the models loaded once, an Engine, and the app ``decoctl serve`` runs, as Serve's ingress
    (``__serve_build_asgi_app__``). Its responses name it in the ``x-decoctl-replica`` header."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        from decoctl.serve._app import create_app
        from decoctl.serve._command import load_roles
        from decoctl.serve._engine import Engine

        registry = PluginRegistry()
        roles = [f"{role}={model}" for role, model in (config.get("roles") or {}).items()]
        flags = argparse.Namespace(
            model=config.get("model"),
            draft=config.get("draft"),
            role=roles,
            threads=config["threads"],
            no_huge_pages=not config.get("huge_pages"),
            lazy_weights=not config.get("resident_weights", True),
            provider=[config["provider"]] if config.get("provider") else [],
            adapter=[f"{name}={path}" for name, path in (config.get("adapters") or {}).items()],
        )
        models = load_roles(flags, registry)
        self.engine = Engine(
            models,
            registry=registry,
            max_rows=config["max_rows"],
            max_queue=config["max_queue"],
            max_length=config.get("max_length"),
            prefill_chunk=config.get("prefill_chunk"),
            join_rule=JoinRule(prefill_share=config.get("prefill_share", PREFILL_SHARE)),
            deterministic=bool(config.get("deterministic")),
        )
        self.decoctl_app = create_app(
            self.engine,
            model_name=config.get("name") or models["target"].name,
            chat_template=_chat_template(models["target"].spec.path, config.get("chat_template")),
            api_key=config.get("api_key"),
            max_images=config.get("max_images", MAX_IMAGES),
            max_image_pixels=config.get("max_image_pixels", MAX_PIXELS),
            tool_parser=config.get("tool_parser"),
        )

    def __serve_build_asgi_app__(self) -> Any:
        from ray import serve

        return _naming(self.decoctl_app, serve.get_replica_context().replica_id.unique_id)


def _chat_template(folder: Any, path: str | None) -> Any:
    """The chat template the replica answers chats with: ``path``'s, else the model's own, else none (only
    completions then); a ``path`` that does not load is an error."""
    from decoctl.generation import ChatTemplate

    try:
        return ChatTemplate.from_folder(folder, template=path)
    except ConfigError:
        if path:
            raise
        return None


def _naming(app: Any, replica: str) -> Any:
    """``app`` with a header on every HTTP response naming the replica that gave it."""
    header = (REPLICA_HEADER.encode(), replica.encode())

    async def named(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        await app(scope, receive, sending)

    return named


def _checked(given: Mapping[str, Any], known: Mapping[str, tuple[type, Any]]) -> dict[str, Any]:
    """``given`` (from a command line, ``serve run KEY=VALUE`` strings or a config file's values) over the
    defaults, each of its type; ConfigError naming an unknown key or a value of the wrong kind."""
    values = {key: default for key, (_, default) in known.items()}
    for key, value in given.items():
        if key not in known:
            raise ConfigError(f"decoctl.ray.build_app: unknown argument {key!r}: it takes {sorted(known)}")
        kind = known[key][0]
        if value is None:
            values[key] = None
            continue
        try:
            if kind is bool and isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                value = value.lower() in ("true", "1")
            elif kind is dict and isinstance(value, str):
                value = json.loads(value)
            elif kind is int and not isinstance(value, bool):
                value = int(value)
            elif kind is float and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind):
                raise ValueError(value)
        except ValueError:
            raise ConfigError(f"decoctl.ray.build_app: {key}={value!r} must be a {kind.__name__}") from None
        values[key] = value
    for key in ("threads", "max_rows", "replicas", "max_images", "max_image_pixels"):
        if key in values and values[key] < 1:
            raise ConfigError(f"decoctl.ray.build_app: {key}={values[key]} must be at least 1")
    return values


def application(
    *, wheels: str | os.PathLike[str] | None = None, runtime_env: Mapping[str, Any] | None = None, **args: Any
) -> Any:
    """The Ray Serve application of ``decoctl serve``: ``replicas`` replicas (or ``autoscaling``, Serve's
    autoscaling_config as a mapping, passed through), each with ``threads`` intra-op threads (Ray reserves as many
    CPUs for it), ``max_rows`` rows and ``max_queue`` waiting requests, loading ``model`` (and ``draft``, ``roles``:
    role -> model) as ``decoctl serve`` does.

    The replicas run decoctl, and the plugin distributions loaded here, from their wheels, shipped to every node
    through Ray's runtime environment as decoctl.ray.generate_dataset ships them (``wheels``: their folder;
    ``runtime_env`` merged in), so Ray is joined (or started locally) here if this process has not done so.
    ConfigError for an unknown argument, a value of the wrong kind, or a wheel that is missing, broken or of a
    version other than the one installed here."""
    require_ray("decoctl.ray.application")
    deployment, config = _deployment(args)
    ray = connect(None, "decoctl.ray.application")
    environment = worker_runtime_env(ray, PluginRegistry(), wheels=wheels, runtime_env=runtime_env)
    return deployment.options(ray_actor_options={"num_cpus": config["threads"], "runtime_env": environment}).bind(
        config
    )


def _deployment(args: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The Serve deployment of ``args`` (application's), and each replica's configuration."""
    require_ray("decoctl.ray._serve")
    deployment_args = _checked({k: v for k, v in args.items() if k in DEPLOYMENT_ARGS}, DEPLOYMENT_ARGS)
    config = _checked({k: v for k, v in args.items() if k not in DEPLOYMENT_ARGS}, REPLICA_ARGS)
    config["roles"] = deployment_args["roles"] or {}
    from ray import serve

    scale: dict[str, Any] = {"num_replicas": deployment_args["replicas"]}
    if deployment_args["autoscaling"] is not None:
        scale = {"autoscaling_config": deployment_args["autoscaling"]}
    deployment = serve.deployment(
        serve.ingress()(Replica),
        name="decoctl",
        ray_actor_options={"num_cpus": config["threads"]},
        # a replica takes as many requests as it has rows (Serve's default, 5, would cap its batching); the ones
        # beyond wait in Serve's queue, up to max_queue, for whichever replica frees a row first
        max_ongoing_requests=config["max_rows"],
        max_queued_requests=config["max_queue"],
        max_constructor_retry_count=CONSTRUCTOR_RETRIES,
        **scale,
    )
    return deployment, config


def build_app(args: Mapping[str, Any]) -> Any:
    """``serve run decoctl.ray:build_app KEY=VALUE ...`` and a Serve config file's ``import_path``: the
    application of ``application(**args)`` (the values may be strings, as ``serve run`` passes them), whose replicas
    run the decoctl the cluster has: Serve may build it on the cluster, where there are no wheels to ship (give
    ``serve run`` a runtime_env, or put decoctl in the nodes' image). Ray is not joined here."""
    deployment, config = _deployment(dict(args))
    return deployment.bind(config)


def _replica_error(serve: Any) -> DecoctlError | None:
    """The DecoctlError a replica's constructor raised (a model that does not load, say), from the message Serve
    keeps for the failed deployment: its traceback's last "decoctl.errors.Name: message" line; or the reason a node
    could not set up the replicas' runtime environment."""
    try:
        deployments = serve.status().applications[APP_NAME].deployments
    except Exception:  # no status to read: Serve's own error stands
        return None
    text = "\n".join(str(getattr(d, "message", "")) for d in deployments.values())
    not_set_up = setup_error(RuntimeError(text))
    if not_set_up is not None:
        return not_set_up
    found = re.findall(r"^decoctl\.errors\.(\w+): (.*)$", text, flags=re.MULTILINE)
    if not found:
        return None
    name, message = found[-1]
    kind = getattr(errors, name, DecoctlError)
    return kind(message) if isinstance(kind, type) and issubclass(kind, DecoctlError) else DecoctlError(message)


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _one_provider(given: list[str]) -> str | None:
    """The one ``--provider`` value every replica takes (None: the CPU provider); ConfigError for more than one."""
    if len(given) > 1:
        raise ConfigError(
            f"--ray-replicas takes one --provider (got {len(given)}: {', '.join(given)}): give the replicas' "
            "provider once"
        )
    return given[0] if given else None


def run_replicas(args: argparse.Namespace, registry: PluginRegistry) -> int:
    """``decoctl serve --ray-replicas N``: the application on a local Ray cluster (or the one at
    ``--ray-address``), Serve's HTTP proxy on --host/--port, until SIGINT or SIGTERM; then the local cluster is shut
    down, or the application deleted from the cluster at the address."""
    require_ray("decoctl serve --ray-replicas")
    replicas = args.ray_replicas
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ConfigError(f"--ray-replicas {replicas} must be at least 1 (replicas, each with its own models)")
    threads = args.threads or 1
    try:
        autoscaling = json.loads(args.ray_autoscaling) if args.ray_autoscaling else None
    except ValueError as exc:
        raise ConfigError(
            f"--ray-autoscaling is not JSON ({exc}): give Serve's autoscaling_config as an object"
        ) from None
    for reference in (args.model, args.draft, *(r.partition("=")[2] for r in args.role)):
        if reference is not None:
            resolve_model(reference, registry)  # a name that is not registered: refused before Ray starts
    deployment, config = _deployment(
        dict(
            model=args.model,
            draft=args.draft,
            roles=dict(r.split("=", 1) for r in args.role),
            threads=threads,
            max_rows=args.max_rows,
            max_queue=args.max_queue,
            max_length=args.max_length,
            prefill_chunk=args.prefill_chunk,
            prefill_share=args.prefill_share,
            chat_template=args.chat_template,
            name=args.name,
            api_key=args.api_key,
            huge_pages=not args.no_huge_pages,
            resident_weights=not args.lazy_weights,
            deterministic=args.deterministic,
            provider=_one_provider(args.provider),
            max_images=args.max_images,
            max_image_pixels=args.max_image_pixels,
            tool_parser=args.tool_parser,
            # each replica reads the adapter files itself: absolute paths, as the nodes share a file system
            adapters={k: os.path.abspath(v) for k, v in (a.split("=", 1) for a in args.adapter)}
            if getattr(args, "adapter", None)
            else None,
            replicas=replicas,
            autoscaling=autoscaling,
        )
    )
    local = not args.ray_address and not os.environ.get("RAY_ADDRESS")
    with joined(args.ray_address, "decoctl serve --ray-replicas") as ray:
        least = int(autoscaling.get("min_replicas", 1)) if autoscaling else replicas
        plural = "s" if threads > 1 else ""
        what = f"{least} Serve replica{'s' if least > 1 else ''} of {threads} thread{plural}"
        require_cpus(ray, least * threads, what)
        environment = worker_runtime_env(ray, registry, wheels=getattr(args, "ray_wheels", None))
        app = deployment.options(ray_actor_options={"num_cpus": threads, "runtime_env": environment}).bind(config)
        from ray import serve

        port = args.port or _free_port(args.host)
        serve.start(http_options={"host": args.host, "port": port})
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
        except Exception as exc:
            error = decoctl_error(exc) or setup_error(exc) or _replica_error(serve)
            serve.shutdown()
            if error is None and not isinstance(exc, ray.exceptions.RayError | RuntimeError):
                raise
            raise (error or DecoctlError(f"the Serve replicas did not start: {str(exc).strip()[:500]}")) from None
        stop = threading.Event()
        previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
        print(
            f"decoctl: serving on http://{args.host}:{port} ({replicas} Ray Serve replica{'s' if replicas > 1 else ''}"
            f" of {threads} thread{plural}, {args.max_rows} rows each)",
            file=sys.stderr,
            flush=True,
        )
        try:
            stop.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if not local:  # a local cluster goes down whole as the command leaves (joined)
                serve.delete(APP_NAME)
    return 0
