"""What an admitter controls must stay data wherever the fleet shows it: any id can be looked
up and is printed by the CLI as written (escaped), never as markup or terminal control; a
trainer URL's credentials are refused at admission, never stored or echoed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from rollout_fleet.local import fleet_command
from tests.conftest import StartFleet
from tests.harness import FleetUnderTest, fleet_cli, new_id, script

COMPLETE_AT_ONCE = script({"complete": {}})


@pytest.fixture(scope="module")
def handle(start_fleet: StartFleet) -> Iterator[FleetUnderTest]:
    fleet = start_fleet(workers=1)
    yield fleet
    fleet.close()


def wide_cli(handle: FleetUnderTest, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI on a terminal wide enough to show whole ids."""
    env = {**handle.fleet.process_env(), "COLUMNS": "300"}
    command = fleet_command(*args)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


def admitted(handle: FleetUnderTest, rollout_id: str) -> None:
    response = handle.init(handle.body(rollout_id, metadata=COMPLETE_AT_ONCE))
    assert response.status_code == 202, response.text
    handle.wait_status(rollout_id, {"success"})


def test_an_id_with_a_slash_can_be_looked_up(handle: FleetUnderTest) -> None:
    rollout_id = f"team/run-{new_id()}"
    admitted(handle, rollout_id)
    view = handle.http.get(f"/v1/rollouts/{quote(rollout_id, safe='')}")
    assert view.status_code == 200, view.text
    assert view.json()["rollout_id"] == rollout_id


def test_hostile_ids_are_printed_as_data_by_the_cli(handle: FleetUnderTest) -> None:
    """Rich markup in an id crashed ``ls`` for as long as its record was kept (``[/]``) or
    faked another rollout with a link; ESC and CR/LF reached the operator's terminal raw."""
    suffix = new_id()
    markup, closing = f"[bold]mk[/bold][link=http://evil]L[/link]-{suffix}", f"zz[/]-{suffix}"
    control = f"\x1b[31mRED\x1b[0m-cr\r\nX-{suffix}"
    for rollout_id in (markup, closing, control):
        admitted(handle, rollout_id)
    listing = wide_cli(handle, "ls")
    assert listing.returncode == 0, listing.stderr
    assert "Traceback" not in listing.stderr
    assert "\x1b" not in listing.stdout
    assert "\\x1b[31mRED" in listing.stdout
    assert "[bold]mk[/bold]" in listing.stdout  # shown as written, not rendered
    for rollout_id in (closing, markup):
        shown = wide_cli(handle, "status", rollout_id)
        assert shown.returncode == 0, shown.stderr
        assert rollout_id[:8] in shown.stdout
    missing = fleet_cli(handle, "status", "[/x]")
    assert missing.returncode == 1
    assert "Traceback" not in missing.stderr
    assert "no rollout" in missing.stdout


def test_an_id_with_line_breaks_and_escapes_stays_on_one_log_line(handle: FleetUnderTest) -> None:
    """An id carrying a line feed, a Unicode line separator and ESC cannot forge a log line or
    reach the reader's terminal raw: the text format shows them escaped."""
    suffix = new_id()
    forged = f"2026-11-26 23:05:00,000 CRITICAL rollout_worker.runtime: FORGED-{suffix}"
    rollout_id = f"inj-{suffix}\n{forged}\u2028\x1b[2J"
    admitted(handle, rollout_id)
    logs = "\n".join(process.output() for process in handle.fleet.processes.values())
    assert f"inj-{suffix}\\x0a{forged}\\u2028\\x1b[2J" in logs
    assert not [line for line in logs.splitlines() if line.startswith(forged)]
    assert "\x1b" not in logs
    assert "\u2028" not in logs


@pytest.mark.parametrize(
    ("userinfo", "broken", "says"),
    [
        ("trainer:URLPASSWORD@", "", "server_url must not carry credentials"),
        ("URLPASSWORD@", "", "server_url must not carry credentials"),
        # A URL too broken to parse still carries its credentials into the 422's echo.
        ("trainer:URLPASSWORD@", "[::1", "server_url"),
        ("trainer:URLPASS@WORD@", "[", "server_url"),
        ("trainer:URLPASSWORD@", "ftp:", "server_url must use http or https"),
    ],
)
def test_a_trainer_url_with_credentials_is_refused_without_echoing_them(
    handle: FleetUnderTest, userinfo: str, broken: str, says: str
) -> None:
    rollout_id = new_id("cred")
    url = handle.trainer.url.replace("http://", f"http://{userinfo}") + broken
    if broken == "ftp:":
        url = url.replace("http://", "ftp://")
    response = handle.init(handle.body(rollout_id, server_url=url))
    assert response.status_code == 422, response.text
    assert says in response.text
    assert "URLPASS" not in response.text
    assert not handle.record(rollout_id)
