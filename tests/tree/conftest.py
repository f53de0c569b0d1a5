"""Tree-capable tiny models: one built with the tree inputs, and copies of a plain one rewritten by enable_tree."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from decoctl.model.graph import enable_tree
from decoctl.testing import build_genai_model

SEED = 7


def with_external_data(folder: Path) -> Path:
    """Move the folder's weights into model.onnx.data, as onnxruntime-genai's builder lays them out."""
    model = onnx.load_model(str(folder / "model.onnx"))
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    return folder


def without_shared_buffer(folder: Path) -> Path:
    """Make the host keep past and present in separate buffers (ConcatKVCache) for this folder."""
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    config["search"]["past_present_share_buffer"] = False
    path.write_text(json.dumps(config, indent=4))
    return folder


@pytest.fixture(scope="session")
def plain_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A genai model without tree inputs, weights in external data (the transform's input)."""
    return with_external_data(build_genai_model(tmp_path_factory.mktemp("plain"), seed=SEED))


@pytest.fixture(scope="session")
def built_tree_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("built-tree"), seed=SEED, tree_inputs=True)


@pytest.fixture(scope="session")
def transformed_model(plain_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return enable_tree(plain_model, tmp_path_factory.mktemp("transformed") / "model")


@pytest.fixture(scope="session")
def transformed_concat_model(plain_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return without_shared_buffer(enable_tree(plain_model, tmp_path_factory.mktemp("transformed-concat") / "model"))


@pytest.fixture(params=["built", "transformed", "transformed_concat"])
def tree_model(request: pytest.FixtureRequest) -> Path:
    """Every way a tree-capable model reaches the host: built with the inputs, or rewritten by enable_tree
    (with the shared KV buffer and with concatenated past/present)."""
    names = {
        "built": "built_tree_model",
        "transformed": "transformed_model",
        "transformed_concat": "transformed_concat_model",
    }
    return request.getfixturevalue(names[request.param])
