"""OpenAI's tool-calling shapes: `tools`, `tool_choice`, `message.tool_calls` and their deltas, for
function tools and custom tools (whose calls carry one free text, `input`: deployments/custom_tools.py)."""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, field_validator

EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


ToolName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]


class FunctionDefinition(BaseModel):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @property
    def schema_(self) -> dict[str, Any]:
        return self.parameters or EMPTY_PARAMETERS


class ToolDefinition(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition
    _custom: bool = PrivateAttr(False)  # the function a custom tool is offered as (deployments/custom_tools.py)

    @property
    def is_custom(self) -> bool:
        return self._custom


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionName


class TextFormat(BaseModel):
    type: Literal["text"] = "text"


class Grammar(BaseModel):
    definition: str = Field(min_length=1)
    syntax: Literal["lark", "regex"]


class GrammarFormat(BaseModel):
    type: Literal["grammar"]
    grammar: Grammar


class CustomTool(BaseModel):
    name: ToolName
    description: str | None = None
    format: Annotated[TextFormat | GrammarFormat, Field(discriminator="type")] = TextFormat()


class CustomToolDefinition(BaseModel):
    type: Literal["custom"]
    custom: CustomTool


class NamedCustomToolChoice(BaseModel):
    type: Literal["custom"]
    custom: FunctionName


class AllowedTools(BaseModel):
    mode: Literal["auto", "required"]
    # each {"type": "function", "function": {"name": ...}} or {"type": "custom", "custom": {"name": ...}}
    tools: list[NamedToolChoice | NamedCustomToolChoice] = Field(min_length=1)


class AllowedToolsChoice(BaseModel):
    """OpenAI's `allowed_tools`: calls of these tools only, under `mode`, while every tool stays in the
    prompt (so a cached prompt prefix stays the same)."""
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | NamedCustomToolChoice | AllowedToolsChoice


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


class CustomCall(BaseModel):
    name: str
    input: str


class CustomToolCall(BaseModel):
    id: str = Field(default_factory=tool_call_id)
    type: Literal["custom"] = "custom"
    custom: CustomCall


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class CustomCallDelta(BaseModel):
    name: str | None = None
    input: str | None = None


class CustomToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["custom"] | None = None
    custom: CustomCallDelta
