"""The user-level model registry: models that `decoctl models import` converted on this machine.

One JSON file, ``<data dir>/models.json``, maps a model name to its folder ("models"), and a target's folder to
the models its other roles default to ("role_defaults": how ``decoctl generate -c eagle`` on a target finds the
head imported or trained for it without ``--role``). The data dir is ``$XDG_DATA_HOME/decoctl`` (or
``~/.local/share/decoctl``); converted models live under ``<data dir>/models``, never in a repository.
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
    "register_role_default",
    "registry_file",
    "role_defaults",
]

FORMAT_VERSION = 1


def data_dir() -> Path:
    """``$XDG_DATA_HOME/decoctl``, or ``~/.local/share/decoctl`` when XDG_DATA_HOME is unset or empty."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "decoctl"


def models_dir() -> Path:
    """The folder ``decoctl models import`` and ``decoctl eagle import|train`` write models into by default
    (``$XDG_DATA_HOME/decoctl/models``)."""
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
        """The entry ``name`` of the registry file ``registry``; ModelLoadError naming the file when it is broken."""
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
        """The entry as the registry file stores it."""
        return {"path": str(self.path), "summary": self.summary, "source": self.source}


def _read_document(path: Path) -> dict[str, Any]:
    """The registry file's JSON object; an absent file is an empty one."""
    if not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(
            f"the model registry {path} cannot be read ({exc}): delete it and import the models again "
            "(`decoctl models import NAME`)"
        ) from exc
    if not isinstance(document, dict):
        raise ModelLoadError(
            f"the model registry {path} has no 'models' table: delete it and import the models again "
            "(`decoctl models import NAME`)"
        )
    return document


def _write_document(path: Path, document: dict[str, Any]) -> None:
    """Replace the registry file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(staging, path)


def load_registry(path: Path | None = None) -> dict[str, RegisteredModel]:
    """Every registered model by name; an absent registry file means none."""
    path = path or registry_file()
    if not path.is_file():
        return {}
    document = _read_document(path)
    models = document.get("models")
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
    document = _read_document(path)  # its other tables (role_defaults) are kept as they are
    document |= {"version": FORMAT_VERSION, "models": {name: m.to_json() for name, m in sorted(models.items())}}
    _write_document(path, document)
    return path


def _target_key(target: str | Path) -> str:
    return str(Path(target).expanduser().resolve())


def register_role_default(model: RegisteredModel, *, target: str | Path, role: str, path: Path | None = None) -> Path:
    """Register ``model`` and make it the default model of ``role`` whenever the model in folder ``target`` is
    the target: ``decoctl generate -c eagle`` on that target then takes it without ``--role`` (a role given
    explicitly still wins, and so does this default over one a plugin's model bundle declares). Registering
    another model for the same target and role replaces the default. Returns the registry path.
    """
    path = path or registry_file()
    register(model, path)
    document = _read_document(path)
    defaults = document.get("role_defaults")
    defaults = dict(defaults) if isinstance(defaults, dict) else {}
    key = _target_key(target)
    roles = defaults.get(key)
    defaults[key] = {**(roles if isinstance(roles, dict) else {}), role: model.name}
    document["role_defaults"] = dict(sorted(defaults.items()))
    _write_document(path, document)
    return path


def role_defaults(target: str | Path, path: Path | None = None) -> dict[str, str]:
    """role -> registered model name that ``register_role_default`` recorded for the target in folder ``target``
    (empty when none)."""
    document = _read_document(path or registry_file())
    defaults = document.get("role_defaults")
    roles = defaults.get(_target_key(target)) if isinstance(defaults, dict) else None
    if not isinstance(roles, dict):
        return {}
    return {str(role): str(name) for role, name in roles.items() if isinstance(name, str)}


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
