"""What genai_config.json says about the KV cache against what the graph computes (decoctl.model._kv_layout), and
the load-time probe of ring caches (decoctl.model._ring_probe): an export whose config and graph disagree is refused
at load with the reason and the fix, before it can run past its window with wrong tokens."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from decoctl.errors import ModelLoadError
from decoctl.model import _ring_probe, load_model
from decoctl.testing import build_genai_model


@pytest.fixture(autouse=True)
def fresh_probes() -> Iterator[None]:
    """The kernel probe remembers its answers for the process: each test here starts and ends without them."""
    _ring_probe._kernel_failure.cache_clear()
    yield
    _ring_probe._kernel_failure.cache_clear()


def edit_config(folder: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    path = folder / "genai_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    change(config)
    path.write_text(json.dumps(config), encoding="utf-8")
    return folder


def declare_window(window: int, layers: list[int], **flags: bool) -> Callable[[dict[str, Any]], None]:
    def change(config: dict[str, Any]) -> None:
        config["model"]["decoder"]["sliding_window"] = {"window_size": window, "layers": layers, **flags}

    return change


def test_a_window_the_graph_applies_as_the_config_declares_loads(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path / "m", seed=1, num_layers=3, local_window_size=8, ring_cache=True)
    edit_config(folder, declare_window(8, [0, 1]))

    model = load_model(folder, threads=1)

    assert [(r.layer, r.window) for r in model.capabilities.rings] == [(0, 8), (1, 8)]


def test_a_declared_window_no_shorter_than_the_context_needs_no_window_in_the_graph(tmp_path: Path) -> None:
    folder = edit_config(build_genai_model(tmp_path / "m", seed=1, max_length=64), declare_window(64, []))

    assert load_model(folder, threads=1).capabilities.rings == ()


def test_a_window_of_another_size_than_the_config_declares_is_refused(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path / "m", seed=1, num_layers=3, local_window_size=8)
    edit_config(folder, declare_window(16, [0, 1]))

    with pytest.raises(ModelLoadError, match=r"window of 16 on layers \[0, 1\].* windows on layers \{0: 8, 1: 8\}"):
        load_model(folder, threads=1)


def test_windows_on_other_layers_than_the_config_lists_are_refused(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path / "m", seed=1, num_layers=3, local_window_size=8)
    edit_config(folder, declare_window(8, [0, 2]))

    with pytest.raises(ModelLoadError, match=r"do not belong together .* export both again in one builder run"):
        load_model(folder, threads=1)


@pytest.mark.parametrize("flag", ["slide_key_value_cache", "slide_inputs"])
def test_a_config_that_asks_the_runtime_to_slide_is_refused(tmp_path: Path, flag: str) -> None:
    folder = build_genai_model(tmp_path / "m", seed=1, num_layers=3, local_window_size=8)
    edit_config(folder, declare_window(8, [0, 1], **{flag: True}))

    with pytest.raises(ModelLoadError, match=rf"sets {flag}, .* export the model for the CPU"):
        load_model(folder, threads=1)


def test_past_inputs_of_a_fixed_length_are_refused(tmp_path: Path) -> None:
    import onnx

    folder = build_genai_model(tmp_path / "m", seed=1)
    graph = onnx.load(str(folder / "model.onnx"))
    for value in graph.graph.input:
        if value.name.startswith("past_key_values."):
            value.type.tensor_type.shape.dim[2].dim_value = 256
    onnx.save(graph, str(folder / "model.onnx"))

    with pytest.raises(
        ModelLoadError, match=r"past input past_key_values\.0\.key has a fixed length of 256 .* dynamic"
    ):
        load_model(folder, threads=1)


def test_a_context_longer_than_the_rotary_tables_is_refused(tmp_path: Path) -> None:
    def longer(config: dict[str, Any]) -> None:
        config["model"]["context_length"] = config["search"]["max_length"] = 512

    folder = edit_config(build_genai_model(tmp_path / "m", seed=1, max_length=128), longer)

    with pytest.raises(ModelLoadError, match=r"rotary tables .* hold 128 positions .* set both to 128 or less"):
        load_model(folder, threads=1)


def test_ring_caches_without_the_shared_buffer_are_refused_at_load(tmp_path: Path) -> None:
    def unshared(config: dict[str, Any]) -> None:
        config["search"]["past_present_share_buffer"] = False

    folder = build_genai_model(tmp_path / "m", seed=1, num_layers=3, local_window_size=8, ring_cache=True)
    edit_config(folder, unshared)

    with pytest.raises(ModelLoadError, match=r"ring caches on layers \[0, 1\] .* past_present_share_buffer"):
        load_model(folder, threads=1)


def test_the_ring_probe_runs_the_kernel_at_the_ring_layers_shape(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path / "m", seed=1, num_layers=3, local_window_size=8, ring_cache=True)

    with capture_logs() as events:
        load_model(folder, threads=1)

    probes = [
        (e["heads"], e["kv_heads"], e["head_size"], e["window"]) for e in events if e["event"] == "decoctl.ring_probe"
    ]
    assert probes == [(4, 2, 16, 8)]


def test_a_kernel_whose_ring_run_differs_from_the_full_length_run_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As an onnxruntime whose GroupQueryAttention ignored sliding_window_cache would run: stood in for by a ring
    run whose attention is off once the ring is full."""
    folder = build_genai_model(tmp_path / "m", seed=1, num_layers=3, local_window_size=8, ring_cache=True)
    full_length = _ring_probe.ring_outputs

    def misread(session: Any, qkv: Any, prompt: int, capacity: int) -> list[np.ndarray]:
        outputs = full_length(session, qkv, prompt, capacity)
        return [o + 1.0 for o in outputs] if capacity == prompt else outputs

    monkeypatch.setattr(_ring_probe, "ring_outputs", misread)

    with pytest.raises(ModelLoadError, match=r"layers \[0, 1\] keep .* other attention .* windowed_kv_cache=false"):
        load_model(folder, threads=1)
