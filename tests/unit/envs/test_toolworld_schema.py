"""Tool-world argument validation on jsonschema (Draft 2020-12): definitions are checked when a tool is
built, and of several violations the first in our fixed order is reported, with our codes and words."""

from __future__ import annotations

import pytest

from envace.envs.toolworld.schema import Param, ToolError, ToolSpec


def _noop(state: dict, arguments: dict) -> dict:
    return {"ok": True}


BOOK = ToolSpec(
    name="book",
    domain="test",
    description="Book a slot.",
    params=(
        Param("size", "string", "Room size.", enum=("small", "large")),
        Param("date", "string", "Date.", pattern=r"^\d{4}-\d{2}-\d{2}$", hint="YYYY-MM-DD"),
        Param("seats", "integer", "Seats.", minimum=1, maximum=8),
        Param("note", "string", "A note.", required=False, min_length=1, default="-"),
    ),
    handler=_noop,
)
VALID = {"size": "small", "date": "2025-03-04", "seats": 2}


def error_of(arguments: object) -> tuple[str, str]:
    with pytest.raises(ToolError) as info:
        BOOK.validate(arguments)
    return info.value.code, info.value.message


def test_valid_arguments_get_defaults_and_integral_floats_become_ints() -> None:
    assert BOOK.validate(VALID) == {**VALID, "note": "-"}
    out = BOOK.validate({**VALID, "seats": 3.0, "note": "window"})
    assert out["seats"] == 3 and type(out["seats"]) is int and out["note"] == "window"


@pytest.mark.parametrize(
    "arguments,expected",
    [
        (["size"], ("INVALID_ARGUMENTS", "arguments must be a JSON object, got array")),
        # unexpected before missing, missing before any value problem
        ({"zeta": 1, "alpha": 2}, ("UNEXPECTED_ARGUMENT", "book has no argument 'alpha'")),
        ({"size": "huge", "seats": "2"}, ("MISSING_ARGUMENT", "missing required argument 'date'")),
        # parameters in declaration order: size's bad value before date's wrong type
        (
            {**VALID, "size": "huge", "date": 20250304},
            ("INVALID_VALUE", "argument 'size' must be one of: small, large"),
        ),
        ({**VALID, "date": 20250304, "seats": 0}, ("WRONG_TYPE", "argument 'date' must be string, got integer")),
        ({**VALID, "date": "March 4"}, ("INVALID_VALUE", "argument 'date' must have the format YYYY-MM-DD")),
        ({**VALID, "seats": True}, ("WRONG_TYPE", "argument 'seats' must be integer, got boolean")),
        ({**VALID, "seats": 2.5}, ("WRONG_TYPE", "argument 'seats' must be integer, got number")),
        ({**VALID, "seats": 0}, ("INVALID_VALUE", "argument 'seats' must be >= 1")),
        ({**VALID, "seats": 9}, ("INVALID_VALUE", "argument 'seats' must be <= 8")),
        ({**VALID, "note": ""}, ("INVALID_VALUE", "argument 'note' must not be empty")),
    ],
)
def test_first_violation_in_fixed_order(arguments: object, expected: tuple[str, str]) -> None:
    assert error_of(arguments) == expected


def test_param_check_alone() -> None:
    seats = BOOK.params[2]
    assert seats.check(4.0) == 4 and type(seats.check(4.0)) is int
    with pytest.raises(ToolError, match="must be <= 8"):
        seats.check(12)


@pytest.mark.parametrize(
    "param,where",
    [
        (Param("when", "string", "When.", pattern="("), "properties/when/pattern"),  # not a regex
        (Param("n", "integer", "N.", minimum="one"), "properties/n/minimum"),  # type: ignore[arg-type]
    ],
)
def test_invalid_definitions_fail_when_the_tool_is_built(param: Param, where: str) -> None:
    with pytest.raises(ValueError, match=f"tool 'broken'.*not a valid JSON schema.*at {where}"):
        ToolSpec("broken", "test", "Broken.", (param,), _noop)
