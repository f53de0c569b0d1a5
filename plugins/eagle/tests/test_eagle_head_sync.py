"""The head is fed lazily, and after each catch-up it holds exactly the accepted context, paired with the target's own
features.

A step that drafts nothing leaves the head alone (the controller keeps the target's features for it); before the head
drafts, it catches up on them in one forward. After a catch-up the head's cache must equal a from-scratch pass of the
head over the pairs (f_i, x_{i+1}) of the committed context, with f_i the target's true hidden state: whatever it
guessed while drafting (its predicted features, rejected drafts, the branches of its draft tree) must be gone. The
random head's output depends on its features, so a stale or predicted feature left in its cache changes its last row.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from decoctl_eagle import Eagle
from decoctl_eagle.controller import OPTIONS

from decoctl.draft_length import DraftLength
from decoctl.host import Host, Output, Sequence, StopRules
from decoctl.model import load_model
from decoctl.specs import parse_options
from decoctl.testing import reference_outputs

ATOL = 1e-4
PROMPT = "x = [i * i for i in range(10)]\nx = ["


class Scripted(DraftLength):
    """A draft-length rule that drafts what it is told, step after step, round and round."""

    def __init__(self, lengths: list[int]) -> None:
        super().__init__(0, 0, 64)
        self._lengths = itertools.cycle(lengths)

    def choose(self, bucket: int, cap: int, backlog: int = 0) -> int:
        return min(next(self._lengths), cap)


def make_host(target: Path, head: Path, new_tokens: int) -> Host:
    """A host with the prompt prefilled on the target, as the generator hands it to start()."""
    target_model = load_model(target, threads=1)
    prompt = np.asarray(target_model.tokenizer.encode(PROMPT), np.int64)
    roles = {"target": Sequence("target", target_model, max_length=128), "eagle": Sequence("eagle", load_model(head))}
    roles["target"].prefill(prompt)
    rules = StopRules(eos_token_ids=(), max_new_tokens=new_tokens, capacity=100)
    return Host(roles, Output(rules, target_model.tokenizer.detokenizer(), None), prompt=prompt, seed=3)


def assert_the_head_equals_a_recompute(host: Host, target: Path, head_folder: Path, cached: bool) -> None:
    context = [*host.prompt_tokens.tolist(), *host.output_tokens]
    head = host["eagle"]
    assert host.target.tokens.tolist() == (context if cached else context[:-1])
    assert head.tokens.tolist() == context[1:]
    features = reference_outputs(target, context[:-1])["hidden_states"]
    expected = reference_outputs(head_folder, context[1:], features=features)
    np.testing.assert_allclose(head.logits()[-1], expected["logits"][-1], atol=ATOL)
    np.testing.assert_allclose(head.hidden_states()[-1], expected["hidden_states"][-1], atol=ATOL)


@pytest.mark.parametrize(
    ("options", "script"),
    [
        ({"drafting": "chain", "k": 4, "adaptive": False}, None),
        ({"drafting": "chain"}, [0, 0, 0, 4, 1, 0, 2]),
        ({"drafting": "tree", "depth": 4, "topk": 3, "nodes": 10}, None),
        ({"drafting": "tree", "depth": 3, "topk": 2, "nodes": 5, "sampling": True, "temperature": 1.3}, None),
    ],
    ids=["chain k=4", "chain drafting nothing in runs", "tree", "tree sampling"],
)
def test_after_each_catch_up_the_head_equals_a_recompute_over_true_features(
    options: dict[str, object], script: list[int] | None, target: Path, random_head: Path, mimic_head: Path
) -> None:
    for head_folder in (random_head, mimic_head):
        host = make_host(target, head_folder, new_tokens=24)
        controller = Eagle(parse_options("eagle", OPTIONS, options))
        controller.start(host)
        if script:
            controller.length = Scripted(script)
        steps = 0
        while not host.done:
            # every fourth step the test catches the head up; the steps between catch up themselves when they draft,
            # on what accumulated since (several steps' pairs after steps that drafted nothing)
            if steps % 4 == 0:
                controller.catch_up(host)
                assert_the_head_equals_a_recompute(host, target, head_folder, controller.verifier.pending_cached)
            controller.step(host)
            steps += 1
        assert steps < 24 or head_folder == random_head  # the imitating head got drafts accepted
        assert controller.stats()["steps"] == steps


@pytest.mark.parametrize("chunk", [None, 4])
def test_steps_that_draft_nothing_run_no_head_forward_and_resuming_catches_up_in_one(
    chunk: int | None, target: Path, random_head: Path
) -> None:
    host = make_host(target, random_head, new_tokens=24)
    host.prefill_chunk = chunk
    controller = Eagle(parse_options("eagle", OPTIONS, {"drafting": "chain"}))
    controller.start(host)
    controller.length = Scripted([0] * 6 + [3])
    head = host["eagle"]
    for _ in range(6):
        controller.step(host)
    assert (head.stats.forwards, head.stats.tokens_fed) == (0, 0)
    backlog = len(host.prompt_tokens) - 1 + 6  # the prompt's pairs and one per committed token
    controller.step(host)
    catch_up_forwards = 1 if chunk is None else -(-backlog // chunk)
    # the catch-up, then two drafting forwards (the first of three drafts comes from the catch-up's last row)
    assert head.stats.forwards == catch_up_forwards + 2
    assert head.stats.tokens_fed == backlog + 2
    assert controller.stats()["catch_ups"] == 1
    assert controller.stats()["caught_up_rows"] == backlog
    assert controller.stats()["drafted"] == 3
