"""Rollouts for humans: ``GET /v1/rollouts/{id}`` (one rollout's record: status, attempts,
worker, timings, error) and ``GET /v1/rollouts`` (filtered by status and age). Behind the
server key when one is set; ``rollout-fleet status`` / ``ls`` read the same views."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from starlette.convertors import Convertor, register_url_convertor

from rollout_core import views
from rollout_core.views import RolloutView
from rollout_gateway.state import GatewayDep
from rollout_sdk.server.http import ErrorDetail

MAX_LISTED = 1000

router = APIRouter(tags=["operations"])


class _AnyId(Convertor[str]):
    """A v1 id is anything: ``/`` and line breaks included (Starlette's ``path`` stops at a
    newline)."""

    regex = r"[\s\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("rollout_id", _AnyId())


@router.get(
    "/v1/rollouts/{rollout_id:rollout_id}",
    response_model=RolloutView,
    responses={404: {"model": ErrorDetail}},
)
async def rollout(rollout_id: str, gateway: GatewayDep) -> RolloutView:
    """One rollout by id (v1: by its rollout id or its idempotency key), while the fleet keeps
    its record."""
    view = await views.find(gateway.store, rollout_id)
    if view is None:
        raise HTTPException(404, f"no rollout {rollout_id!r}: never admitted, or expired")
    return view


@router.get("/v1/rollouts", response_model=list[RolloutView])
async def rollouts(
    gateway: GatewayDep,
    status: Annotated[list[str] | None, Query(description="Keep these statuses")] = None,
    older_than: Annotated[float | None, Query(ge=0, description="Admitted ≥ s ago")] = None,
    newer_than: Annotated[float | None, Query(ge=0, description="Admitted ≤ s ago")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LISTED)] = 100,
) -> list[RolloutView]:
    """The rollouts the fleet holds, newest first."""
    return await views.listing(
        gateway.store,
        statuses=set(status) if status else None,
        older_than=older_than,
        newer_than=newer_than,
        limit=limit,
    )


__all__ = ["router"]
