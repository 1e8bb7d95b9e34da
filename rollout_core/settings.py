"""Fleet configuration, shared by every fleet process (gateway, workers, Flower, CLI).

Fleet knobs use the ``ROLLOUT_FLEET_`` prefix; the two every deployment sets also answer
to short names (``REDIS_URL``, ``AGENT``). Protocol knobs keep the SDK's ``OSMOSIS_ROLLOUT_*``
variables (max concurrent rollouts, record TTL, client retries) so existing deployments
configure the fleet the way they configured a single rollout server.
"""

from __future__ import annotations

import math
import os
import tempfile
from functools import cached_property
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    AliasChoices,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from rollout_sdk.config import get_settings

# A Redis command that has not answered within this long is given up (and retried on a new
# connection) by the record store; a WAIT for replicas must end well before it.
REDIS_COMMAND_TIMEOUT_SECONDS = 3.0

# Every duration setting: a finite number of seconds between these (Redis keeps times in whole
# milliseconds, so less than 1 ms would become 0, and a year is past any sensible wait or TTL).
MIN_DURATION_SECONDS = 0.001
MAX_DURATION_SECONDS = 365 * 86_400.0
MIN_LEASE_SECONDS = 1.0
# A record TTL under this is warned about (OSMOSIS_ROLLOUT_SERVER_RECORD_TTL_SECONDS's own
# lower bound): a trainer retrying an admission after it runs the rollout again.
SHORT_RECORD_TTL = 60.0


def _duration(seconds: float, *, zero_allowed: bool) -> float:
    if zero_allowed and seconds == 0:
        return seconds
    if not (math.isfinite(seconds) and MIN_DURATION_SECONDS <= seconds <= MAX_DURATION_SECONDS):
        allowed = "0, or " if zero_allowed else ""
        raise PydanticCustomError(
            "duration",
            f"must be {allowed}a finite number of seconds from {MIN_DURATION_SECONDS:g} (1 ms) "
            f"to {MAX_DURATION_SECONDS:.0f} (365 days)",
        )
    return seconds


# A duration in seconds: finite, at least 1 ms, at most a year. Every duration setting is one.
Duration = Annotated[float, AfterValidator(lambda s: _duration(s, zero_allowed=False))]
# The same, or 0 (which the setting documents as "none" or "no limit").
DurationOrZero = Annotated[float, AfterValidator(lambda s: _duration(s, zero_allowed=True))]


