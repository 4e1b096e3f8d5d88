"""OpenAI's tool-calling shapes: `tools`, `tool_choice`, `message.tool_calls` and their deltas."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class FunctionDefinition(BaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @property
    def schema_(self) -> dict[str, Any]:
        return self.parameters or EMPTY_PARAMETERS


class ToolDefinition(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionName


class AllowedTools(BaseModel):
    mode: Literal["auto", "required"]
    tools: list[NamedToolChoice] = Field(min_length=1)  # each {"type": "function", "function": {"name": ...}}


class AllowedToolsChoice(BaseModel):
    """OpenAI's `allowed_tools`: calls of these tools only, under `mode`, while every tool stays in the
    prompt (so a cached prompt prefix stays the same)."""
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON text, as OpenAI sends it

    @field_validator("arguments", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        """Clients sometimes send the arguments back as an object: accept it as its JSON."""
        return value if isinstance(value, str) else json.dumps(value)


class ToolCall(BaseModel):
    id: str = Field(default_factory=tool_call_id)
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta
