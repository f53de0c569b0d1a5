"""Batch generation on Ray Data: a dataset's prompts run on a pool of actors, each holding one Generator whose rows
are batched continuously (decoctl.generation), as ``decoctl generate --prompts FILE --batch-size B`` runs them in one
process.

ds = ray.data.read_json("prompts.jsonl")            # a "prompt" column; "max_new_tokens", "seed", "stop" optional
out = decoctl.ray.generate_dataset(ds, models={"target": "pycode"}, batch_size=8, actors=4)
out.write_json("out/")                               # every column of ds, and "text", "stats", "completions"

Ray does the distributing: ``map_batches`` over an actor pool (``ActorPoolStrategy(size=actors)``, each actor
``num_cpus=threads``), with Ray's own scheduling, retries and back-pressure. An actor loads its models once; each
call hands it a block of prompts, which ``Generator.generate_batch`` runs on ``batch_size`` rows of one KV buffer,
refilled as prompts finish. Every prompt's output is the one it gets alone (greedy token for token, sampling the
same text for the same seed: each prompt draws from its own rng), so neither the number of actors nor the way Ray
cuts the dataset changes it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from decoctl.errors import ConfigError, DecoctlError, GenerationError
from decoctl.generation import PROMPT_KEYS, BatchPrompt, Generator, read_prompts, result_record
from decoctl.plugins import PluginRegistry, parse_processor_chain, resolve_controller, resolve_model
from decoctl.ray._cluster import connect, require_cpus
from decoctl.ray._runtime_env import worker_runtime_env
from decoctl.specs import parse_options

__all__ = [
    "OUTPUT_COLUMNS",
    "PromptActor",
    "check_columns",
    "check_plan",
    "generate_dataset",
    "plain_error",
    "prompt_dataset",
]

#: the columns generate_dataset adds: each prompt's text, its stats as ``decoctl generate --prompts`` writes them,
#: and its completions where the controller gave several (null otherwise)
OUTPUT_COLUMNS = ("text", "stats", "completions")
#: how many restarts an actor gets, and how many tries a block of prompts, before the run fails (Ray Data's
#: default is for ever: an actor that dies on every block, out of memory say, would never end the run)
RESTARTS = 3
#: what Ray Data appends to the message of an exception that failed a block
RETRIES_NOTE = "\nFailed to apply UDF transform"


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be a whole number, at least 1")
    return value


def generate_dataset(
    dataset: Any,
    models: Mapping[str, str | Path | None] | None = None,
    controller: str | type | object = "greedy",
    *,
    options: Mapping[str, Any] | None = None,
    processors: Any = None,
    threads: int = 1,
    prefill_chunk: int | None = None,
    huge_pages: bool = False,
    providers: Any = None,
    batch_size: int = 8,
    actors: int = 1,
    prompts_per_call: int | None = None,
    max_new_tokens: int = 128,
    stop: Sequence[str] = (),
    seed: int | None = 0,
    restarts: int = RESTARTS,
    wheels: str | Path | None = None,
    runtime_env: Mapping[str, Any] | None = None,
) -> Any:
    """``dataset`` (a ray.data.Dataset with a "prompt" column, and optionally "max_new_tokens", "seed" and "stop"
    ones, as a line of a prompts file has them) with each prompt's generation added: "text", "stats" (prompt_tokens,
    new_tokens, stop_reason, seconds, tokens_per_second, batched) and "completions" (text, stop_reason and score of
    each, where the controller gives several; else null). Its other columns pass through, and the rows keep their
    order where the dataset's context asks for it (``ds.context.execution_options.preserve_order = True``, as
    prompt_dataset's datasets do).

    The dataset is lazy, as Ray Data's are: the prompts run when it is consumed (``iter_rows``, ``write_json``, ...),
    on ``actors`` Ray actors of ``threads`` intra-op threads (Ray reserves as many CPUs for each). Each actor holds a
    Generator over ``models`` with ``controller``, ``options``, ``processors``, ``prefill_chunk`` and ``providers`` (as
    decoctl.Generator takes them; every actor loads the models itself, so give names or paths every node can read),
    and runs the ``prompts_per_call`` prompts Ray hands it at a time (default 4 x batch_size) on ``batch_size`` rows.
    ``max_new_tokens``, ``stop`` and ``seed`` are every prompt's unless its row gives its own (stop strings add up).

    The actors run decoctl, and the plugin distributions loaded here, from their wheels, which Ray's runtime
    environment ships to every node: from the folder ``wheels`` (or ``DECOCTL_RAY_WHEELS``) names, else the wheels
    they were installed from (or built from their source folder, for an editable install). ``runtime_env`` is
    merged into it (its ``py_modules`` and ``pip`` packages beside decoctl's). A node that cannot set it up fails the
    run with Ray's reason.

    An actor that dies (its node lost, its process killed) is restarted by Ray and its prompts run again, up to
    ``restarts`` times each; after that the run fails with the cause. ConfigError, before anything loads, for a
    cluster with fewer CPUs than actors x threads, for values out of range, for a wheel that is missing, broken or
    of a version other than the one installed here, and for a dataset whose columns are known without running it
    and lack "prompt" or already hold one of the columns it adds (else the first block says so). Ray is joined (or
    started locally) here if this process has not done so.
    """
    for name, value in (("threads", threads), ("batch_size", batch_size), ("actors", actors)):
        _positive(value, name)
    per_call = _positive(prompts_per_call, "prompts_per_call") if prompts_per_call is not None else 4 * batch_size
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise ConfigError(f"restarts={restarts!r} must be a whole number, 0 or more")
    generator = {
        "models": dict(models or {}),
        "controller": controller,
        "options": dict(options or {}),
        "processors": processors,
        "threads": threads,
        "prefill_chunk": prefill_chunk,
        "huge_pages": huge_pages,
        "providers": providers,
    }
    registry = check_plan(generator)
    ray = connect(None, "decoctl.ray.generate_dataset")
    schema = dataset.schema(fetch_if_missing=False)  # known without running anything, or None
    if schema is not None:
        check_columns(list(schema.names))
    from ray.data import ActorPoolStrategy

    plural = "s" if threads > 1 else ""
    require_cpus(ray, actors * threads, f"{actors} Ray actor{'s' if actors > 1 else ''} of {threads} thread{plural}")
    limits = {"max_new_tokens": max_new_tokens, "stop": tuple(stop), "seed": seed}
    environment = worker_runtime_env(ray, registry, wheels=wheels, runtime_env=runtime_env)
    with warnings.catch_warnings():
        # Ray Data takes an actor's restarts only as a plain remote argument (deprecated, with no named one yet)
        warnings.simplefilter("ignore", DeprecationWarning)
        return dataset.map_batches(
            PromptActor,
            fn_constructor_kwargs={"generator": generator, "batch_size": batch_size, "limits": limits},
            batch_size=per_call,
            batch_format="pyarrow",
            compute=ActorPoolStrategy(size=actors),
            num_cpus=threads,
            max_restarts=restarts,
            max_task_retries=restarts,
            runtime_env=environment,
        )


def check_columns(names: Sequence[str]) -> None:
    """ConfigError for a dataset without a "prompt" column, or with a column generate_dataset adds."""
    taken = [c for c in OUTPUT_COLUMNS if c in names]
    if taken:
        raise ConfigError(
            f"the dataset already has the column(s) {taken}, which generate_dataset adds: rename or drop them"
        )
    if "prompt" not in names:
        raise ConfigError(f'the dataset has no "prompt" column (it has {list(names)}): add or rename one')


def check_plan(generator: Mapping[str, Any]) -> PluginRegistry:
    """What a Generator with these arguments checks before it loads a model (the controller, its options, the
    logits chain, the models' names), checked once here, so that a mistake is one error before any actor starts
    rather than one in every actor: the registry it checked them with."""
    registry = PluginRegistry()
    options = generator.get("options") or {}
    spec = resolve_controller(generator.get("controller", "greedy"), registry, options=options)
    parsed = parse_options(f"controller {spec.name!r}", spec.options, options)
    if spec.check_options is not None:
        spec.check_options(parsed)
    parse_processor_chain(generator.get("processors"), registry)
    for reference in (generator.get("models") or {}).values():
        if isinstance(reference, str | Path) or reference is None:
            resolve_model(reference, registry)
    return registry


def prompt_dataset(
    prompts: str | Path | Sequence[str | Mapping[str, Any] | BatchPrompt], *, actors: int = 1, batch_size: int = 8
) -> Any:
    """A dataset of ``prompts`` (a JSONL prompts file's path, as ``decoctl generate --prompts`` reads it, or prompt
    strings, mappings with a prompts file line's keys, BatchPrompts) with their "index", cut into blocks so that
    every one of ``actors`` has some (at most 4 x batch_size prompts a block), whose rows keep their order through
    generate_dataset and whose failures are raised as the actor raised them. ConfigError naming the line or prompt
    that is not one."""
    import pyarrow as pa
    import ray.data

    given = read_prompts(prompts) if isinstance(prompts, str | Path) else prompts
    items = [BatchPrompt.of(p, f"prompt {i}") for i, p in enumerate(given)]
    if not items:
        raise ConfigError("prompt_dataset: no prompts given")

    table = pa.table(
        {
            "index": pa.array(range(len(items)), pa.int64()),
            "prompt": pa.array([p.prompt for p in items], pa.string()),
            "max_new_tokens": pa.array([p.max_new_tokens for p in items], pa.int64()),
            "seed": pa.array([p.seed for p in items], pa.int64()),
            "stop": pa.array([list(p.stop) for p in items], pa.list_(pa.string())),
        }
    )
    per_block = max(1, min(4 * batch_size, math.ceil(len(items) / actors)))
    blocks = math.ceil(len(items) / per_block)
    dataset = ray.data.from_arrow([table.slice(start * per_block, per_block) for start in range(blocks)])
    # this dataset's own context (a copy of the current one): its rows in order, and a prompt's failure raised as
    # the exception the actor raised (decoctl's), not as Ray Data's wrapping of it
    dataset.context.execution_options.preserve_order = True
    dataset.context.raise_original_map_exception = True
    return dataset


class PromptActor:
    """One actor of the pool: a Generator made once (its models loaded), and each call's prompts run on
    ``batch_size`` rows. A DecoctlError crosses back to the driver as a plain one of its class (its message); one
    that making the Generator raised is raised by the first call, so that Ray fails the run with it rather than
    starting actors again (an actor that fails as it starts is replaced)."""

    def __init__(self, *, generator: dict[str, Any], batch_size: int, limits: dict[str, Any]) -> None:
        self.batch_size = batch_size
        self.limits = limits
        self.failed: DecoctlError | None = None
        try:
            self.generator: Generator | None = Generator(**generator)
        except DecoctlError as exc:
            self.generator, self.failed = None, plain_error(exc)

    def __call__(self, table: Any) -> Any:
        import pyarrow as pa

        if self.generator is None:
            raise self.failed or DecoctlError("this actor has no Generator")

        check_columns(table.column_names)
        indices = table.column("index").to_pylist() if "index" in table.column_names else None
        rows = table.select([c for c in PROMPT_KEYS if c in table.column_names]).to_pylist()
        prompts = []
        for position, row in enumerate(rows):
            where = f"prompt {indices[position]}" if indices else f"row {position} of a block of {len(rows)}"
            given = {k: v for k, v in row.items() if v is not None and not (k == "stop" and not v)}
            prompts.append(BatchPrompt.of(given, where))
        try:
            results = self.generator.generate_batch(prompts, batch_size=self.batch_size, **self.limits)
        except DecoctlError as exc:
            where = f"prompts {indices[0]} to {indices[-1]}" if indices else f"a block of {len(rows)} prompts"
            raise plain_error(exc, where) from None
        records = [result_record(i, r) for i, r in enumerate(results)]
        table = table.append_column("text", pa.array([r["text"] for r in records], pa.string()))
        table = table.append_column("stats", pa.array([r["stats"] for r in records], _stats_type()))
        return table.append_column(
            "completions", pa.array([r.get("completions") for r in records], _completions_type())
        )


def plain_error(error: DecoctlError, where: str = "") -> DecoctlError:
    """``error`` as a plain one of its class, its message prefixed with ``where``: what Ray can pickle across to the
    driver (a GenerationError's text and stats do not cross; its message does, as a DecoctlError). What Ray Data
    appends to the message of an exception that failed a block (its retries) is left out."""
    message = str(error).split(RETRIES_NOTE)[0]
    message = f"{where}: {message}" if where else message
    if isinstance(error, GenerationError):
        return DecoctlError(message)
    try:
        return type(error)(message)
    except TypeError:
        return DecoctlError(message)


def _stats_type() -> Any:
    import pyarrow as pa

    return pa.struct(
        [
            ("prompt_tokens", pa.int64()),
            ("new_tokens", pa.int64()),
            ("stop_reason", pa.string()),
            ("seconds", pa.float64()),
            ("tokens_per_second", pa.float64()),
            ("batched", pa.string()),
        ]
    )


def _completions_type() -> Any:
    import pyarrow as pa

    return pa.list_(pa.struct([("text", pa.string()), ("stop_reason", pa.string()), ("score", pa.float64())]))
