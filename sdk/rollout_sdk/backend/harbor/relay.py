"""A TCP relay: the one way out of a sandbox, to the TrainGate and nowhere else.

Runs in a container of its own on the sandbox's internal network and on a network with a way
out: ``python3 relay.py <listen port> <host> <port>``. Every connection it accepts is joined to
a new connection to ``host:port``, byte for byte (TLS passes through untouched). Standard
library only: it runs on a bare Python image.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


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


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: relay.py <listen port> <host> <port>", file=sys.stderr)
        return 2
    asyncio.run(serve(int(argv[0]), argv[1], int(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
