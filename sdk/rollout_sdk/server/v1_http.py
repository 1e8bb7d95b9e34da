"""The v1 (push/callback) HTTP surface, written once for every server (PROTOCOL.md §1).

The in-process :func:`~rollout_sdk.server.app.create_app` and the fleet gateway both mount these
routes over their own :class:`V1Service`, so status codes, the check order (the body before
the server key, P§1.2) and bodies cannot drift apart.
"""

# No ``from __future__ import annotations``: FastAPI must see the route's annotations as
# objects, and one of them names a dependency made inside ``v1_router``.

from collections.abc import Callable
from typing import Annotated, Protocol

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response

from rollout_sdk.core.schemas import HealthResponse, InitResponse, RolloutRequest
from rollout_sdk.runner import ToolsError
from rollout_sdk.server.auth import INVALID_KEY_DETAIL, AuthorizationHeader, V1ServerKey

ADMISSION_IN_PROGRESS = "an admission with this key is still in progress; retry"


class AdmissionInProgress(Exception):
    """Another admission of the same idempotency key is still being prepared (503)."""


class V1Service(Protocol):
    """What a v1 server does; the HTTP layer maps its exceptions to status codes."""

    async def admit(self, request: RolloutRequest) -> str:
        """The 202 body (JSON): a new rollout's, or for a known idempotency key the first
        admission's, replayed. ``ToolsError`` (500) when ``get_tools`` fails."""
        ...

    async def health(self) -> HealthResponse: ...


V1ServiceGetter = Callable[[Request], V1Service]


def v1_router(service: V1ServiceGetter, server_key: V1ServerKey) -> APIRouter:
    router = APIRouter(tags=["v1"])

    async def admission(
        request: RolloutRequest, authorization: AuthorizationHeader = None
    ) -> RolloutRequest:
        """The body, validated first; then the server key (the reference's order, P§1.2)."""
        server_key.verify(authorization)
        return request

    @router.post(
        "/v1/rollout/init",
        status_code=202,
        response_model=InitResponse,
        responses={
            401: {"description": INVALID_KEY_DETAIL},
            500: {"description": "get_tools failed"},
            503: {"description": ADMISSION_IN_PROGRESS},
        },
    )
    async def init_rollout(
        request: Annotated[RolloutRequest, Depends(admission)], http: Request
    ) -> Response:
        try:
            body = await service(http).admit(request)
        except ToolsError as exc:
            raise HTTPException(500, str(exc)) from exc
        except AdmissionInProgress as exc:
            raise HTTPException(503, ADMISSION_IN_PROGRESS) from exc
        return Response(body, status_code=202, media_type="application/json")

    @router.get("/health", response_model=HealthResponse)
    async def health(http: Request) -> HealthResponse:
        return await service(http).health()

    @router.get(
        "/platform/health",
        response_model=HealthResponse,
        dependencies=[Depends(server_key.platform)],
        responses={401: {"description": INVALID_KEY_DETAIL}, 404: {"description": "No key"}},
    )
    async def platform_health(http: Request) -> HealthResponse:
        return await service(http).health()

    return router


__all__ = ["ADMISSION_IN_PROGRESS", "AdmissionInProgress", "V1Service", "v1_router"]
