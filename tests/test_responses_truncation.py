"""`truncation: "auto"` without a server: the fewest oldest turns go, the system messages and the
last turn stay, and a call stays with the turn that made it and the output that answered it."""

from __future__ import annotations

from deployments.responses_api_input import chat_request
from deployments.responses_api_protocol import ResponsesRequest
from deployments.responses_truncation import conversation_turns, truncated_to_fit

CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}


def request(turns: int, words: int = 10):
    """A conversation of `turns` user turns (each answered, the second by a call and its output),
    then a last question; `words` words a message."""
    items = []
    for t in range(turns):
        items.append({"role": "user", "content": f"question {t} " + "word " * words})
        items += [CALL, OUTPUT] if t == 1 else []
        items.append({"role": "assistant", "content": f"answer {t} " + "word " * words})
    items.append({"role": "user", "content": "the last question"})
    return chat_request(ResponsesRequest.model_validate({"instructions": "Be brief.", "input": items}))


def length(chat) -> int:
    """A stand-in for a template: each message's words, and 3 for its frame."""
    return sum(len((m.content or "").split()) + 3 + 5 * len(m.tool_calls or ()) for m in chat.messages)


def render(chat) -> list[int]:
    return [0] * length(chat)


def test_a_conversation_that_fits_is_left_as_it_is():
    chat = request(4)
    assert truncated_to_fit(chat, render, length(chat)) == (chat, render(chat))


def test_the_fewest_oldest_turns_go():
    chat = request(6)
    head, turns = conversation_turns(chat.messages)
    assert [m.role for m in head] == ["system"] and len(turns) == 7
    assert [m.role for m in turns[1]] == ["user", "assistant", "tool", "assistant"]
    for room in range(length(chat) - 1, length(request(0)) - 1, -7):
        kept, prompt = truncated_to_fit(chat, render, room)
        assert prompt == render(kept)
        dropped = len(turns) - len(conversation_turns(kept.messages)[1])
        assert kept.messages[0] == head[0] and kept.messages[-1] == chat.messages[-1]
        assert kept.messages[1:] == [m for turn in turns[dropped:] for m in turn]  # whole turns, the oldest
        assert length(kept) <= room < length(chat.model_copy(update={"messages": head + [
            m for turn in turns[dropped - 1:] for m in turn]}))  # one turn fewer would not fit


def test_the_last_turn_stays_even_when_it_alone_does_not_fit():
    chat = request(3)
    kept, _ = truncated_to_fit(chat, render, 1)
    assert [m.content for m in kept.messages] == ["Be brief.", "the last question"]


def test_the_stored_conversation_is_not_what_truncation_drops():
    chat = request(3)
    truncated_to_fit(chat, render, length(request(1)))
    assert len(chat.messages) == len(request(3).messages)
