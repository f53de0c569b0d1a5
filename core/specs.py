"""The records plugins contribute: controllers, logits processors, model bundles, and option schemas."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from decoctl.errors import ConfigError

if TYPE_CHECKING:
    import argparse

__all__ = [
    "CommandSpec",
    "ControllerSpec",
    "ModelBundle",
    "Option",
    "ProcessorSpec",
    "normalise_name",
    "parse_options",
]


def normalise_name(name: str) -> str:
    """Plugin names compare case-insensitively with '_' and '-' alike: "Prompt_Lookup" == "prompt-lookup"."""
    return name.strip().lower().replace("_", "-")


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a boolean (use true or false)")


#: how a message names each option type ("is not an int")
_TYPE_NAMES = {"int": "an int", "float": "a float", "str": "a str", "bool": "a bool"}


@attrs.frozen(kw_only=True)
class Option:
    """One option a controller or processor accepts. ``type``: "int", "float", "str" or "bool".

    ``minimum`` and ``maximum`` bound a number, inclusive unless ``exclusive_minimum`` / ``exclusive_maximum`` say the
    bound itself is refused (a temperature is above 0, not at least 0). ``convert`` is the one place a value is
    checked, so a processor or controller built from parsed options never checks its bounds again.
    """

    name: str
    type: str = attrs.field(validator=attrs.validators.in_(("int", "float", "str", "bool")))
    default: Any = None
    help: str = ""
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    exclusive_maximum: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    def __attrs_post_init__(self) -> None:
        for bound, what in ((self.minimum, "minimum"), (self.maximum, "maximum")):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int | float)):
                raise ConfigError(f"option {self.name}: its {what} {bound!r} is not a number")
            if bound is not None and not math.isfinite(bound):
                raise ConfigError(f"option {self.name}: its {what} {bound!r} is not finite: leave it unset instead")
        for flag, bound, what in (
            (self.exclusive_minimum, self.minimum, "minimum"),
            (self.exclusive_maximum, self.maximum, "maximum"),
        ):
            if flag and bound is None:
                raise ConfigError(f"option {self.name}: exclusive_{what} is set but it has no {what}: give one")
        if self.minimum is not None and self.maximum is not None:
            if self.minimum > self.maximum:
                raise ConfigError(f"option {self.name}: its minimum {self.minimum} is above its maximum {self.maximum}")
            if self.minimum == self.maximum and (self.exclusive_minimum or self.exclusive_maximum):
                raise ConfigError(
                    f"option {self.name}: its bounds {self.bounds()} admit no value: make the bound inclusive or "
                    "widen the range"
                )
        if self.default is not None:
            # a default is a value like any other: one that breaks its own schema is the plugin's bug, caught
            # when the plugin lists its options, not when a user happens to leave the option out
            try:
                self.convert(self.default, "the default of")
            except ConfigError as exc:
                raise ConfigError(f"{exc}: fix the option's default or its bounds") from None

    def bounds(self) -> str:
        """The bounds in interval notation ("(0, 1]", "[1, inf)"), for messages and listings."""
        low = "(-inf" if self.minimum is None else f"{'(' if self.exclusive_minimum else '['}{self.minimum}"
        high = "inf)" if self.maximum is None else f"{self.maximum}{')' if self.exclusive_maximum else ']'}"
        return f"{low}, {high}"

    def convert(self, value: Any, owner: str) -> Any:
        """``value`` as this option's type, checked against its choices and bounds; ConfigError otherwise.

        Strings are parsed ("0.8", "true"); a bool is not a number (a TOML ``true`` for a float option is an
        error), a float is an int only when it is whole, and a float must be finite (no nan, no inf).
        """
        try:
            converted = self._typed(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(f"{owner} option {self.name}={value!r} is not {_TYPE_NAMES[self.type]}: {exc}") from None
        if self.choices and converted not in self.choices:
            raise ConfigError(f"{owner} option {self.name}={converted!r} must be one of {list(self.choices)}")
        low, high = self.minimum, self.maximum
        if low is not None and (converted <= low if self.exclusive_minimum else converted < low):
            rule = f"above {low}" if self.exclusive_minimum else f"at least {low}"
            raise ConfigError(f"{owner} option {self.name}={converted!r} must be {rule}")
        if high is not None and (converted >= high if self.exclusive_maximum else converted > high):
            rule = f"below {high}" if self.exclusive_maximum else f"at most {high}"
            raise ConfigError(f"{owner} option {self.name}={converted!r} must be {rule}")
        return converted

    def _typed(self, value: Any) -> Any:
        if self.type == "bool":
            return _to_bool(value)
        if self.type == "str":
            return str(value)
        if isinstance(value, bool):
            raise TypeError("a boolean is not a number (write a number)")
        if self.type == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError("not a whole number")
            return int(value)
        number = float(value)
        if not math.isfinite(number):
            raise ValueError("not a finite number (nan and infinities are refused)")
        return number


def parse_options(owner: str, schema: tuple[Option, ...], given: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults overlaid with ``given``, each converted and checked; an unknown name raises ConfigError."""
    known = {normalise_name(o.name): o for o in schema}
    values = {o.name: o.default for o in schema}
    for key, value in given.items():
        option = known.get(normalise_name(key))
        if option is None:
            names = ", ".join(sorted(o.name for o in schema)) or "none"
            raise ConfigError(f"{owner} has no option {key!r} (its options: {names})")
        values[option.name] = option.convert(value, owner)
    return values


