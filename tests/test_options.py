"""Option values: converted and checked against the schema; nan, infinities and booleans are not numbers, and a
schema whose own default breaks its bounds is refused when the plugin lists it."""

from __future__ import annotations

from typing import Any

import pytest

from decoctl import ConfigError, ControllerSpec, Greedy, Option, PluginError, hookimpl
from decoctl.plugins import PluginRegistry

TEMPERATURE = Option(name="temperature", type="float", default=1.0, minimum=0.0)
STEPS = Option(name="steps", type="int", default=4, minimum=1)


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e999", float("nan"), float("inf")])
def test_a_float_option_refuses_nan_and_infinities(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"is not a float: not a finite number \(nan and infinities are refused\)"):
        TEMPERATURE.convert(value, "controller 'x'")


@pytest.mark.parametrize("option", [TEMPERATURE, STEPS], ids=["float", "int"])
def test_a_boolean_is_not_a_number(option: Option) -> None:
    with pytest.raises(ConfigError, match="a boolean is not a number"):
        option.convert(True, "controller 'x'")


def test_an_int_option_takes_whole_floats_only() -> None:
    assert STEPS.convert(3.0, "controller 'x'") == 3
    for value in (2.5, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="is not an int"):
            STEPS.convert(value, "controller 'x'")


def test_numbers_as_text_still_convert() -> None:
    assert (TEMPERATURE.convert("0.5", "x"), STEPS.convert(" 7 ", "x")) == (0.5, 7)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"type": "int", "default": 0, "minimum": 1}, "the default of option k=0 must be at least 1: fix the option's"),
        ({"type": "float", "default": 1.5, "maximum": 1.0}, "the default of option k=1.5 must be at most 1.0"),
        ({"type": "float", "default": float("nan")}, "the default of option k=nan is not a float"),
        ({"type": "float", "default": True}, "a boolean is not a number"),
        ({"type": "str", "default": "c", "choices": ("a", "b")}, "must be one of"),
        ({"type": "int", "minimum": 3, "maximum": 1}, "its minimum 3 is above its maximum 1"),
        ({"type": "float", "minimum": "0"}, "its minimum '0' is not a number"),
        ({"type": "float", "maximum": float("inf")}, "its maximum inf is not finite"),
    ],
)
def test_a_schema_that_breaks_itself_is_refused_when_built(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        Option(name="k", **fields)


def test_a_default_of_none_means_required_and_is_not_checked() -> None:
    assert Option(name="k", type="int", minimum=1).default is None


class BadDefaultPlugin:
    @hookimpl
    def decoctl_controllers(self) -> list[ControllerSpec]:
        option = Option(name="k", type="int", default=0, minimum=1)
        return [ControllerSpec(name="bad", summary="", factory=Greedy, options=(option,))]


def test_a_plugin_whose_default_breaks_its_bounds_is_refused_when_it_loads() -> None:
    registry = PluginRegistry(autoload=False)
    registry.register(BadDefaultPlugin(), "bad-default")
    with pytest.raises(
        PluginError, match=r"plugin 'bad-default' failed .*the default of option k=0 must be at least 1"
    ):
        registry.controllers()


POSITIVE = Option(name="temperature", type="float", default=1.0, minimum=0.0, exclusive_minimum=True)
OPEN_UNIT = Option(
    name="p", type="float", default=0.5, minimum=0.0, maximum=1.0, exclusive_minimum=True, exclusive_maximum=True
)


def test_an_exclusive_minimum_refuses_the_bound_itself() -> None:
    with pytest.raises(ConfigError, match=r"controller 'x' option temperature=0.0 must be above 0.0"):
        POSITIVE.convert(0, "controller 'x'")


def test_an_exclusive_maximum_refuses_the_bound_itself() -> None:
    with pytest.raises(ConfigError, match=r"option p=1.0 must be below 1.0"):
        OPEN_UNIT.convert(1.0, "x")


def test_values_just_inside_exclusive_bounds_are_taken() -> None:
    assert (POSITIVE.convert(1e-9, "x"), OPEN_UNIT.convert(0.999, "x")) == (1e-9, 0.999)


def test_inclusive_bounds_still_take_the_bound() -> None:
    assert (STEPS.convert(1, "x"), TEMPERATURE.convert(0.0, "x")) == (1, 0.0)


def test_bounds_are_shown_in_interval_notation() -> None:
    assert (OPEN_UNIT.bounds(), STEPS.bounds(), POSITIVE.bounds()) == ("(0.0, 1.0)", "[1, inf)", "(0.0, inf)")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"exclusive_minimum": True}, "exclusive_minimum is set but it has no minimum"),
        ({"maximum": 1.0, "exclusive_maximum": "yes"}, "must be <class 'bool'>"),
        ({"minimum": 1.0, "maximum": 1.0, "exclusive_maximum": True}, r"its bounds \[1.0, 1.0\) admit no value"),
        ({"default": 0.0, "minimum": 0.0, "exclusive_minimum": True}, "the default of option k=0.0 must be above 0.0"),
    ],
)
def test_exclusive_bounds_that_make_no_sense_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises((ConfigError, TypeError), match=message):
        Option(name="k", type="float", **fields)


def test_the_sample_controllers_temperature_is_above_zero(registry: PluginRegistry) -> None:
    (temperature,) = [o for o in registry.controllers()["sample"].options if o.name == "temperature"]
    with pytest.raises(ConfigError, match=r"temperature=0.0 must be above 0.0"):
        temperature.convert(0, "controller 'sample'")
