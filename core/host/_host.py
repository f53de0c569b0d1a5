"""The step primitives: the only place a controller touches a model.

Per role (a Sequence): forward, logits, hidden_states, rewind, keep, length, tokens.
Per generation (the Host): commit, done, is_eos, max_length, remaining, process, rng.

Buffers handed out (logits, hidden states) are host-owned views, valid until the next forward or rewind of
the same role. With ``debug=True`` (or DECOCTL_DEBUG=1) a stale view raises on use instead of silently
showing newer data, and every forward's outputs are a fresh copy that is filled with NaN when the role moves on,
so a raw pointer kept past its lifetime (a C controller's, or a view that escaped the guard) reads NaN.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from decoctl.errors import CapabilityError, ConfigError, SequenceError
from decoctl.host._output import Output
from decoctl.model._capabilities import FEATURES
from decoctl.model._decoder_runner import DecoderRunner, SourceState
from decoctl.model._kv_cache import KVCache
from decoctl.model._loader import LoadedModel
from decoctl.model._runner import Runner, RunOutputs
from decoctl.model._tree import Tree
from decoctl.model._vision import ImageFeatures, no_images
from decoctl.processing import ProcessContext, ProcessorChain

if TYPE_CHECKING:  # decoctl.host builds on Sequence: imported for annotations only
    from decoctl.host._rows import Rows

__all__ = ["ForwardSizes", "Host", "Sequence", "SequenceStats", "debug_default"]

#: the paths of a single row at the next position (no drafted tokens before it), shared by every such context
_NEXT_ONLY: tuple[tuple[int, ...], ...] = ((),)
_NO_TOKENS = np.zeros(0, np.int64)
TREE_TRANSFORM_HINT = "run `decoctl models enable-tree SRC DST` to add position_ids and attention_bias inputs"
"""How a model without tree inputs gets them, for the errors that refuse a tree forward."""
#: debug mode: how many bytes of retired (NaN-filled) output buffers a role keeps alive, so that a stale pointer
#: reads NaN instead of memory the allocator handed to something else; the last retired set is always kept
RETIRED_BYTES = 64 << 20


def role_flag(role: str) -> str:
    """How the command line gives a role its model (for error messages)."""
    return "--draft PATH" if role == "draft" else f"--role {role}=PATH"


def debug_default() -> bool:
    """Whether stale views raise by default: ``DECOCTL_DEBUG`` set, and not to 0."""
    return os.environ.get("DECOCTL_DEBUG", "") not in ("", "0")


class _StaleView(np.ndarray):
    """A debug-mode view that raises once its sequence has moved on (next forward or rewind)."""

    _owner: Sequence | None = None
    _epoch: int = -1

    def _check(self) -> None:
        owner = self._owner
        if owner is not None and owner._epoch != self._epoch:
            raise SequenceError(
                f"a logits/hidden-states view of role {owner.role!r} was used after that role's next forward "
                "or rewind; host buffers are only valid until then: copy what you need to keep (np.array(view))"
            )

    def __array_finalize__(self, obj: Any) -> None:
        self._owner = getattr(obj, "_owner", None)
        self._epoch = getattr(obj, "_epoch", -1)

    def __getitem__(self, key: Any) -> Any:
        self._check()
        return super().__getitem__(key)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        for item in inputs:
            if isinstance(item, _StaleView):
                item._check()
        plain = tuple(np.asarray(i) if isinstance(i, _StaleView) else i for i in inputs)
        return getattr(ufunc, method)(*plain, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        self._check()
        plain = tuple(np.asarray(a) if isinstance(a, _StaleView) else a for a in args)
        return func(*plain, **kwargs)


@attrs.frozen(kw_only=True)
class ForwardSizes:
    """A role's forwards by the tokens each fed, plain (chain) and tree forwards apart: ``chain[n]`` and ``tree[n]``
    are (forwards, seconds inside onnxruntime) of the forwards that fed n tokens: prefill chunks, decode steps,
    verify forwards alike."""

    chain: Mapping[int, tuple[int, float]] = attrs.field(factory=dict)
    tree: Mapping[int, tuple[int, float]] = attrs.field(factory=dict)

    def since(self, earlier: ForwardSizes) -> ForwardSizes:
        """The forwards made after ``earlier``, a snapshot of the same role's sizes; sizes with none are left out."""

        def minus(
            now: Mapping[int, tuple[int, float]], then: Mapping[int, tuple[int, float]]
        ) -> dict[int, tuple[int, float]]:
            out = {}
            for n, (count, seconds) in sorted(now.items()):
                before, before_seconds = then.get(n, (0, 0.0))
                if count > before:
                    out[n] = (count - before, seconds - before_seconds)
            return out

        return ForwardSizes(chain=minus(self.chain, earlier.chain), tree=minus(self.tree, earlier.tree))


