"""A log line never shows bytes another service sent: the fleet's log handler filter
(``rollout_core.logs.ForeignBytesFilter``) tells a foreign exception by its type, in a
message's arguments, in its traceback and where code quoted it into its own text. The
exception comes from a real httpx call to a real local socket that answers an SSH banner."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from rollout_core.logs import ForeignBytesFilter, log_config

pytestmark = pytest.mark.anyio
SECRET = "pw=hunter2-7c1e"


async def banner_error() -> httpx.RemoteProtocolError:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            f"SSH-2.0-OpenSSH_9.6 {SECRET}\r\nInvalid SSH identification string.\r\n\r\n".encode()
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient() as client:
            await client.get(f"http://127.0.0.1:{port}/")
    except httpx.RemoteProtocolError as error:
        return error
    finally:
        server.close()
    raise AssertionError("the banner was taken for HTTP")


def lines(error: BaseException, *filters: logging.Filter) -> list[str]:
    logger = logging.getLogger("test.foreign_bytes")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    for added in filters:
        handler.addFilter(added)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("call failed: %s", error)
        logger.warning("call failed: %s", str(error), exc_info=error)
        logger.error(error)
        try:
            raise RuntimeError(f"wrapped: {error}") from error
        except RuntimeError:
            logger.exception("agent crashed")
    finally:
        logger.removeHandler(handler)
    return [logging.Formatter().format(record) for record in records]


async def test_no_log_line_shows_a_foreign_services_bytes() -> None:
    error = await banner_error()
    assert SECRET in str(error)  # planted: httpx quotes the banner it refused
    shown = lines(error, ForeignBytesFilter())
    assert len(shown) == 4
    for line in shown:
        assert SECRET not in line, line
    port = error.request.url.port
    assert shown[0] == f"call failed: GET http://127.0.0.1:{port}/ failed: RemoteProtocolError"
    assert "Traceback (most recent call last)" in shown[3]
    assert "RemoteProtocolError" in shown[3]


async def test_without_the_filter_the_same_lines_carry_the_secret() -> None:
    """The check can fail: the same records, unfiltered, show the banner."""
    error = await banner_error()
    shown = lines(error)
    assert sum(SECRET in line for line in shown) == 4


def test_every_process_handler_applies_the_filter_before_hiding_secrets() -> None:
    for level, kind in (("info", "text"), ("debug", "json")):
        handler = log_config(level, kind)["handlers"]["stderr"]  # type: ignore[arg-type]
        filters = handler["filters"]
        assert filters.index("foreign_bytes") < filters.index("hidden_secrets")
