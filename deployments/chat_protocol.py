"""The chat completions request: its messages, how they go through the model's chat template (fields
`/tokenize` shares), and its tools, over the sampling fields of deployments/protocol.py. Custom tools
and calls become their functions' as they are read (deployments/custom_tools.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, Field, ValidationInfo, field_validator, model_validator

from deployments.custom_tools import as_functions, custom_call, function_call, function_choice
from deployments.protocol import MAX_LOGPROBS, SamplingFields, TextPart
from deployments.tool_protocol import CustomToolCall, CustomToolDefinition, ToolCall, ToolChoice, ToolDefinition

# transformers' `apply_chat_template` arguments, which `chat_template_kwargs` may not set.
TEMPLATE_CALL_ARGUMENTS = frozenset((
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"))


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    # an assistant turn that called tools (a custom tool's call: as its function's, deployments/custom_tools.py)
    tool_calls: list[ToolCall | CustomToolCall] | None = None
    tool_call_id: str | None = None  # a tool turn: the call it answers
    # An assistant turn's reasoning, fed back: vLLM's `reasoning`, or `reasoning_content`, its old
    # name, which DeepSeek's API and many clients send.
    reasoning: str | None = Field(None, validation_alias=AliasChoices("reasoning", "reasoning_content"))

    @model_validator(mode="after")
    def _custom_calls_as_functions(self) -> "ChatMessage":
        if self.tool_calls:
            self.tool_calls = [function_call(c) for c in self.tool_calls]
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatTemplateFields(BaseModel):
    """How the messages go through the model's chat template (vLLM's fields, on chat and on
    chat /tokenize alike)."""
    add_generation_prompt: bool = True  # open an assistant turn after the messages
    continue_final_message: bool = False  # leave the last (assistant) message open, to be continued
    add_special_tokens: bool = False  # BOS and the like on top of the template's (which writes them)
    documents: list[dict[str, str]] | None = None  # for templates that render retrieved documents
    # More variables for the template, e.g. Qwen3's {"enable_thinking": false}.
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's, a template variable as vLLM passes it (gpt-oss's templates read it); see template_variables.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    # A template of the request's own: refused, as vLLM refuses one without
    # --trust-request-chat-template (it runs as code in the server's renderer).
    chat_template: str | None = None

    @property
    def template_variables(self) -> dict[str, Any]:
        """The template's variables beyond the messages: `chat_template_kwargs`, over what
        `reasoning_effort` implies as vLLM does (`reasoning_effort` itself, and `enable_thinking`
        false for "none", true otherwise)."""
        implied = {} if self.reasoning_effort is None else {
            "reasoning_effort": self.reasoning_effort, "enable_thinking": self.reasoning_effort != "none"}
        return implied | (self.chat_template_kwargs or {})

    @model_validator(mode="after")
    def _check_template_fields(self) -> "ChatTemplateFields":
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError("continue_final_message needs add_generation_prompt to be false "
                             "(a final message is continued, or a new assistant turn is opened)")
        if self.chat_template is not None:
            raise ValueError("chat_template: this server renders messages with the model's own chat "
                             "template only; a request's template is not accepted")
        taken = sorted(set(self.chat_template_kwargs or ()) & TEMPLATE_CALL_ARGUMENTS)
        if taken:
            raise ValueError(f"chat_template_kwargs cannot set {', '.join(taken)}: the server sets "
                             "those (add_generation_prompt and continue_final_message are request fields)")
        return self


class ChatCompletionRequest(SamplingFields, ChatTemplateFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # custom tools (OpenAI's `{"type": "custom", ...}`) become functions of one `input` (deployments/custom_tools.py)
    tools: list[ToolDefinition | CustomToolDefinition] | None = None
    tool_choice: ToolChoice | None = None  # None: "auto" with tools, "none" without
    parallel_tool_calls: bool = True
    echo: bool = False  # vLLM's: the reply's content starts with the last message's, if that is the assistant's
    include_reasoning: bool = True  # vLLM's: false leaves a thinking model's reasoning out of the reply

    @model_validator(mode="after")
    def _check(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs to be true")
        return self

    @field_validator("tools")
    @classmethod
    def _custom_tools_as_functions(cls, tools):
        return as_functions(tools)

    @field_validator("tool_choice")
    @classmethod
    def _custom_choice_as_a_function(cls, choice, info: ValidationInfo):
        return function_choice(choice, info.data.get("tools"))

    def as_reply_call(self, call: ToolCall) -> ToolCall | CustomToolCall:
        """A call as the reply gives it: a custom tool's with its input."""
        return custom_call(call) if self.calls_custom_tool(call.function.name) else call

    def calls_custom_tool(self, name: str) -> bool:
        return any(t.function.name == name and t.is_custom for t in self.tools or ())

    @property
    def echoed_text(self) -> str:
        """What `echo` puts before the reply: the final assistant message being continued."""
        last = self.messages[-1]
        return last.text() if self.echo and last.role == "assistant" else ""

    @property
    def effective_tool_choice(self) -> ToolChoice:
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def beam_search_conflicts(self) -> list[str]:
        tools = ["tools"] if self.tools and self.tool_choice != "none" else []
        return super().beam_search_conflicts() + (["logprobs"] if self.logprobs else []) + tools
