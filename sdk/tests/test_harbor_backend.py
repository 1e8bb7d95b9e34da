"""HarborBackend's choices that need no Docker engine: what it refuses, with what to do
instead; which task a rollout runs; how a fleet worker takes the backend out of main()."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import textwrap
import time
from pathlib import Path

import pytest
from harbor.models.environment_type import EnvironmentType
from harbor.models.trial.config import EnvironmentConfig

from rollout_sdk.agent_workflow import AgentWorkflow
from rollout_sdk.backend.harbor import HarborBackend, HarborBackendError, TaskMode
from rollout_sdk.backend.harbor.egress import RefusedRoute, Route, checked, overlay
from rollout_sdk.backend.harbor.engine import DockerEngine
from rollout_sdk.backend.harbor.relay import serve
from rollout_sdk.backend.harbor.results import messages_of
from rollout_sdk.backend.harbor.sandbox import SandboxOwner
from rollout_sdk.backend.harbor.tasks import (
    PreparedTasks,
    TaskError,
    TaskSources,
    content_hash,
    task_folder,
)
from rollout_sdk.backend.sandboxed import SandboxSettings
from rollout_sdk.loader import AgentLoadError, load_agent


def a_task(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "task.toml").write_text('version = "1.0"\n')
    (folder / "instruction.md").write_text("Say hi.\n")
    return folder


class Workflow(AgentWorkflow):  # type: ignore[type-arg]
    async def run(self, ctx: object) -> None:
        return None


def test_what_cannot_go_into_the_sandbox_is_refused_with_what_to_do(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    with pytest.raises(HarborBackendError, match=r"outside code_dir=.*: the sandbox gets only"):
        HarborBackend(tasks_dir=a_task(tmp_path / "t"), agent=Workflow, code_dir=code)
    with pytest.raises(HarborBackendError, match="such a trial is graded by the task's tests"):
        HarborBackend(tasks_dir=a_task(tmp_path / "u"), agent="oracle", grader="m:G")


def test_environments_other_than_docker_and_bad_modes_are_refused(tmp_path: Path) -> None:
    task = a_task(tmp_path / "t")
    daytona = EnvironmentConfig(type=EnvironmentType.DAYTONA)
    with pytest.raises(HarborBackendError, match=r"'daytona': this fleet runs sandboxes on a"):
        HarborBackend(tasks_dir=task, agent="oracle", environment_config=daytona)
    with pytest.raises(HarborBackendError, match=r"task_mode='tasks' is not a task mode"):
        HarborBackend(tasks_dir=task, agent="oracle", task_mode="tasks")
    with pytest.raises(HarborBackendError, match="max_queue_depth must be 1 or more"):
        HarborBackend(tasks_dir=task, agent="oracle", max_queue_depth=0)
    with pytest.raises(HarborBackendError, match="pass code_dir instead of a prebuilt wheel"):
        HarborBackend(tasks_dir=task, agent="m:W", bundle="w.whl")
    with pytest.raises(HarborBackendError, match="the workflow's packages go into the image"):
        HarborBackend(tasks_dir=task, agent="m:W", patch_dockerfile_with_sdk=False)


def test_which_task_a_rollout_runs(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    one, two = a_task(tasks / "one"), a_task(tasks / "two")
    assert task_folder(one, TaskMode.TEMPLATE, None) == one
    assert task_folder(tasks, TaskMode.DATASET, {"harbor_task_id": "two"}) == two
    assert task_folder(tasks, TaskMode.DATASET, {"harbor_task": str(one)}) == one
    with pytest.raises(TaskError, match="names a registry package, which this fleet does not"):
        task_folder(tasks, TaskMode.DATASET, {"harbor_task": "org/name@v1"})
    with pytest.raises(TaskError, match=r"dataset mode needs metadata\['harbor_task_id'\]"):
        task_folder(tasks, TaskMode.DATASET, {})
    with pytest.raises(TaskError, match="must be one folder name"):
        task_folder(tasks, TaskMode.DATASET, {"harbor_task_id": "../one"})
    with pytest.raises(TaskError, match="which is no Harbor task folder"):
        task_folder(tasks, TaskMode.DATASET, {"harbor_task_id": "three"})


def test_trial_names_are_per_execution_and_valid_project_names() -> None:
    owner = SandboxOwner("rf@d", "rf:v2:é,1", "é,1", "host:1:abcd")
    other = SandboxOwner("rf@d", "rf:v2:é,1", "é,1", "host:1:abce")
    assert owner.trial_name != other.trial_name
    assert owner.trial_name.startswith("rfx-")
    assert owner.trial_name.replace("-", "").isalnum()
    assert owner.trial_name.isascii()
    labels = owner.overlay()["services"]["main"]["labels"]
    assert labels["org.rollout-fleet.rollout"] == "é,1"  # ids kept as they are


def test_a_backend_built_in_main_is_taken_without_serving(tmp_path: Path) -> None:
    task = a_task(tmp_path / "task")
    entry = tmp_path / "main.py"
    entry.write_text(
        textwrap.dedent(
            f"""\
            from harbor.trial.queue import TrialQueue
            from osmosis_ai.rollout.backend.harbor import HarborBackend
            from osmosis_ai.rollout.server import create_rollout_server

            def main():
                backend = HarborBackend(
                    orchestrator=TrialQueue(n_concurrent=3), tasks_dir={str(task)!r},
                    agent="oracle",
                )
                app = create_rollout_server(backend=backend, lifespan=backend.prewarm_lifespan())
                raise SystemExit("served: main() went on past create_rollout_server")
            """
        )
    )
    agent = load_agent(str(entry))
    assert isinstance(agent, HarborBackend)
    assert agent.sandbox_figures() == {"slots": 3, "running": 0, "waiting": 0}


def test_a_main_that_builds_no_server_is_one_line(tmp_path: Path) -> None:
    entry = tmp_path / "main.py"
    entry.write_text(
        "from osmosis_ai.rollout.backend.harbor import HarborBackend\n\ndef main():\n    pass\n"
    )
    with pytest.raises(AgentLoadError, match=r"main\(\) returned without calling create_rollout"):
        load_agent(str(entry))


def test_failed_trials_folders_go_after_their_retention(tmp_path: Path) -> None:
    trials = tmp_path / "trials"
    old, new = trials / "rfx-old", trials / "rfx-new"
    for folder in (old, new):
        (folder / "agent").mkdir(parents=True)
    os.utime(old, (time.time() - 120, time.time() - 120))
    backend = HarborBackend(tasks_dir=a_task(tmp_path / "t"), agent="oracle", trials_dir=trials)
    backend.configure(SandboxSettings(log_retention_seconds=60))
    assert asyncio.run(backend.prune_trials()) == 1
    assert sorted(p.name for p in trials.iterdir()) == ["rfx-new"]


def test_a_traingate_is_reached_under_its_name_or_as_traingate() -> None:
    named = Route.to("https://gate.example.com/v1/rollouts/r1")
    assert (named.host, named.port, named.alias) == ("gate.example.com", 443, "gate.example.com")
    assert named.url == "https://gate.example.com/v1/rollouts/r1"  # TLS names stay right
    literal = Route.to("http://10.1.2.3:9001/v1/rollouts/r1")
    assert (literal.host, literal.port, literal.alias) == ("10.1.2.3", 9001, "traingate")
    assert literal.url == "http://traingate:9001/v1/rollouts/r1"


def test_the_trial_network_is_closed_and_opened_only_to_the_relay() -> None:
    labels = {"org.rollout-fleet.fleet": "rf@d"}
    closed = overlay(labels, None, None)
    assert closed["services"] == {}
    default = closed["networks"]["default"]
    assert default["internal"] is True
    assert default["driver_opts"] == {"com.docker.network.bridge.inhibit_ipv4": "true"}
    route = Route.to("http://10.1.2.3:9001/v1/rollouts/r1")
    opened = overlay(labels, route, "relay:1")
    relay = opened["services"]["rollout-egress"]
    assert relay["command"] == ["python3", "/relay.py", "9001", "10.1.2.3", "9001"]
    assert relay["networks"] == {"default": {"aliases": ["traingate"]}, "egress": {}}
    assert opened["networks"]["default"]["internal"] is True


def test_the_relay_joins_each_connection_to_its_one_destination() -> None:
    async def scenario() -> bytes:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"echo:" + await reader.read(100))
            await writer.drain()
            writer.close()

        target = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = target.sockets[0].getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            listen = probe.getsockname()[1]
        relay = asyncio.create_task(serve(listen, "127.0.0.1", port))
        try:
            for _ in range(50):
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", listen)
                    break
                except OSError:
                    await asyncio.sleep(0.02)
            writer.write(b"hello")
            await writer.drain()
            answer = await reader.read(100)
            writer.close()
            return answer
        finally:
            relay.cancel()
            target.close()

    assert asyncio.run(scenario()) == b"echo:hello"


def test_an_atif_trajectory_reads_as_chat_messages() -> None:
    atif = {
        "steps": [
            {"source": "user", "message": "Write 6 * 7 to answer.txt"},
            {
                "source": "agent",
                "message": "Computing.",
                "reasoning_content": "6 times 7",
                "tool_calls": [
                    {"tool_call_id": "c1", "function_name": "bash", "arguments": {"cmd": "echo"}}
                ],
                "observation": {"results": [{"source_call_id": "c1", "content": "42"}]},
            },
            {"source": "agent"},  # nothing said, nothing called: no message
            {"source": "environment", "message": "done"},
        ]
    }
    assert messages_of(atif) == [
        {"role": "user", "content": "Write 6 * 7 to answer.txt"},
        {
            "role": "assistant",
            "content": "Computing.",
            "reasoning_content": "6 times 7",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"cmd": "echo"}'},
                }
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
        {"role": "tool", "content": "done"},
    ]
    assert messages_of({"messages": [{"role": "user", "content": "x"}]}) == [
        {"role": "user", "content": "x"}
    ]


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/v1", "link-local address 169.254.169.254 (cloud metadata)"),
        ("http://2852039166/v1", "link-local address 169.254.169.254 (cloud metadata)"),
        ("http://[::ffff:169.254.169.254]/v1", "link-local address 169.254.169.254"),
        ("http://metadata.google.internal/v1", "names a cloud metadata service"),
        ("http://localhost:9/v1", "loopback address"),
        ("http://0x7f000001:9/v1", "loopback address 127.0.0.1"),
    ],
)
def test_a_traingate_route_to_a_refused_address_is_one_line(url: str, why: str) -> None:
    with pytest.raises(RefusedRoute, match=re.escape(why)):
        asyncio.run(checked(Route.to(url)))


def test_an_allowed_traingate_keeps_its_address_and_alias() -> None:
    route = asyncio.run(checked(Route.to("http://10.1.2.3:9001/v1/rollouts/r1")))
    assert (route.host, route.port, route.alias) == ("10.1.2.3", 9001, "traingate")


def test_a_sandbox_folder_holds_trials_task_copies_and_overlays(tmp_path: Path) -> None:
    """A worker's ROLLOUT_FLEET_SANDBOX_DIR: what a sandbox may bind-mount lies under it."""
    task = a_task(tmp_path / "t")
    backend = HarborBackend(tasks_dir=task, agent="oracle")
    folder = tmp_path / "sandboxes"
    backend.configure(SandboxSettings(build_network="host", folder=str(folder)))
    assert backend.trials_dir == folder / "trials"
    assert backend.scratch == folder / "overlays"
    assert backend.tasks.root == folder / "tasks"
    assert backend.tasks.build_network == "host"
    assert (folder / "trials").is_dir()
    assert (folder / "overlays").is_dir()

    named = HarborBackend(tasks_dir=task, agent="oracle", trials_dir=tmp_path / "mine")
    named.configure(SandboxSettings(folder=str(folder)))
    assert named.trials_dir == tmp_path / "mine"  # the agent's own choice stands
    assert named.scratch == folder / "overlays"


