"""The logits-processor contract and the chain that host.process() runs.

A processor sees rows of logits, each with its own prefix: the prompt, the committed output, and the tokens a
controller drafted before that row. Controllers that verify drafted tokens therefore see exactly the
distribution plain decoding would have seen at that position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from decoctl.errors import ConfigError, DecoctlError, PluginError
from decoctl.processing import _native as native

__all__ = [
    "LogitsProcessor",
    "ProcessContext",
    "ProcessorChain",
    "bound_through",
    "checked_processor",
    "fuse",
    "processor_name",
]


class ProcessContext:
    """What the rows of one process() call condition on.

    ``prompt``: int64[p]; ``output``: int64[m], the committed tokens; ``paths[i]``: the drafted tokens between
    the committed output and row i (empty for the next position). ``eos_token_ids``: the target model's EOS ids
    (for processors that hold EOS back); ``tokenizer``: the target's tokenizer, or None outside a host (for
    processors that need the vocabulary's text, such as a grammar).
    """

    __slots__ = ("_generated", "_prefixes", "eos_token_ids", "output", "paths", "prompt", "tokenizer")

    def __init__(
        self,
        prompt: np.ndarray,
        output: np.ndarray,
        paths: Sequence[Sequence[int]],
        *,
        eos_token_ids: frozenset[int] = frozenset(),
        tokenizer: Any = None,
    ) -> None:
        self.prompt = prompt
        self.output = output
        self.paths = paths
        # a frozenset is taken as it is: the host builds a context every step
        self.eos_token_ids = eos_token_ids if type(eos_token_ids) is frozenset else frozenset(eos_token_ids)
        self.tokenizer = tokenizer
        self._prefixes: dict[int, np.ndarray] | None = None  # built on first use: most calls never ask
        self._generated: dict[int, np.ndarray] | None = None

    def prefix(self, row: int) -> np.ndarray:
        """int64[p + m + len(paths[row])]: every token before row ``row``'s position. Built once per row and
        shared by every processor of the call: read it, never write to it."""
        if self._prefixes is None:
            self._prefixes = {}
        found = self._prefixes.get(row)
        if found is None:
            found = self._prefixes[row] = np.concatenate((self.prompt, self.generated(row)))
        return found

    def generated(self, row: int) -> np.ndarray:
        """int64[m + len(paths[row])]: the tokens generated before row ``row`` (committed output, then that row's
        drafted path). Shared like ``prefix``: read-only."""
        if self._generated is None:
            self._generated = {}
        found = self._generated.get(row)
        if found is None:
            path = self.paths[row]
            found = self.output if not len(path) else np.concatenate((self.output, np.asarray(path, np.int64)))
            self._generated[row] = found
        return found

    def new_tokens(self, row: int) -> int:
        """How many generated tokens precede row ``row`` (committed plus drafted)."""
        return len(self.output) + len(self.paths[row])


@runtime_checkable
class LogitsProcessor(Protocol):
    """One step of a chain: ``__call__(rows, context)`` is the one method a processor needs. It gets float32[n,
    vocab] rows, each with its own prefix (``context``), and returns float32[n, vocab] of the same shape; it may
    modify ``rows`` in place (the chain hands it a private copy). A plain function ``f(rows, context)`` is a
    processor. The chain refuses, naming the processor, a result of another shape or type, and an exception from
    inside (PluginError, which a generation reports as a GenerationError that keeps the text so far).

    Everything else is optional; without it a processor gets the default named here.

    ``commit(tokens)`` and ``reset(prompt)`` (default: none, the processor keeps no state): a processor that keeps
    state per sequence (a grammar's matcher) advances in ``commit`` with the tokens each sequence accepts and starts
    over in ``reset`` with the prompt. It must not advance on drafted tokens, which reach it only through
    ``context.paths``.

    ``clone()`` (default: none): a processor with state returns an independent copy of itself, state included, for
    another sequence of the same prompt; with it a stateful chain runs with several sequences (parallel samples,
    batched prompts: each sequence's clone is reset with its prompt and sees that sequence's commits). A stateful
    processor without ``clone`` is refused with several sequences, naming it.

    ``stateless`` (default: false when ``commit`` or ``reset`` exist): a true value says they do nothing, and the
    chain does not call them (a commit happens every step, and every call counts there).

    ``terminal`` (default: false): the processor picks the token (greedy, sample) and must come last in its chain.
    ``exclusive`` (default: false): the processor constrains which tokens may come (a grammar); a chain takes one,
    since two would leave a row no token wherever they disagree.

    ``sample_only`` (default: false): the processor only shapes a distribution to draw from (transformers' warpers:
    temperature, top_k, top_p, ...): a controller that ranks continuations instead of drawing them (beam search,
    ``ControllerSpec.sampling_processors`` false) refuses a chain that holds one.

    ``fuse(following)`` (default: no fusing): returns one processor that does what this one and ``following`` do in
    turn (with identical results), or None: the chain folds neighbours together this way when it is built, so a
    plugin can run several of its processors as one pass (the logits chain narrows to the candidates a top_k
    leaves, as llama.cpp's sampler chain does). ``commit`` and ``reset`` keep going to the processors as
    configured, never to a fused one, so fusing never changes what state a processor sees.

    ``bound_argmax(top, second)`` (default: the processor always runs): says what the processor does to a row
    whose largest logit ``top`` is held by one token and whose other logits are all <= ``second``: it returns the
    same two bounds after the processor when that token provably stays the row's only maximum (temperature: both
    divided; top_k, top_p, min_p: unchanged, they keep the top token as it is and only lower others), or None when
    it cannot promise that. A chain whose caller needs only the argmax (``ProcessorChain.argmax``) skips the
    trailing processors that promise it, the way greedy decoding in transformers never runs its sampling warpers.

    ``bound_argmax_at(context, row, token, top, second)`` (default: the processor always runs): the same for a
    processor whose effect depends on the row and its prefix: given that row ``row``'s largest logit ``top`` is
    held by ``token`` alone and its other logits are all <= ``second``, it returns ``(top', second')`` where
    ``top'`` is exactly the logit the processor gives ``token`` (float32 arithmetic) and every other logit after
    it is <= ``second'``, or None when it cannot say so without processing the row (a penalty that may raise a
    logit, a drafted path, a masked ``token``). A chain whose every step before its bound_argmax suffix has it
    finds the argmax from the unprocessed rows: no copy, no pass over the vocabulary (penalties that only lower
    logits rarely move the argmax: when they do, or when a step says None, the chain runs as usual). Bounds may
    be numpy float32 or Python floats holding float32 values.
    """

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray: ...


def processor_name(processor: object) -> str:
    """How messages name a processor: its ``name`` attribute (a string), a function's qualified name, or its
    class's name."""
    name = getattr(processor, "name", None)
    if isinstance(name, str) and name:
        return name
    if isinstance(processor, type):
        return processor.__qualname__
    qualified = getattr(processor, "__qualname__", None)
    if isinstance(qualified, str) and not isinstance(processor, np.ndarray):
        return qualified
    return type(processor).__name__


