"""The prefix cache: the KV of prompts and answers kept in blocks keyed by the token prefix, under a memory budget,
for the Generator and the server's engine alike.

cache = PrefixCache.for_model(model, megabytes=256)     # ConfigError: budget below one block, a model it cannot copy
n = cache.restore(sequence, ids)                       # the longest cached prefix of ids copied in; feed ids[n:]
cache.store(sequence)                                  # the sequence's whole blocks kept (prompt, or prompt + answer)

Blocks are hashed and chained, as vLLM's automatic prefix caching keeps them: block i's key is a digest of block
i-1's key and block i's tokens, so a lookup walks the prompt a block at a time through a dict, a store adds only the
blocks not yet kept, and two prompts that share 3 blocks share those 3 entries. A radix tree (SGLang) shares at
token granularity and finds a prefix that ends mid-block, but reuse stops at a block boundary anyway (the KV is
copied in whole blocks) and a tree's nodes split and merge on every store; chained hashes keep the code and its
eviction rule small. Each key also hashes the tokens of the block itself and the entry keeps them, so a digest
collision is a miss, never another prompt's KV. A vision-language prompt's image tokens are the same ids whatever the
image: from the block holding its first image token on, a key also hashes the features of the prompt's images, so
two prompts that differ only in their images share the blocks before the first image and nothing after; a copy never
ends inside an image's run of tokens (a family whose image tokens attend to each other both ways feeds a run whole).
A row's KV depends on the LoRA adapter it runs too (decoctl.model._adapters): every chain starts from a root of the
row's adapter table, so the same tokens under two adapters share no block, and the base model's keys are as before.

Exact: ``restore`` never gives the prompt's last token (its logits must be computed, and a prompt whose every block
is cached still feeds its last block's tail), and what it copies is what a prefill of those tokens left in the
cache. Eviction is by recency: a lookup touches the blocks it used from the last to the first, so a prefix's earlier
blocks are always more recent than its later ones and eviction takes the tails of chains first. A block is in use
only while ``restore`` copies it, under the cache's lock; a request whose blocks are evicted later holds its own copy.

An encoder-decoder model's decoder KV depends on its whole source, not on a token prefix, so for such a model the
cache keeps sources instead of blocks: ``encode(sequence, source)`` restores what a source kept before left in a row
(the encoder's output, keyed by a digest of the source's bytes: a speech window's features, a text source's token
ids), or runs the encoder; ``keep_source(sequence, source)`` keeps it. The same audio transcribed twice runs the
encoder once. The first-pass decoder still computes the cross-attention KV from the restored output (the
cross-attention projections, a small part of the encoder's cost), so every logit is bitwise what it is without the
cache, on any export.

Ring layers (sliding windows) hold position p at row p only until they evict (decoctl.model._kv_blocks): reuse stops
at the ring's capacity (the window plus the rewind slack) instead of keeping a ring's state per block, which on Gemma 3
(window 512, capacity 576) would cost nine times a block's memory for every ring layer of every block.
"""

from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Callable
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import structlog

from decoctl.errors import ConfigError, SequenceError
from decoctl.host import Sequence
from decoctl.model._decoder_runner import SourceState
from decoctl.model._kv_blocks import block_bytes, linear_length, read_blocks, reuse_limit, write_blocks
from decoctl.model._kv_cache import dtype_name, kv_dtype
from decoctl.model._loader import LoadedModel
from decoctl.model._vision import ImageFeatures

__all__ = ["BLOCK_TOKENS", "PrefixCache", "PrefixCacheStats", "prefill_cached", "ring_split"]

log = structlog.get_logger(__name__)

#: positions a block holds: a prompt reuses its prefix up to the last whole block before its last token
BLOCK_TOKENS = 16
_ROOT = b"decoctl-prefix-cache"