@attrs.define
class SequenceStats:
    """Counters of one role: forwards, tokens fed, seconds inside onnxruntime, and the forwards by size
    (``sizes()``)."""

    forwards: int = 0
    tokens_fed: int = 0
    tree_forwards: int = 0
    seconds: float = 0.0
    #: tokens fed -> [forwards, seconds], plain and tree forwards apart: updated in place on every forward
    _chain: dict[int, list[float]] = attrs.field(factory=dict)
    _tree: dict[int, list[float]] = attrs.field(factory=dict)

    def sizes(self) -> ForwardSizes:
        """A snapshot of the forwards by the tokens each fed."""
        return ForwardSizes(
            chain={n: (int(count), seconds) for n, (count, seconds) in self._chain.items()},
            tree={n: (int(count), seconds) for n, (count, seconds) in self._tree.items()},
        )


class Sequence:
    """One role's tokens and KV cache. Controllers get it from ``host[role]``."""

    def __init__(
        self,
        role: str,
        model: LoadedModel,
        *,
        max_length: int | None = None,
        debug: bool | None = None,
        kv: KVCache | None = None,
    ) -> None:
        self.role = role
        self.model = model
        # ``kv``: one row of the role's batched buffers when the role holds several rows (decoctl.host.Rows); an
        # encoder-decoder model's runner also holds its encoder's output and the cross-attention KV
        self._runner = Runner(model, max_length, kv) if model.encoder is None else DecoderRunner(model, max_length, kv)
        self._tokens = np.zeros(self._runner.max_length, np.int64)
        self._logits: np.ndarray | None = None
        self._hidden: np.ndarray | None = None
        self._aux: np.ndarray | None = None
        self._epoch = 0
        #: the last forward, for keep() and for extending a tree: (start length, tokens fed, their tree or None
        #: for a plain forward). A tree forward right after a tree forward extends it, so start and the count
        #: cover every token fed since the first of them.
        self._fed: tuple[int, int, Tree | None] | None = None
        self._debug = debug_default() if debug is None else debug
        #: debug mode: the outputs of earlier forwards, NaN-filled, newest last (see _retire)
        self._retired: deque[tuple[np.ndarray, ...]] = deque()
        self._retired_bytes = 0
        self.stats = SequenceStats()

    # -- queries ----------------------------------------------------------------------------------------
    @property
    def length(self) -> int:
        """Tokens in the KV cache."""
        return self._runner.length

    @property
    def tokens(self) -> np.ndarray:
        """int64[length], read-only view of the tokens in the KV cache."""
        view = self._tokens[: self.length]
        view.flags.writeable = False
        return view

    @property
    def max_length(self) -> int:
        """Positions the KV cache holds; forward beyond it raises."""
        return self._runner.max_length

    @property
    def vocab_size(self) -> int:
        return self.model.spec.vocab_size

    @property
    def capabilities(self) -> tuple[str, ...]:
        return self.model.capabilities.names()

    @property
    def feature_size(self) -> int | None:
        """The width of the features ``forward(features=...)`` takes (a draft head's target_hidden_states
        input), or None when the model takes none."""
        return self.model.capabilities.feature_size

    # -- primitives -------------------------------------------------------------------------------------
    def forward(
        self,
        tokens: Seq[int] | np.ndarray,
        tree: Seq[int] | np.ndarray | None = None,
        *,
        features: np.ndarray | None = None,
    ) -> np.ndarray:
        """Feed tokens after the current length; return float32[n, vocab], row i predicting the token after
        tokens[i].

        ``tree`` (int[n], a parent index per token) verifies a token tree in one pass: ``tree[i]`` is -1 for a
        root (a token that follows the cached tokens directly; several roots are alternatives) or the index of
        an earlier token (``tree[i] < i``). Row i then equals a plain forward of the cached tokens plus the
        root-to-i path. Afterwards the sequence holds all n tokens (``length`` grows by n) but only one
        root-to-node path is a valid continuation: call ``keep(path)`` (or ``rewind``) before a plain forward.
        A tree forward right after a tree forward (no keep, rewind or prefill between) *extends* that tree: its
        parents may also index the earlier tree's tokens (the indices continue after them, so the m tokens fed
        before are 0..m-1 and the new ones m..m+n-1; -1 still means a root), and keep() then indexes the whole
        extended tree. That is how a drafter grows a tree level by level. Needs the model's position_ids and
        attention_bias inputs (CapabilityError otherwise) and at least one cached token (SequenceError at
        length 0: prefill first).

        ``features`` (float32[n, feature_size], one row per token) feeds the model's features input (a draft
        head's ``target_hidden_states``, which takes the target's hidden states): required by a model that has
        that input (SequenceError without it or with another shape), refused by one that has not
        (CapabilityError). The rows are copied before the call returns.
        """
        if tree is None and features is None:
            # a decode step: one token id, in whatever container (list, tuple, 1-d array) the caller holds it
            try:
                one = len(tokens) == 1
            except TypeError:  # a bare id: the general path reads it as one token
                one = False
            if one:
                token = tokens[0]
                if type(token) is int or isinstance(token, np.integer):
                    return self._forward_one(int(token))
        return self._forward_tokens(tokens, tree, features)

    def _forward_tokens(
        self, tokens: Seq[int] | np.ndarray, tree: Seq[int] | np.ndarray | None, features: np.ndarray | None
    ) -> np.ndarray:
        """forward() with every check: any number of tokens, a tree, features."""
        ids = self._checked_tokens(tokens, tree_follows=tree is not None)
        rows_features = self._checked_features(features, len(ids))
        if len(ids) > 1 and not self.model.capabilities.logits_all_positions:
            raise CapabilityError(
                f"role {self.role!r} (model {self.model.name}) returns logits for the last position only, so "
                f"forward() over {len(ids)} tokens cannot return a row per token: re-export the model with "
                "logits for all positions, or feed one token at a time"
            )
        if tree is not None:
            return self._forward_tree(ids, tree, rows_features)
        rows = self._run(ids, features=rows_features)
        self._fed = (self.length - len(ids), len(ids), None)
        return rows

    def prefill(
        self,
        tokens: Seq[int] | np.ndarray,
        chunk: int | None = None,
        *,
        features: np.ndarray | None = None,
        logits: bool = True,
    ) -> np.ndarray:
        """Feed a prompt, ``chunk`` tokens per run (None: one run); return float32[1, vocab], the last row.

        Works on models that only return the last position's logits; peak memory is bounded by the chunk. A model
        that can compute the last row's logits alone (``Capabilities.logits_from``) computes only that row, the one
        a whole forward gives, and ``logits()`` then holds it alone; its chunks before the last compute no logits
        at all. ``logits=False``: part of a prompt whose rest follows in a later prefill, so no row is wanted; such
        a model then skips the LM head, returns float32[0, vocab] and ``logits()`` is empty until the next forward
        (a model without it computes its rows as ever). ``features``: as for forward(), one row per prompt token.
        """
        ids = self._checked_tokens(tokens)
        rows_features = self._checked_features(features, len(ids))
        if chunk is not None and chunk < 1:
            raise ConfigError(f"prefill chunk {chunk} must be at least 1 token")
        step = len(ids) if chunk is None else chunk
        for start in range(0, len(ids), step):
            part = None if rows_features is None else rows_features[start : start + step]
            keep = 1 if logits and start + step >= len(ids) else 0
            rows = self._run(ids[start : start + step], features=part, keep=keep)
        return rows[-1:] if len(rows) else rows

    def encode(self, source: Seq[int] | np.ndarray) -> None:
        """An encoder-decoder model's encoder over ``source`` (the prompt's tokens; a speech model's window of
        features, float32[1, mel, frames]): the decoder's cache is emptied,
        and its next forward, from length 0 (the decoder start token the Generator prefills), computes the
        cross-attention KV that every later forward reads. The Generator calls it once per generation for every
        role; controllers never need it. CapabilityError on a decoder-only model."""
        runner = self._runner
        if not isinstance(runner, DecoderRunner):
            raise CapabilityError(
                f"encode() on role {self.role!r}: model {self.model.name} is a decoder-only model, which has no "
                "encoder; its prompt is fed with prefill()"
            )
        if self.model.encoder is not None and self.model.encoder.audio is not None:
            runner.encode(np.asarray(source))  # a speech encoder's window of features: the runner checks its shape
            self._invalidate()
            return
        ids = np.asarray(source, dtype=np.int64).reshape(-1)
        vocab = self.vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise SequenceError(f"encode() on role {self.role!r} got token ids outside [0, {vocab})")
        runner.encode(ids)
        self._invalidate()

    def adopt_source(self, state: SourceState) -> None:
        """An encoder-decoder model's source as ``encode`` would leave it, its encoder output copied from ``state``
        (``runner.source_state()`` of a row of the same model): the decoder's cache emptied, no encoder run.

        @private"""
        runner = self._runner
        if not isinstance(runner, DecoderRunner):
            raise CapabilityError(f"adopt_source() on role {self.role!r}: model {self.model.name} has no encoder")
        runner.restore_source(state)
        self._invalidate()

    def logits(self) -> np.ndarray:
        """float32[n, vocab] of the last forward (host-owned; valid until the next forward or rewind)."""
        if self._logits is None:
            raise SequenceError(f"role {self.role!r} has no logits yet: call forward() first")
        return self._guard(self._logits)

    def hidden_states(self, kind: str = "final") -> np.ndarray:
        """float32[n, hidden] of the last forward: ``kind`` "final" (the graph's hidden_states output) or
        "aux" (aux_hidden_states, the concatenated taps). Host-owned; valid until the next forward/rewind."""
        caps = self.model.capabilities
        if kind not in ("final", "aux"):
            raise ConfigError(f"hidden_states(kind={kind!r}): kind is 'final' or 'aux'")
        name = caps.hidden_states if kind == "final" else caps.aux_hidden_states
        if name is None:
            output = "hidden_states" if kind == "final" else "aux_hidden_states"
            raise CapabilityError(
                f"role {self.role!r} (model {self.model.name}) has no {output} output: export it with "
                "onnxruntime-genai's builder option include_hidden_states=1"
                + (" and aux_hidden_state_layers" if kind == "aux" else "")
                + ", or copy it with `decoctl models enable-taps SRC DST`, which adds both"
            )
        value = self._hidden if kind == "final" else self._aux
        if value is None:
            raise SequenceError(f"role {self.role!r} has no hidden states yet: call forward() first")
        return self._guard(value)

    def rewind(self, length: int) -> None:
        """Truncate tokens and KV cache to ``length`` (O(1) on shared-buffer models)."""
        if not 0 <= length <= self.length:
            raise SequenceError(
                f"rewind({length}) on role {self.role!r} of length {self.length}: the length must be between "
                f"0 and {self.length}"
            )
        self._runner.truncate(length)
        self._invalidate()

    def keep(self, indices: Seq[int] | np.ndarray) -> None:
        """Keep the tokens at ``indices`` of the last forward and drop the rest of what it fed.

        ``indices`` index the tokens of the last forward on this role (a tree forward together with the tree
        forwards that extended it, or a plain one, which is the chain tree ``[-1, 0, 1, ...]``), with no
        prefill, rewind or keep since. They must be a root-to-node
        path of that tree: increasing, the first a root (parent -1), each next one the child of the one before.
        After a plain forward that means ``0..k-1``, the same as ``rewind(start + k)``; an empty list keeps
        nothing. The kept tokens' KV rows move to ``start..start+k-1`` (k rows per layer are copied, none when
        they are already in place), ``tokens`` and ``length`` (``start + k``) follow, and views of the last
        forward's outputs become invalid: read the rows you need first. Raises SequenceError otherwise.
        """
        if self._fed is None:
            raise SequenceError(
                f"keep() on role {self.role!r} has no forward to keep from: call it right after forward(), "
                "before any prefill, rewind or other keep"
            )
        start, n, tree = self._fed
        if tree is None:
            tree = Tree(parents=np.arange(-1, n - 1), depths=np.arange(n))
        path = tree.path(indices)
        kept = len(path)
        if np.array_equal(path, np.arange(kept)):
            self._runner.truncate(start + kept)
        else:
            self._runner.gather(start + path, start)
            self._tokens[start : start + kept] = self._tokens[start + path]
        self._invalidate()

    # -- internals --------------------------------------------------------------------------------------
    def _checked_tokens(self, tokens: Seq[int] | np.ndarray, *, tree_follows: bool = False) -> np.ndarray:
        fed_tree = None if self._fed is None else self._fed[2]
        if fed_tree is not None and not tree_follows and not fed_tree.is_chain:
            raise SequenceError(
                f"role {self.role!r} still holds every token of its last tree forward: call keep(path) with the "
                "accepted root-to-node path (or rewind) before feeding more"
            )
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise SequenceError(f"forward() on role {self.role!r} got no tokens: pass at least one")
        if self.length + ids.size > self.max_length:
            raise SequenceError(
                f"forward() of {ids.size} tokens on role {self.role!r} at length {self.length} would pass its "
                f"max_length {self.max_length}: rewind first, or load the model with a larger max_length"
            )
        vocab = self.vocab_size
        # a decode step feeds one token: compare it as an int rather than pay for two numpy reductions
        bad = not 0 <= int(ids[0]) < vocab if ids.size == 1 else ids.min() < 0 or ids.max() >= vocab
        if bad:
            raise SequenceError(
                f"forward() on role {self.role!r} got token ids outside [0, {vocab}): "
                f"{[int(t) for t in ids if t < 0 or t >= vocab][:5]}"
            )
        return ids

    def _checked_features(self, features: np.ndarray | None, n: int) -> np.ndarray | None:
        width = self.model.capabilities.feature_size
        if width is None:
            if features is not None:
                raise CapabilityError(
                    f"forward(features=...) on role {self.role!r}: model {self.model.name} has no {FEATURES} "
                    "input to take them; give this role a draft head exported with that input (tools/export_eagle.py) "
                    "or feed tokens only"
                )
            return None
        if features is None:
            raise SequenceError(
                f"role {self.role!r} (model {self.model.name}) takes the target's features through its {FEATURES} "
                f"input: pass forward(tokens, features=rows), rows float32[{n}, {width}], one per token"
            )
        shape = np.shape(features)
        if shape != (n, width):
            raise SequenceError(
                f"forward() on role {self.role!r} got features of shape {shape} for {n} token(s), but its {FEATURES} "
                f"input takes float32[{n}, {width}]: pass one row of the target's hidden states (width {width}) per "
                "token; a different width means the head was trained for another target"
            )
        return np.asarray(features)

    def _run(
        self,
        ids: np.ndarray,
        positions: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        *,
        features: np.ndarray | None = None,
        bias_positions: np.ndarray | None = None,
        tree: bool = False,
        keep: int | None = None,
    ) -> np.ndarray:
        start = self.length
        begin = time.perf_counter()
        outputs = self._runner.run(ids, positions, bias, features, bias_positions, keep=keep)
        return self._took(start, ids, outputs, begin, tree=tree)

    def _took(
        self, start: int, ids: Seq[int] | np.ndarray, outputs: RunOutputs, begin: float, *, tree: bool = False
    ) -> np.ndarray:
        """The bookkeeping after a run that fed ``ids`` at ``start`` (begun at ``begin``; a tree forward with
        ``tree``): stats, tokens, outputs."""
        stats = self.stats
        seconds = time.perf_counter() - begin
        fed = len(ids)
        stats.seconds += seconds
        stats.forwards += 1
        stats.tokens_fed += fed
        sizes = stats._tree if tree else stats._chain
        try:
            size = sizes[fed]
        except KeyError:
            size = sizes[fed] = [0, 0.0]
        size[0] += 1
        size[1] += seconds
        self._tokens[start : start + len(ids)] = ids
        logits, hidden, aux = outputs.logits, outputs.hidden, outputs.aux
        if self._debug:
            # the runner writes every run into the same buffers, where a kept pointer would read this run's
            # values: hand out copies instead, and poison the previous ones
            self._retire()
            logits = logits.copy()
            hidden = None if hidden is None else hidden.copy()
            aux = None if aux is None else aux.copy()
        self._logits, self._hidden, self._aux = logits, hidden, aux
        self._invalidate(keep_outputs=True)
        return self._guard(logits)

    def _forward_one(self, token: int) -> np.ndarray:
        """forward() of one token id on the decode path: _checked_tokens' checks inline and the runner's one-token
        step. Anything out of the ordinary (a bad token, a full cache, a pending tree, a features input) takes
        the general path, which raises what it raises there."""
        runner = self._runner
        start = runner.kv.length
        fed = self._fed
        if (
            not 0 <= token < self.model.spec.vocab_size
            or start >= runner.max_length
            or (fed is not None and fed[2] is not None and not fed[2].is_chain)
            or self.model.capabilities.feature_input is not None
        ):
            return self._forward_tokens(np.asarray((token,), np.int64), None, None)
        begin = time.perf_counter()
        rows = self._took(start, (token,), runner.step(token), begin)
        self._fed = (start, 1, None)
        return rows

    def _forward_tree(self, ids: np.ndarray, tree: Seq[int] | np.ndarray, features: np.ndarray | None) -> np.ndarray:
        if not self.model.capabilities.tree:
            raise CapabilityError(
                f"forward(tree=...) on role {self.role!r}: model {self.model.name} has no position_ids and "
                f"attention_bias inputs; {TREE_TRANSFORM_HINT}"
            )
        start = self.length
        if start == 0:
            # GroupQueryAttention takes a pass with no past as a first prompt and reads only its first
            # position id, so tree positions would be ignored there.
            raise SequenceError(
                f"forward(tree=...) on role {self.role!r} at length 0: a tree must follow at least one cached "
                "token; prefill the prompt (or forward its tokens) first"
            )
        parents = np.asarray(tree, dtype=np.int64).reshape(-1)
        if parents.size != len(ids):
            raise SequenceError(
                f"forward(tree=...) got {len(ids)} tokens but {parents.size} parents: give one per token"
            )
        fed = self._fed
        if fed is None or fed[2] is None:
            first, before, parsed = start, 0, Tree.from_parents(parents, len(ids))
        else:
            # extend the tree fed just before: its tokens keep their indices 0..before-1
            first, before = fed[0], fed[2].size
            parsed = Tree.from_parents(np.concatenate([fed[2].parents, parents]), before + len(ids))
        # the new tokens' rows of the bias span the whole tree; everything before it stays visible to all
        positions = parsed.positions(first)
        rows = self._run(
            ids, positions[before:], parsed.bias()[before:], features=features, bias_positions=positions, tree=True
        )
        self.stats.tree_forwards += 1
        self._fed = (first, parsed.size, parsed)
        return rows

    # -- rows: what decoctl.host.Rows, the role's batched buffer, does to each of its rows. Not for controllers (a
    # controller goes through Rows), so hidden from the API reference (pdoc's @private) and not promised by it
    @property
    def runner(self) -> Runner:
        """The runner holding this row's KV cache (Rows hands runners round on a concatenated-cache model).

        @private"""
        return self._runner

    def check_batchable(self, what: str) -> None:
        """Refuse ``what`` (a copy or a batched step of this row) while the row still holds a whole tree: keep or
        rewind first.

        @private"""
        fed = self._fed
        if fed is not None and fed[2] is not None and not fed[2].is_chain:
            raise SequenceError(
                f"{what} on role {self.role!r}: a row still holds every token of its last tree forward; call "
                "keep(path) or rewind() on it first"
            )

    def adopt_tokens(self, tokens: np.ndarray, images: ImageFeatures | None = None) -> None:
        """The row's KV cache was replaced by another row's (fork, reorder): take that row's tokens (and the
        images its prompt holds) too.

        @private"""
        self._tokens[: len(tokens)] = tokens
        self._runner.images = images
        self._runner.adopt_tokens(tokens)
        self._invalidate()

    def attach_images(self, images: ImageFeatures | None) -> None:
        """The features of the images this role's prompt holds, in order (decoctl.model._vision): the prompt's
        image tokens take them as the prefill feeds them. Before the prefill; None: no images."""
        if images is not None and self.model.vision is None:
            raise no_images(self.model.name)
        self._runner.images = images

    @property
    def images(self) -> ImageFeatures | None:
        return self._runner.images

    def copy_row_from(self, source: Sequence) -> None:
        """This row keeps a cache of its own (a concatenated-cache model) and takes a copy of ``source``'s: its KV,
        and an encoder-decoder row's encoder output and cross-attention KV; its tokens too (fork).

        @private"""
        self._runner.copy_from(source.runner)
        self.adopt_tokens(source.tokens, source.images)

    def take_runner(self, runner: Runner, tokens: np.ndarray) -> None:
        """This row continues another row of a concatenated-cache model (reorder): it takes that row's runner (its
        cache) and ``tokens``, its tokens from before the reorder.

        @private"""
        images = runner.images
        self._runner = runner
        self.adopt_tokens(tokens, images)

    def detach_outputs(self) -> None:
        """Keep this row's outputs in arrays of its own: the batched step's buffer they view is about to be
        rewritten by a step that passes over this row.

        @private"""
        if self._logits is not None:
            self._logits = self._logits.copy()
        if self._hidden is not None:
            self._hidden = self._hidden.copy()
        if self._aux is not None:
            self._aux = self._aux.copy()

    def record_step(self, token: int, outputs: RunOutputs, seconds: float) -> None:
        """A batched step fed ``token`` to this row and wrote its key and value at the row's length; ``outputs``:
        this row's rows of the step's outputs, ``seconds``: its share of the step's time.

        @private"""
        start = self._runner.kv.length
        self._runner.stepped(token)
        self._took(start, (token,), outputs, time.perf_counter() - seconds)
        self._fed = (start, 1, None)

    def _invalidate(self, *, keep_outputs: bool = False) -> None:
        self._epoch += 1
        self._fed = None
        if not keep_outputs:
            if self._debug:
                self._retire()
            self._logits = self._hidden = self._aux = None

    def _retire(self) -> None:
        """Debug mode: fill the current outputs (copies only this role hands out) with NaN and keep them alive a
        while, so that whatever still points at them reads NaN rather than plausible numbers."""
        retired = tuple(a for a in (self._logits, self._hidden, self._aux) if a is not None)
        if not retired:
            return
        for array in retired:
            array.fill(np.nan)
        self._retired.append(retired)
        self._retired_bytes += sum(a.nbytes for a in retired)
        while len(self._retired) > 1 and self._retired_bytes > RETIRED_BYTES:
            self._retired_bytes -= sum(a.nbytes for a in self._retired.popleft())

    def _guard(self, array: np.ndarray) -> np.ndarray:
        if not self._debug:
            return array
        view = array.view(_StaleView)
        view._owner = self
        view._epoch = self._epoch
        return view


