"""Admission and polling: what gateways call (and only gateways) to take a rollout in, v1 or
v2, and to answer a trainer's poll; with ``admission_replicas``, what a trainer is told waits
until the replicas hold it, so an acknowledged rollout survives a failover.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from rollout_core.store import replies
from rollout_core.store.base import Arg, StoreBase, flatten, ms
from rollout_core.store.errors import NotReplicated
from rollout_core.store.record import RolloutRecord
from rollout_core.store.replies import (
    REPLICATED_FIELDS,
    Finished,
    PollReply,
    Replayed,
    Unfinished,
    V1Admission,
)
from rollout_core.store.schema import (
    AdmitOutcome,
    AdmitStart,
    PollOutcome,
    RecordField,
    RecordKey,
)
from rollout_core.store.scripts import Script


class Admission(StoreBase):
    """The gateway's side of a rollout: admit it, answer its polls, fence admissions."""

    async def confirm_replicated(self, key: RecordKey, read: RolloutRecord) -> RolloutRecord:
        """What a trainer may be told of a record it was ``read`` from (a replayed admission,
        a final result): with ``admission_replicas``, the record's status, response, result
        and lease digest read again in a call that waits until that many replicas hold them
        (else ``NotReplicated``), so what is told survives a failover; ``read`` as it is
        without. A failover since ``read`` shows here: the reply is the new primary's record
        (empty if it has none), never ``read`` confirmed by the new primary's replicas."""
        if not self._replicas:
            return read
        return replies.confirm(await self._replicated(Script.CONFIRM, [key], REPLICATED_FIELDS))

    async def admit_begin(self, key: RecordKey, token: str, pending_seconds: float) -> V1Admission:
        """Take the admission key, or learn what is known of it. A replay (the record is there: the
        trainer retried) is what the replicas hold, as the admission itself was: the first
        answer may have been a 503 whose record never reached them. If they hold no admitted
        record (a failover lost it since the read), the caller is told to wait and begin
        again: on the new primary, the admission key is then taken afresh."""
        args: list[Arg] = [token, ms(pending_seconds)]
        begun = replies.admit_begin(await self._run(Script.ADMIT_BEGIN, [key], args))
        if not isinstance(begun, Replayed):
            return V1Admission(begun)
        replicated = await self.confirm_replicated(
            key, RolloutRecord(status=begun.status, response=begun.response)
        )
        if replicated.admitted and replicated.response is not None:
            return V1Admission(AdmitStart.REPLAY, replicated.response)
        return V1Admission(AdmitStart.WAIT)

    async def admit_commit(
        self,
        key: RecordKey,
        token: str,
        ttl_seconds: float,
        message: str,
        fields: Mapping[RecordField, str],
    ) -> bool:
        """Write the record and enqueue its message in one step; False if the admission key lapsed.

        With ``admission_replicas`` the message waits until the replicas hold the record: a
        commit they do not confirm in time is taken back before ``NotReplicated`` reaches the
        caller (its trainer hears 503), so a rollout its trainer was refused never runs nor
        calls back, and a retry admits it afresh. A confirmed record whose message then fails
        to go (the gateway dies) is a queued record without a message: the workers' sweeper
        resends it, as for any lost message."""
        keys: list[str] = [key, self.queue]
        rollout_id = fields.get(RecordField.ROLLOUT_ID)
        if rollout_id is not None and self.keys.record("v1", rollout_id) != key:
            keys.append(self.keys.v1_alias(rollout_id))  # found by its rollout id too
        if not self._replicas:
            args: list[Arg] = [token, ms(ttl_seconds), message, *flatten(fields)]
            return replies.flag(await self._run(Script.ADMIT_COMMIT, keys, args))
        args = [token, ms(ttl_seconds), "", *flatten(fields)]
        try:
            committed = replies.flag(await self._replicated(Script.ADMIT_COMMIT, keys, args))
        except NotReplicated:
            await self._run(Script.ADMIT_WITHDRAW, [key], [token])
            raise
        if committed:
            await self._redis.lpush(self.queue, message)
        return committed

    async def admit_abort(self, key: RecordKey, token: str) -> None:
        await self._run(Script.ADMIT_ABORT, [key], [token])

    async def admit_v2(
        self,
        key: RecordKey,
        *,
        max_queued: int,
        polling_lease_seconds: float,
        ttl_seconds: float,
        message: str,
        lease_digest: str,
        fields: Mapping[RecordField, str],
    ) -> AdmitOutcome:
        args: list[Arg] = [
            max_queued,
            ms(polling_lease_seconds),
            ms(ttl_seconds),
            self.keys.record_id(key),
            message,
            lease_digest,
            *flatten(fields),
        ]
        if self._replicas:  # a retry may take it over until the replicas confirm it
            args += [RecordField.UNCONFIRMED, "1"]
        keys = [key, self.queue]
        outcome = replies.admit_v2(await self._replicated(Script.ADMIT_V2, keys, args))
        if self._replicas and outcome is AdmitOutcome.QUEUED:
            replies.flag(await self._run(Script.ADMIT_V2_CONFIRMED, [key], [lease_digest]))
        return outcome

    async def poll(
        self,
        key: RecordKey,
        lease_digest: str,
        *,
        polling_lease_seconds: float,
        retention_seconds: float,
        lease_expired_result: str,
    ) -> PollReply:
        """Authenticate, then the final result, or renew the polling lease and the status.
        An overdue lease finishes the rollout with ``lease_expired_result``."""
        args: list[Arg] = [
            lease_digest,
            ms(polling_lease_seconds),
            ms(retention_seconds),
            lease_expired_result,
        ]
        match replies.poll(await self._run(Script.POLL, [key], args)):
            case Finished(result=result, status=status):
                # The final result as the replicas hold it; after a failover, the new
                # primary's record (unfinished there: its status is the answer; gone: unknown).
                replicated = await self.confirm_replicated(
                    key, RolloutRecord(status=status, result=result)
                )
                if replicated.finished and replicated.result is not None:
                    return PollReply(PollOutcome.FINAL, result=replicated.result)
                if replicated.status is not None:
                    return PollReply(PollOutcome.STATUS, status=replicated.status)
                return PollReply(PollOutcome.UNKNOWN)
            case Unfinished(status=status):
                return PollReply(PollOutcome.STATUS, status=status)
            case refused:
                return PollReply(refused)

    async def fence_admissions(self, ttl_seconds: float) -> None:
        """Refuse admissions fleet-wide for ``ttl_seconds`` (a forgotten fence expires)."""
        await self._redis.set(self.keys.draining, "1", px=ms(ttl_seconds))

    async def lift_fence(self) -> None:
        await self._redis.delete(self.keys.draining)

    async def admissions_fenced(self) -> bool:
        return bool(await self._redis.exists(self.keys.draining))

    async def active_record_ids(self) -> list[str]:
        """The record ids of every rollout admitted and not finished."""
        keys = cast(list[str], await self._redis.zrange(self.keys.active, 0, -1))
        return [self.keys.record_id(key) for key in keys]


__all__ = ["Admission"]
