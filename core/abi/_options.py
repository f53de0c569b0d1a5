"""The option schema a C controller declares: its ``options_json`` read into decoctl's Option records."""

from __future__ import annotations

import json

from decoctl.errors import AbiError, ConfigError
from decoctl.specs import Option

__all__ = ["options_from_json"]


def options_from_json(text: str | None, owner: str) -> tuple[Option, ...]:
    """The options a controller's ``options_json`` declares (None: none); AbiError naming ``owner`` (the library
    and the controller) when the text is not a schema or an entry breaks Option's rules (a default outside its
    bounds, a minimum that is not a number)."""
    if text is None:
        return ()
    try:
        entries = json.loads(text)
        if not isinstance(entries, list):
            raise TypeError("the schema must be a JSON array of objects")
        options = []
        for entry in entries:
            if not isinstance(entry, dict):
                raise TypeError(f"{entry!r} is not an object")
            options.append(
                Option(
                    name=str(entry["name"]),
                    type=str(entry["type"]),
                    default=entry.get("default"),
                    help=str(entry.get("help", "")),
                    choices=tuple(entry.get("choices", ())),
                    minimum=entry.get("minimum"),
                    maximum=entry.get("maximum"),
                    exclusive_minimum=entry.get("exclusive_minimum", False),
                    exclusive_maximum=entry.get("exclusive_maximum", False),
                )
            )
    except (ValueError, TypeError, KeyError, ConfigError) as exc:
        raise AbiError(
            f"{owner}: options_json is not an option schema ({type(exc).__name__}: {exc}); write a JSON array such "
            'as [{"name": "k", "type": "int", "default": 8, "help": "..."}]'
        ) from None
    return tuple(options)
