"""The wheels of a workflow's sandbox layer, fetched on the worker for the sandbox.

A workflow's sandbox layer is built with no network (``docker build --network none``): a
build's ``RUN`` could otherwise reach whatever the engine's network reaches (Redis, the
gateway, a cloud's metadata address). So the worker, which has the network, fetches every
wheel the layer installs into the build context first:

* the SDK's dependencies exactly as the fleet's lock pins them, with the lock's hashes
  (``locked/sdk.txt`` and ``locked/<extra>.txt`` for each SDK extra the project asks for,
  exported from ``uv.lock`` by ``scripts/sandbox_requirements.py``);
* the project's other dependencies, resolved by pip with every pin of the lock as a
  constraint, so a project cannot move a package the SDK was locked and tested with; a
  conflict fails the rollout with pip's own explanation of it.

Wheels are for the sandbox's Python and platform, read once per image by running its
``python3`` (with no network), not the worker's. They are kept under the worker's sandbox
folder by their SHA-256, and what a layer needs is remembered by a hash of everything that
decides it, so the next build of the same layer asks nothing of the index.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from rollout_sdk.backend.harbor.engine import EngineError, docker
from rollout_sdk.backend.harbor.workflows import Declared, PackingError

logger = logging.getLogger(__name__)

LOCKED = Path(__file__).parent / "locked"
DOWNLOAD_TIMEOUT_SECONDS = 900.0
PROBE_TIMEOUT_SECONDS = 120.0
# The probe runs the task's image, untrusted: as boxed as a sandbox, and for seconds only.
PROBE_LIMITS = (
    "--memory=256m",
    "--memory-swap=256m",
    "--pids-limit=64",
    "--cpus=1",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges:true",
)
OLDEST_PYTHON = (3, 12)  # the SDK's requires-python
# Runs in the sandbox's image (any Python 3, standard library only): what pip must know to
# pick wheels for it, and the values PEP 508 markers are evaluated against.
PROBE = r"""
import glob, json, os, platform, re, subprocess, sys, sysconfig
libc, version = platform.libc_ver()
if not libc:
    for loader in glob.glob("/lib/ld-musl-*.so.1"):
        said = subprocess.run([loader], capture_output=True, text=True).stderr
        found = re.search(r"Version ([0-9]+\.[0-9]+)", said)
        libc, version = "musl", found.group(1) if found else "1.1"
