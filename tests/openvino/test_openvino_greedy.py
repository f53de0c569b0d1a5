"""Every controller on OpenVINO's provider commits what it commits on the CPU provider (greedy is exact), on the
bundled demo models and, where it is imported on this machine (not in CI), on Gemma 3 270M int8."""

from __future__ import annotations

import pytest

from decoctl import Generator
from decoctl.errors import ConfigError, ModelLoadError
from decoctl.importers._registry import load_registry

PROMPT = "def fibonacci(n):"


def _tokens(models: dict[str, str], controller: str, provider: str, **options: object) -> tuple[int, ...]:
    generator = Generator(models, controller, options=options, threads=1, providers=provider)
    assert generator.models["target"].session.get_providers()[0] == (
        "OpenVINOExecutionProvider" if provider == "openvino" else "CPUExecutionProvider"
    )
    return generator.generate(PROMPT, max_new_tokens=24).tokens


@pytest.mark.parametrize(
    ("controller", "options"),
    [
        ("greedy", {}),
        ("speculative", {}),
        ("lookahead", {}),
        ("eagle", {}),
        ("eagle", {"drafting": "tree"}),
    ],
    ids=["greedy", "speculative", "lookahead", "eagle-chain", "eagle-tree"],
)
def test_openvino_commits_what_cpu_commits_on_the_demo_model(controller: str, options: dict[str, object]) -> None:
    models = {"target": "pycode"}
    assert _tokens(models, controller, "openvino", **options) == _tokens(models, controller, "cpu", **options)


def test_openvino_greedy_equals_cpu_on_gemma3_270m_int8_or_refuses_its_ring_caches_by_name() -> None:
    """The import keeps Gemma 3's sliding layers in ring caches, which onnxruntime-openvino 1.24's GroupQueryAttention
    does not know: where the import has them the load is refused naming them; otherwise greedy is equal."""
    if "gemma3-270m-int8" not in set(load_registry()):
        pytest.skip("gemma3-270m-int8 is not imported here: decoctl models import gemma3-270m --int8 (not in CI)")
    models = {"target": "gemma3-270m-int8"}
    try:
        on_openvino = _tokens(models, "greedy", "openvino")
    except ModelLoadError as exc:
        assert "keeps ring caches" in str(exc)
        return
    assert on_openvino == _tokens(models, "greedy", "cpu")


def test_an_option_openvino_does_not_know_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match=r"refused its options.*bogus"):
        Generator({"target": "pycode"}, "greedy", threads=1, providers="openvino:bogus=1")
