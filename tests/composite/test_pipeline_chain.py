"""A composite nobody wrote a loader for, run from its pipeline.json alone: the tiny LLaVA with its vision tower and
its projector as two graphs gives the tokens of the one-graph export, the chain running once per image; an edge
against the phase order is refused at load, naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from vlm_models import IMAGE_MARK, Llava

import decoctl
from decoctl import ModelLoadError
from decoctl.model._pipeline import Edge, Pipeline, Stage
from decoctl.model._pipeline_executor import OncePerInput, check_phases, generation_stages

PROMPT = f"{IMAGE_MARK}\nUSER: what is in the picture? ASSISTANT:"
NEW = 16
#: where the tiny LLaVA's vision graph enters its projector
PROJECTOR = "/multi_modal_projector/"


@pytest.fixture(scope="module")
def picture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from PIL import Image

    path = tmp_path_factory.mktemp("images") / "noise.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (41, 30, 3), dtype=np.uint8)).save(path)
    return path


def _split(llava: Llava, folder: Path) -> Path:
    """The export with vision.onnx cut into vision_tower.onnx and projector.onnx, described by pipeline.json."""
    import onnx
    from onnx.utils import extract_model

    shutil.copytree(llava.onnx, folder)
    vision = onnx.load(str(folder / "vision.onnx"))
    cut = next(node.input[0] for node in vision.graph.node if node.name.startswith(PROJECTOR))
    extract_model(str(folder / "vision.onnx"), str(folder / "vision_tower.onnx"), ["pixel_values"], [cut])
    extract_model(str(folder / "vision.onnx"), str(folder / "projector.onnx"), [cut], ["image_features"])
    (folder / "vision.onnx").unlink()
    genai = json.loads((folder / "genai_config.json").read_text())["model"]
    description = {
        "sessions": {
            "tower": {"file": "vision_tower.onnx", "phase": "generation", "host_inputs": ["pixel_values"]},
            "projector": {"file": "projector.onnx", "phase": "generation"},
            "embedding": {"file": genai["embedding"]["filename"], "phase": "chunk", "host_inputs": ["input_ids"]},
            "decoder": {"file": genai["decoder"]["filename"], "phase": "step", "host_inputs": ["*"]},
        },
        "edges": [
            {"from": f"tower.{cut}", "to": f"projector.{cut}"},
            {"from": "projector.image_features", "to": "embedding.image_features"},
            {"from": "embedding.inputs_embeds", "to": "decoder.inputs_embeds"},
        ],
    }
    (folder / "pipeline.json").write_text(json.dumps(description))
    return folder


def test_a_separate_projector_runs_from_pipeline_json_alone(llava: Llava, picture: Path, tmp_path: Path) -> None:
    folder = _split(llava, tmp_path / "split")
    whole = decoctl.generate(PROMPT, model=llava.onnx, images=[picture], max_new_tokens=NEW, threads=1)
    split = decoctl.Generator({"target": str(folder)}, "greedy", threads=1)
    result = split.generate(PROMPT, images=[picture], max_new_tokens=NEW)
    assert list(result.tokens) == list(whole.tokens)
    chain = split.models["target"].vision.vision
    assert isinstance(chain, OncePerInput)
    assert chain.order == ("tower", "projector")
    assert chain.stage_runs == {"tower": 1, "projector": 1}  # once per image, not per step


def _pipeline(*edges: tuple[str, str]) -> Pipeline:
    stages = (
        Stage(name="tower", file="t.onnx", phase="generation", host_inputs=("pixel_values",)),
        Stage(name="projector", file="p.onnx", phase="generation"),
        Stage(name="embedding", file="e.onnx", phase="chunk", host_inputs=("input_ids",)),
        Stage(name="decoder", file="d.onnx", phase="step", host_inputs=("*",)),
    )
    return Pipeline(stages=stages, edges=tuple(Edge(source=a, target=b) for a, b in edges), origin="pipeline.json")


def test_generation_sessions_run_in_dataflow_order() -> None:
    described = _pipeline(("projector.out", "embedding.features"), ("tower.hidden", "projector.hidden"))
    assert generation_stages(described) == ("tower", "projector")


def test_a_once_per_input_session_fed_by_a_step_output_is_refused_naming_the_edge() -> None:
    described = _pipeline(("tower.hidden", "projector.hidden"), ("decoder.logits", "projector.bias"))
    with pytest.raises(ModelLoadError, match=r"edge decoder\.logits -> projector\.bias .* rewind"):
        check_phases(described)
