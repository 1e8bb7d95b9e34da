"""Address helpers (``osmosis_ai.rollout.network``): validate hosts and find this machine's
public IPv4 address.

Upstream uses them to register a server with the Osmosis platform; Rollout Fleet registers
with nothing, but user code may call them, so they behave as upstream's do.
:func:`detect_public_ip` asks the cloud metadata services first (AWS, GCP, Azure: the
instance's own address, not a NAT gateway's), then public echo services, each group in
parallel, and returns the first valid answer.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

import httpx

METADATA_TIMEOUT_SECONDS = 2.0
SERVICE_TIMEOUT_SECONDS = 10.0
_METADATA = "http://169.254.169.254"
_MAX_HOST_LENGTH = 253
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


class PublicIPDetectionError(Exception):
    """No metadata service and no echo service gave a public IPv4 address."""


def validate_ipv4(ip: str) -> bool:
    """True for a dotted-quad IPv4 address (``"256.1.1.1"``, IPv6 and names are False)."""
    try:
        return ipaddress.ip_address(ip).version == 4
    except ValueError:
        return False


def is_private_ip(ip: str) -> bool:
    """True for a private address (RFC 1918, loopback, link-local, ...); False when public
    or not an address at all."""
    try:
        return ipaddress.ip_address(ip).is_private
    except ValueError:
        return False


def is_valid_hostname_or_ip(value: str) -> bool:
    """A format check (no DNS): an IPv4 address or a hostname, optionally with ``:port``.

    Labels are 1-63 letters, digits, ``-`` or ``_`` (not starting or ending with ``-``);
    the host is at most 253 characters.
    """
    if not value or len(value) > _MAX_HOST_LENGTH + 7:  # room for ":port"
        return False
    host, sep, port = value.rpartition(":")
    if not (sep and port.isdigit()):
        host = value
    if validate_ipv4(host):
        return True
    return len(host) <= _MAX_HOST_LENGTH and _HOSTNAME.fullmatch(host) is not None


@dataclass(frozen=True)
class _Probe:
    """One place that may know our public address: GET ``url`` with ``headers``; AWS's
    IMDSv2 first wants a session token from ``token_url`` (PUT)."""

    name: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    token_url: str | None = None


CLOUD_METADATA = (
    _Probe(
        "AWS",
        f"{_METADATA}/latest/meta-data/public-ipv4",
        token_url=f"{_METADATA}/latest/api/token",
    ),
    _Probe(
        "GCP",
        f"{_METADATA}/computeMetadata/v1/instance/network-interfaces/0/access-configs/0/external-ip",
        {"Metadata-Flavor": "Google"},
    ),
    _Probe(
        "Azure",
        f"{_METADATA}/metadata/instance/network/interface/0/ipv4/ipAddress/0/publicIpAddress"
        "?api-version=2021-02-01&format=text",
        {"Metadata": "true"},
    ),
)
ECHO_SERVICES = (
    _Probe("checkip.amazonaws.com", "https://checkip.amazonaws.com"),
    _Probe("ipify", "https://api.ipify.org"),
    _Probe("icanhazip", "https://icanhazip.com"),
    _Probe("ifconfig.me", "https://ifconfig.me/ip"),
)


def _ask(probe: _Probe, timeout: float, transport: httpx.BaseTransport | None) -> str | None:
    """The probe's answer if it is an IPv4 address; ``None`` on any failure (a 404 from a
    metadata service means the instance has no public address)."""
    try:
        with httpx.Client(timeout=timeout, transport=transport) as client:
            headers = dict(probe.headers)
            if probe.token_url is not None:
                token = client.put(
                    probe.token_url, headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
                )
                token.raise_for_status()
                headers["X-aws-ec2-metadata-token"] = token.text
            answer = client.get(probe.url, headers=headers)
            answer.raise_for_status()
    except httpx.HTTPError:
        return None
    ip = answer.text.strip()
    return ip if validate_ipv4(ip) else None


def _first_answer(
    probes: Sequence[_Probe], timeout: float, transport: httpx.BaseTransport | None
) -> str | None:
    """Ask all probes at once; the first valid answer wins and the rest are not waited for."""
    pool = ThreadPoolExecutor(max_workers=len(probes), thread_name_prefix="public-ip")
    try:
        futures = [pool.submit(_ask, probe, timeout, transport) for probe in probes]
        for future in as_completed(futures, timeout=2 * timeout + 1):
            ip = future.result()
            if ip is not None:
                return ip
    except TimeoutError:
        return None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return None


def detect_public_ip(*, transport: httpx.BaseTransport | None = None) -> str:
    """This machine's public IPv4 address, from cloud metadata or else from echo services.

    ``transport`` (ours; tests) replaces the network. Raises :class:`PublicIPDetectionError`
    when nothing answers. Environment overrides are the caller's business.
    """
    ip = _first_answer(CLOUD_METADATA, METADATA_TIMEOUT_SECONDS, transport)
    if ip is None:
        ip = _first_answer(ECHO_SERVICES, SERVICE_TIMEOUT_SECONDS, transport)
    if ip is None:
        raise PublicIPDetectionError(
            "Failed to detect public IP address. All detection methods failed:\n"
            "  1. Cloud metadata (AWS/GCP/Azure): unavailable or returned no public IP\n"
            "  2. External IP services: all failed or timed out\n\n"
            "To fix this, provide an explicit IP/hostname to your application."
        )
    return ip


__all__ = [
    "PublicIPDetectionError",
    "detect_public_ip",
    "is_private_ip",
    "is_valid_hostname_or_ip",
    "validate_ipv4",
]
