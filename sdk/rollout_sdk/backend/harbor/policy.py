"""What a sandbox may be: one policy, applied to the final Compose model of a trial.

A task is untrusted code, and what it declares (its ``environment/docker-compose.yaml``, its
``task.toml``) must never widen its box. So the fleet does not look for known dangerous keys:
Compose renders the trial's whole model first (Harbor's files, the task's, the fleet's own,
interpolation and merges resolved), and :func:`confine` keeps a service only if every key it
holds is on a short allow-list, with the values the fleet accepts; anything else refuses the
trial, naming the key and the task. The model it returns is the one the trial runs: every
service gets the fleet's labels and its limits (memory without swap, processes, CPUs; a task
may ask for less, never more) and ``no-new-privileges``; every network is internal except the
one the fleet's TrainGate relay alone joins; every build runs on the fleet's build network.

Never allowed unless an operator lists the key for trusted tasks
(``ROLLOUT_FLEET_SANDBOX_ALLOW``): host namespaces (``network_mode``, ``pid``, ``ipc``,
``userns_mode``), privileges and capabilities, devices, published ports, extra hosts and DNS,
Compose ``configs``/``secrets`` (files of the host), volumes with a driver's options, networks
of the engine (``external``) and bind mounts from anywhere but the trial's own folders.
"""

from __future__ import annotations

import copy
import math
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Keys a service may hold; values are checked below for the ones that could reach out.
SERVICE_KEYS = frozenset(
    {
        "image",
        "build",
        "command",
        "entrypoint",
        "environment",
        "working_dir",
        "user",
        "labels",
        "healthcheck",
        "depends_on",
        "networks",
        "stop_grace_period",
        "stop_signal",
        "init",
        "tty",
        "stdin_open",
        "hostname",
        "domainname",
        "expose",
        "volumes",
        "tmpfs",
        "mem_limit",
        "memswap_limit",
        "mem_reservation",
        "cpus",
        "pids_limit",
        "deploy",
        "pull_policy",
        "restart",
        "read_only",
        "cap_drop",
        "shm_size",
        "platform",
    }
)
TOP_KEYS = frozenset({"name", "services", "networks", "volumes"})
NETWORK_KEYS = frozenset({"name", "internal", "driver", "driver_opts", "labels"})
UNSET_NETWORK_KEYS = frozenset({"ipam", "external", "enable_ipv6", "attachable"})
VOLUME_KEYS = frozenset({"name", "labels", "driver"})
BUILD_KEYS = frozenset({"context", "dockerfile", "args", "target", "labels", "network"})
SERVICE_NETWORK_KEYS = frozenset({"aliases"})
MOUNT_KEYS = frozenset({"type", "source", "target", "read_only", "bind", "volume", "tmpfs"})
# An internal bridge still reaches the engine's host through its own address (seen on
# Docker 28) unless the host's side of the bridge has none.
CLOSED_BRIDGE = {"com.docker.network.bridge.inhibit_ipv4": "true"}
NO_NEW_PRIVILEGES = "no-new-privileges:true"
MB = 2**20


class PolicyRefusal(ValueError):
    """A trial's Compose model holds what no sandbox may; the message names it."""


@dataclass(frozen=True)
class Limits:
    """The most one sandbox container may take; a task's own limits may only lower them."""

    memory_mb: int = 2048
    pids: int = 512
    cpus: float = 1.0
    disk_mb: int = 4096
    output_mb: int = 256