class FleetSettings(BaseSettings):
    # env_ignore_empty: `ROLLOUT_FLEET_API_KEY=` in a compose .env means "unset", not "".
    model_config = SettingsConfigDict(
        env_prefix="ROLLOUT_FLEET_", env_file=".env", extra="ignore", env_ignore_empty=True
    )

    redis_url: SecretStr = Field(
        SecretStr("redis://127.0.0.1:6379/0"),
        validation_alias=AliasChoices("ROLLOUT_FLEET_REDIS_URL", "REDIS_URL"),
        description="Redis holding the queue and every rollout record (redis:// or rediss://).",
    )
    agent: str | None = Field(
        None,
        validation_alias=AliasChoices("ROLLOUT_FLEET_AGENT", "AGENT"),
        description="The agent, as module:attr or path/to/file.py:attr.",
    )
    api_key: SecretStr | None = Field(
        None,
        description="Server key trainers must send. Unset: no key, and a gateway then binds "
        "only a loopback address (see insecure_open_gateway).",
    )
    insecure_open_gateway: bool = Field(
        False,
        description="Let a gateway without api_key listen on a non-loopback address: anyone "
        "who reaches the port may admit, cancel and drain rollouts. Only on a network where "
        "every client is trusted.",
    )
    allow_redis_data_loss: bool = Field(
        False,
        description="Run on a Redis that can lose admitted rollouts (an eviction policy other "
        "than noeviction, or no persistence); without it every gateway and worker refuses.",
    )
    drain_fence_seconds: Duration = Field(
        3600,
        description="How long a v2 POST /drain fences admissions fleet-wide unless lifted "
        "(DELETE /drain) or renewed by another drain.",
    )
    redis_max_connections: int = Field(
        200, ge=1, description="Redis connections per process; more requests wait for one."
    )
    sentinel_master: str = Field(
        "mymaster",
        min_length=1,
        description="With a sentinel:// REDIS_URL (one URL per sentinel, ';'-separated): the "
        "name the sentinels monitor the primary under.",
    )
    admission_replicas: int = Field(
        0,
        ge=0,
        description="An admission is acknowledged (202), and a v2 result handed out, only once "
        "this many replicas hold it (Redis WAIT), so it survives a failover; 0: the primary's "
        "word is enough.",
    )
    admission_replica_timeout_seconds: Duration = Field(
        1.0,
        le=REDIS_COMMAND_TIMEOUT_SECONDS - 1,
        description="How long an admission (or a result) waits for admission_replicas; past it "
        f"the trainer gets 503 and retries. At most {REDIS_COMMAND_TIMEOUT_SECONDS - 1:g} s: a "
        f"Redis command is given up after {REDIS_COMMAND_TIMEOUT_SECONDS:g} s.",
    )
    key_prefix: str = Field(
        "rf", pattern=r"^[A-Za-z0-9_.-]+$", description="Prefix of every Redis key we own."
    )
    queue: str = Field("rollouts", min_length=1, description="Celery queue (a Redis list).")
    worker_concurrency: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="Rollouts one worker process runs at once "
        "(default: OSMOSIS_ROLLOUT_SERVER_MAX_CONCURRENT_ROLLOUTS, 100).",
    )
    record_ttl_seconds: Duration | None = Field(
        None,
        description="How long a finished rollout's record (and idempotency key) is kept "
        "(default: OSMOSIS_ROLLOUT_SERVER_RECORD_TTL_SECONDS, 3600).",
    )
    result_wait_timeout_seconds: Duration = Field(
        30, description="v2: longest a result long-poll waits for a status change."
    )
    polling_lease_timeout_seconds: Duration = Field(
        120, description="v2: a rollout nobody polls for this long fails as lease_expired."
    )
    result_retention_seconds: Duration = Field(
        900,
        description="v2: how long a finished result stays readable (then 404, id reusable).",
    )
    max_queued: int = Field(
        10_000, ge=1, description="v2: queued rollouts beyond which admission answers 429."
    )
    inflight_ttl_seconds: Duration = Field(
        86_400,
        description="Safety TTL of a queued or running record (renewed while it waits).",
    )
    lease_seconds: Duration = Field(
        15, description="A worker holds a rollout this long without renewing it."
    )
    sweep_interval_seconds: Duration = Field(
        5, description="How often workers look for rollouts whose worker died."
    )
    shutdown_grace_seconds: DurationOrZero = Field(
        60,
        description="A stopping worker lets running rollouts finish this long, then hands "
        "the rest back to the queue for other workers.",
    )
    max_rollout_seconds: DurationOrZero = Field(
        3600,
        description="Longest a rollout may run on a worker before it is failed as timed out "
        "(0: no limit). Guards against agents that never return.",
    )
    loop_stall_seconds: Duration | None = Field(
        None,
        description="A worker whose event loop is blocked this long (an agent making a "
        "blocking call) fails that rollout, hands its others back and restarts. Must be "
        "below lease_seconds; default two thirds of it.",
    )
    max_attempts: int = Field(
        5,
        ge=1,
        description="Crashes of a rollout's worker while it ran alone there before it is failed "
        "as a crash loop (crashes beside other rollouts are forgiven, and a rollout forgiven "
        "twice runs alone).",
    )
    visibility_timeout_seconds: int = Field(
        300,
        ge=10,
        description="When kombu hands out again a message recorded as taken; the fleet's workers "
        "keep taken messages in memory instead, and leases and the lost-message check recover "
        "crashed rollouts.",
    )
    allowed_trainer_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated URL prefixes a request's trainer URLs (v1 server_url and "
        "tool_server_url, v2 chat_completions_url) must lie under; others get 422. Empty: any "
        "URL. Closes SSRF through admission.",
    )
    max_request_bytes: int = Field(
        16 * 2**20, ge=1024, description="Request bodies larger than this get 413."
    )
    redis_reserve_fraction: float = Field(
        0.05,
        ge=0,
        le=0.5,
        description="Share of Redis's maxmemory that admissions leave free besides the room "
        "unfinished rollouts need to end (buffers, replication, the fleet's own upkeep).",
    )
    redis_finish_room_factor: float = Field(
        2.0,
        ge=1,
        le=100,
        description="Room kept in Redis for each unfinished rollout to end, as a multiple of "
        "the mean bytes a finishing rollout has added (results differ in size).",
    )
    get_tools_timeout_seconds: Duration = Field(
        10, description="Limit on the agent's get_tools() during admission."
    )
    get_tools_threads: int = Field(16, ge=1, description="Threads running get_tools() per gateway.")
    secret_key: SecretStr | None = Field(
        None,
        description="Fernet key sealing trainer API keys in Redis; to rotate, list the new key "
        "first and the old ones after it, comma-separated (the first seals, all open). Unset: a "
        "key is generated and kept in Redis (obfuscation only).",
    )
    debug_dir: str | None = Field(None, description="Write v1 debug traces (ctx.log_event) here.")
    task_events: bool = Field(
        True,
        description="Workers send Celery task events (what Flower shows), batched: all a "
        "worker's events of a quarter second go in one Redis publish.",
    )
    trajectory_dir: str | None = Field(
        None,
        description="Workers append each finished rollout's trajectory (the export line of "
        "`rollout-fleet export`) to <dir>/<worker>.jsonl as it finishes; unset: none.",
    )
    result_max_mb: int = Field(
        16,
        ge=1,
        le=256,
        description="What one rollout's stored result (messages, trajectory, token ids) may "
        "take in Redis; a larger one ends the rollout as a failure naming this setting.",
    )
    token_ids: bool = Field(
        True,
        description="v2: workers ask the TrainGate for each chat call's token ids and logprobs "
        "(vLLM's return_token_ids and logprobs, unless the call sets them) and keep what it "
        "returns in the rollout's record, for `rollout-fleet export`; false: neither.",
    )
    sandbox_slots: int | None = Field(
        None,
        ge=1,
        description="Sandboxed rollouts (HarborBackend): sandboxes one worker process runs at "
        "once, apart from its rollout slots (waiting rollouts hold a slot, not a sandbox); "
        "default the agent's TrialQueue(n_concurrent=...).",
    )
    sandbox_build_network: str = Field(
        "none",
        min_length=1,
        description="Sandboxed rollouts: the network task image builds use. none (default): a "
        "task's Dockerfile RUN reaches nothing. proxied: an internal network whose one way out "
        "is a proxy to the internet (and sandbox_build_hosts), never this host, the fleet or "
        "a metadata address. Another name (host, a network of the engine's) reaches whatever "
        "that network reaches: only for trusted tasks (docs/SANDBOXES.md).",
    )
    sandbox_memory_mb: int = Field(
        2048,
        ge=16,
        description="Sandboxed rollouts: the memory each sandbox container may use, swap "
        "included (a task may ask for less, never more).",
    )
    sandbox_pids: int = Field(
        512, ge=8, description="Sandboxed rollouts: the processes each sandbox container may run."
    )
    sandbox_cpus: float = Field(
        1.0,
        gt=0,
        le=1024,
        description="Sandboxed rollouts: the CPUs each sandbox container may use.",
    )
    sandbox_disk_mb: int = Field(
        4096,
        ge=1,
        description="Sandboxed rollouts: what one trial's containers may write to their own "
        "disks (the task's storage_mb if lower); past it the trial is stopped and fails.",
    )
    sandbox_output_mb: int = Field(
        64,
        ge=1,
        description="Sandboxed rollouts: what the fleet copies out of one sandbox (logs, "
        "reward, trajectory, artifacts); past it the rollout fails naming the file.",
    )
    sandbox_trials_mb: int = Field(
        2048,
        ge=0,
        description="Sandboxed rollouts: what the folders of ended trials (failed trials' logs) "
        "may take on one worker's disk; the oldest go first.",
    )
    sandbox_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Sandboxed rollouts: comma-separated Compose service keys an operator "
        "allows for trusted tasks beyond the sandbox policy (e.g. cap_add); default none.",
    )
    sandbox_task_roots: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Sandboxed rollouts: comma-separated folders (absolute) beside the agent's "
        "tasks_dir from which a rollout's metadata['harbor_task'] may name a task.",
    )
    sandbox_task_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Sandboxed rollouts: comma-separated https hosts a rollout's "
        "metadata['git_url'] may fetch a task from; default none.",
    )
    sandbox_registries: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Sandboxed rollouts: comma-separated registry hosts a task's images may "
        "name (an image naming none comes from the engine's default registry); default none.",
    )
    sandbox_build_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Sandboxed rollouts: with sandbox_build_network=proxied, comma-separated "
        "hosts a build may reach beside the internet (a package mirror on a private address); "
        "never a link-local or metadata address.",
    )
    sandbox_egress: Literal["traingate", "open"] = Field(
        "traingate",
        description="Sandboxed rollouts: where a sandbox may connect. traingate: only the "
        "rollout's TrainGate, through a relay (its network has no other way out); open: as "
        "the engine routes, for tasks whose tests fetch from the internet.",
    )
    sandbox_dir: str | None = Field(
        None,
        description="Sandboxed rollouts: the folder workers keep the trials' folders, the "
        "prepared task copies and the Compose overlays in (an absolute path); default "
        "$TMPDIR/rollout-harbor-<uid>. The engine resolves what a sandbox bind-mounts from it "
        "on its own host, so a worker in a container keeps it at the same path there.",
    )
    tracing: bool = Field(
        False,
        description="OpenTelemetry: one trace per rollout (gateway, worker, TrainGate calls), "
        "exported over OTLP/HTTP as the OTEL_* variables say. Needs rollout-fleet[tracing].",
    )
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Worker processes serve Prometheus metrics (GET /metrics) on this port; "
        "unset: none. Gateways always serve GET /metrics on their own port.",
    )
    metrics_host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="The address worker metrics listen on (0.0.0.0: every interface, as a "
        "container on a scrape network needs).",
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="Log lines as text, or one JSON object each (with rollout_id)."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="Log level of gateways (info: one access line per request) and workers "
        "(info: a line per rollout task); warning saves their CPU at high rates.",
    )
    worker_alive_file: str = Field(
        default_factory=lambda: os.path.join(tempfile.gettempdir(), "rollout-worker.alive"),
        description="Touched while the worker consumes and its loop and Redis answer "
        "(``rollout-fleet probe worker`` checks its age). Default: $TMPDIR/rollout-worker.alive.",
    )

    @field_validator("sandbox_dir")
    @classmethod
    def _absolute_folder(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isabs(value):
            raise PydanticCustomError("absolute", "must be an absolute path")
        return value

    @field_validator("secret_key")
    @classmethod
    def _fernet_keys(cls, value: SecretStr | None) -> SecretStr | None:
        """Each comma-separated key a Fernet key; the message never shows one."""
        if value is None:
            return value
        import base64
        import binascii

        keys = [key.strip() for key in value.get_secret_value().split(",") if key.strip()]
        for position, key in enumerate(keys, start=1):
            try:
                valid = len(base64.urlsafe_b64decode(key.encode("ascii"))) == 32
            except (binascii.Error, UnicodeEncodeError, ValueError):
                valid = False
            if not valid:
                raise PydanticCustomError(
                    "fernet_key",
                    "key {position} of {count} is not a Fernet key (32 url-safe base64-encoded "
                    "bytes, as Fernet.generate_key() makes)",
                    {"position": position, "count": len(keys)},
                )
        return value

    @field_validator(
        "sandbox_allow",
        "sandbox_task_roots",
        "sandbox_task_hosts",
        "sandbox_registries",
        "sandbox_build_hosts",
        mode="before",
    )
    @classmethod
    def _split_list(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("sandbox_task_roots")
    @classmethod
    def _absolute_roots(cls, value: list[str]) -> list[str]:
        for root in value:
            if not os.path.isabs(root):
                raise PydanticCustomError(
                    "absolute", "{root} is not an absolute path", {"root": root}
                )
        return value

    @field_validator("allowed_trainer_urls", mode="before")
    @classmethod
    def _split_prefixes(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list) and value:
            import httpx  # only here: every CLI command reads settings, few set trainer URLs

            for prefix in value:
                url = httpx.URL(prefix)
                if url.scheme not in ("http", "https") or not url.host:
                    raise ValueError(f"{prefix!r} is not an http(s) URL prefix with a host")
        return value

    @model_validator(mode="after")
    def _lease_leaves_room(self) -> Self:
        if self.lease_seconds < MIN_LEASE_SECONDS:
            raise ValueError(
                f"lease_seconds must be at least {MIN_LEASE_SECONDS:g}: the worker renews its "
                "leases every third of it and takes its loop for blocked after two thirds, so "
                "a shorter lease blames an agent for an import or a GC pause"
            )
        return self

    @model_validator(mode="after")
    def _stall_below_lease(self) -> Self:
        if self.loop_stall_seconds is not None and self.loop_stall_seconds >= self.lease_seconds:
            raise ValueError(
                "loop_stall_seconds must be below lease_seconds: a worker must notice its "
                "blocked loop before other workers take its rollouts over"
            )
        return self

    @model_validator(mode="after")
    def _inflight_ttl_beyond_lease(self) -> Self:
        if self.inflight_ttl_seconds <= self.lease_seconds:
            raise ValueError(
                "inflight_ttl_seconds must be above lease_seconds: a running rollout's record "
                "TTL is renewed with its lease (every third of lease_seconds), so a shorter "
                "TTL deletes running rollouts between renewals"
            )
        if self.inflight_ttl_seconds < 4 * self.sweep_interval_seconds:
            raise ValueError(
                "inflight_ttl_seconds must be at least 4 x sweep_interval_seconds: a waiting "
                "rollout's TTL is renewed once half of it is gone, checked every sweep "
                "interval, so a shorter TTL deletes rollouts waiting for a worker"
            )
        return self

    @model_validator(mode="after")
    def _long_poll_within_lease(self) -> Self:
        if self.result_wait_timeout_seconds >= self.polling_lease_timeout_seconds:
            raise ValueError(
                "result_wait_timeout_seconds must be below polling_lease_timeout_seconds: a "
                "long-poll waiting longer than the polling lease lets every rollout expire "
                "while its trainer waits"
            )
        return self

    @model_validator(mode="after")
    def _result_kept_for_a_polling_lease(self) -> Self:
        if self.result_retention_seconds < self.polling_lease_timeout_seconds:
            raise ValueError(
                "result_retention_seconds must be at least polling_lease_timeout_seconds: a "
                "trainer polling on time (once per polling lease) would find a finished "
                "result already deleted (404)"
            )
        return self

    @property
    def loop_stall_limit(self) -> float:
        return self.loop_stall_seconds or self.lease_seconds * 2 / 3

    @cached_property
    def concurrency(self) -> int:
        return self.worker_concurrency or get_settings().server.max_concurrent_rollouts

    @cached_property
    def record_ttl(self) -> float:
        return self.record_ttl_seconds or get_settings().server.record_ttl_seconds

    @property
    def shared(self) -> dict[str, float]:
        """The settings every gateway and worker of one fleet must share, by environment
        variable: one process's leases are renewed, taken over, kept and told to trainers by
        the others (a worker with a shorter lease took a longer-leased worker's delivering
        rollout over after a Redis outage; a worker keeping results for less than the
        gateways' polling lease deleted them before the trainer's next poll)."""
        return {
            "ROLLOUT_FLEET_LEASE_SECONDS": self.lease_seconds,
            "ROLLOUT_FLEET_POLLING_LEASE_TIMEOUT_SECONDS": self.polling_lease_timeout_seconds,
            "ROLLOUT_FLEET_RESULT_RETENTION_SECONDS": self.result_retention_seconds,
            "ROLLOUT_FLEET_RECORD_TTL_SECONDS": self.record_ttl,
            "ROLLOUT_FLEET_INFLIGHT_TTL_SECONDS": self.inflight_ttl_seconds,
        }

    @property
    def shared_ttl(self) -> float:
        """How long the fleet's shared settings outlive its last process: every worker
        renews them with each heartbeat (a third of a lease), every gateway each sweep."""
        return 3 * max(self.lease_seconds, self.sweep_interval_seconds)

    @property
    def redis_dsn(self) -> str:
        return self.redis_url.get_secret_value()


__all__ = ["SHORT_RECORD_TTL", "FleetSettings"]
