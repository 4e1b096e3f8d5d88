"""vLLM's `/tokenize` and `/detokenize` shapes (a prompt, or chat messages as the chat route
renders them, tools included)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from deployments.chat_protocol import ChatMessage, ChatTemplateFields
from deployments.tool_protocol import ToolDefinition


class TokenizeCompletionRequest(BaseModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(ChatTemplateFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    return_token_strs: bool = False
    tools: list[ToolDefinition] | None = None


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str
