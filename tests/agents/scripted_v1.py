"""A v1 agent whose behaviour each request picks through ``metadata``.

``metadata["script"]`` is a list of steps run in order (default: echo the request, one chat,
complete):

    {"chat": {...kwargs}}       ctx.chat(history, **kwargs); the reply is appended
    {"inspect_chat": {...}}     like chat, but append what the agent received as JSON
    {"sleep": seconds}          asyncio.sleep
    {"block": seconds}          time.sleep (blocks the worker's event loop)
    {"record_tool_call": ms}    ctx.record_tool_call(latency_ms=ms)
    {"log": "event"}            ctx.log_event("event", step=i)
    {"echo_request": true}      append the request (minus api_key) as an assistant message
    {"raise": "message"}        raise RuntimeError(message)
    {"exit": code}              os._exit(code): the agent kills its worker process
    {"error": "message"}        return ctx.error(message, final_messages=history)
    {"complete": {...kwargs}}   return ctx.complete(history, **kwargs)

``metadata["get_tools"]`` picks the tools answer: "ok" (default), "raise", "hang",
"invalid" (a tool without a name), "no_description".
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from rollout_sdk import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "number"},
                    "b": {"type": "number", "minimum": 0},
                    "items": {"type": "array", "items": {"type": "integer"}},
                },
                "required": ["a", "b"],
            },
        },
    }
]

DEFAULT_SCRIPT: list[dict[str, Any]] = [{"echo_request": True}, {"chat": {}}, {"complete": {}}]


class ScriptedAgent(RolloutAgentLoop):
    name = "scripted"

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        mode = request.metadata.get("get_tools", "ok")
        if mode == "raise":
            raise RuntimeError(f"get_tools exploded for {request.rollout_id}")
        if mode == "hang":
            time.sleep(float(request.metadata.get("hang_s", 30)))
        if mode == "invalid":
            return [{"type": "function", "function": {"description": "a tool without a name"}}]
        if mode == "no_description":
            return [{"type": "function", "function": {"name": "nodesc"}}]
        return TOOLS

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        history = list(ctx.request.messages)
        for index, step in enumerate(ctx.request.metadata.get("script", DEFAULT_SCRIPT)):
            action, argument = next(iter(step.items()))
            if action == "chat":
                reply = await ctx.chat(history, **argument)
                history.append(reply.message)
            elif action == "inspect_chat":
                reply = await ctx.chat(history, **argument)
                seen = {
                    "message": reply.message,
                    "finish_reason": reply.finish_reason,
                    "usage": reply.usage,
                    "token_ids": reply.token_ids,
                    "logprobs": reply.logprobs,
                    "tool_calls": reply.tool_calls,
                }
                history.append({"role": "assistant", "content": json.dumps(seen)})
            elif action == "sleep":
                await asyncio.sleep(argument)
            elif action == "block":
                time.sleep(argument)  # noqa: ASYNC251 - the point: an agent that blocks its loop
            elif action == "record_tool_call":
                ctx.record_tool_call(latency_ms=argument)
            elif action == "log":
                ctx.log_event(argument, step=index)
            elif action == "echo_request":
                echo = ctx.request.model_dump(exclude={"api_key"})
                history.append({"role": "assistant", "content": json.dumps(echo)})
            elif action == "raise":
                raise RuntimeError(argument)
            elif action == "exit":
                os._exit(argument)
            elif action == "error":
                return ctx.error(argument, final_messages=history)
            elif action == "complete":
                return ctx.complete(history, **argument)
        return ctx.complete(history)


agent_loop = ScriptedAgent()
