"""Execution providers: parsed, checked and applied per role (decoctl.model._providers); the CPU provider by default.
OpenVINO's runs in its own environment (tests/openvino); CUDA's where a GPU is (tests/test_providers_cuda.py)."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime as ort
import pytest

from decoctl import Generator
from decoctl._runfile import RunFile
from decoctl.cli import main
from decoctl.errors import ConfigError
from decoctl.model._loader import load_model
from decoctl.model._providers import CPU, Provider, providers_by_role
from decoctl.plugins import PluginRegistry

#: a provider no Linux onnxruntime build carries (DirectML is Windows-only)
ABSENT = "dml"


def test_a_provider_parses_from_its_short_name_with_its_options() -> None:
    provider = Provider.parse("openvino:device_type=CPU, num_of_threads=1")
    assert provider.name == "OpenVINOExecutionProvider"
    assert provider.options == {"device_type": "CPU", "num_of_threads": "1"}
    assert provider.short == "openvino"


def test_onnxruntime_names_are_taken_as_they_are() -> None:
    assert Provider.parse("CUDAExecutionProvider").short == "cuda"


def test_a_name_that_is_no_provider_is_refused_with_the_names_there_are() -> None:
    with pytest.raises(ConfigError, match=r"'gpu' is not a provider name.*openvino"):
        Provider.parse("gpu")


def test_an_option_that_is_not_key_value_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"option 'fast' is not KEY=VALUE"):
        Provider.parse("openvino:fast")


def test_a_bare_provider_goes_to_every_role_and_a_named_one_overrides_it() -> None:
    chosen = providers_by_role(["draft=cpu", "openvino"], ["target", "draft"])
    assert chosen["target"].short == "openvino"
    assert chosen["draft"] == CPU


def test_a_provider_for_a_role_the_controller_does_not_use_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"provider for role 'eagle'.*\['target'\]"):
        providers_by_role(["eagle=cpu"], ["target"])


def test_a_provider_this_onnxruntime_lacks_is_refused_with_the_package_that_brings_it(genai_model: Path) -> None:
    assert "DmlExecutionProvider" not in ort.get_available_providers()
    with pytest.raises(
        ConfigError, match=r"dml \(DmlExecutionProvider\) is not in this onnxruntime.*onnxruntime-directml"
    ):
        load_model(genai_model, threads=1, provider=ABSENT)


def test_the_cpu_provider_takes_no_options_and_says_where_threads_go(genai_model: Path) -> None:
    with pytest.raises(ConfigError, match=r"CPU provider takes no options.*--threads"):
        load_model(genai_model, threads=1, provider="cpu:intra_op_num_threads=2")


def test_models_load_on_the_cpu_provider_by_default(genai_model: Path, registry: PluginRegistry) -> None:
    generator = Generator({"target": str(genai_model)}, "greedy", threads=1, registry=registry)
    model = generator.models["target"]
    assert model.provider == CPU
    assert model.session.get_providers() == ["CPUExecutionProvider"]


def test_the_generator_refuses_a_missing_provider_before_loading_anything(
    genai_model: Path, registry: PluginRegistry
) -> None:
    with pytest.raises(ConfigError, match=r"install onnxruntime-directml"):
        Generator({"target": str(genai_model)}, "greedy", threads=1, registry=registry, providers=ABSENT)


def test_generate_takes_provider_on_the_command_line(genai_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", "def f(x):", "--model", str(genai_model), "-n", "4", "--threads", "1", "--stats", "none"]
    assert main([*args, "--provider", "cpu"]) == 0
    plain = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == plain
    assert main([*args, "--provider", ABSENT]) == 2
    assert "onnxruntime-directml" in capsys.readouterr().err


def test_a_run_file_names_providers_and_a_bad_one_is_refused_when_read(tmp_path: Path) -> None:
    good = tmp_path / "run.json"
    good.write_text(json.dumps({"runtime": {"providers": ["openvino:device_type=CPU", "draft=cpu"]}}))
    assert RunFile.load(good).providers == ["openvino:device_type=CPU", "draft=cpu"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"runtime": {"providers": {"target": "gpu"}}}))
    with pytest.raises(ConfigError, match=r"\[runtime\].providers: provider 'gpu' is not a provider name"):
        RunFile.load(bad)


def test_bench_refuses_contenders_that_cannot_run_on_the_provider(capsys: pytest.CaptureFixture[str]) -> None:
    # refused before any model loads: raw-ort opens its own CPU session whatever --provider says
    status = main(["bench", "--contenders", "raw-ort,greedy", "--provider", "openvino", "-n", "2", "--repeats", "1"])
    assert status == 2
    assert "contender raw-ort runs on its own runtime's CPU device" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["serve", "chat"])
def test_serve_and_chat_refuse_a_missing_provider_before_starting(
    command: str, genai_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "-m", str(genai_model), "--threads", "1", "--provider", ABSENT]) == 2
    assert "install onnxruntime-directml" in capsys.readouterr().err