class Host:
    """The primitives of one generation: its roles, its output, its processor chain and its rng.

    ``host["draft"]`` (or ``host.role("draft")``) is a role's Sequence; ``host.target`` the target's.
    """

    def __init__(
        self,
        roles: Mapping[str, Sequence],
        output: Output,
        *,
        prompt: np.ndarray,
        chain: ProcessorChain | None = None,
        seed: int | None = None,
        rows: Mapping[str, Rows] | None = None,
        new_output: Callable[[], Output] | None = None,
    ) -> None:
        if "target" not in roles:
            raise ConfigError("a host needs a 'target' role: give the model to generate with")
        self._roles = dict(roles)
        self._output = output
        #: every completion of this generation's prompt: output 0 streams; beams and parallel samples add more
        self._outputs = [output]
        self._scores: dict[int, float] = {}
        self._new_output = new_output
        self._rows = dict(rows or {})
        self._prompt = prompt
        self._chain = chain or ProcessorChain()
        #: output -> the chain that follows it, for the outputs after the first when the chain keeps state per
        #: sequence (each a clone of the chain, reset with the prompt; new_output)
        self._output_chains: dict[int, ProcessorChain] = {}
        # what every processing context carries, looked up once rather than at every step
        self._eos_token_ids = frozenset(output.rules.eos_token_ids)
        self._tokenizer = self._roles["target"].model.tokenizer
        self.rng = np.random.default_rng(seed)
        self.prefill_chunk: int | None = None
        #: int64[s]: an encoder-decoder target's source, the encoded prompt its encoder read (the Generator sets
        #: it); empty for a decoder-only target. Prompt lookup copies from it as from a prompt.
        self.source_tokens: np.ndarray = _NO_TOKENS
        #: what the controller did, for the stats' execution trace: drafters, modes, and under "degraded"
        #: any degraded mode the user asked for
        self.trace: dict[str, Any] = {}

    # -- roles ------------------------------------------------------------------------------------------
    def role(self, name: str) -> Sequence:
        """Role ``name``'s Sequence (also ``host[name]``); ConfigError naming the roles given when it is not one."""
        try:
            return self._roles[name]
        except KeyError:
            raise ConfigError(
                f"role {name!r} was not given to this generation (roles: {sorted(self._roles)}): pass a model "
                f"for it, e.g. {role_flag(name)}"
            ) from None

    __getitem__ = role

    @property
    def target(self) -> Sequence:
        return self._roles["target"]

    def _move_role(self, name: str, sequence: Sequence) -> None:
        """Role ``name`` goes on in ``sequence`` (a serving engine resuming a preempted request on another row of
        the batched buffer, its tokens fed there again); the host's other state stays as it is."""
        self.role(name)
        self._roles[name] = sequence

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(self._roles)

    def rows(self, name: str = "target") -> Rows:
        """The rows of role ``name`` (decoctl.host.Rows): row 0 is ``host[name]``; fork, reorder, release and a batched
        one-token step. How many rows a role holds is the controller's ``rows_for`` (ControllerSpec). Where the
        model steps its rows one Run per row (a concatenated KV cache), the trace says so under "rows"."""
        self.role(name)
        found = self._rows.get(name)
        if found is None:
            raise CapabilityError(f"role {name!r} holds one sequence in this host: it has no rows to fork")
        if found.capacity > 1 and not found.batched:
            self.trace["rows"] = found.stepping
        return found

    # -- completions: several outputs of one prompt (beams, parallel samples) ------------------------------
    def new_output(self, *, final: bool = False) -> int:
        """Start another completion of the prompt (empty, with the same stop rules); return its index. commit(),
        process() and argmax() take ``output=`` to address it; output 0 is the one that streams. ``final``: the
        completion is committed whole once the controller processes no more rows (beam search's hypotheses), so a
        logits chain that keeps per-sequence state is never asked about it.

        Otherwise a chain that keeps state per sequence follows the new completion with a clone of its own (the
        processors' ``clone()``, reset with the prompt): ConfigError naming the stateful processors that have none."""
        if self._new_output is None:
            raise CapabilityError("this host holds one output: it cannot start another completion")
        chain = None
        if not final and self._chain.stateful:
            chain = self._chain.clone()
            chain.reset(self._prompt)
        self._outputs.append(self._new_output())
        index = len(self._outputs) - 1
        if chain is not None:
            self._output_chains[index] = chain
        return index

    @property
    def outputs(self) -> int:
        """How many completions this generation has."""
        return len(self._outputs)

    @property
    def committed(self) -> int:
        """Tokens committed to every completion together."""
        return sum(len(o.tokens) for o in self._outputs)

    def output_done(self, output: int = 0) -> bool:
        """Whether output ``output`` has stopped (EOS, a stop string, its length)."""
        return self._completion(output).done

    def output_ids(self, output: int = 0) -> np.ndarray:
        """int64[m]: the tokens committed to ``output`` (a read-only view, valid until its next commit)."""
        return self._completion(output).ids

    def score(self, output: int, value: float) -> None:
        """Record ``output``'s score (a beam's length-normalised log-probability, a sample's mean log-probability):
        the result lists completions with their scores."""
        self._completion(output)
        self._scores[output] = float(value)

    def rank_outputs(self, order: Seq[int]) -> None:
        """Keep only the completions ``order`` names, in that order (best first), for the result. Rank once the
        completions are done: commit() and friends then address the ranked indices. Output 0 streamed as it was
        generated; the result lists the completions in this order."""
        picked = [int(i) for i in order]
        for index in picked:
            self._completion(index)
        if not picked or len(set(picked)) != len(picked):
            raise SequenceError(f"rank_outputs({picked}): name each kept output once, at least one")
        self._scores = {new: self._scores[old] for new, old in enumerate(picked) if old in self._scores}
        self._outputs = [self._outputs[i] for i in picked]
        self._output_chains = {
            new: self._output_chains[old] for new, old in enumerate(picked) if old in self._output_chains
        }

    def completions(self) -> tuple[tuple[Output, float | None], ...]:
        """(output, score or None) per completion, in order."""
        return tuple((o, self._scores.get(i)) for i, o in enumerate(self._outputs))

    def _completion(self, output: int) -> Output:
        if not 0 <= output < len(self._outputs):
            raise SequenceError(f"output {output} does not exist: this generation has {len(self._outputs)}")
        return self._outputs[output]

    # -- output -----------------------------------------------------------------------------------------
    def commit(self, tokens: Seq[int] | np.ndarray, *, output: int = 0) -> int:
        """Append accepted tokens to the output, applying EOS, max_new_tokens and stop strings; return how
        many were taken (fewer than given once the generation is done)."""
        if output:
            completion = self._completion(output)
            taken = completion.commit(tokens)
            chain = self._output_chains.get(output)  # the clone that follows it, when the chain keeps state
            if taken and chain is not None:
                chain.commit(completion.tokens[-taken:])
            return taken
        taken = self._output.commit(tokens)
        if taken and self._chain:
            self._chain.commit(self._output.tokens[-taken:])
        return taken

    @property
    def done(self) -> bool:
        """Every completion is done (with one output: that output is)."""
        if len(self._outputs) == 1:
            return self._output.done
        return all(o.done for o in self._outputs)

    def is_eos(self, token: int) -> bool:
        """Whether ``token`` is one of the target's end-of-sequence tokens."""
        return self._output.is_eos(int(token))

    @property
    def max_length(self) -> int:
        """The longest the target sequence may grow in this generation (prompt plus new tokens)."""
        return len(self._prompt) + min(self._output.rules.max_new_tokens, self._output.rules.capacity)

    @property
    def remaining(self) -> int:
        """How many more tokens commit() will take."""
        return self._output.remaining

    @property
    def output_tokens(self) -> tuple[int, ...]:
        return tuple(self._output.tokens)

    @property
    def prompt_tokens(self) -> np.ndarray:
        """int64[p]: what the target held before the output: the encoded prompt, or an encoder-decoder model's
        decoder start token (its prompt is the source)."""
        return self._prompt

    # -- processing -------------------------------------------------------------------------------------
    def process(
        self,
        rows: np.ndarray,
        drafted: Seq[int] | None = None,
        *,
        paths: Seq[Seq[int]] | None = None,
        outputs: Seq[int] | None = None,
    ) -> np.ndarray:
        """Run the processor chain over float32[n, vocab] rows; identity (no copy) when none is configured.

        Row i is conditioned on the committed output plus ``drafted[:i]`` (a chain of drafted tokens), or
        plus ``paths[i]`` for arbitrary prefixes (a tree). Neither given: every row follows the committed
        output directly. ``outputs[i]``: row i follows that completion's committed tokens instead (one row per
        completion, as parallel samples step; decoctl.host.Host.new_output).
        """
        if not self._chain:
            return rows
        if outputs is not None and self._output_chains:
            return self._per_output(rows, outputs, drafted, paths, argmax=False)
        return self._chain(rows, self._process_context(len(rows), drafted, paths, outputs))

    def argmax(
        self,
        rows: np.ndarray,
        drafted: Seq[int] | None = None,
        *,
        paths: Seq[Seq[int]] | None = None,
        outputs: Seq[int] | None = None,
    ) -> np.ndarray:
        """int64[n]: each processed row's argmax (the first on ties), what greedy decoding and greedy
        verification need. Equal to ``process(rows, ...).argmax(axis=1)``; the chain may skip its trailing
        steps where they provably keep a row's argmax (``ProcessorChain.argmax``)."""
        if not self._chain:
            return rows.argmax(axis=1)
        if outputs is not None and self._output_chains:
            return self._per_output(rows, outputs, drafted, paths, argmax=True)
        return self._chain.argmax(rows, self._process_context(len(rows), drafted, paths, outputs))

    def _per_output(
        self,
        rows: np.ndarray,
        outputs: Seq[int],
        drafted: Seq[int] | None,
        paths: Seq[Seq[int]] | None,
        *,
        argmax: bool,
    ) -> np.ndarray:
        """process() / argmax() of rows that follow several completions when each completion has a chain of its own
        (a chain that keeps state per sequence): each completion's rows through its chain, with its committed tokens
        as the context's output."""
        if len(outputs) != len(rows) or drafted is not None or paths is not None:
            raise SequenceError(f"process() got {len(rows)} rows and outputs {list(outputs)}: give one output per row")
        result = np.empty(len(rows), np.int64) if argmax else np.empty(rows.shape, np.float32)
        at: dict[int, list[int]] = {}
        for index, output in enumerate(outputs):
            at.setdefault(int(output), []).append(index)
        for output, indices in at.items():
            completion = self._completion(output)
            chain = self._chain if output == 0 else self._output_chains.get(output)
            if chain is None:  # a final completion (new_output(final=True)): it follows the shared chain's prefix
                context = ProcessContext(
                    self._prompt,
                    _NO_TOKENS,
                    [completion.ids] * len(indices),
                    eos_token_ids=self._eos_token_ids,
                    tokenizer=self._tokenizer,
                )
                chain = self._chain
            else:
                context = ProcessContext(
                    self._prompt,
                    completion.ids,
                    [()] * len(indices),
                    eos_token_ids=self._eos_token_ids,
                    tokenizer=self._tokenizer,
                )
            picked = rows[indices]
            result[indices] = chain.argmax(picked, context) if argmax else chain(picked, context)
        return result

    def _process_context(
        self, n: int, drafted: Seq[int] | None, paths: Seq[Seq[int]] | None, outputs: Seq[int] | None = None
    ) -> ProcessContext:
        if outputs is not None:
            if len(outputs) != n or drafted is not None or paths is not None:
                raise SequenceError(f"process() got {n} rows and outputs {list(outputs)}: give one output per row")
            followed = [self._completion(int(o)).ids for o in outputs]
            return ProcessContext(
                self._prompt, _NO_TOKENS, followed, eos_token_ids=self._eos_token_ids, tokenizer=self._tokenizer
            )
        if paths is None and drafted is None and n == 1:
            paths = _NEXT_ONLY  # one row at the next position: what every greedy or sampling step asks
        elif paths is None:
            drafted = () if drafted is None else [int(t) for t in drafted]
            if n > len(drafted) + 1:
                raise SequenceError(
                    f"process() got {n} rows but only {len(drafted)} drafted tokens: row i needs drafted[:i]"
                )
            paths = [drafted[:i] for i in range(n)]
        elif len(paths) != n:
            raise SequenceError(f"process() got {n} rows and {len(paths)} paths: give one path per row")
        return ProcessContext(
            self._prompt, self._output.ids, paths, eos_token_ids=self._eos_token_ids, tokenizer=self._tokenizer
        )
