"""The v2 (poll/lease) HTTP surface, written once for every server (PROTOCOL.md §2).

The in-process :func:`~rollout_sdk.server.rollout_server.create_rollout_server` and the fleet
gateway both mount these routes over their own :class:`RolloutService`, so status codes,
check order and bodies cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Protocol

from fastapi import APIRouter, Header, HTTPException, Request, Response

from rollout_sdk.server.http import ErrorDetail, ValidationErrors
from rollout_sdk.server.lease import (
    InvalidLeaseError,
    lease_digest,
    lease_matches,
    new_lease_token,
)
from rollout_sdk.server.result_registry import DuplicateRolloutError, UnknownRolloutError
from rollout_sdk.types.protocol import (
    POLLING_LEASE_HEADER,
    CancelDisposition,
    CancelRolloutsRequest,
    CancelRolloutsResponse,
    DrainRequest,
    DrainResponse,
    RolloutInitRequest,
    RolloutInitResponse,
    RolloutLifecycle,
    RolloutResultResponse,
    RolloutServerHealth,
)

SHUTTING_DOWN = "rollout server is shutting down"
QUEUE_FULL = "rollout queue is full; retry later"
DUPLICATE = "rollout_id is already registered"
UNKNOWN = "unknown rollout_id"
BAD_LEASE = "invalid polling lease"
ONE_SELECTOR = "pass exactly one selector: ids, prefix, or all"
RETRY_AFTER_SECONDS = 5


class ServerDraining(Exception):
    """Admissions are fenced (503)."""


class QueueFull(Exception):
    """No capacity to queue another rollout (429)."""


# 409, 404 and 403 are upstream's exception classes; rollout_gateway raises them by these names.
DuplicateRollout = DuplicateRolloutError
UnknownRollout = UnknownRolloutError
InvalidLease = InvalidLeaseError


@dataclass(frozen=True)
class StoredResult:
    """A finished rollout's result body as a server stored it: already the wire JSON
    (``RolloutResultResponse.wire_json``), answered as is, never parsed again."""

    wire_json: str


class RolloutService(Protocol):
    """What a v2 server does; the HTTP layer maps its exceptions to status codes."""

    async def admit(self, request: RolloutInitRequest) -> RolloutInitResponse: ...

    async def poll(self, rollout_id: str, lease_token: str) -> RolloutResultResponse | StoredResult:
        """Authenticate, renew the lease, wait for a status change (or the wait timeout)."""
        ...

    async def cancel(self, request: CancelRolloutsRequest) -> dict[str, CancelDisposition]: ...

    async def health(self) -> RolloutServerHealth: ...

    async def drain(self, timeout_sec: float) -> DrainResponse: ...

    async def resume(self) -> RolloutLifecycle:
        """Lift a drain fence (extension: ``DELETE /drain``)."""
        ...


ServiceGetter = Callable[[Request], RolloutService]


def _json(body: str, status_code: int = 200) -> Response:
    """A body already serialized from its response model: FastAPI would validate and
    serialize it again, the largest part of a poll's cost for a long trajectory."""
    return Response(body, status_code=status_code, media_type="application/json")


def v2_router(service: ServiceGetter) -> APIRouter:
    router = APIRouter(tags=["v2"])

    @router.post(
        "/rollout",
        status_code=202,
        response_model=RolloutInitResponse,
        responses={409: {}, 429: {}, 503: {}},
    )
    async def admit(request: RolloutInitRequest, http: Request) -> Response:
        try:
            admitted = await service(http).admit(request)
        except ServerDraining as exc:
            raise HTTPException(503, SHUTTING_DOWN) from exc
        except QueueFull as exc:
            raise HTTPException(
                429, QUEUE_FULL, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
            ) from exc
        except DuplicateRollout as exc:
            raise HTTPException(409, DUPLICATE) from exc
        return _json(admitted.model_dump_json(), status_code=202)

    @router.get(
        "/rollout/{rollout_id}/result",
        response_model=RolloutResultResponse,
        responses={403: {}, 404: {}},
    )
    async def result(
        rollout_id: str,
        http: Request,
        lease_token: Annotated[str, Header(alias=POLLING_LEASE_HEADER, min_length=1)],
    ) -> Response:
        try:
            polled = await service(http).poll(rollout_id, lease_token)
        except UnknownRollout as exc:
            raise HTTPException(404, UNKNOWN) from exc
        except InvalidLease as exc:
            raise HTTPException(403, BAD_LEASE) from exc
        return _json(polled.wire_json if isinstance(polled, StoredResult) else polled.wire_json())

    @router.post(
        "/rollout/cancel",
        response_model=CancelRolloutsResponse,
        responses={
            422: {"model": ValidationErrors | ErrorDetail, "description": "Not one selector"}
        },
    )
    async def cancel(request: CancelRolloutsRequest, http: Request) -> CancelRolloutsResponse:
        if request.selector_count != 1:
            raise HTTPException(422, ONE_SELECTOR)
        return CancelRolloutsResponse(dispositions=await service(http).cancel(request))

    @router.get("/health", response_model=RolloutServerHealth)
    async def health(http: Request) -> RolloutServerHealth:
        return await service(http).health()

    @router.post("/drain", response_model=DrainResponse)
    async def drain(http: Request, request: DrainRequest | None = None) -> DrainResponse:
        return await service(http).drain((request or DrainRequest()).timeout_sec)

    @router.delete("/drain", response_model=RolloutLifecycle)
    async def resume(http: Request) -> RolloutLifecycle:
        return await service(http).resume()

    return router


__all__ = [
    "QUEUE_FULL",
    "DuplicateRollout",
    "InvalidLease",
    "QueueFull",
    "RolloutService",
    "ServerDraining",
    "StoredResult",
    "UnknownRollout",
    "lease_digest",
    "lease_matches",
    "new_lease_token",
    "v2_router",
]