info = sys.implementation.version
kind = info.releaselevel
suffix = "" if kind == "final" else kind[0] + str(info.serial)
implementation_version = "%d.%d.%d" % info[:3] + suffix
print(json.dumps({
    "version": list(sys.version_info[:2]),
    "implementation": sys.implementation.name,
    "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    "machine": platform.machine(),
    "libc": [libc, version],
    "markers": {
        "implementation_name": sys.implementation.name,
        "implementation_version": implementation_version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    },
}))
"""
# pip's words for an index it could not reach (its resolver then also says "no version").
UNREACHABLE = (
    "Could not fetch URL",
    "NewConnectionError",
    "ConnectTimeoutError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "ReadTimeoutError",
)
_NO_VERSION = re.compile(
    r"Could not find a version that satisfies the requirement (\S+)(?: \(from versions: (.*)\))?"
)
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


@dataclass(frozen=True)
class Target:
    """The sandbox's Python and platform, as pip's download options name them."""

    python_version: str  # "3.12"
    implementation: str  # "cp"
    abi: str  # "cp312"
    platforms: tuple[str, ...]  # most specific first
    markers: dict[str, str]

    def pip_options(self) -> list[str]:
        options = ["--only-binary=:all:", "--python-version", self.python_version]
        options += ["--implementation", self.implementation, "--abi", self.abi]
        for platform in self.platforms:
            options += ["--platform", platform]
        return options

    def describe(self) -> str:
        return f"Python {self.python_version} ({self.abi}, {self.platforms[0]})"


def target_of(probed: dict[str, Any], image: str) -> Target:
    """The :class:`Target` of what :data:`PROBE` printed in ``image``."""
    major, minor = (int(part) for part in probed["version"])
    if (major, minor) < OLDEST_PYTHON:
        raise PackingError(
            f"the task's image {image} has Python {major}.{minor}; a workflow's sandbox needs "
            f"Python {OLDEST_PYTHON[0]}.{OLDEST_PYTHON[1]} or newer as python3 in it"
        )
    name = str(probed["implementation"])
    short = {"cpython": "cp", "pypy": "pp"}.get(name, name)
    abi = f"{short}{major}{minor}{'t' if probed.get('free_threaded') else ''}"
    machine = str(probed["machine"])
    libc, version = (str(part) for part in probed["libc"])
    platforms: list[str] = []
    if libc in ("glibc", "musl") and re.fullmatch(r"\d+\.\d+(\.\d+)?", version):
        first, second = (int(part) for part in version.split(".")[:2])
        if libc == "glibc":
            for step in range(second, 4, -1):
                platforms.append(f"manylinux_{first}_{step}_{machine}")
                if step in _LEGACY_MANYLINUX and first == 2:
                    platforms.append(f"{_LEGACY_MANYLINUX[step]}_{machine}")
        else:
            platforms += [f"musllinux_{first}_{step}_{machine}" for step in range(second, -1, -1)]
    platforms.append(f"linux_{machine}")
    markers = {str(k): str(v) for k, v in dict(probed["markers"]).items()}
    return Target(f"{major}.{minor}", short, abi, tuple(platforms), markers)


@dataclass(frozen=True)
class Pin:
    """One requirement of the lock's export: ``name==version`` and its hashes."""

    name: str  # canonical
    line: str  # "name==version --hash=sha256:... ..." (marker left out: it was evaluated)


def locked_pins(files: list[str], target: Target) -> dict[str, Pin]:
    """The pins of the lock's exports ``files`` (``sdk``, an extra) that apply to ``target``."""
    pins: dict[str, Pin] = {}
    for file in files:
        text = (LOCKED / f"{file}.txt").read_text().replace("\\\n", " ")
        for line in text.splitlines():
            head, *hashes = line.split(" --hash=")
            if not head.strip() or head.lstrip().startswith("#"):
                continue
            requirement = Requirement(head)
            marker = requirement.marker
            if marker is not None and not marker.evaluate({**target.markers, "extra": ""}):
                continue
            requirement.marker = None
            name = canonicalize_name(requirement.name)
            flags = " ".join(f"--hash={digest.strip()}" for digest in hashes)
            pins.setdefault(name, Pin(name, f"{requirement} {flags}".strip()))
    return pins


def _project_requirements(declared: Declared, target: Target) -> list[str]:
    """The project's own requirements that apply in the sandbox, markers evaluated there."""
    chosen = []
    for text in declared.project:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise PackingError(f"the project's dependency {text!r} is invalid: {exc}") from None
        marker: Marker | None = requirement.marker
        if marker is not None and not marker.evaluate({**target.markers, "extra": ""}):
            continue
        requirement.marker = None
        chosen.append(str(requirement))
    return chosen


def pip_reason(output: str, target: Target) -> str:
    """pip's own explanation of a failed download, trimmed to one line (no traceback)."""
    lines = [line.rstrip() for line in output.splitlines()]
    if "The conflict is caused by:" in lines:
        start = lines.index("The conflict is caused by:") + 1
        causes = []
        for line in lines[start:]:
            if not line.strip():
                break
            # pip's "user" is this fleet: its constraints are the lock, its requests the project.
            cause = line.strip().replace(
                "The user requested (constraint) ", "the fleet's lock pins "
            )
            causes.append(cause.replace("The user requested ", "the project asks "))
        return "the sandbox layer's packages do not resolve: " + "; ".join(causes) + " (from pip)"
    for line in lines:
        found = _NO_VERSION.search(line)
        if found:
            requirement, versions = found.group(1), (found.group(2) or "none").strip()
            if versions == "none":
                return (
                    f"no wheel of {requirement} for the sandbox's {target.describe()}: the "
                    "layer installs wheels only, with no network (from pip)"
                )
            listed = versions.split(", ")
            shown = ", ".join(listed[-5:]) if len(listed) <= 5 else "…, " + ", ".join(listed[-5:])
            return (
                f"no version of {requirement} for the sandbox's {target.describe()} "
                f"(wheels there: {shown}) (from pip)"
            )
    errors = [line.removeprefix("ERROR: ").strip() for line in lines if line.startswith("ERROR:")]
    return (errors[0] if errors else (lines[-1] if lines else "pip said nothing")) + " (from pip)"


