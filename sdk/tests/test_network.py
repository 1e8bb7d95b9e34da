"""Address helpers (``osmosis_ai.rollout.network``): host checks, and public-IP detection
against a scripted network (no real request leaves the test)."""

from __future__ import annotations

import httpx
import pytest

from rollout_sdk import (
    PublicIPDetectionError,
    detect_public_ip,
    is_private_ip,
    is_valid_hostname_or_ip,
    validate_ipv4,
)

Answers = dict[str, httpx.Response]


def network(answers: Answers, asked: list[str] | None = None) -> httpx.MockTransport:
    """Answer a request by its host (or ``host/path``); anything else cannot connect."""

    def handle(request: httpx.Request) -> httpx.Response:
        if asked is not None:
            asked.append(f"{request.method} {request.url}")
        for where in (f"{request.url.host}{request.url.path}", request.url.host):
            if where in answers:
                return answers[where]
        raise httpx.ConnectError("unreachable", request=request)

    return httpx.MockTransport(handle)


def text(body: str, status: int = 200) -> httpx.Response:
    return httpx.Response(status, text=body)


def test_ipv4_and_private_checks() -> None:
    assert validate_ipv4("192.168.1.1")
    assert not validate_ipv4("256.1.1.1")
    assert not validate_ipv4("::1")
    assert not validate_ipv4("not-an-ip")
    assert is_private_ip("10.0.0.1")
    assert is_private_ip("192.168.1.1")
    assert not is_private_ip("54.123.45.67")
    assert not is_private_ip("nonsense")


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("192.168.1.1", True),
        ("192.168.1.1:8080", True),
        ("example.com", True),
        ("example.com:8080", True),
        ("my_host", True),
        ("a", True),
        ("localhost", True),
        ("", False),
        ("has spaces", False),
        ("-leading.example.com", False),
        ("trailing-.example.com", False),
        ("a" * 64 + ".com", False),
        ("a." * 130, False),
        ("host:port", False),
    ],
)
def test_hostname_or_ip_is_a_format_check(value: str, valid: bool) -> None:
    assert is_valid_hostname_or_ip(value) is valid


def test_cloud_metadata_answers_first() -> None:
    """AWS IMDSv2: a session token (PUT), then the address with the token."""
    asked: list[str] = []
    answers = {
        "169.254.169.254/latest/api/token": text("tok"),
        "169.254.169.254/latest/meta-data/public-ipv4": text("54.1.2.3\n"),
        "api.ipify.org": text("9.9.9.9"),
    }
    assert detect_public_ip(transport=network(answers, asked)) == "54.1.2.3"
    assert not any("ipify" in request for request in asked)


def test_echo_services_are_the_fallback() -> None:
    answers: Answers = {
        "169.254.169.254": text("not found", 404),  # no public address on this instance
        "checkip.amazonaws.com": text("garbage"),
        "api.ipify.org": text("9.9.9.9"),
    }
    assert detect_public_ip(transport=network(answers)) == "9.9.9.9"


def test_nothing_answers() -> None:
    with pytest.raises(PublicIPDetectionError, match="Failed to detect public IP address"):
        detect_public_ip(transport=network({}))
