"""A TCP relay: the one way out of a sandbox, to the TrainGate and nowhere else; and the
proxy of a build that may fetch packages.

Runs in a container of its own on the sandbox's internal network and on a network with a way
out: ``python3 relay.py <listen port> <host> <port>``. Every connection it accepts is joined to
a new connection to ``host:port``, byte for byte (TLS passes through untouched).

``python3 relay.py proxy <listen port> [<host>,...]``: an HTTP proxy for an image build on an
internal network (``CONNECT host:port`` and absolute-URI requests). It connects only to
addresses of the internet (``is_global``), or to the hosts the operator listed (a package
mirror), never to a link-local or metadata address: the build reaches neither this host, the
fleet, Redis nor a cloud's metadata. Standard library only: it runs on a bare Python image.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import sys
from urllib.parse import urlsplit


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()


async def serve(listen: int, host: str, port: int) -> None:
    async def joined(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    server = await asyncio.start_server(joined, "0.0.0.0", listen)
    async with server:
        await server.serve_forever()


HEAD_CAP = 16 * 1024  # a request's line and headers


def refused(address: str, listed: bool) -> str | None:
    """Why the proxy never connects to ``address``; None if it may."""
    found = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        found = found.ipv4_mapped
    if found.is_link_local or found.is_multicast or found.is_unspecified:
        return f"{found} is link-local, multicast or unspecified"
    if not listed and not found.is_global:
        return f"{found} is not an address of the internet"
    return None


async def _target(host: str, port: int, allowed: frozenset[str]) -> list[str]:
    """The checked addresses of ``host``; ValueError naming why none may be reached."""
    loop = asyncio.get_running_loop()
    found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [str(entry[4][0]) for entry in found]
    listed = host.lower() in allowed
    for address in addresses:
        why = refused(address, listed)
        if why is not None:
            raise ValueError(f"{host}: {why}")
    return addresses


async def _deny(writer: asyncio.StreamWriter, status: str, why: str) -> None:
    body = f"{why}\n".encode()
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    writer.write(head.encode() + body)
    with contextlib.suppress(ConnectionError, OSError):
        await writer.drain()
        writer.close()


async def proxy(listen: int, allowed: frozenset[str]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        line, _, rest = head.partition(b"\r\n")
        parts = line.decode("latin-1").split(" ")
        if len(parts) != 3:
            await _deny(writer, "400 Bad Request", "not an HTTP request")
            return
        method, target, version = parts
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            host, port = host.strip("[]"), int(port_text or 443)
        else:
            url = urlsplit(target)
            host, port = url.hostname or "", url.port or 80
            if url.scheme != "http" or not host:
                await _deny(writer, "400 Bad Request", "a proxy request names an http URL")
                return
        try:
            addresses = await _target(host, port, allowed)
            upstream_reader, upstream_writer = await asyncio.open_connection(addresses[0], port)
        except (ValueError, OSError) as exc:
            await _deny(writer, "403 Forbidden", str(exc))
            return
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            path = urlsplit(target)._replace(scheme="", netloc="").geturl() or "/"
            upstream_writer.write(f"{method} {path} {version}\r\n".encode() + rest)
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    server = await asyncio.start_server(handle, "0.0.0.0", listen, limit=HEAD_CAP)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if argv[:1] == ["proxy"] and len(argv) in (2, 3):
        hosts = argv[2].split(",") if len(argv) == 3 else []
        asyncio.run(proxy(int(argv[1]), frozenset(h.strip().lower() for h in hosts if h.strip())))
        return 0
    if len(argv) != 3:
        print("usage: relay.py <listen port> <host> <port> | proxy <port> [hosts]", file=sys.stderr)
        return 2
    asyncio.run(serve(int(argv[0]), argv[1], int(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
