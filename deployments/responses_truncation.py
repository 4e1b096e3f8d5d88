"""The Responses API's `truncation: "auto"`: a conversation too long for the model's context loses
its oldest turns until its prompt fits, as OpenAI drops input items from the middle of a
conversation. The leading system (and developer) messages, the instructions among them, stay,
and so does the last turn: a conversation that does not fit with its last turn alone is refused
as one with truncation off is.

A turn is a user message and what follows it up to the next one (the assistant's reply, its
calls and their tools' outputs), so a call is never kept without the turn that made it.
"""

from __future__ import annotations

from typing import Callable

from deployments.chat_protocol import ChatCompletionRequest, ChatMessage

HEAD_ROLES = ("system", "developer")


def conversation_turns(messages: list[ChatMessage]) -> tuple[list[ChatMessage], list[list[ChatMessage]]]:
    """The leading system messages, and the turns after them."""
    start = next((i for i, m in enumerate(messages) if m.role not in HEAD_ROLES), len(messages))
    turns: list[list[ChatMessage]] = []
    for m in messages[start:]:
        if m.role == "user" or not turns:
            turns.append([])
        turns[-1].append(m)
    return messages[:start], turns


def truncated_to_fit(chat: ChatCompletionRequest, render: Callable[[ChatCompletionRequest], list[int]],
                     room: int) -> tuple[ChatCompletionRequest, list[int]]:
    """`chat` with the fewest oldest turns left out for its prompt to take at most `room`
    tokens, and that prompt; `render` gives a request's prompt. The prompt shrinks as turns go,
    so the count is found by bisection: a few renders, however long the conversation."""
    prompt = render(chat)
    head, turns = conversation_turns(chat.messages)
    if len(prompt) <= room or len(turns) < 2:  # the last turn always stays
        return chat, prompt

    def without(dropped: int) -> ChatCompletionRequest:
        return chat.model_copy(update={"messages": head + [m for turn in turns[dropped:] for m in turn]})

    fewest, most = 1, len(turns) - 1
    fitted = {}
    while fewest < most:
        middle = (fewest + most) // 2
        fitted[middle] = render(without(middle))
        if len(fitted[middle]) <= room:
            most = middle
        else:
            fewest = middle + 1
    kept = without(most)
    return kept, fitted[most] if most in fitted else render(kept)
