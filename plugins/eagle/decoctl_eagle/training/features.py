"""The target's features and labels for every training token, in memory-mapped shards under ``DIR/features``.

Each window of tokens is run through the ONNX target by decoctl's own runtime (one forward from an empty cache,
``Sequence.hidden_states``), and per token the store keeps:

- ``ids``: int32, the token;
- ``features``: the head's input from the target (``aux_hidden_states``, the three taps, for EAGLE-3; the final
  ``hidden_states`` for EAGLE-1), bfloat16 by default (kept as uint16: numpy has no bfloat16), which has float32's
  range: real models' residual streams pass float16's (Gemma 3's taps reach 1e5);
- ``label_ids`` / ``label_logits``: the target's ``topk`` most likely next tokens and their logits (int32, float32),
  best first: the distribution the head learns (renormalised over them) and the target's greedy choice.

A shard is one set of ``.npy`` files (numpy's format, opened with ``np.load(mmap_mode="r")``) of up to
``shard_tokens`` rows; ``manifest.json`` lists the finished shards with their windows (offset, length, held out)
and how many of the data's windows are done, so an interrupted extraction resumes after its last finished shard.
Every ``heldout_every``-th window is held out for evaluation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from decoctl import ConfigError

__all__ = ["FeatureStore", "Shard", "Window"]

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
_ARRAYS = ("ids", "features", "label_ids", "label_logits")


@attrs.frozen
class Window:
    """One window of a shard: rows ``offset .. offset + length`` of shard ``shard``."""

    shard: int
    offset: int
    length: int
    heldout: bool


@attrs.frozen
class Shard:
    """The arrays of one finished shard (memory-mapped, read only)."""

    ids: np.ndarray
    features: np.ndarray
    label_ids: np.ndarray
    label_logits: np.ndarray


class FeatureStore:
    """``DIR/features``: its manifest and shards. ``kind``: "aux" (EAGLE-3's taps) or "final" (EAGLE-1)."""

    def __init__(self, folder: Path, *, kind: str, width: int, topk: int, dtype: str, fingerprint: str) -> None:
        self.folder = folder
        self.meta = {"kind": kind, "width": width, "topk": topk, "dtype": dtype, "fingerprint": fingerprint}
        self.manifest: dict[str, Any] = {"version": FORMAT_VERSION, **self.meta, "shards": [], "windows_done": 0}
        path = folder / MANIFEST
        if path.is_file():
            found = json.loads(path.read_text(encoding="utf-8"))
            differing = [key for key, value in self.meta.items() if found.get(key) != value]
            if differing:
                raise ConfigError(
                    f"{folder} holds features extracted with other settings ({', '.join(differing)}: "
                    f"{[found.get(k) for k in differing]} there, {[self.meta[k] for k in differing]} now): give "
                    "another --out, or delete that folder to extract them again"
                )
            self.manifest = found
        self._open: dict[int, Shard] = {}

    # -- reading ------------------------------------------------------------------------------------------------
    @property
    def windows_done(self) -> int:
        return int(self.manifest["windows_done"])

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    def windows(self, *, heldout: bool) -> list[Window]:
        return [
            Window(index, int(offset), int(length), bool(held))
            for index, shard in enumerate(self.manifest["shards"])
            for offset, length, held in shard["windows"]
            if bool(held) == heldout
        ]

    def tokens(self, *, heldout: bool) -> int:
        return sum(w.length for w in self.windows(heldout=heldout))

    def shard(self, index: int) -> Shard:
        if index not in self._open:
            entry = self.manifest["shards"][index]
            rows = int(entry["rows"])
            arrays = [np.load(self.folder / f"{entry['name']}.{name}.npy", mmap_mode="r")[:rows] for name in _ARRAYS]
            self._open[index] = Shard(*arrays)
        return self._open[index]

    def read(self, window: Window) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, features, label_ids, label_logits) of one window, as arrays in memory."""
        shard = self.shard(window.shard)
        rows = slice(window.offset, window.offset + window.length)
        return (
            np.asarray(shard.ids[rows]),
            _decoded(np.asarray(shard.features[rows]), self.meta["dtype"]),
            np.asarray(shard.label_ids[rows]),
            np.asarray(shard.label_logits[rows]),
        )

    # -- writing ------------------------------------------------------------------------------------------------
    def extract(
        self,
        target: Any,
        windows: Iterable[np.ndarray],
        *,
        shard_tokens: int,
        heldout_every: int,
        max_train_tokens: int | None,
        report: Callable[[int], None],
    ) -> None:
        """Run the target over every window not yet extracted (the first ``windows_done`` are skipped) and write
        full shards as they fill; stop once ``max_train_tokens`` training tokens are stored. ``target``: a decoctl
        Sequence of the target; ``report(n)``: n more tokens are done."""
        self.folder.mkdir(parents=True, exist_ok=True)
        done = self.windows_done
        trained = self.tokens(heldout=False)
        writer: _ShardWriter | None = None
        position = done  # the index of the next window to extract
        for index, window in enumerate(windows):
            if index < done:
                continue
            if max_train_tokens is not None and trained >= max_train_tokens:
                break
            heldout = heldout_every > 0 and index % heldout_every == heldout_every - 1
            if writer is None:
                writer = _ShardWriter(self.folder, len(self.manifest["shards"]), shard_tokens, self.meta)
            writer.add(*_target_rows(target, window, self.meta), heldout=heldout)
            trained += 0 if heldout else len(window)
            position = index + 1
            report(len(window))
            if writer.rows >= shard_tokens:
                self._finish(writer, position)
                writer = None
        if writer is not None and writer.rows:
            self._finish(writer, position)
        self.manifest["complete"] = True
        self._save()
        if not self.windows(heldout=False):
            raise ConfigError("the data gave no training window: give more text (--data) or --distill-prompts")

    def _finish(self, writer: _ShardWriter, windows_done: int) -> None:
        self.manifest["shards"].append(writer.close())
        self.manifest["windows_done"] = windows_done
        self._save()

    def _save(self) -> None:
        path = self.folder / MANIFEST
        staging = path.with_name(MANIFEST + ".tmp")
        staging.write_text(json.dumps(self.manifest, indent=1) + "\n", encoding="utf-8")
        os.replace(staging, path)


def _target_rows(target: Any, window: np.ndarray, meta: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """(ids, features, label ids, label logits) of one window from one target forward."""
    target.rewind(0)
    logits = target.forward(window)
    features = target.hidden_states(kind="aux" if meta["kind"] == "aux" else "final")
    if meta["dtype"] == "float16" and np.abs(features).max() > 60000:
        raise ConfigError(
            "the target's features pass float16's range (above 60000): extract them with --feature-dtype bfloat16 (the "
            "default) or float32"
        )
    # torch's top-k, on torch's threads: an order of magnitude faster than numpy's argpartition over a large
    # vocabulary (Gemma's 262k: 0.05 s a window of 256 tokens against 0.86 s, which was 40% of the extraction)
    import torch

    values, top = torch.topk(torch.from_numpy(np.asarray(logits)), meta["topk"], dim=1, sorted=True)
    return (
        np.asarray(window, np.int32),
        _encoded(np.asarray(features, np.float32), meta["dtype"]),
        top.numpy().astype(np.int32),
        values.numpy().astype(np.float32),
    )


def _storage(dtype: str) -> np.dtype:
    return np.dtype(np.uint16 if dtype == "bfloat16" else dtype)


def _encoded(features: np.ndarray, dtype: str) -> np.ndarray:
    """float32 features as stored: bfloat16 as the upper half of each float32, rounded to nearest even."""
    if dtype != "bfloat16":
        return features.astype(dtype)
    bits = np.ascontiguousarray(features, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _decoded(stored: np.ndarray, dtype: str) -> np.ndarray:
    if dtype != "bfloat16":
        return stored.astype(np.float32)
    return (stored.astype(np.uint32) << 16).view(np.float32)


class _ShardWriter:
    """A shard being filled: memory-mapped .npy files of ``capacity`` rows, written as windows come."""

    def __init__(self, folder: Path, index: int, shard_tokens: int, meta: dict[str, Any]) -> None:
        self.name = f"shard-{index:05d}"
        self.folder = folder
        self.capacity = shard_tokens
        self.meta = meta
        self.rows = 0
        self.windows: list[list[Any]] = []
        self.arrays: dict[str, np.ndarray] = {}

    def _grow(self, needed: int) -> None:
        if self.arrays and needed <= self.capacity:
            return
        self.capacity = max(self.capacity, needed)
        shapes = {
            "ids": ((self.capacity,), np.int32),
            "features": ((self.capacity, self.meta["width"]), _storage(self.meta["dtype"])),
            "label_ids": ((self.capacity, self.meta["topk"]), np.int32),
            "label_logits": ((self.capacity, self.meta["topk"]), np.float32),
        }
        for name, (shape, dtype) in shapes.items():
            grown = np.lib.format.open_memmap(self._path(name, ".tmp"), mode="w+", dtype=dtype, shape=shape)
            if name in self.arrays:
                grown[: self.rows] = self.arrays[name][: self.rows]
                del self.arrays[name]
            self.arrays[name] = grown
            os.replace(self._path(name, ".tmp"), self._path(name, ".part"))

    def _path(self, name: str, suffix: str) -> Path:
        return self.folder / f"{self.name}.{name}.npy{suffix}"

    def add(self, *rows: np.ndarray, heldout: bool) -> None:
        n = len(rows[0])
        self._grow(self.rows + n)
        for name, value in zip(_ARRAYS, rows, strict=True):
            self.arrays[name][self.rows : self.rows + n] = value
        self.windows.append([self.rows, n, heldout])
        self.rows += n

    def close(self) -> dict[str, Any]:
        """Flush, give the files their final names, and return the shard's manifest entry."""
        for name, array in self.arrays.items():
            array.flush()
            os.replace(self._path(name, ".part"), self.folder / f"{self.name}.{name}.npy")
        self.arrays.clear()
        return {"name": self.name, "rows": self.rows, "windows": self.windows}
