"""OpenAI's Responses API (`/v1/responses`): the request a client sends and the response object,
output items and stream events written back. The ingress answers it as a chat completion
(deployments/responses_api_input.py turns the request into one); the shapes of completions and
chat are in deployments/protocol.py, deployments/chat_protocol.py and deployments/responses.py.

Responses are kept (`store`, OpenAI's default) in memory, up to the app's
`max_stored_responses` (deployments/response_store.py), so that `previous_response_id`
continues one and `GET /v1/responses/{id}` reads it; `background` ones run on after the POST
(deployments/responses_background.py). OpenAI's stored conversations and prompts
(`conversation`, `prompt`) are not kept: those are refused with a 400.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from deployments.protocol import MAX_LOGPROBS
from deployments.request_ids import MAX_REQUEST_ID_CHARS
from deployments.responses import ChatTokenLogprob

OUTPUT_LOGPROBS = "message.output_text.logprobs"  # the `include` value that asks for logprobs
# Fields that need responses kept on the server: a 400 each, not a silent fresh start.
NEEDS_STORED_RESPONSES = ("conversation", "prompt")  # OpenAI's stored conversations and prompts

# The chat-completion fields (vLLM's extras among them) a Responses request may also set, as
# vLLM's Responses API takes them; they pass to the chat request unchanged.
SAMPLING_EXTRAS = ("top_k", "min_p", "min_tokens", "seed", "stop", "presence_penalty",
                   "frequency_penalty", "repetition_penalty", "logit_bias", "allowed_token_ids", "bad_words",
                   "ignore_eos", "stop_token_ids", "skip_special_tokens", "include_stop_str_in_output",
                   "return_tokens_as_token_ids", "speculative_decoding", "truncate_prompt_tokens",
                   "chat_template_kwargs", "cache_salt", "priority", "logits_processors")

Status = Literal["in_progress", "completed", "incomplete"]


# -- the request ----------------------------------------------------------------------------
class TextFormat(BaseModel):
    """`text.format`: plain text, a JSON schema (`name`, `schema`, `strict` beside `type`,
    not nested as chat's `response_format` has them), or any JSON object."""
    model_config = ConfigDict(populate_by_name=True)

    type: Literal["text", "json_schema", "json_object"]
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "TextFormat":
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError('text.format of type "json_schema" needs a "schema"')
        return self


class TextConfig(BaseModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(BaseModel):
    """Fields this server does not know are kept aside (`ignored_fields`) and logged."""
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None  # a system message before the input
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    include: list[str] | None = None
    stream: bool = False
    store: bool = True  # kept for `previous_response_id` and GET (deployments/response_store.py)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    truncation: Literal["disabled", "auto"] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: dict[str, Any] | None = None  # its `effort` is chat's `reasoning_effort`; summaries are not written
    background: bool = False
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None  # a stored prompt template, by id
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID_CHARS)  # vLLM's

    @property
    def ignored_fields(self) -> list[str]:
        return sorted(set(self.model_extra or ()) - set(SAMPLING_EXTRAS))

    @property
    def sampling_extras(self) -> dict[str, Any]:
        return {k: v for k, v in (self.model_extra or {}).items() if k in SAMPLING_EXTRAS}

    @property
    def wants_logprobs(self) -> bool:
        return OUTPUT_LOGPROBS in (self.include or ())


# -- what is written back -------------------------------------------------------------------
class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[ChatTokenLogprob] | None = None


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    """A thinking model's reasoning, with the app's `reasoning_parser` (deployments/reasoning.py);
    no summaries are written."""
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    status: Status


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Status
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionToolCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str  # the item's own id
    call_id: str  # what the client's `function_call_output` item names
    name: str
    arguments: str  # a JSON text
    status: Status = "completed"


class CustomToolCallItem(BaseModel):
    """A call of a custom tool (deployments/custom_tools.py): its input, free text."""
    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str  # what the client's `custom_tool_call_output` item names
    name: str
    input: str
    status: Status = "completed"


OutputItem = ReasoningItem | OutputMessage | FunctionToolCall | CustomToolCallItem


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: Literal["in_progress", "completed", "incomplete", "failed", "cancelled"] = "in_progress"
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    truncation: str = "disabled"
    reasoning: dict[str, Any] | None = None  # as the request gave it (its effort reached the template)
    usage: ResponseUsage | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    store: bool = False
    background: bool = False
