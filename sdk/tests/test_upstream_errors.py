"""Errors users handle by type and key phrase are upstream's: the
type is the same and our message contains upstream's phrase."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from rollout_sdk import (
    CompletionsRequest,
    ExecutionRequest,
    RolloutAgentLoop,
    RolloutContext,
    RolloutInitRequest,
    RolloutRequest,
    RolloutResult,
    ServeError,
    serve_agent_loop,
)
from rollout_sdk.cli_utils import CLIError, load_agent_loop
from rollout_sdk.client import RolloutProtocolError

MESSAGES = [{"role": "user", "content": "hi"}]


class Echo(RolloutAgentLoop):
    name = "echo"

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        return ctx.complete([])


@pytest.mark.parametrize("name", [None, ""], ids=["missing", "empty"])
def test_an_agent_loop_without_a_name_is_a_type_error(name: str | None) -> None:
    namespace: dict[str, Any] = {
        "get_tools": Echo.get_tools,
        "run": Echo.run,
        **({} if name is None else {"name": name}),
    }
    with pytest.raises(TypeError, match="Agent loop class Nameless must define a 'name' class"):
        type("Nameless", (RolloutAgentLoop,), namespace)


def test_a_blank_v1_rollout_id_is_rejected_with_upstreams_words() -> None:
    with pytest.raises(ValidationError, match="rollout_id cannot be empty or whitespace only"):
        RolloutRequest(
            rollout_id="  ", server_url="http://t", messages=MESSAGES, completion_params={}
        )
    with pytest.raises(ValidationError, match="rollout_id cannot be empty or whitespace only"):
        CompletionsRequest(rollout_id=" ", messages=MESSAGES)
    with pytest.raises(ValidationError, match="server_url must use http or https scheme"):
        RolloutRequest(rollout_id="r", server_url="ftp://t", messages=[], completion_params={})
    with pytest.raises(ValidationError, match="server_url must have a valid host"):
        RolloutRequest(rollout_id="r", server_url="http://", messages=[], completion_params={})


@pytest.mark.parametrize("rollout_id", ["", ".", "a/b"])
def test_a_blank_v2_rollout_id_is_rejected_with_upstreams_words(rollout_id: str) -> None:
    with pytest.raises(ValidationError, match="rollout_id must be a single path segment"):
        RolloutInitRequest(
            rollout_id=rollout_id, initial_messages=MESSAGES, chat_completions_url="http://t"
        )
    with pytest.raises(ValidationError, match="rollout_id must be a single path segment"):
        ExecutionRequest(id=rollout_id, prompt=MESSAGES)


MISSING = """
import sys
for name in sys.argv[1:]:
    sys.modules[name] = None  # as if not installed
from rollout_sdk.compat import install_osmosis_alias
install_osmosis_alias()
from osmosis_ai.rollout import create_app, create_rollout_server, serve_agent_loop
for call in (
    lambda: create_app(None),
    lambda: create_rollout_server(backend=None),
    lambda: serve_agent_loop(None),
):
    try:
        call()
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}")
"""


def _errors_without(*modules: str) -> list[str]:
    run = subprocess.run(
        [sys.executable, "-c", MISSING, *modules], capture_output=True, text=True, check=True
    )
    return run.stdout.splitlines()


def test_without_fastapi_the_servers_import_and_calling_one_says_what_to_install() -> None:
    hint = "Install it with: pip install 'rollout-sdk[server]'"
    assert _errors_without("fastapi", "uvicorn") == [
        f"ImportError: FastAPI is required for create_app(). {hint}",
        f"ImportError: FastAPI is required for create_rollout_server(). {hint}",
        f"ImportError: FastAPI is required for serve_agent_loop(). {hint}",
    ]
    assert _errors_without("uvicorn")[-1] == (
        f"ImportError: uvicorn is required for serve_agent_loop(). {hint}"
    )


def test_an_api_key_in_local_debug_mode_is_a_serve_error() -> None:
    with pytest.raises(ServeError, match="local_debug=True disables API key authentication"):
        serve_agent_loop(Echo(), api_key="k", local_debug=True, validate=False)


def test_cli_utils_fail_with_cli_error() -> None:
    with pytest.raises(CLIError, match="no_such_module_anywhere"):
        load_agent_loop("no_such_module_anywhere:agent")


def test_a_protocol_error_is_a_runtime_error() -> None:
    error = RolloutProtocolError("bad answer", status_code=502)
    assert isinstance(error, RuntimeError)
    assert error.status_code == 502


def test_optional_dependencies_are_imported_on_first_use() -> None:
    import fastapi

    from rollout_sdk import _compat

    assert _compat.FASTAPI_AVAILABLE is True
    assert _compat.fastapi is fastapi
    assert _compat.import_optional("no_such_module_anywhere") == (None, False)
    with pytest.raises(ImportError, match=r"pip install 'rollout-sdk\[extra\]'"):
        _compat.require_optional("no_such_module_anywhere", install_extra="extra")


@pytest.mark.anyio
async def test_the_llm_clients_key_is_readable_as_upstreams_attribute() -> None:
    """``OsmosisLLMClient(...).api_key`` is the key the client sends (``None`` without)."""
    from osmosis_ai.rollout import OsmosisLLMClient

    async with OsmosisLLMClient("http://127.0.0.1:9", "r1", api_key="sk-k") as keyed:
        assert keyed.api_key == "sk-k"
    async with OsmosisLLMClient("http://127.0.0.1:9", "r1") as keyless:
        assert keyless.api_key is None
