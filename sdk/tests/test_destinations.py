"""The destination policy: every form of an address a resolver reads is judged by the address
it reaches; a name is judged by what it resolves to, at connect time, on a real socket."""

from __future__ import annotations

import asyncio
import ipaddress

import httpx
import pytest

from rollout_sdk.client import new_http_client
from rollout_sdk.client.destinations import (
    host_address,
    loopback_host,
    parse_networks,
    refused_host,
)
from rollout_sdk.config import RolloutSettings
from rollout_sdk.config.settings import RolloutClientSettings

METADATA_FORMS = [
    "169.254.169.254",
    "2852039166",  # one decimal number
    "0xa9fea9fe",  # one hex number
    "0xA9.0xFE.0xA9.0xFE",
    "0251.0376.0251.0376",  # octal parts
    "169.254.43518",  # a, b, 16-bit c
    "169.16689662",  # a, 24-bit b
    "169.254.169.254.",  # a trailing dot
    "[::ffff:169.254.169.254]",  # IPv4-mapped
    "::ffff:a9fe:a9fe",
    "[::169.254.169.254]",  # IPv4-compatible
    "64:ff9b::a9fe:a9fe",  # NAT64
    "[64:ff9b:1::a9fe:a9fe]",  # NAT64, local-use prefix
    "[::ffff:0:a9fe:a9fe]",  # IPv4-translated (SIIT)
    "2002:a9fe:a9fe::1",  # 6to4
]
LINK_LOCAL = ["169.254.1.1", "0xa9fe0101", "[fe80::1]", "fe80::1%eth0", "::ffff:169.254.0.1"]
OTHER_METADATA = ["100.100.100.200", "1684301000", "[fd00:ec2::254]", "metadata.google.internal"]
ALLOWED = [
    "127.0.0.1",
    "2130706433",  # 127.0.0.1: loopback stays allowed (local trainers)
    "localhost",
    "[::1]",
    "10.0.0.1",
    "trainer.example",
    "169.254.example",  # a name, checked as it resolves
    "1.2.3.4.5",
    "0x1g",
    "256.1.1.1",
]


@pytest.mark.parametrize("host", METADATA_FORMS)
def test_every_form_of_the_metadata_address_is_refused(host: str) -> None:
    assert host_address(host) is not None
    refused = refused_host(host)
    assert refused is not None
    assert "169.254.169.254" in refused
    assert "(cloud metadata)" in refused


@pytest.mark.parametrize("host", LINK_LOCAL + OTHER_METADATA)
def test_link_local_and_other_metadata_addresses_are_refused(host: str) -> None:
    assert refused_host(host) is not None


@pytest.mark.parametrize("host", ALLOWED)
def test_other_hosts_are_admitted_as_written(host: str) -> None:
    assert refused_host(host) is None


def test_refused_networks_apply_to_every_form() -> None:
    networks = parse_networks(["127.0.0.0/8", "::1/128"])
    for host in ("127.0.0.1", "2130706433", "0x7f.1", "[::ffff:127.0.0.1]", "[::1]"):
        assert "refused network" in (refused_host(host, networks) or ""), host
    assert refused_host("10.0.0.1", networks) is None


def test_the_setting_reads_comma_separated_networks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_ROLLOUT_CLIENT_REFUSED_NETWORKS", "10.0.0.0/8, fd00::/8")
    assert RolloutClientSettings().refused_networks == [
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("fd00::/8"),
    ]


async def _serve() -> tuple[asyncio.Server, list[int]]:
    """A server on loopback that counts the connections it gets and answers 200."""
    accepted: list[int] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0), accepted


@pytest.mark.anyio
async def test_a_name_is_checked_on_the_address_it_resolves_to() -> None:
    """``localhost`` passes admission (a name); with loopback refused, the client resolves
    it, refuses, and never connects."""
    server, accepted = await _serve()
    port = server.sockets[0].getsockname()[1]
    refusing = RolloutSettings(client=RolloutClientSettings(refused_networks="127.0.0.0/8,::1"))
    try:
        async with new_http_client(refusing) as client:
            with pytest.raises(httpx.ConnectError, match=r"refused: localhost resolves to"):
                await client.get(f"http://localhost:{port}/")
            with pytest.raises(httpx.ConnectError, match=r"refused: 2130706433 resolves to"):
                await client.get(f"http://2130706433:{port}/")
        assert accepted == []
        async with new_http_client(RolloutSettings()) as client:
            assert (await client.get(f"http://localhost:{port}/")).text == "ok"
        assert accepted == [1]
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    "host",
    [
        *("127.0.0.1", "127.9.9.9", "2130706433", "127.1", "[::1]", "::ffff:127.0.0.1"),
        *("0.0.0.0", "localhost", "LOCALHOST.", "gate.localhost"),
    ],
)
def test_every_form_of_this_hosts_loopback_is_loopback(host: str) -> None:
    assert loopback_host(host)


@pytest.mark.parametrize("host", ["192.0.2.2", "10.0.0.1", "[2001:db8::1]", "traingate", "a.b"])
def test_other_hosts_are_not_loopback(host: str) -> None:
    assert not loopback_host(host)
