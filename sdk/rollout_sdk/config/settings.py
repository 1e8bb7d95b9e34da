"""SDK settings (SDK.md §1.11; upstream's ``osmosis_ai.rollout.config.settings``).

Values come from, in priority order: explicit arguments / :func:`configure`, environment
variables, a ``.env`` file in the working directory, defaults. Out-of-range values raise a
pydantic ``ValidationError`` when the settings are loaded, so a bad deployment fails at
startup rather than mid-rollout.
"""

from __future__ import annotations

import ipaddress
import threading
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_MAX_METADATA_SIZE_BYTES = 1_048_576


def _env(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=prefix, env_file=".env", extra="ignore")


class RolloutClientSettings(BaseSettings):
    """How the SDK talks to the TrainGate (``OSMOSIS_ROLLOUT_CLIENT_*``)."""

    model_config = _env("OSMOSIS_ROLLOUT_CLIENT_")

    timeout_seconds: float = Field(300.0, ge=1, le=3600)
    max_retries: int = Field(3, ge=0, le=10)
    complete_rollout_retries: int = Field(2, ge=0, le=10)
    retry_base_delay: float = Field(1.0, ge=0.1, le=60)
    retry_max_delay: float = Field(30.0, ge=1, le=300)
    max_connections: int = Field(100, ge=1, le=1000)
    max_keepalive_connections: int = Field(20, ge=1, le=100)
    # Beyond upstream: what one answer may hold (raw or decoded), what the answers being read
    # at once may hold together in this process, and what one rollout's answers may add up
    # to (docs/OPERATIONS.md sizes them).
    max_answer_mb: int = Field(8, ge=1, le=256)
    answers_in_flight_mb: int = Field(128, ge=1, le=4096)
    max_rollout_answers_mb: int = Field(32, ge=1, le=4096)
    # Beyond upstream: networks no trainer-chosen URL may reach (comma-separated CIDRs),
    # besides link-local and cloud-metadata addresses, which are always refused.
    refused_networks: Annotated[list[ipaddress.IPv4Network | ipaddress.IPv6Network], NoDecode] = (
        Field(default_factory=list)
    )

    @field_validator("refused_networks", mode="before")
    @classmethod
    def _split_networks(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list):
            return [ipaddress.ip_network(str(item), strict=False) for item in value]
        return value


class RolloutServerSettings(BaseSettings):
    """How a v1 rollout server behaves (``OSMOSIS_ROLLOUT_SERVER_*``)."""

    model_config = _env("OSMOSIS_ROLLOUT_SERVER_")

    max_concurrent_rollouts: int = Field(100, ge=1, le=10000)
    record_ttl_seconds: float = Field(3600.0, ge=60, le=86400)
    cleanup_interval_seconds: float = Field(60.0, ge=10, le=3600)
    request_timeout_seconds: float = Field(600.0, ge=10, le=3600)
    registration_readiness_timeout_seconds: float = Field(10.0, ge=1, le=60)
    registration_readiness_poll_interval_seconds: float = Field(0.2, ge=0.05, le=5)
    registration_shutdown_timeout_seconds: float = Field(30.0, ge=1, le=300)


class RolloutSettings(BaseSettings):
    """All SDK settings (``OSMOSIS_ROLLOUT_*``)."""

    model_config = _env("OSMOSIS_ROLLOUT_")

    client: RolloutClientSettings = Field(default_factory=RolloutClientSettings)
    server: RolloutServerSettings = Field(default_factory=RolloutServerSettings)
    max_metadata_size_bytes: int = Field(DEFAULT_MAX_METADATA_SIZE_BYTES, ge=1024, le=104_857_600)


_lock = threading.Lock()
_settings: RolloutSettings | None = None


def get_settings() -> RolloutSettings:
    """Return the process-wide settings, loading them on first use."""
    global _settings  # noqa: PLW0603 - a lazily built process-wide singleton
    with _lock:
        if _settings is None:
            _settings = RolloutSettings()
        return _settings


def configure(settings: RolloutSettings) -> None:
    """Replace the process-wide settings."""
    global _settings  # noqa: PLW0603
    with _lock:
        _settings = settings


def reset_settings() -> None:
    """Forget the process-wide settings; the next :func:`get_settings` reloads them."""
    global _settings  # noqa: PLW0603
    with _lock:
        _settings = None


__all__ = [
    "DEFAULT_MAX_METADATA_SIZE_BYTES",
    "RolloutClientSettings",
    "RolloutServerSettings",
    "RolloutSettings",
    "configure",
    "get_settings",
    "reset_settings",
]