@attrs.frozen(kw_only=True)
class ControllerSpec:
    """A controller a plugin provides.

    ``factory(options: dict) -> Controller`` builds one from parsed options (or ``library`` names a shared
    library speaking the C ABI, with ``symbol`` the controller's name inside it). ``roles``: every role it
    may drive ("target" first); ``roles_for(options) -> tuple`` narrows them when the options decide (a
    prompt-lookup drafter needs no draft model). ``capabilities``: role -> capability names it needs (see
    Capabilities.names()); ``capabilities_for(options) -> Mapping`` replaces them when the options decide (tree
    drafting needs tree inputs, chain drafting does not). ``check_options(options)`` raises ConfigError for
    combinations of option values the schema cannot express; it runs when a Generator is built, before any
    model loads. ``rows_for(options) -> int``: how many rows (decoctl.host.Rows) each role holds, for controllers that
    keep several sequences (beam search, parallel sampling). ``batched``: the controller can run batched prompts
    (decoctl.generation: several prompts' rows stepped in one Run, refilled as prompts finish): it is a
    decoctl.controllers.RowController, whose ``next_token(host)`` picks each prompt's next token from its row's
    logits while the batch commits and feeds it. A controller that is not batched (or holds several rows per
    prompt for these options, or a generation whose chain keeps state per sequence) runs the prompts of a batch
    one at a time, and each result's trace says why under "batched". ``plugin`` is stamped by the plugin manager.
    """

    name: str = attrs.field(converter=normalise_name)
    summary: str
    factory: Callable[[dict[str, Any]], Any] | None = None
    library: Path | None = None
    symbol: str | None = None
    roles: tuple[str, ...] = ("target",)
    roles_for: Callable[[dict[str, Any]], tuple[str, ...]] | None = None
    #: extra KV positions a forward may need beyond the committed tokens (drafts, a lookahead window)
    scratch_for: Callable[[dict[str, Any]], int] | None = None
    capabilities: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    capabilities_for: Callable[[dict[str, Any]], Mapping[str, tuple[str, ...]]] | None = None
    check_options: Callable[[dict[str, Any]], None] | None = None
    #: rows each role holds (beams, parallel samples; decoctl.host.Rows), for these options; None: one
    rows_for: Callable[[dict[str, Any]], int] | None = None
    #: the controller steps one row per prompt for batched prompts (a RowController; decoctl.generation)
    batched: bool = False
    #: False: the controller ranks continuations instead of drawing them (beam search), so a logits chain holding a
    #: sample-only processor (temperature, top_k, top_p, ...: LogitsProcessor's ``sample_only``) is refused
    sampling_processors: bool = True
    options: tuple[Option, ...] = ()
    plugin: str = ""

    def rows(self, options: dict[str, Any]) -> int:
        """How many rows each role holds for these (parsed) options (1 unless ``rows_for`` says more)."""
        return 1 if self.rows_for is None else max(1, int(self.rows_for(options)))

    def scratch(self, options: dict[str, Any]) -> int:
        """KV positions to allocate beyond prompt plus max_new_tokens for these (parsed) options."""
        return 0 if self.scratch_for is None else int(self.scratch_for(options))

    def active_roles(self, options: dict[str, Any]) -> tuple[str, ...]:
        """The roles a generation with these (parsed) options uses."""
        return self.roles if self.roles_for is None else tuple(self.roles_for(options))

    def active_capabilities(self, options: dict[str, Any]) -> Mapping[str, tuple[str, ...]]:
        """Role -> the capabilities a generation with these (parsed) options needs."""
        return self.capabilities if self.capabilities_for is None else self.capabilities_for(options)

    def __attrs_post_init__(self) -> None:
        if (self.factory is None) == (self.library is None):
            raise ConfigError(f"controller spec {self.name!r} needs exactly one of factory or library")


@attrs.frozen(kw_only=True)
class ProcessorSpec:
    """A logits processor a plugin provides: ``factory(options: dict) -> LogitsProcessor``."""

    name: str = attrs.field(converter=normalise_name)
    summary: str
    factory: Callable[[dict[str, Any]], Any]
    options: tuple[Option, ...] = ()
    plugin: str = ""


@attrs.frozen(kw_only=True)
class ModelBundle:
    """A named model folder a plugin ships (how the demo models become the default without a path)."""

    name: str = attrs.field(converter=normalise_name)
    path: Path = attrs.field(converter=Path)
    summary: str = ""
    roles: Mapping[str, str] = attrs.field(factory=dict)
    plugin: str = ""


@attrs.frozen(kw_only=True)
class CommandSpec:
    """A ``decoctl`` subcommand a plugin provides (``decoctl NAME ...``).

    ``add_arguments(parser)`` fills the subcommand's argparse parser (it may add subparsers of its own:
    ``decoctl eagle train|import|info``); ``run(args) -> int`` runs it with the parsed arguments and returns the exit
    status. A DecoctlError it raises is printed as ``decoctl: error: ...`` (exit status 2), like the built-in
    commands' errors. ``add_arguments`` runs whenever the command line is parsed, so it imports nothing heavy:
    ``run`` does. ``plugin`` is stamped by the plugin manager.
    """

    name: str = attrs.field(converter=normalise_name)
    summary: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    plugin: str = ""