def _keeps_state(processor: object) -> bool:
    """Whether the chain must call ``processor``'s commit and reset (it has either and does not say it is
    stateless)."""
    has_state = callable(getattr(processor, "commit", None)) or callable(getattr(processor, "reset", None))
    return has_state and not getattr(processor, "stateless", False)


def _methods(processors: Sequence[object], name: str) -> tuple[Callable[..., Any], ...]:
    """The bound methods ``name`` of those ``processors`` that have one."""
    found = (getattr(p, name, None) for p in processors)
    return tuple(method for method in found if callable(method))


def checked_processor(processor: object) -> LogitsProcessor:
    """``processor`` once it can run in a chain; ConfigError naming it and what it lacks otherwise (a class instead
    of an instance, no ``__call__``, a transformers processor not wrapped by ``decoctl.from_transformers``)."""
    name = processor_name(processor)
    if isinstance(processor, type):
        raise ConfigError(
            f"logits processor {name} is a class: pass an instance ({name}(...)), which the chain calls as "
            "processor(rows, context)"
        )
    if type(processor).__module__.split(".")[0] == "transformers":
        raise ConfigError(
            f"logits processor {name} is transformers' (it takes input_ids and scores tensors): wrap it, "
            f"decoctl.from_transformers({name}(...)), to run it in a decoctl chain"
        )
    if not callable(processor):
        raise ConfigError(
            f"logits processor {name} has no __call__(rows, context) method: a processor is called with float32[n, "
            "vocab] rows and a ProcessContext and returns the processed rows (commit, reset, clone and the rest are "
            "optional)"
        )
    return cast(LogitsProcessor, processor)  # being callable is all the protocol requires


def fuse(processors: Sequence[LogitsProcessor]) -> tuple[LogitsProcessor, ...]:
    """The steps that run ``processors`` in order: neighbours folded by their optional ``fuse`` (left to right)."""
    steps: list[LogitsProcessor] = []
    for processor in processors:
        fused = getattr(steps[-1], "fuse", None) if steps else None
        joined = fused(processor) if fused is not None else None
        if joined is None:
            steps.append(processor)
        else:
            steps[-1] = joined
    return tuple(steps)


def bound_through(bounds: Sequence[Callable[..., Any]], top: Any, second: Any) -> tuple[Any, Any] | None:
    """The bounds of a row after steps whose ``bound_argmax`` methods are ``bounds`` (looked up once by the caller),
    in turn, starting from a unique maximum ``top`` over others <= ``second``; None unless every step promises the
    maximum stays unique."""
    for bound in bounds:
        if not second < top:
            return None
        found = bound(top, second)
        if found is None:
            return None
        top, second = found
    return (top, second) if second < top else None