@dataclass(frozen=True)
class Fetched:
    """The wheels a layer installs (kept in the store) and its requirements file."""

    wheels: list[Path]
    pins: str
    bytes: int


class LayerWheels:
    """Fetches and keeps the wheels of workflow layers under ``root`` (the worker's sandbox
    folder): ``wheels/<sha256>/<file>``, ``plans/<key>.json`` (which wheels a layer needs)
    and ``targets/<image id>.json`` (what an image's Python is)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks: dict[str, asyncio.Lock] = {}

    async def target(self, image: str) -> Target:
        """The sandbox's Python and platform, read once per image (by its id)."""
        image_id = (await docker("image", "inspect", "--format", "{{.Id}}", image)).strip()
        kept = self.root / "targets" / f"{image_id.replace(':', '-')}.json"
        if kept.is_file():
            return target_of(json.loads(kept.read_text()), image)
        try:
            said = await docker(
                "run", "--rm", "--network", "none", *PROBE_LIMITS, "--entrypoint", "python3",
                image, "-c", PROBE,
                seconds=PROBE_TIMEOUT_SECONDS,
            )  # fmt: skip
        except EngineError as exc:
            raise PackingError(
                f"the task's image {image} did not run python3 ({exc}): a workflow's sandbox "
                "needs Python 3.12 or newer, with its venv module, as python3 in the image"
            ) from None
        probed = json.loads(said.strip().splitlines()[-1])
        found = target_of(probed, image)
        await asyncio.to_thread(_write_atomically, kept, json.dumps(probed))
        return found

    async def fetch(self, declared: Declared, target: Target) -> Fetched:
        """The wheels and pinned requirements of a layer: from the store when a build of the
        same layer fetched them, else downloaded (off the loop, within a time limit)."""
        every = sorted(path.stem for path in LOCKED.glob("*.txt"))
        asked = set(every) if "all" in declared.extras else declared.extras & set(every)
        files = ["sdk", *sorted(asked - {"sdk"})]
        sdk, everything = await asyncio.to_thread(
            lambda: (locked_pins(files, target), locked_pins(every, target))
        )
        project = _project_requirements(declared, target)
        constraints = "".join(f"{pin.line.split(' ')[0]}\n" for pin in everything.values())
        key = hashlib.sha256(
            json.dumps(
                [asdict(target), [p.line for p in sdk.values()], project, constraints]
            ).encode()
        ).hexdigest()
        async with self._locks.setdefault(key, asyncio.Lock()):
            kept = await asyncio.to_thread(self._planned, key)
            if kept is not None:
                return kept
            started = time.monotonic()
            fetched = await self._download(key, sdk, project, constraints, target)
            logger.info(
                "sandbox layer: %d wheels, %.1f MB fetched in %.1fs",
                len(fetched.wheels), fetched.bytes / 1e6, time.monotonic() - started,
            )  # fmt: skip
            return fetched

    def _planned(self, key: str) -> Fetched | None:
        """The layer's wheels as an earlier build kept them, each checked by its hash."""
        plan = self.root / "plans" / f"{key}.json"
        if not plan.is_file():
            return None
        kept = json.loads(plan.read_text())
        wheels = []
        for entry in kept["wheels"]:
            path = self.root / "wheels" / entry["sha256"] / entry["file"]
            if not path.is_file() or _sha256(path) != entry["sha256"]:
                return None
            wheels.append(path)
        return Fetched(wheels, kept["pins"], sum(path.stat().st_size for path in wheels))

    async def _download(
        self, key: str, sdk: dict[str, Pin], project: list[str], constraints: str, target: Target
    ) -> Fetched:
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".download-", dir=self.root) as scratch:
            folder = Path(scratch)
            into = folder / "wheels"
            (folder / "sdk.txt").write_text("".join(f"{pin.line}\n" for pin in sdk.values()))
            # The lock's own pins, with its hashes: nothing resolved, nothing else taken.
            await self._pip(
                ["--no-deps", "--require-hashes", "-r", str(folder / "sdk.txt")],
                into, target, project_cause=False,
            )  # fmt: skip
            if project:
                (folder / "constraints.txt").write_text(constraints)
                (folder / "project.txt").write_text("".join(f"{line}\n" for line in project))
                await self._pip(
                    ["-c", str(folder / "constraints.txt"), "-r", str(folder / "project.txt")],
                    into, target, project_cause=True,
                )  # fmt: skip
            return await asyncio.to_thread(self._keep, key, into, sdk)

    async def _pip(
        self, arguments: list[str], into: Path, target: Target, *, project_cause: bool
    ) -> None:
        argv = [sys.executable, "-m", "pip", "download", "--dest", str(into)]
        argv += ["--disable-pip-version-check", "--no-input", "--progress-bar", "off"]
        argv += [*target.pip_options(), *arguments]
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(DOWNLOAD_TIMEOUT_SECONDS):
                output, _ = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise EngineError(
                f"downloading the sandbox layer's wheels took over {DOWNLOAD_TIMEOUT_SECONDS:.0f}s"
            ) from None
        except BaseException:
            process.kill()
            await process.wait()
            raise
        said = output.decode(errors="replace")
        if process.returncode == 0:
            return
        if "No module named pip" in said:
            raise EngineError(
                "pip is not installed beside the worker: install the harbor extra "
                "(pip install 'rollout-sdk[harbor]'), which brings it"
            )
        if any(word in said for word in UNREACHABLE):
            unreachable = next(
                line for line in said.splitlines() if any(w in line for w in UNREACHABLE)
            )
            raise EngineError(
                f"the package index was not reachable from the worker: {unreachable.strip()[:300]}"
            )
        reason = pip_reason(said, target)
        logger.warning("sandbox layer: %s", reason)
        # The project's requirements are the user's to fix; the lock's pins missing a wheel
        # for the task's image are too (another image, or another Python in it).
        raise PackingError(reason)

    def _keep(self, key: str, downloaded: Path, sdk: dict[str, Pin]) -> Fetched:
        """Move the downloads into the store by hash; write the layer's requirements (every
        pin with a hash: the lock's, or the downloaded file's) and its plan."""
        wheels: list[Path] = []
        entries: list[dict[str, str]] = []
        lines = [pin.line for pin in sdk.values()]
        for file in sorted(downloaded.iterdir()):
            try:
                name, version, _, _ = parse_wheel_filename(file.name)
            except InvalidWheelFilename:
                continue
            digest = _sha256(file)
            stored = self.root / "wheels" / digest / file.name
            stored.parent.mkdir(parents=True, exist_ok=True)
            os.replace(file, stored)
            wheels.append(stored)
            entries.append({"file": file.name, "sha256": digest})
            if name not in sdk:
                lines.append(f"{name}=={version} --hash=sha256:{digest}")
        pins = "".join(f"{line}\n" for line in sorted(lines))
        plan = {"wheels": entries, "pins": pins}
        _write_atomically(self.root / "plans" / f"{key}.json", json.dumps(plan))
        return Fetched(wheels, pins, sum(path.stat().st_size for path in wheels))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_atomically(path: Path, text: str) -> None:
    """Write beside ``path`` and rename: other workers on this host read the same folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(text)
    os.replace(staging, path)


__all__ = ["Fetched", "LayerWheels", "Pin", "Target", "locked_pins", "pip_reason", "target_of"]