@attrs.frozen(kw_only=True)
class PrefixCacheStats:
    """What the cache did since it was made: ``lookups`` (restores asked), ``hits`` (restores that copied at least
    one block), ``tokens_saved`` (prompt tokens copied instead of prefilled), ``blocks``, ``bytes`` (held now,
    blocks and image features), ``budget`` (bytes), ``evicted`` (blocks, or an encoder-decoder model's sources,
    dropped for room), ``image_hits`` (prompts whose images' features were kept), ``source_hits`` (an encoder-decoder
    model's sources restored instead of encoded), ``sources`` (such sources held now)."""

    lookups: int
    hits: int
    tokens_saved: int
    blocks: int
    bytes: int
    budget: int
    evicted: int
    image_hits: int = 0
    source_hits: int = 0
    sources: int = 0


@attrs.frozen(kw_only=True)
class _Block:
    tokens: bytes
    kv: np.ndarray


class PrefixCache:
    """KV blocks of one model's prompts and answers (see the module docstring). Thread-safe."""

    def __init__(self, model: LoadedModel, budget: int, block_tokens: int = BLOCK_TOKENS) -> None:
        spec = model.spec
        #: an encoder-decoder model's sources (SourceState) by the digest of the source, least recent first
        self._sources: collections.OrderedDict[bytes, SourceState] = collections.OrderedDict()
        self._source_bytes = self._source_hits = 0
        #: a vision-language target's image token: blocks from the first one on are keyed by the images too
        self.image_token = None if model.vision is None else model.vision.embedder.image_token
        if block_tokens < 1:
            raise ConfigError(f"prefix cache blocks of {block_tokens} tokens: give at least 1")
        self.model = model
        self.dtype = kv_dtype(model.session, spec)
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes(spec.num_layers, spec.num_kv_heads, spec.head_size, self.dtype, block_tokens)
        if model.encoder is not None:
            largest = source_bytes(model)
            if budget < largest:
                raise ConfigError(
                    f"a prefix cache of {budget} bytes holds no source of model {model.name} (the encoder's output "
                    f"for {model.encoder.parts.source_length} positions is {largest} bytes): give at least "
                    f"{-(-largest // 2**20)} MB, or leave the cache off"
                )
        elif budget < self.block_bytes:
            raise ConfigError(
                f"a prefix cache of {budget} bytes holds no block of model {model.name} (one block of "
                f"{block_tokens} tokens is {self.block_bytes} bytes of {dtype_name(self.dtype)} KV over "
                f"{spec.num_layers} layers): give at least {-(-self.block_bytes // 2**20)} MB, or leave the cache off"
            )
        self.budget = budget
        self._blocks: collections.OrderedDict[bytes, _Block] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._lookups = self._hits = self._saved = self._evicted = 0
        #: a vision-language target's image features by the digest of the images' bytes, least recent first
        self._features: collections.OrderedDict[bytes, ImageFeatures] = collections.OrderedDict()
        self._feature_bytes = self._image_hits = 0

    @classmethod
    def for_model(cls, model: LoadedModel, megabytes: float) -> PrefixCache:
        """A cache of ``megabytes`` MiB for ``model`` (ConfigError where it holds no block, or cannot serve the
        model)."""
        return cls(model, int(megabytes * 2**20))

    # -- keys ------------------------------------------------------------------------------------------------
    def _keys(
        self, ids: np.ndarray, count: int, images: ImageFeatures | None, adapter: int = 0
    ) -> list[tuple[bytes, bytes]]:
        """(key, tokens) of the first ``count`` whole blocks of ``ids``. A prompt's image tokens are the same ids
        whatever the image, so from the block that holds the first of them on, each key also hashes the features of
        the prompt's images (``images``); the blocks before it are the images' alike. ``adapter``: the LoRA table
        the row runs (0: the base model), which roots the chain."""
        size = self.block_tokens
        data = np.ascontiguousarray(ids[: count * size], np.int64).tobytes()
        step = size * 8
        first, digest = self._first_image(ids), b""
        if first is not None:
            digest = _digest(images)
        keys, parent = [], _ROOT if not adapter else _ROOT + b"/lora/" + str(adapter).encode()
        for i in range(count):
            tokens = data[i * step : (i + 1) * step]
            seen = first is not None and (i + 1) * size > first
            parent = hashlib.blake2b(parent + tokens + (digest if seen else b""), digest_size=16).digest()
            keys.append((parent, tokens))
        return keys

    def _first_image(self, ids: np.ndarray) -> int | None:
        """The position of the first image token of ``ids``, or None."""
        if self.image_token is None:
            return None
        found = np.flatnonzero(np.asarray(ids) == self.image_token)
        return int(found[0]) if found.size else None

    def _whole_images(self, ids: np.ndarray, count: int) -> int:
        """``count`` blocks, fewer where the last would end inside a run of image tokens: an image's tokens go in
        one forward (a family whose image tokens attend to each other both ways needs the whole run)."""
        size = self.block_tokens
        while count and self.image_token is not None:
            end = count * size
            if end < len(ids) and ids[end - 1] == self.image_token and ids[end] == self.image_token:
                count -= 1
            else:
                break
        return count

    # -- use -------------------------------------------------------------------------------------------------
    def restore(self, sequence: Sequence, ids: np.ndarray, limit: int | None = None) -> int:
        """Copy the longest cached prefix of ``ids`` (int64[n]) into the empty ``sequence`` (its tokens and KV), in
        whole blocks, never the last token and never more than ``limit`` tokens; return how many it holds now (feed
        ``ids`` from there)."""
        self._check(sequence)
        if self.model.encoder is not None:  # its decoder's KV depends on the source: kept by source (encode)
            return 0
        kv = sequence.runner.kv
        if kv.length:
            raise SequenceError(f"the prefix cache restores into an empty row, not one holding {kv.length} tokens")
        cap = min(len(ids) - 1, reuse_limit(kv), len(ids) if limit is None else limit)
        count = self._whole_images(ids, max(cap, 0) // self.block_tokens)
        images = sequence.images
        with self._lock:
            self._lookups += 1
            found: list[tuple[bytes, _Block]] = []
            for key, tokens in self._keys(ids, count, images, sequence.runner.adapter):
                block = self._blocks.get(key)
                if block is None or block.tokens != tokens:
                    break
                found.append((key, block))
            for key, _ in reversed(found):  # the chain's head ends most recent: eviction takes tails first
                self._blocks.move_to_end(key)
            if not found:
                return 0
            write_blocks(kv, [b.kv for _, b in found], self.block_tokens)
            self._hits += 1
            length = len(found) * self.block_tokens
            self._saved += length
        sequence.adopt_tokens(np.asarray(ids[:length], np.int64), images)
        return length

    def cached(self, ids: np.ndarray, room: int, images: ImageFeatures | None = None, adapter: int = 0) -> int:
        """How many tokens ``restore`` would give ``ids`` (with ``images``, its image tokens' features; under LoRA
        table ``adapter``) now, into a row of ``room`` reusable positions (touches nothing)."""
        cap = min(len(ids) - 1, room)
        count = self._whole_images(ids, max(cap, 0) // self.block_tokens)
        with self._lock:
            found = 0
            for key, tokens in self._keys(ids, count, images, adapter):
                block = self._blocks.get(key)
                if block is None or block.tokens != tokens:
                    break
                found += 1
        return found * self.block_tokens

    def store(self, sequence: Sequence) -> int:
        """Keep the whole blocks of what ``sequence`` holds (its prompt, or prompt and answer) that are not kept yet,
        evicting the least recently used blocks for room; return how many blocks were added. A row that still holds a
        whole tree, or whose ring layers evicted before a block ends, keeps nothing past that point."""
        self._check(sequence)
        if self.model.encoder is not None:  # its decoder's KV depends on the source: kept by source (keep_source)
            return 0
        try:
            sequence.check_batchable("keeping a prefix")
        except SequenceError:
            return 0  # its tokens are a tree's, not one prefix
        kv = sequence.runner.kv
        count = linear_length(kv) // self.block_tokens
        if count == 0:
            return 0
        tokens = np.asarray(sequence.tokens)
        keys = self._keys(tokens, count, sequence.images, sequence.runner.adapter)
        with self._lock:
            have = 0
            while have < count and keys[have][0] in self._blocks:
                have += 1
            room = (self.budget - self._feature_bytes) // self.block_bytes
            count = min(count, room)  # a chain longer than the budget keeps its head
            added = max(count - have, 0)
            if added:
                data = read_blocks(kv, have * self.block_tokens, self.block_tokens, added)
                for key, _ in keys[:have]:  # the blocks it continues are never the ones evicted for it
                    self._blocks.move_to_end(key)
                while len(self._blocks) + added > room:
                    self._blocks.popitem(last=False)
                    self._evicted += 1
                for (key, block_tokens), block in zip(keys[have:count], data, strict=True):
                    self._blocks[key] = _Block(tokens=block_tokens, kv=block)
            for key, _ in reversed(keys[:count]):  # tail to head: the head ends most recent, tails go first
                self._blocks.move_to_end(key)
        return added

    def image_features(
        self, pictures: Seq[Any], encode: Callable[[list[Any]], ImageFeatures], salt: str = ""
    ) -> ImageFeatures:
        """The features ``encode(pictures)`` gives, kept by the digest of the pictures' bytes in order (with ``salt``,
        the options the encoding depends on, such as a pixel limit): a prompt that carries the same images as a kept
        one (the next turn of a chat about a picture) runs no vision encoder. Pictures as bytes or file paths are
        kept; a call with any other kind (a PIL image) is encoded every time. The features held never take more than
        a quarter of the budget; the blocks have what the features leave."""
        key = _pictures_key(pictures, salt)
        if key is None:
            return encode(list(pictures))
        with self._lock:
            held = self._features.get(key)
            if held is not None:
                self._features.move_to_end(key)
                self._image_hits += 1
                return held
        features = encode(list(pictures))
        size = features.rows.nbytes
        with self._lock:
            if key not in self._features and size <= self.budget // 4:
                while self._features and self._feature_bytes + size > self.budget // 4:
                    self._feature_bytes -= self._features.popitem(last=False)[1].rows.nbytes
                while self._blocks and len(self._blocks) * self.block_bytes + self._feature_bytes + size > self.budget:
                    self._blocks.popitem(last=False)
                    self._evicted += 1
                self._features[key] = features
                self._feature_bytes += size
        return features

    def encode(self, sequence: Sequence, source: np.ndarray) -> bool:
        """``sequence.encode(source)``, or, where ``source`` was kept (``keep_source``), what it left restored into
        the row without running the encoder; True for the latter."""
        self._check(sequence)
        key = _source_key(source)
        with self._lock:
            state = self._sources.get(key)
            if state is not None:
                self._sources.move_to_end(key)
                self._source_hits += 1
        if state is None:
            sequence.encode(source)
            return False
        sequence.adopt_source(state)
        return True

    def keep_source(self, sequence: Sequence, source: np.ndarray) -> bool:
        """Keep what ``sequence``'s encoder computed from ``source``, evicting the least recently used sources for
        room; True where it was added."""
        self._check(sequence)
        key = _source_key(source)
        with self._lock:
            if key in self._sources:
                return False
        state = sequence.runner.source_state()
        if state is None or state.nbytes > self.budget:
            return False
        with self._lock:
            if key in self._sources:
                return False
            while self._sources and self._source_bytes + state.nbytes > self.budget:
                self._source_bytes -= self._sources.popitem(last=False)[1].nbytes
                self._evicted += 1
            self._sources[key] = state
            self._source_bytes += state.nbytes
        return True

    def stats(self) -> PrefixCacheStats:
        with self._lock:
            return PrefixCacheStats(
                lookups=self._lookups,
                hits=self._hits,
                tokens_saved=self._saved,
                blocks=len(self._blocks),
                bytes=len(self._blocks) * self.block_bytes + self._feature_bytes + self._source_bytes,
                budget=self.budget,
                evicted=self._evicted,
                image_hits=self._image_hits,
                source_hits=self._source_hits,
                sources=len(self._sources),
            )

    def _check(self, sequence: Sequence) -> None:
        if sequence.model.session is not self.model.session:
            raise ConfigError(
                f"this prefix cache keeps model {self.model.name}'s KV, not model {sequence.model.name}'s: give each "
                "model its own cache"
            )


def source_bytes(model: LoadedModel) -> int:
    """The bytes one source of ``model`` (an encoder-decoder model) takes in the cache at its longest: the encoder's
    output over its longest source."""
    encoder = model.encoder
    assert encoder is not None
    return encoder.parts.source_length * encoder.hidden_size * encoder.hidden_dtype.itemsize


def _source_key(source: np.ndarray) -> bytes:
    """A digest of an encoder's source: its dtype, shape and bytes."""
    data = np.ascontiguousarray(source)
    head = f"{data.dtype.str}{data.shape}".encode()
    return hashlib.blake2b(b"decoctl-source/" + head + data.tobytes(), digest_size=16).digest()


def prefill_cached(cache: PrefixCache, sequence: Sequence, ids: np.ndarray, chunk: int | None) -> int:
    """Prefill ``ids`` into the empty ``sequence`` through ``cache``: the longest cached prefix copied in, the rest
    fed (``chunk`` tokens a run) and the prompt's whole blocks kept; return the tokens copied. On a model with ring
    layers, a prompt longer than their capacity is fed in two parts, the part the rings hold linearly first, so that
    its blocks can be kept before the rings evict them."""
    copied = cache.restore(sequence, ids)
    split = ring_split(cache, sequence, ids)
    if split is not None and copied < split:
        sequence.prefill(ids[copied:split], chunk, logits=False)
        cache.store(sequence)
        sequence.prefill(ids[split:], chunk)
        return copied
    sequence.prefill(ids[copied:], chunk)
    cache.store(sequence)
    return copied


def _digest(images: ImageFeatures | None) -> bytes:
    """A digest of a prompt's images as the model sees them: every image's feature rows, their counts and grids."""
    if images is None:
        return b"no images"
    digest = hashlib.blake2b(np.ascontiguousarray(images.rows).tobytes(), digest_size=16)
    digest.update(repr((images.per_image, images.grids, images.rows.shape, images.rows.dtype.str)).encode())
    return digest.digest()


def ring_split(cache: PrefixCache, sequence: Sequence, ids: np.ndarray) -> int | None:
    """Where a prompt ``ids`` fed into ``sequence`` must pause for its blocks to be kept: the last whole block the
    rings of a ring-cache model hold from position 0 (a prompt fed past it in one forward evicts them first), never
    inside an image's tokens; None on a model without ring layers."""
    kv = sequence.runner.kv
    if kv.rings is None:
        return None
    size = cache.block_tokens
    return cache._whole_images(ids, min(reuse_limit(kv), len(ids) - 1) // size) * size


def _pictures_key(pictures: Seq[Any], salt: str) -> bytes | None:
    """A digest of ``pictures`` (bytes or file paths) in order, or None where one is of another kind."""
    digest = hashlib.blake2b(salt.encode(), digest_size=16)
    for picture in pictures:
        if isinstance(picture, bytes | bytearray | memoryview):
            data = bytes(picture)
        elif isinstance(picture, str | Path):
            try:
                data = Path(picture).read_bytes()
            except OSError:
                return None  # the encoder names the file it cannot read
        else:
            return None
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.digest()
