"""The OpenAI response shapes the ingress writes (completions, chat, streamed chunks, models,
errors), with vLLM's extras (`prompt_logprobs`, `stop_reason`, `max_model_len`); the requests are in
deployments/protocol.py and deployments/chat_protocol.py."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field

from deployments.tool_protocol import CustomToolCall, CustomToolCallDelta, ToolCall, ToolCallDelta


# vLLM's extra on a choice: the stop string, or the request's own stop token id, that ended it
# (finish_reason "stop"); None when it ended otherwise, the model's EOS included.
StopReason = str | int | None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # of the prompt's tokens, those the prefix cache held


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0  # of the completion's tokens, those written before the reasoning ended
    # With a `prediction`: its tokens that were drafted and kept, and drafted and refused (OpenAI
    # counts a prediction's tokens that appear in the completion or not; here, those speculation tried)
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None  # with a reasoning parser or a prediction


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptTokenLogprob(BaseModel):
    """vLLM's shape for one entry of `prompt_logprobs`."""
    logprob: float
    rank: int | None = None
    decoded_token: str


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: StopReason = None
    # vLLM's: per prompt token (the first None), the token and its top alternatives by id.
    prompt_logprobs: list[dict[int, PromptTokenLogprob] | None] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning: str | None = None  # a thinking model's, with the app's `reasoning_parser`
    tool_calls: list[ToolCall | CustomToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: StopReason = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta | CustomToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: StopReason = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "specserve"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
