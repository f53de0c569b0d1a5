"""``decoctl generate --prompts FILE --ray-actors N``: the prompts file through decoctl.ray.generate_dataset, the
same JSON lines as the single-process command writes, in the file's order."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

from decoctl.errors import ConfigError, DecoctlError
from decoctl.generation import BatchPrompt
from decoctl.ray._batch import OUTPUT_COLUMNS, RESTARTS, check_plan, generate_dataset, plain_error, prompt_dataset
from decoctl.ray._cluster import joined, require_ray
from decoctl.ray._runtime_env import setup_error

__all__ = ["decoctl_error", "run_prompts"]


def decoctl_error(exc: BaseException) -> DecoctlError | None:
    """The DecoctlError a Ray failure carries (an actor's or a task's, however deeply Ray wrapped it), as a plain one
    of its class with its own message (not Ray's wrapping and the remote traceback); None where there is none."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        error = todo.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        cause = getattr(error, "cause", None)  # RayTaskError and RayActorError keep the remote exception here
        for found in (cause, error):
            if isinstance(found, DecoctlError) and type(found).__module__.startswith("decoctl"):
                return plain_error(found)
        todo.extend([error.__cause__, error.__context__, cause if isinstance(cause, BaseException) else None])
    return None


def _died(exc: BaseException) -> DecoctlError:
    """A Ray failure that carries no DecoctlError (an actor that kept dying, a node lost) in one paragraph."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    detail = next((line for line in lines if "exit detail" in line), lines[0] if lines else "")
    return DecoctlError(
        f"Ray could not finish the prompts ({type(exc).__name__}: {detail[:300]}); an actor is restarted and its "
        f"prompts run again {RESTARTS} times before the run fails. A process that keeps dying is most often out of "
        "memory: give each actor fewer rows (--batch-size) or fewer threads, and see the actor's log (`ray logs`)"
    )


@contextlib.contextmanager
def _failures_to_ray_logs() -> Iterator[None]:
    """Ray Data's own reports of a failure (ERROR records with Ray's tracebacks) kept to its log file for the
    command's duration: the command says what failed in one line. Its progress still shows on the console."""
    import ray.data  # noqa: F401 - sets up Ray Data's loggers

    console = [h for h in logging.getLogger("ray.data").handlers if not type(h).__name__.startswith("SessionFile")]
    below_errors = _BelowErrors()
    for handler in console:
        handler.addFilter(below_errors)
    try:
        yield
    finally:
        for handler in console:
            handler.removeFilter(below_errors)


class _BelowErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


def run_prompts(
    prompts: Sequence[BatchPrompt],
    *,
    generator: Mapping[str, Any],
    batch_size: int,
    actors: int,
    address: str | None,
    limits: Mapping[str, Any],
    stats: str,
    out: TextIO | None = None,
    wheels: str | None = None,
) -> int:
    """Run ``prompts`` on ``actors`` Ray actors (each a Generator made with ``generator``'s arguments, on
    ``batch_size`` rows, from the wheels in ``wheels`` or found as generate_dataset finds them) of the cluster at
    ``address`` (None: a local one) and write one JSON line per prompt to ``out`` (stdout) in the prompts' order; a
    summary on stderr unless ``stats`` is "none". A failure in an actor is raised here as the DecoctlError it was,
    and a node that could not set up the actors' runtime environment as Ray's reason, in one line."""
    out = out or sys.stdout
    if isinstance(actors, bool) or not isinstance(actors, int) or actors < 1:
        raise ConfigError(f"--ray-actors {actors} must be at least 1 (Ray actors, each with its own models)")
    require_ray("decoctl generate --ray-actors")
    check_plan(generator)
    tokens = 0
    how = ""
    # Ray prints what its workers report (an actor that died, say) on sys.stdout: on stderr while the lines are out
    with (
        contextlib.redirect_stdout(sys.stderr),
        joined(address, "decoctl generate --ray-actors") as ray,
        _failures_to_ray_logs(),
    ):
        started = time.perf_counter()  # the cluster joined; the actors' start and model loads count
        dataset = prompt_dataset(prompts, actors=actors, batch_size=batch_size)
        try:
            generated = generate_dataset(
                dataset, **generator, batch_size=batch_size, actors=actors, wheels=wheels, **limits
            )
            for table in generated.iter_batches(batch_format="pyarrow", batch_size=None):
                for row in table.to_pylist():
                    record = {"index": row["index"]} | {k: row[k] for k in OUTPUT_COLUMNS if row[k] is not None}
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
                    tokens += row["stats"]["new_tokens"]
                    how = row["stats"]["batched"] or ""
                out.flush()
        except Exception as exc:
            error = decoctl_error(exc) or setup_error(exc)
            if error is None and not isinstance(exc, ray.exceptions.RayError):
                raise
            raise (error or _died(exc)) from None
    if stats != "none":
        seconds = time.perf_counter() - started
        print(
            f"-- {len(prompts)} prompts, {tokens} tokens in {seconds:.2f} s ({tokens / max(seconds, 1e-9):.1f} tok/s), "
            f"controller: {generator.get('controller') or 'greedy'}, batched: {how}, on {actors} Ray "
            f"actor{'s' if actors > 1 else ''} of {generator.get('threads') or 1} thread(s)",
            file=sys.stderr,
        )
    return 0
