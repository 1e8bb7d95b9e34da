"""Which addresses a trainer-chosen URL may make the SDK's clients connect to: one policy,
checked by the fleet's gateway on the URL it admits and by every client of
:func:`~rollout_sdk.client.new_http_client` on each address it actually connects to.

Never: link-local addresses (169.254.0.0/16, fe80::/10, where cloud instances serve their
credentials) and the cloud metadata services outside them (100.100.100.200, fd00:ec2::254,
``metadata.google.internal``), in any form a resolver accepts: ``2852039166``,
``0xa9fea9fe``, ``0251.0376.0251.0376``, ``169.254.43518``, ``[::ffff:169.254.169.254]``,
NAT64 and 6to4 forms. Besides, the networks an operator lists in
``OSMOSIS_ROLLOUT_CLIENT_REFUSED_NETWORKS`` (e.g. ``10.0.0.0/8``: the cluster's own).

A URL's host is checked as written when admitted; a name is checked when it is resolved, at
connect time, and the connection goes to the address that was checked, so a name that
resolves elsewhere later (DNS rebinding) never reaches a refused address.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from collections.abc import Iterable, Sequence
from typing import Any

import anyio
import httpcore
import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

CLOUD_METADATA = ipaddress.ip_address("169.254.169.254")
# Cloud metadata services outside the link-local ranges, by address and by name.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    {
        CLOUD_METADATA,
        ipaddress.ip_address("100.100.100.200"),
        ipaddress.ip_address("fd00:ec2::254"),
    }
)
METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "metadata.goog"})
# Prefixes whose last 32 bits are the IPv4 address a translator reaches: NAT64's well-known
# and local-use prefixes (RFC 6052, RFC 8215: 64:ff9b:1::/48 puts it in the last 32 bits for
# a /96 inside it), IPv4-translated (SIIT, RFC 2765) and IPv4-compatible addresses.
_TRANSLATED = (
    ipaddress.ip_network("64:ff9b::/96"),
    ipaddress.ip_network("64:ff9b:1::/48"),
    ipaddress.ip_network("::ffff:0:0:0/96"),
)
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


class RefusedDestination(httpcore.ConnectError):
    """A connection the policy refuses; httpx raises it as an ``httpx.ConnectError`` whose
    ``__cause__`` is this. Its text is the SDK's own (``rollout_sdk.core.foreign``)."""

    own_words = True


def _inet_aton_part(part: str) -> int | None:
    if not part:
        return None
    try:
        if part[:2].lower() == "0x":
            return int(part[2:], 16) if part[2:] else 0
        if len(part) > 1 and part[0] == "0":
            return int(part[1:], 8)
        return int(part, 10) if part.isdigit() else None
    except ValueError:
        return None


def _inet_aton(host: str) -> ipaddress.IPv4Address | None:
    """``host`` as the C library's ``inet_aton`` (and so ``getaddrinfo``) reads it: one to
    four parts, each decimal, octal (``0``) or hex (``0x``), the last filling the bytes left."""
    parts = host.split(".")
    if len(parts) > 4:
        return None
    values = [_inet_aton_part(part) for part in parts]
    if any(value is None for value in values):
        return None
    numbers = [value for value in values if value is not None]
    *leading, last = numbers
    if any(value > 255 for value in leading) or last >= 256 ** (4 - len(leading)):
        return None
    packed = 0
    for value in leading:
        packed = packed << 8 | value
    return ipaddress.IPv4Address(packed << 8 * (4 - len(leading)) | last)


def host_address(host: str) -> IPAddress | None:
    """The address a URL's host names literally (whatever form a resolver accepts), or None
    for a name."""
    host = host.strip("[]").rstrip(".").split("%", 1)[0]
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return _inet_aton(host)


