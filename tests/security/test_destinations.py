"""The workers never connect to a refused address, whatever form the URL gave it in, and
whatever a name resolves to when they connect. Real gateway, worker and Redis.

Admission refuses the address forms a resolver reads (``2852039166``, ``0xa9fea9fe``,
``169.254.43518``, ``[::ffff:169.254.169.254]``); a name passes admission (it is not
resolved there: what it resolves to then proves nothing) and is checked by the worker on the
address it resolves to, at connect time. To watch that on one machine, these fleets also
refuse loopback (``OSMOSIS_ROLLOUT_CLIENT_REFUSED_NETWORKS``, the same policy) and aim a
rollout at ``localhost``: a listening socket there must see no connection."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import V2_ENV, StartFleet
from tests.harness import STRANDS_AGENT, FleetUnderTest, V2FleetUnderTest, all_logs, new_id

REFUSING_LOOPBACK = {"OSMOSIS_ROLLOUT_CLIENT_REFUSED_NETWORKS": "127.0.0.0/8, ::1/128"}
METADATA_FORMS = [
    "http://2852039166/latest",
    "http://0xa9fea9fe/latest",
    "http://169.254.43518/latest",
    "http://[::ffff:169.254.169.254]/latest",
    "http://[::ffff:a9fe:a9fe]/latest",
]


class Listener:
    """A socket on loopback that counts the connections it accepts (and answers none)."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self._socket.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    opened = Listener()
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def v1_fleet(start_fleet: StartFleet) -> Iterator[FleetUnderTest]:
    handle = start_fleet(workers=1, env=REFUSING_LOOPBACK)
    yield handle
    handle.close()


@pytest.mark.parametrize("url", METADATA_FORMS)
def test_every_form_of_the_metadata_address_is_refused_at_admission(
    v1_fleet: FleetUnderTest, url: str
) -> None:
    rollout_id = new_id("form")
    response = v1_fleet.init(v1_fleet.body(rollout_id, server_url=url))
    assert response.status_code == 422, response.text
    assert "169.254.169.254 (cloud metadata)" in response.text
    assert not v1_fleet.record(rollout_id)


def test_a_refused_network_is_refused_at_admission_when_written_as_an_address(
    v1_fleet: FleetUnderTest, listener: Listener
) -> None:
    # 0.0.0.0 ("this network"), its short form and the unspecified IPv6 address connect to
    # this host on Linux: loopback as far as the refused networks go.
    for host in ("127.0.0.1", "2130706433", "[::1]", "0.0.0.0", "0", "[::]", "[::ffff:0.0.0.0]"):
        body = v1_fleet.body(server_url=f"http://{host}:{listener.port}/gate")
        response = v1_fleet.init(body)
        assert response.status_code == 422, response.text
        assert "refused network" in response.text
    assert listener.accepted == 0


def test_a_v1_rollout_whose_name_resolves_to_a_refused_address_never_connects(
    v1_fleet: FleetUnderTest, listener: Listener
) -> None:
    rollout_id = new_id("rebind")
    body = v1_fleet.body(rollout_id, server_url=f"http://localhost:{listener.port}/gate")
    assert v1_fleet.init(body).status_code == 202  # a name: checked when it resolves
    record = v1_fleet.wait_status(rollout_id, {"success", "failure"}, timeout=30)
    view = httpx.get(f"{v1_fleet.fleet.gateway_url}/v1/rollouts/{rollout_id}", timeout=10).json()
    assert view["status"] == "failure", view
    assert view["attempt"] == 1, view
    assert view["error"].startswith("refused: localhost resolves to address "), view
    assert "in a refused network" in view["error"]
    assert record["delivery"].startswith("failed: refused: localhost resolves to"), record
    # Refused once each: the chat call and the callback, neither retried.
    assert all_logs(v1_fleet).count(f"localhost:{listener.port}") <= 2
    assert listener.accepted == 0


def test_a_v2_rollout_whose_name_resolves_to_a_refused_address_never_connects(
    start_fleet: StartFleet, listener: Listener
) -> None:
    """The Strands example calls through the SDK's OpenAI client, on the same transport."""
    env = {**V2_ENV, **REFUSING_LOOPBACK, "OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES": "1"}
    handle = start_fleet(STRANDS_AGENT, workers=1, gateways=1, handle=V2FleetUnderTest, env=env)
    assert isinstance(handle, V2FleetUnderTest)
    try:
        url = f"http://localhost:{listener.port}/v1"
        result = handle.run(chat_completions_url=url)
        assert result["status"] == "failure", json.dumps(result)
        assert listener.accepted == 0
        assert result["err_message"].startswith("refused: localhost resolves to address "), result
    finally:
        handle.close()
