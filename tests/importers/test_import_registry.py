"""The user-level model registry, and resolve_model consulting it after plugin-registered names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decoctl.cli import main
from decoctl.errors import ModelLoadError
from decoctl.importers._registry import (
    RegisteredModel,
    data_dir,
    find_registered,
    load_registry,
    models_dir,
    register,
    register_role_default,
    registry_file,
    role_defaults,
)
from decoctl.plugins import PluginRegistry, hookimpl, resolve_model
from decoctl.specs import ModelBundle


def imported(user_data: Path, name: str = "gemma3-270m") -> RegisteredModel:
    folder = user_data / "models" / name
    folder.mkdir(parents=True)
    model = RegisteredModel(name=name, path=folder, summary="Gemma 3 270M (fp32)", source="a package")
    register(model)
    return model


def test_the_data_dir_follows_xdg_data_home(user_data: Path) -> None:
    assert data_dir() == user_data
    assert models_dir() == user_data / "models"
    assert registry_file() == user_data / "models.json"


def test_without_xdg_data_home_the_data_dir_is_under_local_share(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data_dir() == tmp_path / ".local" / "share" / "decoctl"


def test_no_registry_file_means_no_models(user_data: Path) -> None:
    assert load_registry() == {}
    assert find_registered("gemma3-270m") is None


def test_a_registered_model_reads_back_equal(user_data: Path) -> None:
    model = imported(user_data)
    assert load_registry() == {"gemma3-270m": model}
    assert json.loads(registry_file().read_text())["version"] == 1


def test_registering_a_name_again_replaces_it_and_keeps_the_others(user_data: Path) -> None:
    imported(user_data, "gemma3-270m-int8")
    first = imported(user_data)
    second = RegisteredModel(name="gemma3-270m", path=first.path, summary="again")
    register(second)
    assert load_registry() == {"gemma3-270m": second, "gemma3-270m-int8": load_registry()["gemma3-270m-int8"]}


def test_names_compare_like_plugin_names(user_data: Path) -> None:
    model = imported(user_data)
    assert find_registered("Gemma3_270M") == model


def test_resolve_model_finds_an_imported_name(user_data: Path) -> None:
    model = imported(user_data)
    assert resolve_model("gemma3-270m", PluginRegistry(autoload=False)) == ("gemma3-270m", model.path)


def test_a_plugin_bundle_of_the_same_name_comes_first(user_data: Path, tmp_path: Path) -> None:
    imported(user_data)

    class Models:
        @hookimpl
        def decoctl_models(self) -> list[ModelBundle]:
            return [ModelBundle(name="gemma3-270m", path=tmp_path / "bundled")]

    registry = PluginRegistry(autoload=False)
    registry.register(Models(), "models-plugin")
    assert resolve_model("gemma3-270m", registry) == ("gemma3-270m", tmp_path / "bundled")


def test_an_unknown_name_lists_the_imported_models_and_how_to_import(user_data: Path) -> None:
    imported(user_data)
    with pytest.raises(ModelLoadError, match=r"registered: gemma3-270m\).*decoctl models import gemma3-270m"):
        resolve_model("nope", PluginRegistry(autoload=False))


def test_an_entry_whose_folder_is_gone_says_to_import_again(user_data: Path) -> None:
    model = imported(user_data)
    model.path.rmdir()
    with pytest.raises(ModelLoadError, match=r"no longer exists.*decoctl models import gemma3-270m --force"):
        resolve_model("gemma3-270m", PluginRegistry(autoload=False))


def test_a_corrupt_registry_names_the_file_and_the_fix(user_data: Path) -> None:
    user_data.mkdir(parents=True)
    registry_file().write_text("{not json")
    with pytest.raises(ModelLoadError, match=rf"{registry_file()} cannot be read.*delete it"):
        find_registered("gemma3-270m")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([1, 2], "has no 'models' table"),
        ({"models": {"gemma3-270m": {"summary": "no path"}}}, r"broken entry 'gemma3-270m' \(no 'path'\)"),
    ],
)
def test_a_registry_of_the_wrong_shape_is_refused(user_data: Path, document: object, message: str) -> None:
    user_data.mkdir(parents=True)
    registry_file().write_text(json.dumps(document))
    with pytest.raises(ModelLoadError, match=message):
        load_registry()


def test_models_lists_imported_models(user_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = imported(user_data)
    assert main(["models"]) == 0
    assert f"gemma3-270m          (imported)             {model.path}" in capsys.readouterr().out


def test_a_role_default_is_kept_per_target_folder_and_survives_later_registrations(
    user_data: Path, tmp_path: Path
) -> None:
    target = tmp_path / "target"
    target.mkdir()
    head = RegisteredModel(name="my-head", path=tmp_path / "head", summary="a head")
    register_role_default(head, target=target, role="eagle")
    assert role_defaults(target / ".") == {"eagle": "my-head"}  # the same folder, however it is written
    assert role_defaults(tmp_path) == {}
    imported(user_data)  # registering another model keeps the defaults
    assert role_defaults(target) == {"eagle": "my-head"}
    assert set(load_registry()) == {"my-head", "gemma3-270m"}
    register_role_default(RegisteredModel(name="newer", path=tmp_path / "newer"), target=target, role="eagle")
    assert role_defaults(target) == {"eagle": "newer"}
