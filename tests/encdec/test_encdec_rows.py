"""Several rows of an encoder-decoder model (issue 24): beam search equal to transformers' generate(num_beams=...)
on the same weights, parallel samples, batched prompts, and the rows themselves (each a decoder of its own; a
fork copies the source's encoder output and cross-attention KV, the encoder never runs again)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import Generator
from decoctl.host import ONE_RUN_PER_ROW, Rows, Sequence
from decoctl.model._loader import LoadedModel, load_model

PROMPTS = ("def fibonacci(n):", "class Stack:\n    def push(self, item):", "return result", "for x in range(10):")
NEW = 12
ATOL = 1e-4
#: the scores agree to float32 rounding: the test T5's logits reach a few hundred (initializer_factor 8), where
#: onnxruntime's and torch's float32 differ by ~1e-3, so a sum of a dozen log-probabilities differs by about that
SCORE_REL, SCORE_ABS = 2e-4, 1e-3
#: (num_beams, length_penalty, early_stopping, num_return_sequences)
SEARCHES = [
    (2, 1.0, "false", 1),
    (3, 1.0, "false", 2),
    (3, 0.0, "true", 2),
    (2, 2.0, "never", 2),
    (3, -0.5, "false", 1),
]
EARLY = {"true": True, "false": False, "never": "never"}
#: a second EOS per model, one that its searches reach now and then: the searches end both in EOS and at
#: max_new_tokens (the random weights rarely give EOS 1), and keep 3 * num_beams continuations, as transformers does
#: with two EOS ids
SECOND_EOS = {"t5": 11, "bart": 92}


@pytest.fixture(scope="module")
def two_eos(seq2seq: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each model's export with generation_config.json's eos_token_id [1, SECOND_EOS[name]]."""
    folders = {}
    for name, second in SECOND_EOS.items():
        folder = tmp_path_factory.mktemp("two-eos") / name
        shutil.copytree(seq2seq.folder(name), folder)
        path = folder / "generation_config.json"
        config = json.loads(path.read_text())
        path.write_text(json.dumps({**config, "eos_token_id": [config["eos_token_id"], second]}))
        folders[name] = folder
    return folders


def eos_ids(seq2seq: Any, name: str) -> list[int]:
    return [seq2seq.model(name).config.eos_token_id, SECOND_EOS[name]]


def transformers_beams(seq2seq: Any, name: str, ids: list[int], **generate: Any) -> list[tuple[list[int], float]]:
    """transformers' returned sequences (new tokens: the decoder start token and padding cut) and sequences_scores."""
    import torch

    # torch's threads contend with onnxruntime's and with whatever else runs beside the tests: a tiny model's
    # generate() takes seconds on several threads, milliseconds on one
    torch.set_num_threads(1)
    model = seq2seq.model(name)
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            return_dict_in_generate=True,
            output_scores=True,
            max_new_tokens=NEW,
            **generate,
        )
    found = []
    for i in range(generate.get("num_return_sequences", 1)):
        tokens = [int(t) for t in out.sequences[i, 1:]]
        found.append((tokens[: int((out.beam_indices[i] >= 0).sum())], float(out.sequences_scores[i])))
    return found


@pytest.mark.parametrize(("num_beams", "length_penalty", "early_stopping", "count"), SEARCHES)
@pytest.mark.parametrize("name", ["t5", "bart"])
def test_beam_search_equals_transformers_generate(
    seq2seq: Any,
    two_eos: dict[str, Path],
    name: str,
    num_beams: int,
    length_penalty: float,
    early_stopping: str,
    count: int,
) -> None:
    options = {
        "num_beams": num_beams,
        "length_penalty": length_penalty,
        "early_stopping": early_stopping,
        "num_return_sequences": count,
    }
    generator = Generator({"target": str(two_eos[name])}, "beam", options=options, threads=1)
    for prompt in PROMPTS:
        result = generator.generate(prompt, max_new_tokens=NEW)
        expected = transformers_beams(
            seq2seq,
            name,
            generator.tokenizer.encode(prompt),
            num_beams=num_beams,
            length_penalty=length_penalty,
            early_stopping=EARLY[early_stopping],
            num_return_sequences=count,
            eos_token_id=eos_ids(seq2seq, name),
        )
        assert [list(c.tokens) for c in result.completions] == [tokens for tokens, _ in expected], prompt
        for completion, (_, score) in zip(result.completions, expected, strict=True):
            assert completion.score == pytest.approx(score, rel=SCORE_REL, abs=SCORE_ABS), prompt
            ended = completion.tokens[-1] in eos_ids(seq2seq, name)
            assert completion.stop_reason == ("eos" if ended else "max_new_tokens"), prompt
        assert result.stats.trace["rows"] == ONE_RUN_PER_ROW


