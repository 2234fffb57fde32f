"""The task layer's sans-I/O core (issue 29), fuzzed: any payload a worker claims is either a task
call it reads or a ``BadTaskPayload`` (never another exception), a call survives the round trip, a
task name is checked at its ceiling, and any row a wait reads settles into a value, an error of ours,
or "not yet"."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import echomq
from echomq.tasks import JSON, PICKLE, BadTaskPayload
from echomq.tasks.envelope import (
    MAX_NAME_CHARS,
    check_name,
    decode_result,
    encode_call,
    encode_result,
    parse_call,
)
from echomq.tasks.results import ResultWait

pytestmark = pytest.mark.once

NAMES = st.text(
    st.characters(blacklist_categories=("Zs", "Cc", "Zl", "Zp")), min_size=1, max_size=MAX_NAME_CHARS
)
JSONS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_payload_is_a_call_or_a_bad_task_payload(payload: bytes) -> None:
    try:
        call = parse_call(payload)
    except BadTaskPayload:
        return
    with contextlib.suppress(BadTaskPayload):
        call.arguments({"json": JSON})


def test_what_json_cannot_encode_is_a_serialization_error() -> None:
    with pytest.raises(echomq.tasks.SerializationError, match="argument 1"):
        encode_call("t", JSON, ["\ud800"], {})


@settings(max_examples=200, deadline=None)
@given(NAMES, st.lists(JSONS, max_size=4), st.dictionaries(st.text(min_size=1), JSONS, max_size=4))
def test_a_call_survives_its_round_trip(name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    try:
        check_name(name)
    except ValueError:
        return  # whitespace, an unprintable character, a lone surrogate: refused (below)
    call = parse_call(encode_call(check_name(name), JSON, args, kwargs))
    assert call.name == name and call.serializer == "json"
    assert call.arguments({"json": JSON}) == (args, kwargs)
    assert decode_result(encode_result(JSON, args, name)) == args


def test_names_at_their_ceiling_and_refused_past_it() -> None:
    assert check_name("x" * MAX_NAME_CHARS) == "x" * MAX_NAME_CHARS
    for bad in ("", "x" * (MAX_NAME_CHARS + 1), "send mail", "a\nb", "\ud800", "a\x00b"):
        with pytest.raises(ValueError, match="a task name"):
            check_name(bad)
    with pytest.raises(TypeError):
        check_name(3)


def test_a_pickle_is_read_only_by_a_reader_given_pickle() -> None:
    stored = encode_result(PICKLE, {1, 2}, "t")
    with pytest.raises(BadTaskPayload, match="'pickle' form"):
        decode_result(stored)
    assert decode_result(stored, PICKLE) == {1, 2}
    call = parse_call(encode_call("t", PICKLE, [{1}], {}))
    with pytest.raises(BadTaskPayload, match="does not accept"):
        call.arguments({"json": JSON})


ROW_VALUE = st.none() | st.binary(max_size=80)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([None, b"pending", b"active", b"done", b"dead", b"cancelled", b"odd"]),
       st.lists(ROW_VALUE, min_size=19, max_size=19))  # fmt: skip
def test_any_row_settles_into_a_value_an_error_of_ours_or_not_yet(
    state: bytes | None, rest: list[Any]
) -> None:
    wait = ResultWait("q", "j", None, 0.0)
    # ValueError: a done row whose result is not JSON (json.JSONDecodeError is one)
    with contextlib.suppress(
        echomq.JobFailed, echomq.JobCancelled, echomq.JobGone, BadTaskPayload, ValueError
    ):
        wait.settle([state, *rest])
