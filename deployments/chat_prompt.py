"""A chat request's prompt: its messages (and tools) through the model's chat template, with
the request's template fields (deployments/chat_protocol.py: ChatTemplateFields)."""

from __future__ import annotations

from deployments.harmony_prompt import check_reasoning_effort, harmony_messages, harmony_tools
from deployments.openai_errors import OpenAIError
from deployments.tool_calls import ToolCallSyntax, render_messages


def chat_prompt_ids(tokenizer, body, tool_syntax: ToolCallSyntax, native_tools: bool) -> list[int]:
    """The prompt ids of a chat (or chat /tokenize) request. Tools are written into the messages
    where the template does not take them itself (deployments/tool_calls.py: render_messages)."""
    if not getattr(tokenizer, "chat_template", None):
        raise OpenAIError(400, "this model has no chat template; use /v1/completions")
    if tool_syntax.harmony:
        check_reasoning_effort(body.template_variables.get("reasoning_effort"))
    try:
        try:
            text = _render(tokenizer, body, tool_syntax, native_tools, arguments_as_text=False)
        except TypeError:  # a template that adds a call's arguments to a string (DeepSeek's) takes them as text
            text = _render(tokenizer, body, tool_syntax, native_tools, arguments_as_text=True)
    except Exception as exc:  # noqa: BLE001 - a template that refuses the messages
        raise OpenAIError(400, f"the chat template could not render the messages: {exc}",
                          param="messages") from None
    return tokenizer.encode(text, add_special_tokens=body.add_special_tokens)


def _render(tokenizer, body, tool_syntax: ToolCallSyntax, native_tools: bool, arguments_as_text: bool) -> str:
    messages = render_messages(body.messages, body.tools, tool_syntax, native_tools, arguments_as_text)
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools and native_tools else None
    if tool_syntax.harmony and native_tools:  # gpt-oss's template (deployments/harmony_prompt.py)
        messages, tools = harmony_messages(messages), harmony_tools(tools)
    return tokenizer.apply_chat_template(
        messages, tools=tools, documents=body.documents, add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message, tokenize=False, **body.template_variables)
