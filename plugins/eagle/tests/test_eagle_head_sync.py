"""Between steps the head holds exactly the accepted context, paired with the target's own features.

After every step the head's cache must equal a from-scratch pass of the head over the pairs (f_i, x_{i+1}) of the
committed context, with f_i the target's true hidden state: whatever it guessed while drafting (its predicted
features, rejected drafts, the branches of its draft tree) must be gone. The random head's output depends on its
features, so a stale or predicted feature left in its cache changes its last row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from decoctl_eagle import Eagle
from decoctl_eagle.controller import OPTIONS

from decoctl.host import Host, Sequence
from decoctl.model import load_model
from decoctl.output import Output, StopRules
from decoctl.specs import parse_options
from decoctl.testing import reference_outputs

ATOL = 1e-4
PROMPT = "x = [i * i for i in range(10)]\nx = ["


def make_host(target: Path, head: Path, new_tokens: int) -> Host:
    """A host with the prompt prefilled on the target, as the generator hands it to start()."""
    target_model = load_model(target, threads=1)
    prompt = np.asarray(target_model.tokenizer.encode(PROMPT), np.int64)
    roles = {"target": Sequence("target", target_model, max_length=128), "eagle": Sequence("eagle", load_model(head))}
    roles["target"].prefill(prompt)
    rules = StopRules(eos_token_ids=(), max_new_tokens=new_tokens, capacity=100)
    return Host(roles, Output(rules, target_model.tokenizer.detokenizer(), None), prompt=prompt, seed=3)


@pytest.mark.parametrize(
    "options",
    [
        {"drafting": "chain", "k": 4},
        {"drafting": "tree", "depth": 4, "topk": 3, "nodes": 10},
        {"drafting": "tree", "depth": 3, "topk": 2, "nodes": 5, "sampling": True, "temperature": 1.3},
    ],
)
def test_after_each_step_the_head_equals_a_recompute_over_true_features(
    options: dict[str, object], target: Path, random_head: Path, mimic_head: Path
) -> None:
    for head_folder in (random_head, mimic_head):
        host = make_host(target, head_folder, new_tokens=24)
        controller = Eagle(parse_options("eagle", OPTIONS, options))
        controller.start(host)
        steps = 0
        while True:
            context = [*host.prompt_tokens.tolist(), *host.output_tokens]
            head = host["eagle"]
            assert host.target.tokens.tolist() == context[:-1]
            assert head.tokens.tolist() == context[1:]
            features = reference_outputs(target, context[:-1])["hidden_states"]
            expected = reference_outputs(head_folder, context[1:], features=features)
            np.testing.assert_allclose(head.logits()[-1], expected["logits"][-1], atol=ATOL)
            np.testing.assert_allclose(head.hidden_states()[-1], expected["hidden_states"][-1], atol=ATOL)
            controller.step(host)
            steps += 1
            if host.done:
                break
        assert steps < 24 or head_folder == random_head  # the imitating head got drafts accepted
        assert controller.stats()["steps"] == steps
