"""tools.py of the quick-start project layout (001 points to the example repo for it)."""

import json

from osmosis_ai.rollout.tools import create_tool_result, get_tool_call_info

CALCULATOR_TOOL_SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.capitalize()} two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
    for name in ("add", "multiply")
]


async def execute_tools(tool_calls):
    results = []
    for call in tool_calls:
        call_id, name, args = get_tool_call_info(call)
        value = args["a"] + args["b"] if name == "add" else round(args["a"] * args["b"], 4)
        results.append(create_tool_result(call_id, json.dumps(value)))
    return results
