"""optimum-onnx's own exports of the tiny T5 and BART load and give transformers' greedy tokens.

optimum-onnx needs transformers < 4.58, so this runs in the ``test-exports`` extra's environment (pyproject.toml says
how to make it: ``build/venv-exports/bin/python -m pytest tests/encdec/test_optimum_seq2seq.py``); elsewhere it
skips, saying why. Each export is made as ``optimum-cli export onnx --task text2text-generation-with-past`` makes it
(its merged decoder, next to the two it was merged from) and with ``--no-post-process`` (the pair alone).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import pytest

from decoctl import Generator


def _why_not() -> str | None:
    try:
        versions = {name: importlib.metadata.version(name) for name in ("optimum-onnx", "transformers")}
    except importlib.metadata.PackageNotFoundError as exc:
        return f"{exc.name} is not installed (the test-exports extra brings it: see pyproject.toml)"
    if tuple(int(part) for part in versions["transformers"].split(".")[:2]) >= (4, 58):
        return f"optimum-onnx needs transformers < 4.58, and {versions['transformers']} is installed"
    return None


REASON = _why_not()
if REASON is not None:
    pytest.skip(f"optimum-onnx encoder-decoder exports: {REASON}", allow_module_level=True)

PROMPTS = ("def fibonacci(n):", "class Stack:\n    def push(self, item):", "for x in range(10):")
NEW = 24


@pytest.fixture(scope="module")
def optimum_folder(seq2seq: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from optimum.exporters.onnx import main_export

    made: dict[tuple[str, bool], Path] = {}

    def folder(name: str, post_process: bool) -> Path:
        if (name, post_process) not in made:
            root = tmp_path_factory.mktemp(f"optimum-{name}")
            source = seq2seq.folder(name)  # config, generation config, tokenizer
            seq2seq.model(name).save_pretrained(root / "source")
            for path in source.glob("*.json"):
                if not (root / "source" / path.name).exists():
                    (root / "source" / path.name).write_bytes(path.read_bytes())
            main_export(
                str(root / "source"),
                output=root / name,
                task="text2text-generation-with-past",
                do_validation=False,
                no_post_process=not post_process,
            )
            made[(name, post_process)] = root / name
        return made[(name, post_process)]

    return folder


@pytest.mark.parametrize("post_process", [True, False], ids=["merged", "pair"])
@pytest.mark.parametrize("name", ["t5", "bart"])
def test_optimum_s_export_gives_transformers_greedy_tokens(
    seq2seq: Any, optimum_folder: Any, name: str, post_process: bool
) -> None:
    import torch

    folder = optimum_folder(name, post_process)
    generator = Generator({"target": str(folder)}, "greedy", threads=1)
    parts = generator.models["target"].spec.encoder_decoder
    assert parts is not None and parts.merged == post_process
    for prompt in PROMPTS:
        ids = generator.tokenizer.encode(prompt)
        with torch.no_grad():
            expected = seq2seq.model(name).generate(input_ids=torch.tensor([ids]), max_new_tokens=NEW, do_sample=False)[
                0, 1:
            ]
        assert list(generator.generate(prompt, max_new_tokens=NEW).tokens) == expected.tolist(), prompt


@pytest.mark.parametrize("post_process", [True, False], ids=["merged", "pair"])
@pytest.mark.parametrize("name", ["t5", "bart"])
def test_verify_forwards_on_optimum_s_export_give_greedy_tokens(
    seq2seq: Any, optimum_folder: Any, name: str, post_process: bool
) -> None:
    """Speculative decoding feeds several tokens after a past: the with-past decoder must take them."""
    pytest.importorskip("decoctl_speculative", reason="the speculative plugin is not installed here")
    from decoctl_speculative import plugin

    from decoctl.plugins import PluginRegistry

    registry = PluginRegistry(autoload=False)
    registry.register(plugin, "speculative")
    folder = str(optimum_folder(name, post_process))
    greedy = Generator({"target": folder}, "greedy", threads=1)
    speculative = Generator(
        {"target": folder, "draft": folder}, "speculative", options={"k": 4, "adaptive": False}, registry=registry
    )
    for prompt in PROMPTS:
        expected = greedy.generate(prompt, max_new_tokens=NEW).tokens
        assert speculative.generate(prompt, max_new_tokens=NEW).tokens == expected, prompt


@pytest.mark.parametrize("post_process", [True, False], ids=["merged", "pair"])
@pytest.mark.parametrize("name", ["t5", "bart"])
def test_a_rewind_to_zero_on_optimum_s_export_reuses_the_cross_kv(
    optimum_folder: Any, name: str, post_process: bool
) -> None:
    """After a rewind to 0 the with-past decoder runs with an empty self-attention past over the bound
    cross-attention KV: optimum's graphs take the empty past and give the first pass's logits."""
    import numpy as np

    from decoctl.host import Sequence
    from decoctl.model.decoder_runner import DecoderRunner
    from decoctl.model.loader import load_model

    model = load_model(optimum_folder(name, post_process), threads=1)
    start = model.encoder.parts.decoder_start_token_id if model.encoder else 0
    sequence = Sequence("target", model)
    sequence.encode([40, 41, 42, 43, 1])
    expected = np.array(sequence.forward([start, 7, 9, 11]))
    for fed in ([start, 7, 9, 11], [start]):
        sequence.rewind(0)
        np.testing.assert_allclose(sequence.forward(fed), expected[: len(fed)], atol=1e-5)
    runner = sequence._runner
    assert isinstance(runner, DecoderRunner)
    assert (runner.encoder_runs, runner.cross_passes) == (1, 1)
