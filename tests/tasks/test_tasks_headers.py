"""A task job's header words (``key=value`` after the serializer's name): what integrations carry.

``echomq.contrib.otel`` puts the W3C trace context there; these tests fuzz
the words' round trip, their ceilings (16 headers, 1,024 characters a key
or an encoded value), and that a payload with a bad word is a
``BadTaskPayload`` (dead at once in a worker), never another exception.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echomq.tasks import JSON, BadTaskPayload
from echomq.tasks.envelope import MAX_HEADER_CHARS, MAX_HEADERS, encode_call, encode_headers, parse_call

pytestmark = pytest.mark.once

KEYS = st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True)
VALUES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=MAX_HEADERS), st.lists(st.integers(), max_size=3))
def test_headers_survive_the_round_trip_beside_the_arguments(
    headers: dict[str, str], args: list[int]
) -> None:
    payload = encode_call("send", JSON, args, {"k": 1}, headers)
    head = payload.partition(b"\n")[0]
    assert b"\n" not in head and head.isascii()  # one line, whatever the values hold
    call = parse_call(payload)
    assert (call.name, call.serializer, dict(call.headers)) == ("send", "json", headers)
    assert call.arguments({"json": JSON}) == (args, {"k": 1})


def test_a_payload_without_headers_is_what_it_always_was() -> None:
    assert encode_call("send", JSON, [1], {}) == b"task send json\n[[1],{}]"
    assert encode_call("send", JSON, [1], {}, {}) == b"task send json\n[[1],{}]"
    assert parse_call(b"task send json\n[[1],{}]").headers == {}
    traced = encode_call("send", JSON, [1], {}, {"traceparent": "00-ab-cd-01"})
    assert traced == b"task send json traceparent=00-ab-cd-01\n[[1],{}]"


def test_header_ceilings_and_bad_keys_are_refused_before_anything_is_sent() -> None:
    at_ceiling = {f"h{i}": "v" for i in range(MAX_HEADERS)}
    assert dict(parse_call(encode_call("t", JSON, [], {}, at_ceiling)).headers) == at_ceiling
    with pytest.raises(ValueError, match="at most 16 headers"):
        encode_headers({**at_ceiling, "one-more": "v"})
    assert parse_call(encode_call("t", JSON, [], {}, {"k": "x" * MAX_HEADER_CHARS})).headers["k"]
    with pytest.raises(ValueError, match="over 1024 characters"):
        encode_headers({"k": "x" * (MAX_HEADER_CHARS + 1)})
    with pytest.raises(ValueError, match="over 1024 characters"):
        encode_headers({"k": " " * (MAX_HEADER_CHARS // 3 + 1)})  # each space is %20 encoded
    for key in ("", "Upper", "1st", "with space", "a=b", "é"):
        with pytest.raises(ValueError, match="lowercase word"):
            encode_headers({key: "v"})
    with pytest.raises(TypeError, match="must be a str"):
        encode_headers({"k": 1})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    "head",
    [
        b"task send json novalue",
        b"task send json =v",
        b"task send json Key=v",
        b"task send json k=1 k=2",
        b"task send json " + b" ".join(b"h%d=v" % i for i in range(MAX_HEADERS + 1)),
        b"task send json k=1  j=2",
    ],
)
def test_a_bad_header_word_is_a_bad_task_payload(head: bytes) -> None:
    with pytest.raises(BadTaskPayload):
        parse_call(head + b"\n[[],{}]")
