"""The ids a v2 LLM call names in headers (P§2.11): any text goes on the wire as a header
value an HTTP/1.1 client sends, and reads back as itself; plain header-safe ASCII goes as it
is (the ids trainers used so far are unchanged)."""

from __future__ import annotations

import h11
from hypothesis import example, given
from hypothesis import strategies as st

from rollout_sdk.client.headers import (
    ROLLOUT_HEADER,
    SAMPLE_HEADER,
    decode_header_id,
    encode_header_id,
    llm_call_headers,
)

PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters="%")


def sent(value: str) -> bytes:
    """The request h11 (httpx's HTTP/1.1) writes with ``value`` in a header; raises if it
    refuses the value."""
    request = h11.Request(method="POST", target="/", headers=[("Host", "h"), ("x-id", value)])
    return h11.Connection(h11.CLIENT).send(request) or b""


@given(st.text(st.characters(exclude_categories=["Cs"])))
@example("é中文😀")
@example("a\r\nb")
@example(" leading")
@example("trailing ")
@example("line\u2028separator")
@example("%41")
@example("")
def test_any_text_goes_as_a_header_value_and_reads_back_as_itself(text: str) -> None:
    value = encode_header_id(text)
    assert value.isascii()
    assert value == value.strip()  # no space a parser would take off
    assert f"x-id: {value}\r\n".encode() in sent(value)
    assert decode_header_id(value) == text


@given(st.text(PRINTABLE, min_size=1).filter(lambda text: text == text.strip(" ")))
@example("r-0007")
@example("run 42.attempt_2:x")
def test_plain_header_safe_ascii_goes_as_it_is(text: str) -> None:
    assert encode_header_id(text) == text


def test_percent_and_outer_spaces_are_encoded() -> None:
    assert encode_header_id("100%") == "100%25"
    assert encode_header_id(" x ") == "%20x%20"
    assert encode_header_id("é") == "%C3%A9"
    assert llm_call_headers("é", "s") == {ROLLOUT_HEADER: "%C3%A9", SAMPLE_HEADER: "s"}
    assert llm_call_headers("r-1", None) == {ROLLOUT_HEADER: "r-1"}
