"""`decoctl bench`: contender parsing, the ideal-speedup formula, the verify-cost calibration, first differences,
and small end-to-end benches on tiny models with the speculative, lookahead and onnxruntime-genai contenders.

No timing is asserted: only structure, identity with greedy and the formula's properties.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decoctl.bench import (
    ContenderResult,
    Difference,
    build_contenders,
    difference_message,
    first_difference,
    parse_contenders,
    summarise,
)
from decoctl.bench._contenders import Outcome
from decoctl.bench._ideal import (
    CostCalibrator,
    CostCurve,
    ForwardLedger,
    ideal_ratio,
    ledger_from_stats,
    spread,
)
from decoctl.cli import main
from decoctl.errors import CapabilityError, ConfigError
from decoctl.host import ForwardSizes
from decoctl.model import load_model
from decoctl.testing import build_genai_model

CURVE = CostCurve(chain={1: 1.0, 2: 1.5, 4: 2.0}, tree={8: 3.0}, one_token_seconds=0.01, context=16, pairs=1)
REPEAT_PROMPT = "def f(x):\n    return x + 1\n\ndef f(x):\n    return x + 1\n"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain twins of tree models go to this test's folder, not the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def outcome(tokens: tuple[int, ...], ledger: ForwardLedger, seconds: float = 1.0) -> Outcome:
    return Outcome(
        tokens=tokens,
        decode_seconds=seconds,
        total_seconds=seconds,
        target_forwards=sum(ledger.chain.values()) + sum(ledger.tree.values()),
        ledger=ledger,
    )


@pytest.fixture(scope="module")
def tree_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("bench-tree"), seed=3, tree_inputs=True)


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": REPEAT_PROMPT}) + "\n" + json.dumps({"prompt": "import os"}) + "\n")
    return path


def bench_json(model: Path, contenders: str, prompts: Path, tmp_path: Path, *extra: str) -> dict[str, Any]:
    report = tmp_path / "bench.json"
    args = ["bench", "-m", str(model), "--contenders", contenders, "--prompts", str(prompts), "-n", "24"]
    args += ["--repeats", "2", "--threads", "1", "--calibration-pairs", "1", "--json", str(report), *extra]
    assert main(args) == 0
    return dict(json.loads(report.read_text()))


# -- parsing -------------------------------------------------------------------------------------------------
def test_onnxruntime_genai_speculative_contenders_parse_with_their_options() -> None:
    specs = parse_contenders("greedy,ort-genai-ngram(k=4;ngram=3),og=ort-genai-draft(k=2)")
    assert [(s.label, s.name, s.options) for s in specs] == [
        ("greedy", "greedy", {}),
        ("ort-genai-ngram(k=4;ngram=3)", "ort-genai-ngram", {"k": "4", "ngram": "3"}),
        ("og", "ort-genai-draft", {"k": "2"}),
    ]


def test_an_unknown_onnxruntime_genai_option_is_refused_listing_the_known_ones(
    genai_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "-m", str(genai_model), "--contenders", "greedy,ort-genai-ngram(window=3)"]) == 2
    err = capsys.readouterr().err
    assert "contender ort-genai-ngram has no option 'window'" in err
    assert "chained, k, min_adaptive_k, ngram" in err


def test_an_out_of_range_draft_length_is_refused(genai_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "-m", str(genai_model), "--contenders", "greedy,ort-genai-ngram(k=17)"]) == 2
    assert "option k=17 must be at most 16" in capsys.readouterr().err


def test_the_draft_contender_without_a_draft_model_asks_for_one(
    genai_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnxruntime_genai")
    assert main(["bench", "-m", str(genai_model), "--contenders", "greedy,ort-genai-draft"]) == 2
    assert "contender ort-genai-draft needs a draft model: pass --draft MODEL" in capsys.readouterr().err


def test_calibration_pairs_below_one_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--contenders", "greedy", "--calibration-pairs", "0"]) == 2
    assert "--calibration-pairs must be at least 1" in capsys.readouterr().err


# -- the formula ---------------------------------------------------------------------------------------------
@given(tokens=st.integers(0, 500), forwards=st.integers(1, 100))
def test_spreading_keeps_the_tokens_and_forwards_and_sizes_differ_by_at_most_one(tokens: int, forwards: int) -> None:
    sizes = spread(tokens, forwards)
    assert sum(n * count for n, count in sizes.items()) == tokens
    if tokens >= forwards:
        assert sum(sizes.values()) == forwards
    assert not sizes or max(sizes) - min(sizes) <= 1


def test_one_token_forwards_are_worth_exactly_the_baseline() -> None:
    assert ideal_ratio([(41, ForwardLedger.one_token(40)), (9, ForwardLedger.one_token(8))], CURVE) == 1.0


def test_the_ideal_divides_the_baseline_forwards_by_the_priced_verify_forwards() -> None:
    # 41 tokens: greedy pays 40 one-token forwards; ten 4-token verifies cost 10 * c(4) = 20
    assert ideal_ratio([(41, ForwardLedger(basis="test", chain={4: 10}))], CURVE) == pytest.approx(2.0)


def test_draft_seconds_are_priced_in_one_token_forwards() -> None:
    # 0.1 s of draft work at 0.01 s per one-token target forward costs 10 more forwards
    ledger = ForwardLedger(basis="test", chain={4: 10}, other_seconds=0.1)
    assert ideal_ratio([(41, ledger)], CURVE) == pytest.approx(40 / 30)


def test_tree_forwards_are_priced_on_the_tree_curve() -> None:
    assert ideal_ratio([(41, ForwardLedger(basis="test", tree={8: 5}, chain={1: 5}))], CURVE) == pytest.approx(40 / 20)


def test_a_size_the_curve_lacks_is_an_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="no chain forward of 3 token"):
        ideal_ratio([(10, ForwardLedger(basis="test", chain={3: 2}))], CURVE)


def test_no_decode_work_has_no_ideal() -> None:
    assert ideal_ratio([(1, ForwardLedger(basis="test"))], CURVE) is None


def test_the_hosts_forward_sizes_make_an_exact_ledger() -> None:
    sizes = ForwardSizes(chain={4: (2, 0.3), 1: (1, 0.1)}, tree={9: (3, 0.6)})
    ledger = ledger_from_stats(
        forward_sizes={"target": sizes, "draft": ForwardSizes(chain={1: (9, 0.2)})},
        onnx_seconds={"target": 1.0, "draft": 0.2},
    )
    assert ledger == ForwardLedger(basis="forward sizes", chain={4: 2, 1: 1}, tree={9: 3}, other_seconds=0.2)


def test_a_greedy_generations_ledger_prices_like_the_baseline() -> None:
    ledger = ledger_from_stats(forward_sizes={"target": ForwardSizes(chain={1: (5, 0.5)})}, onnx_seconds={})
    assert ledger.chain == ForwardLedger.one_token(5).chain
    assert ideal_ratio([(6, ledger)], CURVE) == 1.0
    assert ledger_from_stats(forward_sizes={}, onnx_seconds={}).chain == {}


def test_summarise_reports_the_fraction_of_ideal_as_ratio_over_ideal() -> None:
    base = [[outcome((1, 2, 3, 4, 5), ForwardLedger.one_token(4), seconds=2.0)]]
    fast = [[outcome((1, 2, 3, 4, 5), ForwardLedger(basis="verify sizes", chain={2: 2}), seconds=1.0)]]
    rows = {r.name: r for r in summarise({"greedy": base, "fast": fast}, "greedy", CURVE)}
    assert rows["greedy"].ideal_ratio == 1.0
    assert rows["fast"].ratio_to_baseline == pytest.approx(2.0)
    assert rows["fast"].ideal_ratio == pytest.approx(4 / 3)
    assert rows["fast"].fraction_of_ideal == pytest.approx(2.0 / (4 / 3))
    assert rows["fast"].ideal_basis == "verify sizes"


# -- first differences ---------------------------------------------------------------------------------------
def test_the_first_difference_names_the_prompt_the_position_and_both_tokens() -> None:
    found = first_difference([(1, 2, 3), (4, 5, 6)], [(1, 2, 3), (4, 9, 6)])
    assert found == Difference(prompt=1, position=1, baseline_token=9, token=5)


def test_an_output_that_stops_early_differs_where_it_ends() -> None:
    assert first_difference([(1, 2)], [(1, 2, 3)]) == Difference(prompt=0, position=2, baseline_token=3, token=None)
    assert first_difference([(1, 2)], [(1, 2)]) is None


def test_the_require_identical_message_names_the_contender_and_the_position() -> None:
    result = ContenderResult(
        name="spec4",
        tokens_per_s=1.0,
        ratio_to_baseline=1.0,
        identical_to_baseline=False,
        target_forwards=1,
        tokens=3,
        tokens_per_target_forward=3.0,
        decode_seconds_median=1.0,
        repeats_tokens_per_s=[1.0],
        mismatches=[1],
        first_difference=Difference(prompt=1, position=7, baseline_token=42, token=None),
        ideal_ratio=None,
        fraction_of_ideal=None,
        ideal_basis="",
        extra={},
    )
    assert difference_message(result, "greedy", ["a", "import os"]) == (
        "contender 'spec4' differs from baseline 'greedy' on 1 of 2 prompt(s); first on prompt 1 ('import os') at "
        "new token 7: greedy has token 42, spec4 has end of output"
    )


def test_require_identical_exits_3_and_explains_on_stderr(
    genai_model: Path, prompts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "-m", str(genai_model), "--contenders", "greedy,hot=sample(temperature=2.0)", "-n", "8"]
    assert main([*args, "--prompts", str(prompts), "--repeats", "1", "--threads", "1", "--require-identical"]) == 3
    assert "contender 'hot' differs from baseline 'greedy'" in capsys.readouterr().err


# -- calibration ---------------------------------------------------------------------------------------------
def test_the_calibrated_curve_has_every_size_asked_with_the_unit_at_one(genai_model: Path) -> None:
    calibrator = CostCalibrator(load_model(genai_model, threads=1), [5, 6, 7], context=20, pairs=2)
    calibrator.measure([3, 5])
    calibrator.measure([2])
    curve = calibrator.curve()
    assert set(curve.chain) == {1, 2, 3, 5}
    assert curve.chain[1] == 1.0
    assert all(math.isfinite(c) and c > 0 for c in curve.chain.values())
    assert curve.one_token_seconds > 0
    assert (curve.context, curve.pairs, curve.tree) == (20, 2, {})


def test_tree_sizes_are_calibrated_as_tree_forwards(tree_model: Path) -> None:
    calibrator = CostCalibrator(load_model(tree_model, threads=1), [5, 6, 7], context=20, pairs=1)
    calibrator.measure([], [1, 6])
    assert set(calibrator.curve().tree) == {1, 6}


def test_tree_sizes_on_a_model_without_tree_inputs_are_refused(genai_model: Path) -> None:
    calibrator = CostCalibrator(load_model(genai_model, threads=1), [5], context=20, pairs=1)
    with pytest.raises(CapabilityError, match="no tree inputs"):
        calibrator.measure([], [6])


# -- end to end ----------------------------------------------------------------------------------------------
def test_a_bench_with_speculative_contenders_reports_the_curve_and_ideal_ratios(
    genai_model: Path, genai_draft: Path, prompts: Path, tmp_path: Path
) -> None:
    pytest.importorskip("decoctl_speculative")
    contenders = "greedy,pl=speculative(drafter=prompt-lookup;k=4;adaptive=false),dm=speculative(k=3;adaptive=false)"
    data = bench_json(genai_model, contenders, prompts, tmp_path, "--draft", str(genai_draft))
    assert data["verify_cost"]["1"] == 1.0
    assert {"2", "4", "5"} <= set(data["verify_cost"])  # a 3-draft verify feeds 4 tokens, a 4-draft one 5
    assert data["verify_cost_tree"] == {}
    assert data["calibration"]["pairs"] == 1
    rows = {c["name"]: c for c in data["contenders"]}
    assert rows["greedy"]["ideal_ratio"] == 1.0
    assert rows["greedy"]["ideal_basis"] == "forward sizes"
    for name in ("pl", "dm"):
        row = rows[name]
        assert row["identical_to_baseline"] is True
        assert row["first_difference"] is None
        assert row["ideal_basis"] == "forward sizes"
        assert row["fraction_of_ideal"] == pytest.approx(row["ratio_to_baseline"] / row["ideal_ratio"])


def test_a_bench_with_lookahead_calibrates_tree_forwards(tree_model: Path, prompts: Path, tmp_path: Path) -> None:
    pytest.importorskip("decoctl_lookahead")
    data = bench_json(tree_model, "greedy,la=lookahead(window=3;ngram=3;guesses=2)", prompts, tmp_path)
    assert data["verify_cost_tree"]
    row = {c["name"]: c for c in data["contenders"]}["la"]
    assert row["identical_to_baseline"] is True
    assert row["ideal_basis"] == "forward sizes"
    assert row["ideal_ratio"] > 0


def test_the_raw_loop_runs_a_tree_model_as_its_plain_twin(tree_model: Path, prompts: Path, tmp_path: Path) -> None:
    plain = build_genai_model(tmp_path / "plain", seed=3)  # the same weights without tree inputs, given by hand
    contenders = f"greedy,raw-ort,given=raw-ort(model={plain})"
    data = bench_json(tree_model, contenders, prompts, tmp_path, "--require-identical")
    rows = {c["name"]: c for c in data["contenders"]}
    assert {name: row["identical_to_baseline"] for name, row in rows.items()} == dict.fromkeys(rows, True)
    assert set(rows) == {"greedy", "raw-ort", "given"}


def test_onnxruntime_genai_contenders_run_a_tree_model_as_its_plain_twin(
    tree_model: Path, prompts: Path, tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime_genai")
    contenders = "greedy,ort-genai,ng=ort-genai-ngram(k=4;ngram=3),dr=ort-genai-draft(k=3)"
    # the draft has tree inputs too: it runs as its twin as well
    data = bench_json(tree_model, contenders, prompts, tmp_path, "--draft", str(tree_model), "--require-identical")
    assert {c["name"] for c in data["contenders"]} == {"greedy", "ort-genai", "ng", "dr"}


def positions_outside_attention(source: Path, destination: Path) -> Path:
    """A copy of the tree model ``source`` whose graph reads ``position_ids`` outside GroupQueryAttention (as a
    builder export with rotary embeddings outside the op does) and takes no attention_bias: a plain graph that
    must be fed positions. The positions reach the logits through a multiplication by zero."""
    import onnx
    from onnx import TensorProto, helper

    shutil.copytree(source, destination)
    model = onnx.load_model(str(destination / "model.onnx"))
    graph = model.graph
    kept = [value for value in graph.input if value.name != "attention_bias"]
    del graph.input[:]
    graph.input.extend(kept)
    for node in graph.node:
        if node.op_type == "GroupQueryAttention":
            inputs = list(node.input[:9])
            del node.input[:]
            node.input.extend(inputs)
        node.output[:] = ["logits_before" if name == "logits" else name for name in node.output]
    graph.initializer.append(helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]))
    graph.node.extend(
        [
            helper.make_node("Cast", ["position_ids"], ["positions_float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["positions_float", "zero"], ["positions_zero"]),
            helper.make_node("ReduceSum", ["positions_zero"], ["positions_sum"], keepdims=0),
            helper.make_node("Add", ["logits_before", "positions_sum"], ["logits"]),
        ]
    )
    onnx.save_model(model, str(destination / "model.onnx"))
    return destination


def test_the_raw_loop_feeds_position_ids_to_a_graph_that_reads_them(
    tree_model: Path, prompts: Path, tmp_path: Path
) -> None:
    model = positions_outside_attention(tree_model, tmp_path / "positions")
    assert load_model(model, threads=1).capabilities.position_ids == "position_ids"
    data = bench_json(model, "greedy,raw-ort", prompts, tmp_path, "--require-identical")
    assert [c["name"] for c in data["contenders"]] == ["greedy", "raw-ort"]
    assert not (tmp_path / "cache").exists()  # nothing to remove: no twin was derived


def test_a_bundled_targets_own_draft_serves_its_contenders(
    genai_model: Path, genai_draft: Path, tmp_path: Path
) -> None:
    pytest.importorskip("decoctl_speculative")
    from decoctl import ModelBundle, hookimpl
    from decoctl.bench._contenders import ControllerContender
    from decoctl.plugins import PluginRegistry

    class Bundle:
        @hookimpl
        def decoctl_models(self) -> list[ModelBundle]:
            return [ModelBundle(name="tiny", path=genai_model, roles={"draft": str(genai_draft)})]

    registry = PluginRegistry()
    registry.register(Bundle(), "tiny-bundle")
    specs = parse_contenders("greedy,speculative")
    built = dict(build_contenders(specs, model="tiny", roles={}, threads=1, registry=registry))
    speculative = built["speculative"]
    assert isinstance(speculative, ControllerContender)
    assert speculative.generator.models["draft"].spec.path == genai_draft
    assert speculative.generator.generate("import os", max_new_tokens=4).tokens


def test_onnxruntime_genai_speculative_contenders_match_greedy(
    genai_model: Path, genai_draft: Path, prompts: Path, tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime_genai")
    contenders = "greedy,ort-genai,ng=ort-genai-ngram(k=4;ngram=3),dr=ort-genai-draft(k=3)"
    data = bench_json(genai_model, contenders, prompts, tmp_path, "--draft", str(genai_draft))
    rows = {c["name"]: c for c in data["contenders"]}
    for name in ("ort-genai", "ng", "dr"):
        assert rows[name]["identical_to_baseline"] is True
        assert rows[name]["tokens"] == rows["greedy"]["tokens"]
    assert rows["ort-genai"]["ideal_ratio"] == 1.0
    for name in ("ng", "dr"):
        assert rows[name]["ideal_basis"] == "onnxruntime-genai stats"
        assert rows[name]["ideal_ratio"] > 0
        assert "acceptance_rate" in rows[name]["extra"]
    assert rows["dr"]["extra"]["draft_forward_passes"] > 0
    assert rows["ng"]["extra"]["draft_forward_passes"] == 0


def test_a_contenders_processors_option_gives_it_a_logits_chain(
    genai_model: Path, prompts: Path, tmp_path: Path
) -> None:
    pytest.importorskip("decoctl_logits_chain")
    from decoctl.generation import Generator

    first = Generator({"target": str(genai_model)}, "greedy", threads=1).generate(REPEAT_PROMPT, max_new_tokens=1)
    banned = first.tokens[0]
    contenders = f"greedy,banned=greedy(processors=suppress_tokens={banned})"
    data = bench_json(genai_model, contenders, prompts, tmp_path)
    row = {c["name"]: c for c in data["contenders"]}["banned"]
    assert row["identical_to_baseline"] is False
    assert row["first_difference"]["prompt"] == 0
    assert row["first_difference"]["position"] == 0
    assert row["first_difference"]["baseline_token"] == banned


def test_decoctl_contenders_of_one_model_share_its_session_and_keep_their_own_caches(genai_model: Path) -> None:
    from decoctl.bench._contenders import ControllerContender
    from decoctl.plugins import PluginRegistry

    specs = parse_contenders("greedy,again=greedy,sample")
    built = build_contenders(specs, model=str(genai_model), roles={}, threads=1, registry=PluginRegistry())
    generators = [c.generator for _, c in built if isinstance(c, ControllerContender)]
    assert len(generators) == 3
    sessions = {id(g.models["target"].session) for g in generators}
    assert len(sessions) == 1
    first, second = (g.generate("import os", max_new_tokens=6) for g in generators[:2])
    assert first.tokens == second.tokens


def test_onnxruntime_genai_outputs_that_stop_on_eos_end_with_it_as_decoctls_do(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime_genai")
    from decoctl.generation import Generator

    probe = build_genai_model(tmp_path / "probe", seed=5)
    third = Generator({"target": str(probe)}, "greedy", threads=1).generate(REPEAT_PROMPT, max_new_tokens=3).tokens[2]
    model = build_genai_model(tmp_path / "stops", seed=5, eos_token_id=third)
    prompts = tmp_path / "one.jsonl"
    prompts.write_text(json.dumps({"prompt": REPEAT_PROMPT}) + "\n")
    data = bench_json(model, "greedy,ort-genai", prompts, tmp_path)
    rows = {c["name"]: c for c in data["contenders"]}
    assert rows["greedy"]["tokens"] == 3  # greedy stopped on the EOS, which its output keeps
    assert rows["ort-genai"]["identical_to_baseline"] is True