@dataclass(frozen=True)
class SandboxPolicy:
    """The box a trial's containers get."""

    limits: Limits = field(default_factory=Limits)
    labels: Mapping[str, str] = field(default_factory=dict)
    # The folders a task's bind mount may come from, read-only: its own prepared copy, shared
    # by every trial of the task (paths of the engine's host, which the fleet keeps equal to
    # its own). No trial writes what another runs, nor sees another task's files.
    mount_roots: tuple[str, ...] = ()
    # The fleet's own binds, as (source, target) pairs: Harbor's log folders when the agent
    # author turned its auto-mounting on, the agent's configured mounts. Only these write to
    # the host.
    fleet_mounts: frozenset[tuple[str, str]] = frozenset()
    # Networks with a way out, and the one service that may join them (the fleet's relay).
    open_networks: frozenset[str] = frozenset()
    relay: str | None = None
    # Egress ``open``: networks stay as Harbor makes them (the operator's choice).
    closed: bool = True
    build_network: str = "none"
    # Service keys an operator allows for trusted tasks, values unchecked.
    allowed: frozenset[str] = frozenset()
    # The relay's image: a service named like the relay must be exactly the fleet's.
    relay_image: str | None = None
    # Registry hosts an image may name (an image naming none comes from the engine's default).
    registries: frozenset[str] = frozenset()


def _within(path: str, roots: Iterable[str]) -> bool:
    normal = posixpath.normpath(path)
    if not posixpath.isabs(path) or ".." in path.split("/"):
        return False
    return any(normal == root or normal.startswith(root.rstrip("/") + "/") for root in roots)


def _refuse(task: str, where: str, why: str) -> PolicyRefusal:
    return PolicyRefusal(
        f"task {task}: {where} is not allowed in a sandbox ({why}); remove it from the task, "
        "or list the key in ROLLOUT_FLEET_SANDBOX_ALLOW for trusted tasks"
    )


def _memory(value: Any) -> int | None:
    """Compose's rendered memory (bytes, as a number or string) in bytes; None: unset."""
    if value in (None, "", 0, "0"):
        return None
    text = str(value).strip().lower()
    units = {"b": 1, "k": 2**10, "kb": 2**10, "m": MB, "mb": MB, "g": 2**30, "gb": 2**30}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return int(float(text[: -len(unit)]) * units[unit])
    try:
        return int(float(text))
    except ValueError:
        return None


def _number(value: Any) -> float | None:
    try:
        found = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return found if math.isfinite(found) and found > 0 else None


def _least(ceiling: float, *asked: float | None) -> float:
    return min([ceiling, *(a for a in asked if a is not None and a > 0)])


def _own_name(
    model: Mapping[str, Any], section: str, key: str, body: Mapping[str, Any], task: str
) -> None:
    """A network or volume keeps the name Compose gives it (``<project>_<key>``): a name of
    its own would join, or remove, what another project or the engine holds."""
    named = body.get("name")
    if named is not None and named != f"{model.get('name')}_{key}":
        raise _refuse(task, f"{section}.{key}.name={named}", "a name of the trial's own")


def confine(
    model: Mapping[str, Any],
    policy: SandboxPolicy,
    task: str,
    resolve: Callable[[str], str] = posixpath.normpath,
) -> dict[str, Any]:
    """The trial's model as it may run, or :class:`PolicyRefusal` naming what may not.
    ``resolve`` gives the path a bind mount's source really names (links followed: the
    engine follows them)."""
    for key in model:
        if key not in TOP_KEYS and not key.startswith("x-"):
            raise _refuse(task, key, "files and settings of the host")
    for section in ("networks", "volumes"):
        for key, body in (model.get(section) or {}).items():
            _own_name(model, section, key, body or {}, task)
    networks = _networks(model.get("networks") or {}, policy, task)
    volumes = _volumes(model.get("volumes") or {}, policy, task)
    services = {
        name: _service(name, body or {}, policy, task, networks, volumes, resolve)
        for name, body in (model.get("services") or {}).items()
    }
    confined: dict[str, Any] = {"services": services, "networks": networks}
    if volumes:
        confined["volumes"] = volumes
    if "name" in model:
        confined["name"] = model["name"]
    return confined


