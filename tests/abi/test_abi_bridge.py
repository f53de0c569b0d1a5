"""The bridge: what a C controller sees through the host table, how errors cross, and every refusal.

The controllers come from tests/abi/c/misbehave.c; none of these failures may crash the process.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from decoctl import (
    AbiError,
    CapabilityError,
    ConfigError,
    ControllerError,
    ControllerSpec,
    GenerationError,
    GenerationResult,
    Generator,
    PluginError,
    SequenceError,
)
from decoctl.abi import ABI_MAJOR, ABI_MINOR, ffi, library_controller_spec, library_factory, load_library
from decoctl.host import Host, Output, Sequence, StopRules
from decoctl.model import load_model
from decoctl.plugins import PluginRegistry

Build = Callable[..., Path]
PROMPT = "def fib(n):"


def generate(model: Path, reference: str, registry: PluginRegistry, n: int = 8, **options: Any) -> GenerationResult:
    return Generator({"target": model}, reference, registry=registry, threads=1, **options).generate(
        PROMPT, max_new_tokens=n
    )


def failure(model: Path, reference: str, registry: PluginRegistry, **options: Any) -> GenerationError:
    with pytest.raises(GenerationError) as caught:
        generate(model, reference, registry, **options)
    return caught.value


def make_host(model_dir: Path, n: int) -> Host:
    """A host with the prompt prefilled, as the generator hands it to start()."""
    model = load_model(model_dir, threads=1)
    sequence = Sequence("target", model)
    prompt = np.asarray(model.tokenizer.encode(PROMPT), np.int64)
    sequence.prefill(prompt)
    rules = StopRules(eos_token_ids=model.spec.eos_token_ids, max_new_tokens=n, capacity=sequence.max_length)
    return Host({"target": sequence}, Output(rules, model.tokenizer.detokenizer(), None), prompt=prompt)


# -- what C sees -------------------------------------------------------------------------------------------------


def test_a_probe_reads_every_query_primitive(genai_model: Path, misbehave: Path, registry: PluginRegistry) -> None:
    result = generate(genai_model, f"{misbehave}:probe_all", registry, n=6)
    assert result.tokens == generate(genai_model, "greedy", registry, n=6).tokens
    prompt = Generator({"target": genai_model}, registry=registry).tokenizer.encode(PROMPT)
    seen = result.stats.controller  # as the last step saw it, before its commit
    assert seen["abi_major"] == 1
    assert seen["host_struct_size"] == ffi.sizeof("decoctl_host")
    assert seen["length"] == seen["n_tokens"] == len(prompt) + 5
    assert (seen["first_token"], seen["last_token"]) == (prompt[0], result.tokens[4])
    assert (seen["logits_n"], seen["vocab"], seen["hidden_width"]) == (1, 384, 64)
    assert (seen["has_hidden"], seen["has_tree"]) == (1, 0)
    assert (seen["max_length"], seen["remaining"], seen["done"]) == (len(prompt) + 6, 1, 0)
    assert (seen["eos_1"], seen["eos_5"]) == (1, 0)
    assert seen["uniform"] == list(np.random.default_rng(0).random(12)[10:])


def test_logits_hidden_states_and_tokens_cross_zero_copy(genai_model: Path, misbehave: Path) -> None:
    host = make_host(genai_model, 4)
    target = host.target
    controller = library_factory(library_controller_spec(misbehave, "probe_all"))({})
    controller.start(host)
    addresses = (target.logits().ctypes.data, target.hidden_states().ctypes.data, target.tokens.ctypes.data)
    controller.step(host)
    seen = controller.stats()
    assert (seen["logits_ptr"], seen["hidden_ptr"], seen["tokens_ptr"]) == addresses


def test_process_without_processors_hands_back_the_callers_rows(
    genai_model: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    assert generate(genai_model, f"{misbehave}:process_probe", registry, n=3).stats.controller == {"same_pointer": 1}


def test_c_log_messages_reach_the_hosts_logger(genai_model: Path, misbehave: Path, registry: PluginRegistry) -> None:
    with capture_logs() as logs:
        generate(genai_model, f"{misbehave}:probe_all", registry, n=2)
    messages = [e for e in logs if e["event"] == "decoctl.c_controller_log"]
    assert messages[0] == {
        "event": "decoctl.c_controller_log",
        "controller": "probe_all",
        "message": "hello from C",
        "log_level": "warning",
    }


def test_options_reach_create_as_a_json_object(genai_model: Path, misbehave: Path, registry: PluginRegistry) -> None:
    error = failure(genai_model, f"{misbehave}:echo_config", registry, options={"width": "7"})
    assert isinstance(error.__cause__, AbiError)
    assert 'config: {"width": 7}' in str(error.__cause__)


def test_reset_reuses_the_instance_for_a_new_generation(genai_model: Path, c_examples: dict[str, Path]) -> None:
    controller = library_factory(library_controller_spec(c_examples["prompt_lookup"], "prompt_lookup"))({"k": 4})
    abandoned = make_host(genai_model, 16)
    controller.start(abandoned)
    controller.step(abandoned)
    host = make_host(genai_model, 16)
    controller.start(host)  # the library has reset: same instance, same role handles, new generation
    while not host.done:
        controller.step(host)
    expected = Generator({"target": genai_model}, registry=PluginRegistry(autoload=False)).generate(
        PROMPT, max_new_tokens=16
    )
    assert host.output_tokens == expected.tokens


# -- errors crossing the boundary -------------------------------------------------------------------------------


def test_an_error_status_raises_abi_error_with_last_error_and_keeps_the_text_so_far(
    genai_model: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    error = failure(genai_model, f"{misbehave}:fails", registry)
    assert isinstance(error.__cause__, AbiError)
    assert "step failed with status -1 (DECOCTL_ERR_FAILED): deliberate failure at step 4" in str(error.__cause__)
    assert len(error.tokens) == 3
    assert error.tokens == list(generate(genai_model, "greedy", registry, n=3).tokens)
    assert error.text == generate(genai_model, "greedy", registry, n=3).text


def test_a_python_exception_inside_a_host_function_comes_back_as_itself(
    genai_model: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    error = failure(genai_model, f"{misbehave}:overflow", registry)
    cause = error.__cause__
    assert isinstance(cause, SequenceError)
    assert "would pass its max_length" in str(cause)
    assert len(error.tokens) == 2
    note = " ".join(cause.__notes__)
    assert "'overflow'" in note and "returned -4" in note and "forward returned -4" in note


def test_a_host_error_the_controller_ignores_is_raised_anyway(
    genai_model: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    error = failure(genai_model, f"{misbehave}:ignores_error", registry)
    assert isinstance(error.__cause__, SequenceError)
    assert "rewind(1073741824)" in str(error.__cause__)


def test_a_tree_forward_on_a_model_without_tree_inputs_is_a_capability_error(
    genai_model: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    error = failure(genai_model, f"{misbehave}:tree", registry)
    assert isinstance(error.__cause__, CapabilityError)
    assert "forward_tree returned -3" in " ".join(error.__cause__.__notes__)


def test_forward_features_feeds_a_head_from_c_as_python_does(
    genai_model: Path, eagle_head: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    roles = {"target": genai_model, "eagle": eagle_head}
    result = Generator(roles, f"{misbehave}:features_probe", registry=registry, threads=1).generate(
        PROMPT, max_new_tokens=3
    )
    seen = result.stats.controller
    assert (seen["abi_minor"], seen["has_forward_features"], seen["has_features"]) == (ABI_MINOR, 1, 1)
    assert result.tokens == generate(genai_model, "greedy", registry, n=3).tokens
    prompt = Generator({"target": genai_model}, registry=registry).tokenizer.encode(PROMPT)
    target = Sequence("target", load_model(genai_model, threads=1))
    target.prefill(prompt)
    hidden = np.array(target.hidden_states())
    head = Sequence("eagle", load_model(eagle_head, threads=1))
    chain = np.array(head.forward(prompt[1:], features=hidden[:-1]))
    assert (seen["chain_n"], seen["chain_argmax"]) == (len(prompt) - 1, int(chain[-1].argmax()))
    assert np.isclose(seen["chain_last_first"], chain[-1, 0], atol=1e-5)
    tree = head.forward([5, 6, 7], tree=[-1, 0, -1], features=np.repeat(hidden[-1:], 3, axis=0))
    assert (seen["tree_n"], seen["tree_argmax"]) == (3, tree.argmax(axis=-1).tolist())
    assert seen["head_length"] == len(prompt) + 2


@pytest.mark.parametrize(
    ("controller", "error", "message", "status"),
    [
        ("features_wrong_width", SequenceError, r"shape \(1, 65\) .* float32\[1, 64\]", -4),
        ("features_on_target", CapabilityError, "has no target_hidden_states input", -3),
    ],
)
def test_forward_features_refusals_cross_as_their_python_errors(
    controller: str,
    error: type[Exception],
    message: str,
    status: int,
    genai_model: Path,
    eagle_head: Path,
    misbehave: Path,
    registry: PluginRegistry,
) -> None:
    roles = (
        {"target": genai_model, "eagle": eagle_head} if controller != "features_on_target" else {"target": genai_model}
    )
    with pytest.raises(GenerationError) as caught:
        Generator(roles, f"{misbehave}:{controller}", registry=registry, threads=1).generate(PROMPT, max_new_tokens=2)
    cause = caught.value.__cause__
    assert isinstance(cause, error)
    assert re.search(message, str(cause))
    assert f"forward_features returned {status}" in " ".join(cause.__notes__)


def test_a_positive_status_from_step_is_an_invalid_status_not_success(
    genai_model: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    error = failure(genai_model, f"{misbehave}:positive_step", registry)
    cause = error.__cause__
    assert isinstance(cause, ControllerError)
    assert f"C controller 'positive_step' ({misbehave}) step returned 1, an invalid status" in str(cause)
    assert error.tokens == list(generate(genai_model, "greedy", registry, n=1).tokens)  # its one commit is kept


def test_a_positive_status_from_create_is_an_invalid_status(
    genai_model: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    error = failure(genai_model, f"{misbehave}:positive_create", registry)
    assert isinstance(error.__cause__, ControllerError)
    assert "'positive_create'" in str(error.__cause__)
    assert "create returned 7, an invalid status" in str(error.__cause__)
    assert error.tokens == []


def test_a_positive_status_from_reset_is_an_invalid_status(genai_model: Path, misbehave: Path) -> None:
    controller = library_factory(library_controller_spec(misbehave, "positive_reset"))({})
    abandoned = make_host(genai_model, 16)
    controller.start(abandoned)
    controller.step(abandoned)
    with pytest.raises(ControllerError, match=r"'positive_reset' .* reset returned 3, an invalid status"):
        controller.start(make_host(genai_model, 2))  # the library has reset: the host calls it, not create


def test_a_step_that_commits_nothing_is_stopped(genai_model: Path, misbehave: Path, registry: PluginRegistry) -> None:
    error = failure(genai_model, f"{misbehave}:stalls", registry)
    assert isinstance(error.__cause__, ControllerError)
    assert error.tokens == []


def test_a_commit_of_out_of_range_token_ids_is_refused_whole(
    genai_model: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    error = failure(genai_model, f"{misbehave}:bad_commit", registry)
    assert isinstance(error.__cause__, SequenceError)
    assert "outside [0, 384): [1099511627776]" in str(error.__cause__)
    assert error.tokens == []


@pytest.mark.parametrize(
    ("controller", "message"),
    [
        ("small_rows", "decoctl_rows.struct_size is 4"),
        ("unknown_role", "role 'draft' was not given to this generation"),
    ],
)
def test_bad_arguments_to_host_functions_are_config_errors(
    controller: str, message: str, genai_model: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    error = failure(genai_model, f"{misbehave}:{controller}", registry)
    assert isinstance(error.__cause__, ConfigError)
    assert message in str(error.__cause__)
    assert "returned -5" in " ".join(error.__cause__.__notes__)


def test_a_failed_create_reports_last_error_of_a_null_state(
    genai_model: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    error = failure(genai_model, f"{misbehave}:create_fails", registry)
    assert isinstance(error.__cause__, AbiError)
    assert "create failed with status -1 (DECOCTL_ERR_FAILED): create_fails refuses" in str(error.__cause__)


def test_host_functions_called_from_destroy_are_refused_and_logged(
    genai_model: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    with capture_logs() as logs:
        result = generate(genai_model, f"{misbehave}:calls_host_in_destroy", registry, n=3)
    assert len(result.tokens) == 3
    refused = [e for e in logs if e["event"] == "decoctl.abi_callback_outside_call"]
    assert "outside create/step/reset" in refused[0]["error"]


# -- the queries the bridge answers in C (length, remaining, done, max_length, logits) -------------------------------

QUERY_SCRIPT = ["start", "forward", "keep", "forward", "commit", "rewind", "finish"]  # queries.c's script


def test_queries_answered_in_c_match_the_python_host_after_every_primitive(genai_model: Path, c_queries: Path) -> None:
    host = make_host(genai_model, 4)
    target = host.target
    controller = library_factory(library_controller_spec(c_queries, "queries"))({})
    controller.start(host)
    for action in QUERY_SCRIPT:
        controller.step(host)  # one primitive, then every query, read from C while the host stands still
        seen = controller.stats()
        assert seen["action"] == action
        python = {"length": target.length, "remaining": host.remaining, "done": int(host.done)}
        assert {key: seen[key] for key in python} == python, action
        assert seen["max_length"] == host.max_length
        if seen["read_logits"]:
            logits = target.logits()
            assert (seen["logits_ptr"], seen["logits_n"], seen["logits_width"]) == (logits.ctypes.data, *logits.shape)
        else:
            with pytest.raises(SequenceError, match="has no logits yet"):
                target.logits()
    assert host.done


@pytest.mark.parametrize("after", ["keep", "rewind"])
def test_logits_after_keep_or_rewind_is_refused_with_the_hosts_sequence_error(
    after: str, genai_model: Path, c_queries: Path, registry: PluginRegistry
) -> None:
    error = failure(genai_model, f"{c_queries}:logits_after", registry, options={"after": after})
    cause = error.__cause__
    assert isinstance(cause, SequenceError)
    assert "role 'target' has no logits yet" in str(cause)
    # the C side saw DECOCTL_ERR_SEQUENCE and host_error's message, as when logits was a Python callback
    assert "logits returned -4: SequenceError: role 'target' has no logits yet" in " ".join(cause.__notes__)


def test_queries_answered_in_c_refuse_calls_from_destroy(
    genai_model: Path, c_queries: Path, registry: PluginRegistry
) -> None:
    with capture_logs() as logs:
        result = generate(genai_model, f"{c_queries}:queries_in_destroy", registry, n=2)
    assert result.tokens == (5, 5)
    refused = [e for e in logs if e["event"] == "decoctl.abi_callback_outside_call"]
    assert len(refused) == 5
    assert all("outside create/step/reset" in e["error"] for e in refused)


def test_queries_answered_in_c_refuse_another_thread(
    genai_model: Path, c_queries: Path, registry: PluginRegistry
) -> None:
    with capture_logs() as logs:
        result = generate(genai_model, f"{c_queries}:queries_other_thread", registry, n=2)
    assert result.stats.controller == {"answers": [-5] * 5}  # DECOCTL_ERR_ARGUMENT, each
    refused = [e for e in logs if e["event"] == "decoctl.abi_callback_outside_call"]
    assert len(refused) == 5
    assert result.tokens == (5, 5)


def test_queries_answered_in_c_refuse_a_host_data_that_is_no_host(
    genai_model: Path, c_queries: Path, registry: PluginRegistry
) -> None:
    error = failure(genai_model, f"{c_queries}:queries_foreign", registry)
    cause = error.__cause__
    assert isinstance(cause, AbiError)
    assert "no live decoctl host" in str(cause)
    assert "foreign host_data answers [-5, -5, -5, -5, -5]" in " ".join(cause.__notes__)


# -- refusals at load ---------------------------------------------------------------------------------------------


def test_a_missing_library_path_is_a_plugin_error(tmp_path: Path, registry: PluginRegistry) -> None:
    with pytest.raises(PluginError, match="does not exist"):
        Generator({"target": tmp_path}, f"{tmp_path}/libnothing.so:greedy", registry=registry)
    spec = ControllerSpec(name="gone", summary="", library=tmp_path / "libgone.so", symbol="gone")
    with pytest.raises(PluginError, match=r"libgone\.so does not exist"):
        library_factory(spec)


def test_a_bare_library_name_is_never_searched_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PluginError, match=r"libm\.so\.6 does not exist"):
        load_library("libm.so.6")  # on the loader's path, but only explicit files are loaded


def test_a_file_that_is_no_shared_library_is_an_abi_error(tmp_path: Path) -> None:
    fake = tmp_path / "libfake.so"
    fake.write_text("not a library")
    with pytest.raises(AbiError, match="cannot load shared library"):
        load_library(fake)


def test_an_unknown_controller_name_lists_what_the_library_provides(misbehave: Path) -> None:
    with pytest.raises(PluginError, match=r"no controller named 'nope' .*probe_all, process_probe"):
        library_controller_spec(misbehave, "nope")


def test_a_library_without_a_name_gives_its_only_controller(
    genai_model: Path, c_examples: dict[str, Path], registry: PluginRegistry
) -> None:
    library = c_examples["greedy"]
    assert library_controller_spec(library).name == "greedy"
    result = generate(genai_model, str(library), registry, n=6)
    assert result.tokens == generate(genai_model, "greedy", registry, n=6).tokens
    assert result.stats.trace["controller"] == "greedy"


def test_a_library_of_several_controllers_without_a_name_lists_them(
    genai_model: Path, misbehave: Path, registry: PluginRegistry
) -> None:
    count = len(load_library(misbehave).controllers)
    pattern = rf"provides {count} controllers \(probe_all, process_probe, .*, positive_reset\): pick one with .*:NAME"
    with pytest.raises(PluginError, match=pattern):
        library_controller_spec(misbehave)
    with pytest.raises(PluginError, match=pattern):
        Generator({"target": genai_model}, str(misbehave), registry=registry)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("-DNO_ENTRY", "exports no decoctl_plugin_entry"),
        ("-DWRONG_MAJOR", f"built for decoctl ABI 99.0, but this host speaks ABI {ABI_MAJOR}.{ABI_MINOR}"),
        ("-DSMALL_ENTRY", "decoctl_plugin_entry.struct_size is 8, less than"),
        ("-DSMALL_CONTROLLER", r"controllers\[0\]: struct_size is 8, less than"),
        ("-DNULL_STEP", "controller 'null_step': step is NULL, but it is required"),
        # an Option rule (a default above its maximum) broken in options_json: the library's error, not the host's
        ("-DBAD_OPTION_DEFAULT", r"controller 'bad_default': options_json is not an option schema \(ConfigError: .*"),
    ],
)
def test_a_library_breaking_the_abi_is_refused_with_an_abi_error(flag: str, message: str, build_broken: Build) -> None:
    library = build_broken(flag)
    with pytest.raises(AbiError, match=message):
        library_controller_spec(library, "probe_all")


def test_an_option_schema_breaking_option_rules_names_the_library_and_the_controller(build_broken: Build) -> None:
    library = build_broken("-DBAD_OPTION_DEFAULT")
    expected = f"{library.resolve()}: controller 'bad_default': .*width=100 must be at most 10"
    with pytest.raises(AbiError, match=expected):
        load_library(library)


def test_an_abi_refusal_through_the_generator_names_the_library(
    genai_model: Path, build_broken: Build, registry: PluginRegistry
) -> None:
    library = build_broken("-DWRONG_MAJOR")
    with pytest.raises(AbiError, match=f"{library}.*rebuild the library"):
        Generator({"target": genai_model}, f"{library}:probe_all", registry=registry)
