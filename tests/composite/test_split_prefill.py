"""A split prefill/decode export (NPU-style: a prefill graph of a fixed chunk length and a decode graph sharing one
KV cache) against its one-graph twin: the prefill graph runs every multi-token forward chunk by chunk, padding the
last chunk, and every strategy gives the twin's tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from split_models import split_export

from decoctl import Generator, ModelLoadError
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.plugins import PluginRegistry
from decoctl.testing import build_genai_model, reference_logits

CHUNK = 8
ATOL = 1e-4
PROMPT = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("one-graph") / "m", seed=4, num_layers=2)


@pytest.fixture(scope="module")
def split(twin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return split_export(twin, tmp_path_factory.mktemp("split") / "m", CHUNK)


def test_a_prompt_runs_through_the_prefill_graph_chunk_by_chunk_with_the_twins_logits(split: Path, twin: Path) -> None:
    sequence = Sequence("target", load_model(split, threads=1))
    tokens = list(range(5, 25))  # 20 tokens: chunks of 8, 8 and a padded 4

    logits = np.array(sequence.forward(tokens))

    np.testing.assert_allclose(logits, reference_logits(twin, tokens), atol=ATOL)
    assert sequence._runner._prefill is not None and sequence._runner._prefill.runs == 3


def test_steps_and_rewinds_after_a_split_prefill_give_the_twins_logits(split: Path, twin: Path) -> None:
    sequence = Sequence("target", load_model(split, threads=1))
    fed = list(range(5, 16))
    sequence.forward(fed)
    for token in (7, 8, 9):
        step = np.array(sequence.forward([token]))
        fed.append(token)
        np.testing.assert_allclose(step[-1], reference_logits(twin, fed)[-1], atol=ATOL)
    sequence.rewind(9)
    fed = fed[:9]

    verify = np.array(sequence.forward([3, 4, 5]))  # a verification-sized forward: the prefill graph, padded

    np.testing.assert_allclose(verify, reference_logits(twin, [*fed, 3, 4, 5])[-3:], atol=ATOL)


@pytest.mark.parametrize(
    ("controller", "options"),
    [
        ("greedy", {}),
        ("speculative", {"drafter": "prompt-lookup"}),
        ("sample", {"temperature": 0.9}),
        ("beam", {"num_beams": 3, "num_return_sequences": 2}),
    ],
)
def test_every_strategy_gives_the_one_graph_twins_tokens(
    split: Path, twin: Path, controller: str, options: dict[str, Any]
) -> None:
    registry = PluginRegistry()
    results = [
        Generator({"target": folder}, controller, options=options, registry=registry, threads=1).generate(
            PROMPT, max_new_tokens=40, seed=3
        )
        for folder in (split, twin)
    ]

    assert [c.tokens for c in results[0].completions] == [c.tokens for c in results[1].completions]


def test_a_prefill_graph_without_query_seqlens_is_refused_by_name(split: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(split, folder)
    model = onnx.load(folder / "prefill.onnx")
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention":
            node.input[16] = ""
    kept = [i for i in model.graph.input if i.name != "query_seqlens"]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    onnx.save(model, folder / "prefill.onnx")

    with pytest.raises(ModelLoadError, match=r"prefill.onnx: a prefill graph takes query_seqlens"):
        load_model(folder, threads=1)


def test_a_prefill_session_that_does_not_share_the_kv_cache_is_refused(split: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(split, folder)
    description = json.loads((folder / "pipeline.json").read_text(encoding="utf-8"))
    description["sessions"]["prefill"]["shares_kv"] = False
    (folder / "pipeline.json").write_text(json.dumps(description), encoding="utf-8")

    with pytest.raises(ModelLoadError, match=r"session 'prefill' feeds nothing"):
        load_model(folder, threads=1)