def _networks(declared: Mapping[str, Any], policy: SandboxPolicy, task: str) -> dict[str, Any]:
    networks: dict[str, Any] = {}
    for name, given in declared.items():
        body = dict(given or {})
        for key, value in body.items():
            if key in UNSET_NETWORK_KEYS and not value:
                continue  # Compose renders some keys empty
            if key not in NETWORK_KEYS:
                raise _refuse(task, f"networks.{name}.{key}", "networks of the engine's own")
            if key == "driver" and value not in ("bridge", None):
                raise _refuse(task, f"networks.{name}.driver={value}", "a bridge only")
        opts = body.get("driver_opts") or {}
        if any(k not in CLOSED_BRIDGE for k in opts):
            raise _refuse(task, f"networks.{name}.driver_opts", "the bridge's own settings")
        body["labels"] = {**(body.get("labels") or {}), **policy.labels}
        if policy.closed and name not in policy.open_networks:
            body["internal"] = True
            body["driver_opts"] = dict(CLOSED_BRIDGE)
        networks[name] = body
    return networks


def _volumes(declared: Mapping[str, Any], policy: SandboxPolicy, task: str) -> dict[str, Any]:
    volumes: dict[str, Any] = {}
    for name, given in declared.items():
        body = dict(given or {})
        for key, value in body.items():
            if key == "external" and not value:
                continue
            if key not in VOLUME_KEYS:
                raise _refuse(task, f"volumes.{name}.{key}", "a volume's driver options")
            if key == "driver" and value not in ("local", None):
                raise _refuse(task, f"volumes.{name}.driver={value}", "the local driver only")
        body["labels"] = {**(body.get("labels") or {}), **policy.labels}
        volumes[name] = body
    return volumes


def _service(
    name: str,
    declared: Mapping[str, Any],
    policy: SandboxPolicy,
    task: str,
    networks: Mapping[str, Any],
    volumes: Mapping[str, Any],
    resolve: Callable[[str], str],
) -> dict[str, Any]:
    where = f"services.{name}"
    service = copy.deepcopy(dict(declared))
    if policy.relay is not None and name == policy.relay:
        _check_relay(service, where, policy, task)
    _check_image(service.get("image"), where, policy, task)
    for key in service:
        if key not in SERVICE_KEYS and key not in policy.allowed and not key.startswith("x-"):
            raise _refuse(
                task,
                f"{where}.{key}",
                "host namespaces, privileges, devices and the host's files never are",
            )
    _check_joined(name, service.get("networks") or {}, policy, task, networks)
    service["volumes"] = [
        _mount(m, where, policy, task, volumes, resolve) for m in service.get("volumes") or []
    ]
    if not service["volumes"]:
        del service["volumes"]
    if "build" in service:
        service["build"] = _build(service["build"], where, policy, task, resolve)
    if "deploy" in service:
        _check_deploy(service["deploy"], where, task)
    _limit(service, policy.limits)
    service["labels"] = {**(service.get("labels") or {}), **policy.labels}
    if "security_opt" not in policy.allowed:
        service["security_opt"] = [NO_NEW_PRIVILEGES]
    return service


def _mount(
    mount: Any,
    where: str,
    policy: SandboxPolicy,
    task: str,
    volumes: Mapping[str, Any],
    resolve: Callable[[str], str],
) -> dict[str, Any]:
    if not isinstance(mount, Mapping):
        raise _refuse(task, f"{where}.volumes", "a mount Compose did not render")
    for key in mount:
        if key not in MOUNT_KEYS:
            raise _refuse(task, f"{where}.volumes[{mount.get('target')}].{key}", "plain mounts")
    kind = mount.get("type")
    source = str(mount.get("source") or "")
    if kind == "bind":
        return _bind(mount, source, where, policy, task, resolve)
    if kind == "volume":
        if source and source not in volumes:
            raise _refuse(task, f"{where}.volumes {source}", "the trial's own volumes only")
        if set(mount.get("volume") or {}) - {"nocopy"}:
            raise _refuse(task, f"{where}.volumes {source}", "a plain volume")
    elif kind != "tmpfs":
        raise _refuse(task, f"{where}.volumes type {kind}", "binds, volumes and tmpfs only")
    return dict(mount)


