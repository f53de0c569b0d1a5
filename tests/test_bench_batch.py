"""`decoctl bench --batch`: many sequences at once against onnxruntime-genai (decoctl.bench._batch).

A tiny model whose EOS is a token its greedy outputs often reach, so that rows of a batch end at different steps (and
decoctl refills them) while onnxruntime-genai pads them. No timing is asserted: only the report's structure and that
every contender's outputs equal decoctl's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from decoctl.bench._batch import equal_length_prompts, parse_batch_sizes
from decoctl.cli import main
from decoctl.errors import ConfigError
from decoctl.model import load_model
from decoctl.testing import build_genai_model

PROMPTS = ("import os\nimport sys", "class A:\n    pass", "def f(x):\n    return", "x = [1, 2, 3]", "for i in x:")
MAX_NEW = 16


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain twins of tree models go to this test's folder, not the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def eos_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Its greedy outputs reach token 50 within 16 tokens for some of PROMPTS, and that is its EOS."""
    return build_genai_model(tmp_path_factory.mktemp("bench-batch"), seed=3, eos_token_id=50)


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def batch_json(model: Path, prompts: Path, tmp_path: Path, *extra: str) -> dict[str, Any]:
    report = tmp_path / "batch.json"
    args = ["bench", "-m", str(model), "--batch", "1,2", "--prompts", str(prompts), "-n", str(MAX_NEW)]
    args += ["--repeats", "1", "--threads", "1", "--fork-prefix", "32", "--json", str(report), *extra]
    assert main(args) == 0
    return dict(json.loads(report.read_text()))


# -- options ----------------------------------------------------------------------------------------------------
def test_batch_sizes_parse_in_the_order_given() -> None:
    assert parse_batch_sizes("1,4,16,64") == [1, 4, 16, 64]
    assert parse_batch_sizes(" 8, 2 ") == [8, 2]


@pytest.mark.parametrize(
    ("text", "message"),
    [("0", "'0' is not a batch size"), ("1,x", "'x' is not a batch size"), (",", "names no batch size"),
     ("2,2", "a batch size twice")],
)  # fmt: skip
def test_bad_batch_sizes_are_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_batch_sizes(text)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--runs", "2"], "takes no --runs"),
        (["--contenders", "greedy,raw-ort"], "not ['raw-ort']"),
        (["--beams", "0"], "--beams 0"),
        (["--batch-rounds", "0"], "--batch-rounds 0"),
    ],
)
def test_options_a_batch_bench_cannot_honour_are_refused(
    eos_model: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "-m", str(eos_model), "--batch", "1,2", "-n", "2", *extra]) == 2
    assert message in capsys.readouterr().err


def test_prompts_are_cut_to_the_shortest_length_in_tokens(eos_model: Path) -> None:
    tokenizer = load_model(eos_model).tokenizer
    texts, ids = equal_length_prompts(tokenizer, PROMPTS)
    shortest = min(len(tokenizer.encode(p)) for p in PROMPTS)
    assert {len(i) for i in ids} == {shortest}
    assert [tokenizer.encode(t) for t in texts] == ids
    assert all(p.startswith(t) for p, t in zip(PROMPTS, texts, strict=False))


# -- a run ------------------------------------------------------------------------------------------------------
def test_a_batch_bench_reports_every_batch_size_with_outputs_equal_to_decoctls(
    eos_model: Path, prompts: Path, tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime_genai")

    data = batch_json(eos_model, prompts, tmp_path, "--batch-rounds", "2", "--require-identical")

    rows = {(r["name"], r["batch"]): r for r in data["results"]}
    assert sorted(rows) == [("greedy", 1), ("greedy", 2), ("ort-genai", 1), ("ort-genai", 2)]
    for (name, batch), row in rows.items():
        assert row["prompts"] == 2 * batch
        assert row["tokens_per_s"] > 0 and row["per_row_tokens_per_s"] == pytest.approx(row["tokens_per_s"] / batch)
        assert row["identical_to_baseline"] is (None if name == "greedy" else True)
    assert rows["greedy", 1]["vs_batch_1"] == 1.0
    assert rows["greedy", 2]["tokens"] < 4 * MAX_NEW  # some rows ended at the EOS, before the others
    assert rows["greedy", 2]["tokens"] == rows["ort-genai", 2]["tokens"]
    beams = {r["name"]: r for r in data["beam"]}
    assert set(beams) == {"beam", "ort-genai-beam"} and beams["ort-genai-beam"]["identical_to_baseline"] is True
    assert data["fork"]["prefix_tokens"] == 32 and data["fork"]["fork_ms"] > 0 and data["fork"]["decode_step_ms"] > 0
    assert data["skipped"] == {} and set(data["rss_mb"]) == {"1", "2"}


def test_onnxruntime_genai_contenders_are_skipped_when_it_is_not_installed(
    eos_model: Path, prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)  # import onnxruntime_genai raises ImportError

    data = batch_json(eos_model, prompts, tmp_path)

    assert {r["name"] for r in data["results"]} == {"greedy"}
    assert {r["name"] for r in data["beam"]} == {"beam"}
    assert set(data["skipped"]) == {"ort-genai", "ort-genai-beam"}
    assert "pip install 'decoctl[ort-genai]'" in data["skipped"]["ort-genai"]


def test_a_concat_cache_model_steps_its_rows_one_run_per_row_and_skips_onnxruntime_genai(
    optimum_model: Path, prompts: Path, tmp_path: Path
) -> None:
    data = batch_json(optimum_model, prompts, tmp_path, "--contenders", "greedy,beam,ort-genai")

    assert {r["name"] for r in data["results"]} == {"greedy"}
    assert {r["name"] for r in data["beam"]} == {"beam"}
    assert "stepped one Run per row (concatenated KV cache)" in data["notes"]["greedy"]
    assert data["notes"]["beam"] == "beams stepped one Run per row (concatenated KV cache)"
    assert set(data["skipped"]) == {"ort-genai"}
    assert data["fork"]["prefix_tokens"] > 0