def test_each_trial_reads_its_own_rollouts_prompt_and_the_prepared_task_keeps_its_own(
    tmp_path: Path,
) -> None:
    """Template mode: Harbor reads each trial's instruction from the trial's own copy of the
    prepared task, the rollout's prompt as upstream writes it; rollouts prepared at once see
    none of each other's, and the prepared copy (linked into theirs) is left as it was."""
    from harbor.models.task.task import Task

    prepared = a_task(tmp_path / "tasks" / "0123456789abcdef" / "multiply")
    (prepared / "tests").mkdir()
    (prepared / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    tasks = PreparedTasks(tmp_path / "tasks", DockerEngine())
    trials = tmp_path / "trials"
    prompts = {
        f"rfx-{n}": [
            {"role": "system", "content": "Multiply."},
            {"role": "user", "content": f"{n} * 7?"},
        ]
        for n in range(8)
    }

    async def prepare_all() -> list[Path]:
        return await asyncio.gather(
            *(tasks.instructed(prepared, trials / name, prompt) for name, prompt in prompts.items())
        )

    copies = asyncio.run(prepare_all())
    for (name, prompt), copy in zip(prompts.items(), copies, strict=True):
        assert copy.is_relative_to(trials / name)
        assert json.loads(Task(copy).instruction) == prompt
        assert (copy / "tests" / "test.sh").samefile(prepared / "tests" / "test.sh")
    assert (prepared / "instruction.md").read_text() == "Say hi.\n"
    assert Task(prepared).instruction == "Say hi.\n"
    # No prompt: the task's own instruction, or a refusal saying what is missing.
    assert asyncio.run(tasks.instructed(prepared, trials / "rfx-none", [])) == prepared
    (prepared / "instruction.md").unlink()
    with pytest.raises(TaskError, match=r"has no instruction\.md and the rollout has no prompt"):
        asyncio.run(tasks.instructed(prepared, trials / "rfx-none", []))


def test_ended_trials_folders_past_the_cap_go_oldest_first_and_running_ones_stay(
    tmp_path: Path,
) -> None:
    trials = tmp_path / "trials"
    now = time.time()
    for age, name in (
        (300, "rfx-oldest"),
        (200, "rfx-older"),
        (100, "rfx-newer"),
        (400, "rfx-running"),
    ):
        folder = trials / name
        folder.mkdir(parents=True)
        (folder / "log.bin").write_bytes(b"x" * 2**20)
        os.utime(folder, (now - age, now - age))
    backend = HarborBackend(tasks_dir=a_task(tmp_path / "t"), agent="oracle", trials_dir=trials)
    backend.configure(SandboxSettings(log_retention_seconds=3600, trials_mb=2))
    backend._trials_running.add("rfx-running")  # a trial in use is never pruned
    assert asyncio.run(backend.prune_trials()) == 1
    assert sorted(p.name for p in trials.iterdir()) == ["rfx-newer", "rfx-older", "rfx-running"]


def test_a_git_task_comes_only_from_an_allowed_https_host(tmp_path: Path) -> None:
    tasks = a_task(tmp_path / "tasks")
    row = {"harbor_task": "tasks/one", "git_url": "https://tasks.example.com/org/repo.git"}
    with pytest.raises(TaskError, match="not an https host the operator allowed"):
        task_folder(tasks, TaskMode.DATASET, row)
    allowed = TaskSources(git_hosts=frozenset({"tasks.example.com"}))
    assert task_folder(tasks, TaskMode.DATASET, row, allowed) == "tasks/one"
    for url in ("http://tasks.example.com/r.git", "ssh://tasks.example.com/r", "file:///etc"):
        with pytest.raises(TaskError, match="not an https host"):
            task_folder(tasks, TaskMode.DATASET, {**row, "git_url": url}, allowed)


def test_a_task_path_must_lie_under_tasks_dir_or_a_task_root_links_followed(
    tmp_path: Path,
) -> None:
    tasks = tmp_path / "tasks"
    inside = a_task(tasks / "one")
    outside = a_task(tmp_path / "elsewhere" / "two")
    (tasks / "link").symlink_to(outside)
    assert task_folder(tasks, TaskMode.DATASET, {"harbor_task": str(inside)}) == inside
    for reference in (str(outside), "./link", "./../elsewhere/two", "/etc"):
        with pytest.raises(TaskError, match="outside tasks_dir and the task roots"):
            task_folder(tasks, TaskMode.DATASET, {"harbor_task": reference})
    rooted = TaskSources(roots=(tmp_path / "elsewhere",))
    assert task_folder(tasks, TaskMode.DATASET, {"harbor_task": str(outside)}, rooted) == outside


def test_a_task_is_hashed_in_chunks_its_links_as_links_and_within_a_cap(tmp_path: Path) -> None:
    task = a_task(tmp_path / "task")
    outside = tmp_path / "big.bin"
    outside.write_bytes(b"x" * 4096)
    (task / "link").symlink_to(outside)
    before = content_hash(task)
    outside.write_bytes(b"y" * 4096)  # a link is hashed as its target's name, never read
    assert content_hash(task) == before
    (task / "data.bin").write_bytes(b"z" * 3000)
    with pytest.raises(TaskError, match="holds more than"):
        content_hash(task, cap=2048)
