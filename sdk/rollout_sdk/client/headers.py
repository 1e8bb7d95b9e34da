"""The ids a v2 LLM call names in its headers: ``x-rollout-id`` and ``x-sample-id``
(PROTOCOL.md §2.11).

A header value carries visible ASCII only. A rollout id may hold any character but ``/``,
``\\`` and NUL, and a sample id (an agent's or a session's name) any at all: sent as they are,
non-ASCII failed in the HTTP client (``'ascii' codec can't encode``) and CR/LF or a leading
space made no request at all (``Connection error.``), so the rollout failed. An id therefore
goes as it is when it is plain header-safe ASCII — printable ASCII (space to ``~``) without
``%``, not beginning or ending with a space — and otherwise as its UTF-8 bytes
percent-encoded (RFC 3986 §2.1: every byte but ``A-Z a-z 0-9 - . _ ~``). A receiver
percent-decodes every value: a plain one has no ``%`` and reads as itself, so the ids trainers
used so far go unchanged.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

ROLLOUT_HEADER = "x-rollout-id"
SAMPLE_HEADER = "x-sample-id"

# Printable ASCII but "%", with no space at either end.
_PLAIN = re.compile(r"[!-$&-~](?:[ -$&-~]*[!-$&-~])?")


def encode_header_id(text: str) -> str:
    """``text`` as a header value: as it is if plain header-safe ASCII, else percent-encoded."""
    return text if _PLAIN.fullmatch(text) else quote(text, safe="")


def decode_header_id(value: str) -> str:
    """The id a header value of :func:`encode_header_id` names."""
    return unquote(value)


def llm_call_headers(rollout_id: str, sample_id: str | None = None) -> dict[str, str]:
    """The headers naming a v2 LLM call's rollout and, when given, its sample."""
    headers = {ROLLOUT_HEADER: encode_header_id(rollout_id)}
    if sample_id:
        headers[SAMPLE_HEADER] = encode_header_id(sample_id)
    return headers


__all__ = [
    "ROLLOUT_HEADER",
    "SAMPLE_HEADER",
    "decode_header_id",
    "encode_header_id",
    "llm_call_headers",
]
