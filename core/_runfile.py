"""A declarative run file (TOML or JSON), validated strictly: every key and block must be consumed.

    [roles]                 # role -> registered model name or folder
    target = "pycode"
    draft = "pycode-draft"

    [controller]
    name = "speculative"
    options = { k = 4 }     # checked against the controller's option schema

    [generation]
    prompt = "def f(x):"    # optional; the command line's prompt wins
    max_new_tokens = 128
    seed = 0
    stop = ["\\n\\n"]
    processors = "top_k=40,temperature=0.8"   # or a list of {name = ..., option = ...} tables

    [runtime]
    threads = 1
    prefill_chunk = 256
    providers = "openvino"  # or ["openvino", "draft=cpu"], or { target = "openvino:device_type=CPU" }

An unknown key, a block nothing consumes, or a role the controller does not use is an error, raised before any
model is loaded where the file alone shows it.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from decoctl.errors import ConfigError
from decoctl.model._providers import Provider

__all__ = ["RunFile", "key_values"]

_SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {
    "roles": {},
    "controller": {"name": str, "options": dict},
    "generation": {
        "prompt": str,
        "max_new_tokens": int,
        "seed": int,
        "stop": (list, str),
        "processors": (str, list),
    },
    "runtime": {"threads": int, "prefill_chunk": int, "providers": (str, list, dict)},
}


@attrs.frozen(kw_only=True)
class RunFile:
    path: Path
    roles: Mapping[str, str]
    controller: str
    options: Mapping[str, Any]
    prompt: str | None
    max_new_tokens: int | None
    seed: int | None
    stop: tuple[str, ...]
    processors: str | list[Any] | None
    threads: int | None
    prefill_chunk: int | None
    #: the execution providers (decoctl.model._providers.ProviderChoice), checked when the file is read
    providers: str | list[str] | dict[str, str] | None = None

    @classmethod
    def load(cls, path: str | Path) -> RunFile:
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"run file {file} cannot be read ({exc.strerror}): check the path") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"run file {file} is not UTF-8 text ({exc.reason} at byte {exc.start}): save it as UTF-8"
            ) from None
        try:
            data = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"run file {file} is not valid {file.suffix.lstrip('.') or 'TOML'}: {exc}") from exc
        return cls.from_mapping(data, file)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], path: Path) -> RunFile:
        unknown = sorted(set(data) - set(_SCHEMA))
        if unknown:
            raise ConfigError(
                f"run file {path}: block(s) {unknown} are not consumed by anything (known blocks: "
                f"{sorted(_SCHEMA)}): remove or rename them"
            )
        for block, fields in _SCHEMA.items():
            table = data.get(block, {})
            if not isinstance(table, dict):
                raise ConfigError(f"run file {path}: [{block}] must be a table")
            if block == "roles":
                bad = [k for k, v in table.items() if not isinstance(v, str)]
                if bad:
                    raise ConfigError(f"run file {path}: roles {bad} must name a model or a folder (a string)")
                continue
            for key, value in table.items():
                if key not in fields:
                    raise ConfigError(
                        f"run file {path}: [{block}] has no key {key!r} (known: {sorted(fields)}); nothing would "
                        "read it"
                    )
                expected = fields[key]
                if not isinstance(value, expected) or isinstance(value, bool):
                    raise ConfigError(f"run file {path}: [{block}].{key} = {value!r} has the wrong type")
        controller = data.get("controller", {})
        generation = data.get("generation", {})
        runtime = data.get("runtime", {})
        stop = generation.get("stop", ())
        return cls(
            path=path,
            roles=dict(data.get("roles", {})),
            controller=controller.get("name", "greedy"),
            options=dict(controller.get("options", {})),
            prompt=generation.get("prompt"),
            max_new_tokens=generation.get("max_new_tokens"),
            seed=generation.get("seed"),
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            processors=generation.get("processors"),
            threads=runtime.get("threads"),
            prefill_chunk=runtime.get("prefill_chunk"),
            providers=_checked_providers(runtime.get("providers"), path),
        )


def _checked_providers(
    value: str | list[Any] | dict[str, Any] | None, path: Path
) -> str | list[str] | dict[str, str] | None:
    """[runtime].providers with every entry a provider that parses (decoctl.model._providers), or ConfigError."""
    entries = [value] if isinstance(value, str) else list(value.values()) if isinstance(value, dict) else value or []
    for entry in entries:
        if not isinstance(entry, str):
            raise ConfigError(
                f"run file {path}: [runtime].providers entry {entry!r} must be a string such as 'openvino'"
            )
        text = entry.partition(":")[0].partition("=")[2] if "=" in entry.partition(":")[0] else entry
        try:
            Provider.parse(text)
        except ConfigError as exc:
            raise ConfigError(f"run file {path}: [runtime].providers: {exc}") from None
    return value


def key_values(items: Sequence[str], what: str) -> dict[str, str]:
    """Command-line ``KEY=VALUE`` items (``--role``, ``--option``, ``--adapter``) as a dict; ``what`` names the flag in
    the refusal of an item without its ``=``."""
    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} {item!r} must be written KEY=VALUE")
        values[key.strip()] = value.strip()
    return values
