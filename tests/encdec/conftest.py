"""The session's encoder-decoder exports (tests/encdec/seq2seq_exports.py), each made once, on first use."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def seq2seq(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("torch", reason="the encoder-decoder tests export with torch (the test extra brings it)")
    pytest.importorskip("transformers", reason="the encoder-decoder tests build their models with transformers")
    from seq2seq_exports import Seq2SeqExports

    return Seq2SeqExports(tmp_path_factory.mktemp("seq2seq"))
