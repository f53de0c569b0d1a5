"""enable_taps / `decoctl models enable-taps`: a genai model gains aux_hidden_states (the residual stream entering
chosen layers) and hidden_states (the final norm's output), the features an EAGLE head reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from decoctl import ConfigError, ModelLoadError
from decoctl.cli import main
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model.graph import default_tap_layers, enable_taps, tap_layers
from decoctl.testing import build_genai_model

TOKENS = [1, 5, 9, 22, 40, 7, 300]
SEED = 3


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("plain"), seed=SEED, num_layers=4, tree_inputs=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights built with taps by decoctl.testing, whose tap_layers name the layers entering which the
    stream is tapped, as enable-taps' layers do."""
    return build_genai_model(
        tmp_path_factory.mktemp("built"),
        seed=SEED,
        num_layers=4,
        tree_inputs=True,
        hidden_states=True,
        tap_layers=(3, 0, 1),
    )


def outputs(folder: Path) -> Sequence:
    sequence = Sequence("target", load_model(folder, threads=1))
    sequence.forward(TOKENS)
    return sequence


def test_the_taps_are_the_residual_stream_entering_each_layer(plain: Path, built: Path, tmp_path: Path) -> None:
    """enable-taps reads each layer's input norm; a testing target built with the same tap_layers has the same
    taps (layer 0: the embeddings) and records the same layers."""
    copy = enable_taps(plain, tmp_path / "tapped", layers=[3, 0, 1])
    assert tap_layers(copy) == tap_layers(built) == (3, 0, 1)
    tapped = outputs(copy)
    reference = outputs(built)
    np.testing.assert_array_equal(tapped.hidden_states("aux"), reference.hidden_states("aux"))
    np.testing.assert_array_equal(tapped.hidden_states(), reference.hidden_states())
    np.testing.assert_array_equal(tapped.logits(), reference.logits())


def test_the_copy_records_its_layers_and_keeps_every_other_file(plain: Path, tmp_path: Path) -> None:
    tapped = enable_taps(plain, tmp_path / "tapped", layers=[1, 2])
    assert tap_layers(tapped) == (1, 2)
    assert tap_layers(plain) is None
    for name in ("genai_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tapped / name).read_bytes() == (plain / name).read_bytes()
    capabilities = load_model(tapped, threads=1).capabilities
    assert (capabilities.hidden_size, capabilities.aux_hidden_size) == (64, 128)
    assert capabilities.tree


def test_the_default_layers_are_eagle3s_low_middle_and_high() -> None:
    assert default_tap_layers(32) == (2, 16, 29)
    assert default_tap_layers(18) == (2, 9, 15)
    assert default_tap_layers(6) == (2, 3, 5)
    assert default_tap_layers(4) == (1, 2, 3)
    assert default_tap_layers(2) == (1, 1, 1)


def test_layers_outside_the_model_are_refused_naming_the_range(plain: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--layers 1,4: give decoder layers in 0\.\.3"):
        enable_taps(plain, tmp_path / "tapped", layers=[1, 4])


def test_a_model_that_already_has_taps_is_refused(built: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="already has an aux_hidden_states output"):
        enable_taps(built, tmp_path / "tapped")


def test_the_command_writes_the_copy(plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "enable-taps", str(plain), str(tmp_path / "tapped"), "--layers", "2"]) == 0
    assert "aux_hidden_states" in capsys.readouterr().out
    assert tap_layers(tmp_path / "tapped") == (2,)
    assert main(["models", "enable-taps", str(plain), str(tmp_path / "other"), "--layers", "two"]) == 2
    assert "--layers 'two'" in capsys.readouterr().err