def test_beam_search_on_the_merged_decoder_equals_the_pair(seq2seq: Any) -> None:
    options = {"num_beams": 3, "num_return_sequences": 2}
    pair = Generator({"target": str(seq2seq.folder("t5"))}, "beam", options=options, threads=1)
    merged = Generator({"target": str(seq2seq.folder("t5", "merged"))}, "beam", options=options, threads=1)
    for prompt in PROMPTS[:2]:
        expected = pair.generate(prompt, max_new_tokens=NEW).completions
        got = merged.generate(prompt, max_new_tokens=NEW).completions
        assert [c.tokens for c in got] == [c.tokens for c in expected]
        assert [c.score for c in got] == pytest.approx([c.score for c in expected], abs=SCORE_ABS)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_the_searches_end_both_in_eos_and_at_max_new_tokens(seq2seq: Any, two_eos: dict[str, Path], name: str) -> None:
    """What makes the comparisons above cover both ways a hypothesis finishes."""
    options = {"num_beams": 3, "num_return_sequences": 3}
    generator = Generator({"target": str(two_eos[name])}, "beam", options=options, threads=1)
    endings = {
        completion.stop_reason
        for prompt in PROMPTS
        for completion in generator.generate(prompt, max_new_tokens=NEW).completions
    }
    assert endings == {"eos", "max_new_tokens"}


def test_several_samples_run_and_sample_zero_is_what_one_sample_draws(seq2seq: Any) -> None:
    folder = str(seq2seq.folder("bart"))
    one = Generator({"target": folder}, "sample", options={"temperature": 1.5}, threads=1)
    three = Generator({"target": folder}, "sample", options={"temperature": 1.5, "n": 3}, threads=1)
    for seed in (1, 2):
        alone = one.generate(PROMPTS[0], max_new_tokens=NEW, seed=seed)
        result = three.generate(PROMPTS[0], max_new_tokens=NEW, seed=seed)
        assert len(result.completions) == 3
        assert result.completions[0].tokens == alone.tokens
        assert result.stats.trace["rows"] == ONE_RUN_PER_ROW
        again = three.generate(PROMPTS[0], max_new_tokens=NEW, seed=seed)
        assert [c.tokens for c in again.completions] == [c.tokens for c in result.completions]
    assert len({c.tokens for c in result.completions}) > 1


@pytest.mark.parametrize("controller", ["greedy", "sample"])
def test_batched_prompts_give_what_each_prompt_gets_alone(seq2seq: Any, controller: str) -> None:
    """Each prompt's row runs its own encoder over its own prompt when it is admitted, rows refilled as prompts
    finish (3 rows, 4 prompts)."""
    generator = Generator({"target": str(seq2seq.folder("t5"))}, controller, threads=1)
    results = generator.generate_batch(list(PROMPTS), batch_size=3, max_new_tokens=NEW, seed=5)
    for prompt, result in zip(PROMPTS, results, strict=True):
        alone = generator.generate(prompt, max_new_tokens=NEW, seed=5)
        assert result.tokens == alone.tokens, prompt
        assert result.stats.prompt_tokens == alone.stats.prompt_tokens  # the source's tokens
        assert result.stats.trace["batched"] == f"3 rows stepped {ONE_RUN_PER_ROW}, refilled as prompts finish"


# -- the rows themselves ---------------------------------------------------------------------------------------
@pytest.fixture
def bart(seq2seq: Any) -> LoadedModel:
    return load_model(seq2seq.folder("bart"), threads=1)


def decoder_logits(model: LoadedModel, source: list[int], tokens: list[int]) -> np.ndarray:
    """float32[n, vocab]: a fresh decoder's pass over ``tokens`` after encoding ``source``."""
    sequence = Sequence("target", model)
    sequence.encode(source)
    return np.array(sequence.forward(tokens))


def test_rows_fork_reorder_and_step_as_fresh_decoders_do(bart: LoadedModel) -> None:
    start = bart.encoder.parts.decoder_start_token_id if bart.encoder else 0
    source = [40, 41, 42, 43, 44]
    rows = Rows("target", bart, capacity=3, max_length=16)
    rows[0].encode(source)
    rows[0].forward([start, 7])
    rows.fork(0)
    rows.fork(0)

    logits = np.array(rows.step([8, 9, 10]))
    rows.reorder([2, 2, 0])
    after = np.array(rows.step([11, 12, 13]))

    for i, token in enumerate((8, 9, 10)):
        np.testing.assert_allclose(logits[i], decoder_logits(bart, source, [start, 7, token])[-1], atol=ATOL)
    for i, tokens in enumerate(([start, 7, 10, 11], [start, 7, 10, 12], [start, 7, 8, 13])):
        assert rows[i].tokens.tolist() == tokens
        np.testing.assert_allclose(after[i], decoder_logits(bart, source, tokens)[-1], atol=ATOL)


def test_a_fork_copies_the_encoding_and_never_runs_the_encoder(
    bart: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = bart.encoder.parts.decoder_start_token_id if bart.encoder else 0
    source = [30, 31, 32]
    rows = Rows("target", bart, capacity=2, max_length=16)
    rows[0].encode(source)  # encoded, the decoder not run yet: the fork's first pass computes the cross KV itself
    child = rows.fork(0)
    ran = []
    for row in (0, child):
        runner = rows[row]._runner._run_encoder
        monkeypatch.setattr(runner, "run", lambda: ran.append("encoder"))

    first = np.array(rows[child].forward([start, 5]))
    rows[child].rewind(0)  # from an empty cache again: the cross-attention KV its first pass wrote is kept
    again = np.array(rows[child].forward([start, 5]))

    expected = decoder_logits(bart, source, [start, 5])
    np.testing.assert_allclose(first, expected, atol=ATOL)
    np.testing.assert_allclose(again, expected, atol=ATOL)
    assert ran == []
