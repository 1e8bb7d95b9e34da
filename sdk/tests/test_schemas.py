"""Wire models: metadata limits (items 5, 60, 141), tool schemas (7, 15), helpers (S§1.9)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollout_sdk import (
    InitResponse,
    OpenAIFunctionCallSchema,
    OpenAIFunctionParametersSchema,
    OpenAIFunctionParsedSchema,
    OpenAIFunctionPropertySchema,
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    ToolResponse,
    set_max_metadata_size_bytes,
)
from rollout_sdk.core import schemas


def request(**fields: object) -> RolloutRequest:
    return RolloutRequest.model_validate(
        {
            "rollout_id": "r",
            "server_url": "http://h",
            "messages": [],
            "completion_params": {},
            **fields,
        }
    )


def test_60_metadata_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        set_max_metadata_size_bytes(0)


def test_metadata_limit_override_applies_to_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schemas, "_metadata_limit_override", None)
    set_max_metadata_size_bytes(2048)
    with pytest.raises(ValidationError, match="metadata size exceeds maximum allowed size of 0MB"):
        request(metadata={"x": "y" * 3000})
    # A request admitted earlier is not judged again (a worker may have other limits).
    admitted = RolloutRequest.model_validate_json(
        request().model_copy(update={"metadata": {"x": "y" * 3000}}).model_dump_json(),
        context={"admitted": True},
    )
    assert len(admitted.metadata["x"]) == 3000
    monkeypatch.setattr(schemas, "_metadata_limit_override", None)


def test_api_key_is_never_in_a_repr() -> None:
    assert "sekrit" not in repr(request(api_key="sekrit"))


def test_schema_objects_serialize_to_the_p13_shape() -> None:
    tool = OpenAIFunctionToolSchema(
        type="function",
        function=OpenAIFunctionSchema(
            name="search",
            description="Search",
            parameters=OpenAIFunctionParametersSchema(
                type="object",
                properties={"q": OpenAIFunctionPropertySchema(type="string", description="query")},
                required=["q"],
            ),
        ),
    )
    assert InitResponse(rollout_id="r", tools=[tool]).model_dump()["tools"][0] == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string", "description": "query", "enum": None}},
                "required": ["q"],
            },
            "strict": False,
        },
    }


def test_nested_schema_keywords_survive() -> None:
    nested = {
        "type": "function",
        "function": {
            "name": "f",
            "description": "d",
            "parameters": {
                "type": "object",
                "properties": {
                    "point": {
                        "type": "object",
                        "properties": {"x": {"type": "number", "minimum": 0}},
                        "required": ["x"],
                    },
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                },
                "required": ["point"],
                "additionalProperties": False,
            },
        },
    }
    dumped = OpenAIFunctionToolSchema.model_validate(nested).model_dump()
    params = dumped["function"]["parameters"]
    assert params["additionalProperties"] is False
    assert params["properties"]["point"]["properties"] == {"x": {"type": "number", "minimum": 0}}
    assert params["properties"]["tags"]["items"] == {"type": "string"}
    assert params["properties"]["tags"]["maxItems"] == 3


def test_function_call_schema_decoding() -> None:
    good = OpenAIFunctionParsedSchema(name="f", arguments='{"a": 1}')
    assert OpenAIFunctionCallSchema.from_openai_function_parsed_schema(good) == (
        OpenAIFunctionCallSchema(name="f", arguments={"a": 1}),
        False,
    )
    for text in ("nope", "[1]"):
        call, error = OpenAIFunctionCallSchema.from_openai_function_parsed_schema(
            OpenAIFunctionParsedSchema(name="f", arguments=text)
        )
        assert (call.arguments, error) == ({}, True)


def test_tool_response() -> None:
    assert ToolResponse().is_empty()
    assert ToolResponse(text="t").is_text_only()
    assert not ToolResponse(text="t", image=["i"]).is_text_only()
    with pytest.raises(ValueError, match="wrap a single item in a list"):
        ToolResponse(image="one.png")
