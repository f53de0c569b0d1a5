"""The user-level model registry: models that `decoctl models import` converted on this machine.

One JSON file, ``<data dir>/models.json``, maps a model name to its folder. The data dir is
``$XDG_DATA_HOME/decoctl`` (or ``~/.local/share/decoctl``); converted models live under ``<data dir>/models``,
never in a repository.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs

from decoctl.errors import ModelLoadError
from decoctl.specs import normalise_name

__all__ = [
    "RegisteredModel",
    "data_dir",
    "find_registered",
    "load_registry",
    "models_dir",
    "register",
    "registry_file",
]

FORMAT_VERSION = 1


def data_dir() -> Path:
    """``$XDG_DATA_HOME/decoctl``, or ``~/.local/share/decoctl`` when XDG_DATA_HOME is unset or empty."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "decoctl"


def models_dir() -> Path:
    return data_dir() / "models"


def registry_file() -> Path:
    return data_dir() / "models.json"


def _normalised(name: str) -> str:
    # a converter defined in this module: mypy's attrs plugin rejects the imported normalise_name as one
    return normalise_name(name)


@attrs.frozen(kw_only=True)
class RegisteredModel:
    """A converted model folder under a name, with where it came from (``source``) in words."""

    name: str = attrs.field(converter=_normalised)
    path: Path = attrs.field(converter=Path)
    summary: str = ""
    source: str = ""

    @classmethod
    def from_json(cls, name: str, entry: Any, *, registry: Path) -> RegisteredModel:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise ModelLoadError(
                f"the model registry {registry} has a broken entry {name!r} (no 'path'): run "
                f"`decoctl models import {name} --force`, or delete the entry"
            )
        return cls(
            name=name,
            path=entry["path"],
            summary=str(entry.get("summary", "")),
            source=str(entry.get("source", "")),
        )

    def to_json(self) -> dict[str, str]:
        return {"path": str(self.path), "summary": self.summary, "source": self.source}


def load_registry(path: Path | None = None) -> dict[str, RegisteredModel]:
    """Every registered model by name; an absent registry file means none."""
    path = path or registry_file()
    if not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(
            f"the model registry {path} cannot be read ({exc}): delete it and import the models again "
            "(`decoctl models import NAME`)"
        ) from exc
    models = document.get("models") if isinstance(document, dict) else None
    if not isinstance(models, dict):
        raise ModelLoadError(
            f"the model registry {path} has no 'models' table: delete it and import the models again "
            "(`decoctl models import NAME`)"
        )
    return {
        normalise_name(name): RegisteredModel.from_json(name, entry, registry=path) for name, entry in models.items()
    }


def register(model: RegisteredModel, path: Path | None = None) -> Path:
    """Add or replace ``model`` in the registry; the file is replaced atomically. Returns the registry path."""
    path = path or registry_file()
    models = load_registry(path)
    models[model.name] = model
    document = {"version": FORMAT_VERSION, "models": {name: m.to_json() for name, m in sorted(models.items())}}
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(staging, path)
    return path


def find_registered(name: str, path: Path | None = None) -> RegisteredModel | None:
    """The registered model called ``name`` (None when there is none); its folder must still exist."""
    registry = path or registry_file()
    model = load_registry(registry).get(normalise_name(name))
    if model is not None and not model.path.is_dir():
        raise ModelLoadError(
            f"model {model.name!r} is registered in {registry} at {model.path}, which no longer exists: "
            f"run `decoctl models import {model.name} --force` to convert it again"
        )
    return model
