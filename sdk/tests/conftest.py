"""SDK test fixtures: real HTTP servers (uvicorn on a background thread) for the mock
TrainGate and the in-process rollout server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn

from rollout_sdk.config import reset_settings
from rollout_sdk.testing import calculator_responder, create_mock_trainer_app

Serve = Callable[[Any], str]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Serve an ASGI app over real HTTP for the test; returns its base URL."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(app: Any) -> str:
        port = _free_port()
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("uvicorn did not start")
            time.sleep(0.01)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def mock_trainer(serve: Serve) -> tuple[str, Any]:
    """A calculator mock TrainGate over HTTP: (base URL, its MockTrainGate state)."""
    app = create_mock_trainer_app(responder=calculator_responder)
    return serve(app), app.state.gate


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("OSMOSIS_ROLLOUT_CLIENT_RETRY_BASE_DELAY", "0.1")
    reset_settings()
    yield
    reset_settings()
