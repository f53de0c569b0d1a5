"""The config fixes: pure functions on the dicts transformers writes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from decoctl.errors import ModelLoadError
from decoctl.importers._gemma3 import builder_config, tokenizer_config_with_bos
from decoctl.model import load_model
from decoctl.testing._tokenizer import BOS_TOKEN

NESTED = {
    "architectures": ["Gemma3ForCausalLM"],
    "rope_parameters": {
        "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "sliding_window": 512,
}


def test_nested_rope_parameters_are_flattened_the_way_the_builder_reads_them() -> None:
    fixed = builder_config(NESTED)
    assert fixed["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6, "rope_local_base_freq": 1e4}
    assert fixed["rope_theta"] == 1e6
    assert fixed["rope_local_base_freq"] == 1e4
    assert fixed["sliding_window"] == 512


def test_flattening_leaves_its_input_alone() -> None:
    before = json.dumps(NESTED, sort_keys=True)
    builder_config(NESTED)
    assert json.dumps(NESTED, sort_keys=True) == before


def test_flattening_twice_changes_nothing() -> None:
    once = builder_config(NESTED)
    assert builder_config(once) == once


def test_scaling_of_the_global_layers_is_kept() -> None:
    config: dict[str, Any] = json.loads(json.dumps(NESTED))
    config["rope_parameters"]["full_attention"].update(rope_type="linear", factor=8.0)
    flat = builder_config(config)["rope_parameters"]
    assert (flat["rope_type"], flat["factor"], flat["rope_local_base_freq"]) == ("linear", 8.0, 1e4)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"architectures": ["Gemma3ForCausalLM"]}, "no rope_parameters table"),
        ({"rope_parameters": {"full_attention": {"rope_theta": 1.0}}}, "lacks the full_attention or sliding"),
        ({"rope_parameters": {"rope_type": "default"}}, "gives no rope_theta"),
    ],
)
def test_a_config_without_the_rope_bases_is_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        builder_config(config)


def test_the_tokenizer_config_asks_for_bos_and_keeps_the_rest() -> None:
    fixed = tokenizer_config_with_bos({"bos_token": "<bos>", "add_bos_token": False})
    assert fixed == {"bos_token": "<bos>", "add_bos_token": True}


def test_decoctl_prepends_bos_once_the_tokenizer_config_asks(genai_model: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(genai_model, tmp_path / "model"))
    path = folder / "tokenizer_config.json"
    path.write_text(json.dumps(tokenizer_config_with_bos(json.loads(path.read_text()))))
    tokenizer = load_model(folder, threads=1).tokenizer
    assert tokenizer.encode("x")[0] == tokenizer.token_to_id(BOS_TOKEN)
