"""``decoctl eagle eval`` (decoctl_eagle.evaluation): a head's agreement with its target and its chain acceptance on
text, counted with one teacher-forced pass and rewinds, equal to a replay that runs every anchor's chain from an
empty cache; for EAGLE-1 heads (whole and draft vocabulary) and EAGLE-3 heads; refusals name the fix."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
from decoctl_eagle.evaluation import evaluate_head

from decoctl import CapabilityError, Sequence, load_model
from decoctl.cli import main
from decoctl.model.graph import enable_taps
from decoctl.testing import build_eagle3_head, build_genai_model

SEQ_LEN = 24
STEPS = 3


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 1 KB of Python: decoctl's own Generator, a few windows of SEQ_LEN tokens."""
    import decoctl

    path = tmp_path_factory.mktemp("data") / "code.txt"
    path.write_text(inspect.getsource(decoctl.Generator)[:1000], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tapped_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    plain = build_genai_model(
        tmp_path_factory.mktemp("plain"), seed=43, num_layers=4, hidden_states=True, tree_inputs=True
    )
    return enable_taps(plain, tmp_path_factory.mktemp("tapped") / "target")


@pytest.fixture(scope="module")
def eagle3_head(tapped_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_eagle3_head(
        tmp_path_factory.mktemp("eagle3"), tapped_target, seed=7, tree_inputs=True, draft_vocab=192
    )


def replay(target_dir: Path, head_dir: Path, text: Path) -> dict[str, float]:
    """The figures the long way: every anchor's chain drafted by a head fed from an empty cache, walked draft by
    draft as greedy verification walks it, with the text as the target's context."""
    target_model = load_model(target_dir, threads=1)
    head_model = load_model(head_dir, threads=1)
    taps = head_model.capabilities.feature_size - target_model.capabilities.hidden_size
    ids = np.asarray(target_model.tokenizer.encode(text.read_text(encoding="utf-8")), np.int64)
    agree = np.zeros(STEPS)
    labelled = np.zeros(STEPS)
    accepted = []
    for begin in range(0, len(ids), SEQ_LEN):
        window = ids[begin : begin + SEQ_LEN]
        if len(window) < 4:
            continue
        target = Sequence("target", target_model)
        greedy = np.asarray(target.forward(window)).argmax(-1)
        if taps:
            aux = target.hidden_states(kind="aux")
            own = np.zeros((len(aux), target_model.capabilities.hidden_size), np.float32)
            features = np.concatenate([aux, own], axis=1)
        else:
            features = np.array(target.hidden_states())
        for anchor in range(len(window) - 1):
            head = Sequence("eagle", head_model)
            rows = head.forward(window[1 : anchor + 2], features=features[: anchor + 1])
            drafts = [int(np.argmax(rows[-1]))]
            own = np.array(head.hidden_states()[-1])
            for step in range(1, STEPS):
                if anchor + 1 + step >= len(window):
                    break
                fed = np.concatenate([np.zeros(taps, np.float32), own])[None, :]
                row = head.forward([int(window[anchor + 1 + step])], features=fed)
                drafts.append(int(np.argmax(row[-1])))
                own = np.array(head.hidden_states()[-1])
            for step, draft in enumerate(drafts):
                labelled[step] += 1
                agree[step] += draft == greedy[anchor + 1 + step]
            if anchor + STEPS < len(window):
                walked = 0
                for step, draft in enumerate(drafts):
                    if draft != greedy[anchor + 1 + step]:
                        break
                    walked += 1
                    if window[anchor + 2 + step] != greedy[anchor + 1 + step]:
                        break  # the target's context leaves the text here: the chain is not followed further
                accepted.append(walked)
    return {
        "top1": agree[0] / labelled[0],
        "tau": 1 + float(np.mean(accepted)),
        "agreement_by_step": [round(float(a / n), 4) for a, n in zip(agree, labelled, strict=True)],
    }


@pytest.mark.parametrize("which", ["mimic", "random", "narrow", "eagle3"])
def test_eval_counts_what_a_replay_from_an_empty_cache_counts(
    which: str, request: pytest.FixtureRequest, text: Path
) -> None:
    head = request.getfixturevalue(f"{which}_head")
    target = request.getfixturevalue("tapped_target" if which == "eagle3" else "target")
    result = evaluate_head(target, head, [text], steps=STEPS, seq_len=SEQ_LEN, threads=1)
    want = replay(target, head, text)
    assert result.windows > 1
    assert result.top1 == pytest.approx(want["top1"], abs=1e-12)
    assert result.tau == pytest.approx(want["tau"], abs=1e-12)
    assert list(result.agreement_by_step) == want["agreement_by_step"]


def test_a_head_that_imitates_the_target_agrees_more_than_a_random_one(
    target: Path, mimic_head: Path, random_head: Path, text: Path
) -> None:
    mimic = evaluate_head(target, mimic_head, [text], seq_len=SEQ_LEN, threads=1)
    random = evaluate_head(target, random_head, [text], seq_len=SEQ_LEN, threads=1)
    assert mimic.top1 > random.top1 + 0.3
    assert mimic.tau > random.tau


def test_max_tokens_stops_after_the_window_that_reaches_it(target: Path, mimic_head: Path, text: Path) -> None:
    result = evaluate_head(target, mimic_head, [text], seq_len=SEQ_LEN, max_tokens=SEQ_LEN + 1, threads=1)
    assert result.windows == 2


def test_the_command_prints_the_figures_and_writes_them_as_json(
    target: Path, mimic_head: Path, text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval.json"
    argv = ["eagle", "eval", "--target", str(target), "--head", str(mimic_head), "--data", str(text)]
    assert main([*argv, "--seq-len", str(SEQ_LEN), "--threads", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    written = json.loads(out.read_text())
    assert f"top-1 {written['top1']:.3f}, acceptance length {written['tau']:.2f} (chain of 3" in printed
    assert written["windows"] > 1 and len(written["agreement_by_step"]) == 3


def test_an_eagle3_head_on_a_target_without_taps_is_refused_naming_enable_taps(
    target: Path, eagle3_head: Path, text: Path
) -> None:
    with pytest.raises(CapabilityError, match=r"three taps.*enable-taps"):
        evaluate_head(target, eagle3_head, [text], seq_len=SEQ_LEN, threads=1)
