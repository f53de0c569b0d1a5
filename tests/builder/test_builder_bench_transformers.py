"""The bench's transformers contenders (decoctl.bench._transformers) on a decoder-only model: the builder's Llama export
beside the weights it came from, whose two EOS ids (one listed in generation_config.json only) both end the
contenders' outputs as they end decoctl greedy's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builder_models import Export

from decoctl.cli import main

PROMPTS = ("def fibonacci(n):", "x", "class Stack:", "import os")


def test_the_transformers_contenders_give_decoctl_greedy_s_tokens_on_a_decoder_only_model(
    llama: Export, tmp_path: Path
) -> None:
    pytest.importorskip("torch", reason="the transformers contenders need torch")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    model = llama.hf
    contenders = (
        f"greedy,hf=hf(model={model}),assisted=hf-assisted(model={model};draft={model};k=4),"
        f"lookup=hf-lookup(model={model};k=4)"
    )
    report = tmp_path / "bench.json"
    args = ["bench", "-m", str(llama.onnx), "--contenders", contenders, "--prompts", str(prompts), "-n", "12"]
    args += ["--repeats", "1", "--threads", "1", "--calibration-pairs", "1", "--no-huge-pages"]
    assert main([*args, "--require-identical", "--json", str(report)]) == 0
    rows = {c["name"]: c for c in json.loads(report.read_text())["contenders"]}
    assert all(row["identical_to_baseline"] for row in rows.values())
    # an EOS ends some prompt early: each output is whole, not cut at the bench's 12 tokens
    assert rows["greedy"]["tokens"] < 12 * len(PROMPTS)
    assert rows["hf"]["target_forwards"] == rows["greedy"]["target_forwards"]
