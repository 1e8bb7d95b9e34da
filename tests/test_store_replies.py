"""Each script's reply read into its type, as the client hands it over (lists, strings,
integers, None for Lua's nil and false)."""

from __future__ import annotations

import pytest

from rollout_core.store import AdmitStart, PollOutcome, RecordField, Status, Verdict, replies
from rollout_core.store.errors import StoreReplyError


def test_a_poll_reply_is_one_of_its_kinds() -> None:
    assert replies.poll(["final", "RESULT", "success"]) == replies.Finished(
        "RESULT", Status.SUCCESS
    )
    assert replies.poll(["final", None, "failure"]) == replies.Finished(None, Status.FAILURE)
    assert replies.poll(["status", "running"]) == replies.Unfinished(Status.RUNNING)
    assert replies.poll(["unknown"]) is PollOutcome.UNKNOWN
    assert replies.poll(["forbidden"]) is PollOutcome.FORBIDDEN


def test_an_admission_begins_or_replays() -> None:
    assert replies.admit_begin(["lead"]) is AdmitStart.LEAD
    assert replies.admit_begin(["wait"]) is AdmitStart.WAIT
    replayed = replies.admit_begin(["replay", "BODY", "queued"])
    assert replayed == replies.Replayed("BODY", Status.QUEUED)
    assert replies.admit_begin(["replay", None, "queued"]) == replies.Replayed(None, Status.QUEUED)


def test_a_claim_carries_the_record_it_acquired() -> None:
    assert replies.claim(["busy"]).verdict is Verdict.BUSY
    assert not replies.claim(["busy"]).acquired
    claim = replies.claim(
        ["running", 2, 1500, RecordField.STATUS.value, "running", RecordField.REQUEST.value, "{}"]
    )
    assert (claim.verdict, claim.attempt, claim.since_accepted) == (Verdict.RUNNING, 2, 1.5)
    assert (claim.record.status, claim.record.request) == (Status.RUNNING, "{}")
    assert claim.acquired


def test_lists_counts_and_clocks() -> None:
    assert replies.renew([["ex-1"], []]) == replies.Renewal(["ex-1"], [])
    assert replies.record_keys(["p:v1:a", "p:v1:b"]) == ["p:v1:a", "p:v1:b"]
    assert replies.tick([None, None]) == replies.ClockTicks(0, 0.0)
    assert replies.tick(["3", "2500"]) == replies.ClockTicks(3, 2.5)
    assert replies.flag(1)
    assert not replies.flag(0)


def test_a_confirmed_record_is_what_the_replicas_hold() -> None:
    record = replies.confirm(["success", None, "R", "digest"])
    assert (record.status, record.response, record.result) == (Status.SUCCESS, None, "R")
    assert replies.confirm([]).status is None  # the record is gone


def test_a_reply_of_the_wrong_shape_is_a_reply_error() -> None:
    with pytest.raises(StoreReplyError, match="where a list was due"):
        replies.claim("running")
    with pytest.raises(StoreReplyError, match="where a value was due"):
        replies.advance(None)