def _bind(
    mount: Mapping[str, Any],
    source: str,
    where: str,
    policy: SandboxPolicy,
    task: str,
    resolve: Callable[[str], str],
) -> dict[str, Any]:
    """The fleet's own binds as they are; a task's, from its own files only, read-only."""
    resolved = resolve(source)
    if (resolved, str(mount.get("target"))) in policy.fleet_mounts:
        if set(mount.get("bind") or {}) - {"create_host_path", "selinux"}:
            raise _refuse(task, f"{where}.volumes bind {source}", "a plain bind")
        return dict(mount)
    if "volumes" in policy.allowed:
        return dict(mount)
    if not _within(resolved, policy.mount_roots):
        raise _refuse(
            task, f"{where}.volumes bind {source}", "bind mounts come only from the task's files"
        )
    if set(mount.get("bind") or {}) - {"create_host_path"}:
        raise _refuse(task, f"{where}.volumes bind {source}", "a plain bind")
    return {**mount, "read_only": True, "bind": {"create_host_path": False}}


def _build(
    build: Any, where: str, policy: SandboxPolicy, task: str, resolve: Callable[[str], str]
) -> dict[str, Any]:
    body = dict(build if isinstance(build, Mapping) else {"context": build})
    for key in body:
        if key not in BUILD_KEYS:
            raise _refuse(task, f"{where}.build.{key}", "a context, a Dockerfile and arguments")
    context = str(body.get("context") or "")
    if not _within(resolve(context), policy.mount_roots):
        raise _refuse(task, f"{where}.build.context {context}", "the task's own folder only")
    dockerfile = str(body.get("dockerfile") or "Dockerfile")
    if not _within(resolve(posixpath.join(context, dockerfile)), (resolve(context),)):
        raise _refuse(task, f"{where}.build.dockerfile {dockerfile}", "a file of the context")
    body["network"] = policy.build_network
    body["labels"] = {**(body.get("labels") or {}), **policy.labels}
    return body


def _check_joined(
    name: str, joined: Any, policy: SandboxPolicy, task: str, networks: Mapping[str, Any]
) -> None:
    """A service joins only the trial's networks, by aliases; only the relay joins one with
    a way out."""
    where = f"services.{name}"
    if isinstance(joined, list):
        joined = {n: None for n in joined}
    for network, settings in joined.items():
        if network not in networks:
            raise _refuse(task, f"{where}.networks.{network}", "a network the trial lacks")
        if network in policy.open_networks and name != policy.relay:
            raise _refuse(task, f"{where}.networks.{network}", "the fleet's way out is its relay's")
        for key in settings or {}:
            if key not in SERVICE_NETWORK_KEYS:
                raise _refuse(task, f"{where}.networks.{network}.{key}", "aliases only")


RELAY_KEYS = frozenset(
    {"image", "command", "entrypoint", "init", "labels", "stop_grace_period", "networks"}
)


def _check_relay(service: Mapping[str, Any], where: str, policy: SandboxPolicy, task: str) -> None:
    """The service named like the fleet's relay is the relay and nothing else: a task that
    declares one would otherwise run its own code on the relay's way out."""
    extra = set(service) - RELAY_KEYS
    if extra or service.get("entrypoint") or service.get("image") != policy.relay_image:
        what = sorted(extra) or ["entrypoint" if service.get("entrypoint") else "image"]
        raise _refuse(task, f"{where}.{what[0]}", "the fleet's relay is the fleet's alone")


def _registry(image: str) -> str | None:
    """The registry host an image reference names, if any (Docker's rule: a first part with
    a dot or a colon, or ``localhost``)."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first.lower() == "localhost"):
        return first.lower()
    return None


def _check_image(image: Any, where: str, policy: SandboxPolicy, task: str) -> None:
    """An image from a registry the operator named, or from the engine's default: a task
    naming a host would have the engine connect there on its behalf (this host's loopback,
    a metadata address)."""
    registry = _registry(str(image)) if image else None
    if registry is not None and registry.rsplit(":", 1)[0] not in policy.registries:
        raise _refuse(
            task,
            f"{where}.image {image}",
            "images from the engine's default registry, or one in ROLLOUT_FLEET_SANDBOX_REGISTRIES",
        )


def _instructions(text: str) -> list[tuple[str, str]]:
    """A Dockerfile's instructions (name upper-cased, arguments), continuation lines joined
    and comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        if whole:
            name, _, rest = whole.partition(" ")
            found.append((name.upper(), rest.strip()))
    return found


