"""The trainer's data and feature store, without torch: documents from text and JSONL, BOS-led windows, the draft
vocabulary, and shards that an interrupted extraction resumes after its last finished one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from decoctl_eagle.training.data import documents, frequent_tokens, windows
from decoctl_eagle.training.features import FeatureStore

from decoctl import ConfigError

BOS = 1


def ignore(_tokens: int) -> None:
    pass


class FakeTarget:
    """A Sequence stand-in: features are the token ids spread over the width, logits favour token + 1."""

    def __init__(self, width: int, vocab: int = 50) -> None:
        self.width, self.vocab = width, vocab
        self.ids: np.ndarray = np.zeros(0, np.int64)

    def rewind(self, length: int) -> None:
        assert length == 0

    def forward(self, ids: np.ndarray) -> np.ndarray:
        self.ids = np.asarray(ids)
        logits = np.zeros((len(ids), self.vocab), np.float32)
        logits[np.arange(len(ids)), (self.ids + 1) % self.vocab] = 5.0
        return logits

    def hidden_states(self, kind: str = "final") -> np.ndarray:
        return np.repeat(self.ids[:, None].astype(np.float32) * 1000.5, self.width, axis=1)


def test_jsonl_and_text_files_give_documents(tmp_path: Path) -> None:
    jsonl = tmp_path / "chats.jsonl"
    lines = [{"text": "one"}, {"prompt": "Q: ", "completion": "two"}, "three", {"prompt": "four"}]
    jsonl.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n", encoding="utf-8")
    text = tmp_path / "notes.txt"
    text.write_text("a\nb\n", encoding="utf-8")
    assert list(documents([jsonl, text])) == ["one", "Q: two", "three", "four", "a\nb\n"]


def test_a_jsonl_line_without_text_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"text": "ok"}\n{"title": "no text"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: a line needs a 'text' string"):
        list(documents([jsonl]))


def test_windows_start_with_bos_once_and_drop_short_tails() -> None:
    ids = [BOS, *range(10, 20)]
    cut = windows(ids, 4, BOS, shortest=3)
    assert [w.tolist() for w in cut] == [[BOS, 10, 11, 12], [BOS, 13, 14, 15], [BOS, 16, 17, 18]]
    assert [w.tolist() for w in windows(list(range(10, 15)), 4, None)] == [[10, 11, 12, 13]]


def test_the_draft_vocabulary_is_the_most_frequent_tokens_ascending() -> None:
    counts = np.array([0, 5, 1, 5, 9, 0])
    assert frequent_tokens(counts, 3).tolist() == [1, 3, 4]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_stored_features_read_back_as_extracted(dtype: str, tmp_path: Path) -> None:
    store = FeatureStore(tmp_path, kind="aux", width=6, topk=3, dtype=dtype, fingerprint="x")
    data = [np.arange(2, 9, dtype=np.int32), np.arange(20, 25, dtype=np.int32)]
    store.extract(FakeTarget(6), iter(data), shard_tokens=100, heldout_every=0, max_train_tokens=None, report=ignore)
    ids, features, label_ids, label_logits = store.read(store.windows(heldout=False)[1])
    assert ids.tolist() == list(range(20, 25))
    np.testing.assert_allclose(
        features[:, 0], np.arange(20, 25) * 1000.5, rtol={"bfloat16": 4e-3, "float16": 5e-4}.get(dtype, 1e-6)
    )
    assert label_ids[:, 0].tolist() == list(range(21, 26))
    assert (label_logits[:, 0] == 5.0).all()


def test_an_interrupted_extraction_resumes_after_its_last_finished_shard(tmp_path: Path) -> None:
    data = [np.full(10, i, np.int32) for i in range(10)]
    meta = {"kind": "final", "width": 2, "topk": 2, "dtype": "float32", "fingerprint": "x"}
    seen: list[int] = []

    def stop_at_six(n: int) -> None:
        seen.append(n)
        if len(seen) == 6:
            raise KeyboardInterrupt

    store = FeatureStore(tmp_path, **meta)
    with pytest.raises(KeyboardInterrupt):
        store.extract(
            FakeTarget(2), iter(data), shard_tokens=20, heldout_every=5, max_train_tokens=None, report=stop_at_six
        )
    resumed = FeatureStore(tmp_path, **meta)
    assert resumed.windows_done == 4  # two shards of two windows finished; the fifth and sixth are done again
    resumed.extract(FakeTarget(2), iter(data), shard_tokens=20, heldout_every=5, max_train_tokens=None, report=ignore)
    kept = [resumed.read(w)[0][0] for w in resumed.windows(heldout=False)]
    held = [resumed.read(w)[0][0] for w in resumed.windows(heldout=True)]
    assert kept == [0, 1, 2, 3, 5, 6, 7, 8] and held == [4, 9]
    with pytest.raises(ConfigError, match=r"other settings \(width"):
        FeatureStore(tmp_path, **{**meta, "width": 3})