class ProcessorChain:
    """Processors applied in order. An empty chain is the identity and copies nothing.

    ``processors`` are the processors as configured (``commit`` and ``reset`` reach each of them once);
    ``steps`` are what a call runs: the same processors with fusable neighbours folded together (``fuse``).
    ``names`` name them in messages (default: ``processor_name``). A terminal processor anywhere but last is a
    ConfigError.
    """

    def __init__(self, processors: Sequence[LogitsProcessor] = (), *, names: Sequence[str] | None = None) -> None:
        self.processors = tuple(processors)
        self.names = tuple(names) if names is not None else tuple(processor_name(p) for p in self.processors)
        if len(self.names) != len(self.processors):
            raise ConfigError(f"{len(self.names)} names for {len(self.processors)} logits processors: give one each")
        pairs = zip(self.names, self.processors, strict=True)
        exclusive = [name for name, processor in pairs if getattr(processor, "exclusive", False)]
        if len(exclusive) > 1:
            raise ConfigError(
                f"logits processors {', '.join(repr(n) for n in exclusive)} each constrain which tokens may come, and "
                "a chain takes one (two leave a row no token wherever they disagree): combine them into one grammar"
            )
        for at, processor in enumerate(self.processors[:-1]):
            if getattr(processor, "terminal", False):
                following = ", ".join(repr(n) for n in self.names[at + 1 :])
                raise ConfigError(
                    f"logits processor {self.names[at]!r} ends a chain (it picks the token), but {following} follow "
                    "it: put it last"
                )
        self.steps = fuse(self.processors)
        self._stateful = tuple(p for p in self.processors if _keeps_state(p))
        # bound once: a commit happens every step
        self._commits = _methods(self._stateful, "commit")
        self._resets = _methods(self._stateful, "reset")

    def name_of(self, step: object) -> str:
        """How messages name ``step``: its configured name, or (a fused step) its processor_name."""
        for processor, name in zip(self.processors, self.names, strict=True):
            if processor is step:
                return name
        return processor_name(step)

    @property
    def unclonable(self) -> tuple[str, ...]:
        """The names of the processors that keep state per sequence and have no ``clone()``: with any, the chain
        cannot serve several sequences of one generation."""
        return tuple(
            name
            for processor, name in zip(self.processors, self.names, strict=True)
            if _keeps_state(processor) and not callable(getattr(processor, "clone", None))
        )

    def clone(self) -> ProcessorChain:
        """A chain for another sequence: every processor that keeps state is its ``clone()``, the others are shared.
        Reset it with that sequence's prompt before use. ConfigError naming the stateful processors without
        ``clone``."""
        if not self._stateful:
            return self
        lacking = self.unclonable
        if lacking:
            raise ConfigError(
                f"the logits chain holds state per sequence ({', '.join(lacking)}), which several sequences would "
                "share: give those processors a clone() method, drop them, or generate the sequences one at a time"
            )
        stateful = {id(p) for p in self._stateful}
        clones = []
        for processor, name in zip(self.processors, self.names, strict=True):
            if id(processor) not in stateful:
                clones.append(processor)
                continue
            copy = processor.clone()  # type: ignore[attr-defined]  # unclonable checked it has one
            if copy is processor or not callable(copy):
                raise PluginError(
                    f"logits processor {name!r}: clone() returned {'itself' if copy is processor else repr(copy)}; "
                    "it must return a new processor with its own state"
                )
            clones.append(copy)
        return ProcessorChain(clones, names=self.names)

    @property
    def steps(self) -> tuple[Any, ...]:
        return self._steps

    @steps.setter
    def steps(self, steps: Sequence[Any]) -> None:
        self._steps = tuple(steps)
        #: the trailing steps that declare bound_argmax (argmax may skip them) and the steps before them
        cut = len(self._steps)
        while cut and getattr(self._steps[cut - 1], "bound_argmax", None) is not None:
            cut -= 1
        self._head, self._tail = self._steps[:cut], self._steps[cut:]
        self._bounds = tuple(step.bound_argmax for step in self._tail)  # read once: a property may build them
        head_bounds = [getattr(step, "bound_argmax_at", None) for step in self._head]
        self._head_bounds: tuple[Callable[..., Any], ...] | None = (
            None if None in head_bounds else tuple(bound for bound in head_bounds if bound is not None)
        )

    @property
    def stateful(self) -> tuple[LogitsProcessor, ...]:
        """The processors whose ``commit`` / ``reset`` keep state (those that have either, without a true
        ``stateless``)."""
        return self._stateful

    @property
    def sample_only(self) -> tuple[LogitsProcessor, ...]:
        """The processors that only shape a distribution to draw from (a true ``sample_only``)."""
        return tuple(p for p in self.processors if getattr(p, "sample_only", False))

    def __bool__(self) -> bool:
        return bool(self.processors)

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        if not self._steps:
            return rows
        return self._run(self._steps, rows.astype(np.float32), context)  # a private copy: steps write in place

    def _run(self, steps: Sequence[Any], out: np.ndarray, context: ProcessContext) -> np.ndarray:
        """``out`` through ``steps`` in turn, each result checked: PluginError naming the step that raised or that
        returned something other than float32 rows of ``out``'s shape (a DecoctlError passes as it is: it names its
        processor already)."""
        shape = out.shape
        for step in steps:
            try:
                result = step(out, context)
            except DecoctlError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"logits processor {self.name_of(step)!r} raised {type(exc).__name__}: {exc}"
                ) from exc
            if not (isinstance(result, np.ndarray) and result.shape == shape and result.dtype == np.float32):
                raise PluginError(self._broken(step, result, shape))
            out = result
        return out

    def _broken(self, step: object, result: object, shape: tuple[int, ...]) -> str:
        if isinstance(result, np.ndarray):
            got = f"{result.dtype}{list(result.shape)}"
        else:
            got = "None" if result is None else f"a {type(result).__name__}"
        return (
            f"logits processor {self.name_of(step)!r} returned {got}, but a processor returns float32{list(shape)}: "
            "the rows it was given, processed (return rows, or rows.astype(np.float32) after float64 arithmetic)"
        )

    def argmax(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        """int64[n]: ``self(rows, context).argmax(axis=1)``, exactly, at less cost.

        The trailing steps that have ``bound_argmax`` are skipped when, for every row, the argmax after the
        steps before them is a unique maximum that each of them promises to keep (their bounds are checked in
        float32, the arithmetic they use); otherwise they run as usual.
        """
        if not self._steps:
            return rows.argmax(axis=1)
        if self._head_bounds is not None:
            settled = self._argmax_unprocessed(rows, context)
            if settled is not None:
                return settled
        out = self._run(self._head, rows.astype(np.float32), context)
        choices = out.argmax(axis=1)
        if not self._tail or all(self._keeps(out[i], int(choices[i])) for i in range(len(choices))):
            return choices
        return self._run(self._tail, out, context).argmax(axis=1)

    def _argmax_unprocessed(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray | None:
        """Every row's argmax read from the unprocessed rows, or None as soon as one row needs the steps run.

        A float32 row's maximum and runner-up come from one pass (decoctl.processing.top2, compiled when the bridge
        is); other rows take numpy's argmax and two reductions. Both leave the caller's rows as they are and give
        the same numbers."""
        top2 = native.top2 if rows.dtype == np.float32 and rows.flags.c_contiguous else None
        choices = np.empty(len(rows), np.int64)
        for index in range(len(rows)):
            row = rows[index]
            if top2 is not None:
                choice, top, second = top2(row)
            else:
                choice = int(row.argmax())
                top = float(row[choice])
                second = float(max(row[:choice].max(initial=-np.inf), row[choice + 1 :].max(initial=-np.inf)))
            if not self._keeps_unprocessed(context, index, choice, top, second):
                return None
            choices[index] = choice
        return choices

    def _keeps_unprocessed(self, context: ProcessContext, index: int, choice: int, top: float, second: float) -> bool:
        """Whether row ``index``'s maximum ``top`` at ``choice``, over others <= ``second``, is unique and stays the
        maximum through every step: the head's ``bound_argmax_at`` with this row's context, then the tail's
        ``bound_argmax``."""
        if not -np.inf < top < np.inf:
            return False  # a masked, infinite or NaN maximum: let the steps decide
        for bound_at in self._head_bounds or ():
            if not second < top:
                return False
            found = bound_at(context, index, choice, top, second)
            if found is None:
                return False
            top, second = found
        return bound_through(self._bounds, top, second) is not None

    def _keeps(self, row: np.ndarray, choice: int) -> bool:
        """Whether ``row``'s maximum at ``choice`` is unique and every trailing step promises to keep it."""
        top = row[choice]
        if top == -np.inf:
            return False  # a fully masked row: let the steps decide what it becomes
        row[choice] = -np.inf
        second = row.max()
        row[choice] = top
        return bound_through(self._bounds, top, second) is not None

    def commit(self, tokens: Sequence[int]) -> None:
        """Tell the processors that keep state per sequence that ``tokens`` were committed."""
        for commit in self._commits:
            commit(tokens)

    def reset(self, prompt: np.ndarray) -> None:
        """Start the processors that keep state per sequence afresh on ``prompt`` (int64[n])."""
        for reset in self._resets:
            reset(prompt)