def check_dockerfile(text: str, policy: SandboxPolicy, task: str) -> None:
    """What a task's Dockerfile makes the engine fetch: a build has no network, but the engine
    itself pulls a ``FROM`` image and an ``ADD`` URL, on its host's network. So a base image
    names no registry host but the operator's, ``ADD`` takes no URL, and neither takes a
    variable (a build argument could supply either)."""
    stages: set[str] = set()
    for name, rest in _instructions(text):
        words = [w for w in rest.split() if not w.startswith("--")]
        flags = [w for w in rest.split() if w.startswith("--")]
        if name == "FROM" and words:
            image = words[0]
            if len(words) >= 3 and words[1].upper() == "AS":
                stages.add(words[2].lower())
            if image.lower() in stages or image == "scratch":
                continue
            if "$" in image:
                raise _refuse(task, f"Dockerfile FROM {image}", "an image named as it is")
            _check_image(image, "Dockerfile FROM", policy, task)
        if name == "ADD" and any("://" in w or w.startswith("git@") for w in words[:-1]):
            raise _refuse(task, f"Dockerfile ADD {rest[:80]}", "files of the task, not URLs")
        for flag in flags:
            source = flag.split("=", 1)[1] if flag.startswith(("--from=",)) else None
            if flag.startswith("--mount=") and "from=" in flag:
                source = flag.split("from=", 1)[1].split(",", 1)[0]
            if source is None or source.lower() in stages or source.isdigit():
                continue
            if "$" in source:
                raise _refuse(task, f"Dockerfile {name} {flag}", "an image named as it is")
            _check_image(source, f"Dockerfile {name} {flag}", policy, task)
        if name == "ONBUILD":
            raise _refuse(task, "Dockerfile ONBUILD", "instructions run where they are written")


def _check_deploy(deploy: Any, where: str, task: str) -> None:
    if not isinstance(deploy, Mapping) or set(deploy) - {"resources"}:
        raise _refuse(task, f"{where}.deploy", "resource limits only")
    resources = deploy.get("resources") or {}
    if set(resources) - {"limits", "reservations"}:
        raise _refuse(task, f"{where}.deploy.resources", "limits and reservations")
    if set(resources.get("limits") or {}) - {"cpus", "memory", "pids"}:
        raise _refuse(task, f"{where}.deploy.resources.limits", "cpus, memory and pids")
    if set(resources.get("reservations") or {}) - {"cpus", "memory"}:
        raise _refuse(task, f"{where}.deploy.resources.reservations", "no devices or GPUs")


def _limit(service: dict[str, Any], limits: Limits) -> None:
    """The fleet's ceiling, or what the service asks when it asks for less."""
    deploy = service.pop("deploy", None) or {}
    asked = (deploy.get("resources") or {}).get("limits") or {}
    memory = _least(
        limits.memory_mb * MB,
        _memory(service.get("mem_limit")),
        _memory(asked.get("memory")),
    )
    service["mem_limit"] = str(int(memory))
    service["memswap_limit"] = str(int(memory))  # no swap beyond the memory limit
    if _memory(service.get("mem_reservation")) not in (None,) and (
        (_memory(service.get("mem_reservation")) or 0) > memory
    ):
        service["mem_reservation"] = str(int(memory))
    service["cpus"] = _least(limits.cpus, _number(service.get("cpus")), _number(asked.get("cpus")))
    pids = [_number(service.get("pids_limit")), _number(asked.get("pids"))]
    service["pids_limit"] = int(_least(limits.pids, *pids))
    shm = _memory(service.get("shm_size"))
    if shm is not None and shm > memory:
        service["shm_size"] = str(int(memory))


def disk_cap_mb(ceiling_mb: int, storage_mb: Any) -> int:
    """The disk one trial's containers may write: the fleet's, or the task's if smaller."""
    return int(_least(ceiling_mb, _number(storage_mb)))


__all__ = [
    "Limits",
    "PolicyRefusal",
    "SandboxPolicy",
    "check_dockerfile",
    "confine",
    "disk_cap_mb",
]