_THIS_HOST_V4 = ipaddress.ip_network("0.0.0.0/8")
_ANY_V6 = ipaddress.IPv6Address("::")
_LOOPBACK_V4 = ipaddress.IPv4Address("127.0.0.1")
_LOOPBACK_V6 = ipaddress.IPv6Address("::1")


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches: mapped, translated, compatible, NAT64 or
    6to4."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    translated = any(address in network for network in _TRANSLATED)
    if translated or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def refused_address(address: IPAddress, networks: Sequence[IPNetwork] = ()) -> str | None:
    """Why the SDK never connects to ``address`` (e.g. ``link-local address 169.254.169.254
    (cloud metadata)``); None if it may."""
    reached = _embedded_ipv4(address) or address
    if reached in _THIS_HOST_V4 or reached == _ANY_V6:
        # A connection to "this network" / the unspecified address lands on this host: it is
        # loopback as far as any refused network is concerned.
        reached = _LOOPBACK_V4 if reached.version == 4 else _LOOPBACK_V6
    written = "" if reached == address else f", written {address}"
    if reached in METADATA_ADDRESSES:
        kind = "link-local" if reached.is_link_local else "cloud-metadata"
        return f"{kind} address {reached} (cloud metadata){written}"
    if reached.is_link_local:
        return f"link-local address {reached}{written}"
    for network in networks:
        if reached.version == network.version and reached in network:
            return f"address {reached}{written}, in a refused network ({network})"
    return None


def loopback_host(host: str) -> bool:
    """Whether ``host`` names this host's own loopback (``127.0.0.0/8``, ``::1``, ``0.0.0.0``
    or ``localhost``, in any form a resolver reads), where no container of an engine reaches
    it."""
    address = host_address(host)
    if address is None:
        name = host.lower().rstrip(".")
        return name == "localhost" or name.endswith(".localhost")
    reached = _embedded_ipv4(address) or address
    return reached.is_loopback or reached in _THIS_HOST_V4 or reached == _ANY_V6


def refused_host(host: str, networks: Sequence[IPNetwork] = ()) -> str | None:
    """Why a URL whose host is ``host`` is refused as written; None if it may be admitted (a
    name is checked again on each address it resolves to)."""
    if host.lower().rstrip(".") in METADATA_NAMES:
        return "names a cloud metadata service"
    address = host_address(host)
    if address is None:
        return None
    refused = refused_address(address, networks)
    return None if refused is None else f"is a refused address: {refused}"


def parse_networks(values: Iterable[str]) -> list[IPNetwork]:
    return [ipaddress.ip_network(value.strip(), strict=False) for value in values if value.strip()]


class CheckedBackend(httpcore.AsyncNetworkBackend):
    """Resolves a host itself (on the event loop's resolver, never blocking it), refuses it if
    any address it resolves to is refused, and connects to the checked addresses only."""

    def __init__(self, networks: Sequence[IPNetwork] = ()) -> None:
        self._networks = tuple(networks)
        self._inner = httpcore.AnyIOBackend()

    async def _resolve(self, host: str, port: int, seconds: float | None) -> list[str]:
        literal = host_address(host)
        if literal is not None:
            return [str(literal)]
        try:
            with anyio.fail_after(seconds):
                answers = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from None
        return list(dict.fromkeys(str(answer[4][0]) for answer in answers))

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self._resolve(host, port, timeout)
        for address in addresses:
            parsed = host_address(address)
            refused = "an address it cannot read" if parsed is None else None
            refused = refused or refused_address(parsed or CLOUD_METADATA, self._networks)
            if refused is not None:
                raise RefusedDestination(f"refused: {host} resolves to {refused}")
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        raise failure or httpcore.ConnectError(f"{host} resolves to no address")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return await self._inner.connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def checked_transport(
    networks: Sequence[IPNetwork], limits: httpx.Limits, tls: ssl.SSLContext
) -> httpx.AsyncHTTPTransport:
    """An ``AsyncHTTPTransport`` whose connections go through :class:`CheckedBackend`."""
    transport = httpx.AsyncHTTPTransport(verify=tls, limits=limits)
    # httpx takes no network backend: its pool is rebuilt with the same settings and one.
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=tls,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=CheckedBackend(networks),
    )
    return transport


__all__ = [
    "METADATA_ADDRESSES",
    "METADATA_NAMES",
    "CheckedBackend",
    "RefusedDestination",
    "checked_transport",
    "host_address",
    "loopback_host",
    "parse_networks",
    "refused_address",
    "refused_host",
]
