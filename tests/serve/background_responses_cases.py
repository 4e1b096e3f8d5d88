"""Background responses (deployments/responses_background.py) through the served app and the real
`openai` client: the POST answers at once, a poll ends with what a foreground request answers,
`cancel` stops one and frees its KV, a streamed one streams what the foreground streams and runs
on when its client leaves, to be followed again from any event, and what cannot run in the
background (or be streamed again) is a 400.

Imported by tests/serve/test_openai_api.py so that they run against that module's app."""

from __future__ import annotations

import time

import openai
import pytest

from tests.serve.api_helpers import wait_for_free_kv


def polled(client, response_id: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while (r := client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, f"{response_id} still {r.status} after {timeout_s}s"
        time.sleep(0.05)
    return r


def test_a_background_response_ends_as_the_same_request_in_the_foreground(serve_app, client):
    kwargs = dict(model=serve_app.model, instructions="Be brief.", input="Say something", max_output_tokens=40,
                  temperature=0)
    started = client.responses.create(**kwargs, background=True)
    assert (started.status, started.background, started.output) == ("in_progress", True, [])
    done = polled(client, started.id)
    foreground = client.responses.create(**kwargs)
    assert done.background is True and done.status == foreground.status
    assert (done.output_text, done.usage.output_tokens) == (foreground.output_text, foreground.usage.output_tokens)
    assert [i.id for i in client.responses.input_items.list(done.id).data] != []
    follow = client.responses.create(model=serve_app.model, previous_response_id=done.id, input="More",
                                     max_output_tokens=4, temperature=0)
    assert follow.status in ("completed", "incomplete")
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.cancel(done.id)
    assert "already" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.cancel(foreground.id)
    assert "synchronous" in info.value.body["message"]


LONG = 1500  # output tokens a background response below would write if nothing stopped it


def long_background_response(serve_app, client):
    return client.responses.create(model=serve_app.model, input="Count to a thousand", background=True,
                                   max_output_tokens=LONG, temperature=0, extra_body={"ignore_eos": True})


def generated_tokens(serve_app) -> int:
    return serve_app.target_handle().stats.remote().result()["generation_tokens"]


def test_cancelling_a_background_response_stops_it_and_frees_its_kv(serve_app, client):
    before = generated_tokens(serve_app)
    started = long_background_response(serve_app, client)
    assert serve_app.target_handle().stats.remote().result()["num_requests_running"] == 1
    cancelled = client.responses.cancel(started.id)
    assert (cancelled.id, cancelled.status) == (started.id, "cancelled")
    wait_for_free_kv(serve_app)
    assert generated_tokens(serve_app) - before < LONG  # stopped, not run to its end
    time.sleep(0.2)  # a late final state would have been stored by now
    assert client.responses.retrieve(started.id).status == "cancelled"
    assert client.responses.cancel(started.id).status == "cancelled"  # cancelling again answers the same


def test_deleting_a_running_background_response_stops_it(serve_app, client):
    before = generated_tokens(serve_app)
    started = long_background_response(serve_app, client)
    client.responses.delete(started.id)
    wait_for_free_kv(serve_app)
    assert generated_tokens(serve_app) - before < LONG
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(started.id)


@pytest.mark.parametrize("kwargs, param", [
    ({"store": False}, "background"),
    ({"max_output_tokens": 10 ** 6}, "max_output_tokens"),  # refused by the POST, as in the foreground
])
def test_what_cannot_run_in_the_background_is_a_400(serve_app, client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=serve_app.model, input="hi", background=True, **kwargs)
    assert info.value.status_code == 400 and info.value.body["param"] == param
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nobody")
    kept = client.responses.create(model=serve_app.model, input="hi", max_output_tokens=2)
    unstreamed = client.responses.create(model=serve_app.model, input="hi", max_output_tokens=2, background=True)
    for response_id in (kept.id, unstreamed.id):  # only a streamed background response keeps its events
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.retrieve(response_id, stream=True)
        assert info.value.body["param"] == "stream"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nobody", stream=True)


STREAMED = dict(instructions="Be brief.", input="Tell me a story", max_output_tokens=48, temperature=0)


def event_summary(events) -> list[tuple]:
    """What a client reads of a Responses stream: each event's type and its delta, if any."""
    return [(e.type, getattr(e, "delta", None)) for e in events]


def stream_summary(events) -> tuple[list[str], str]:
    """A Responses stream as two runs of one request stream it: its events but the text deltas,
    and their text joined (how the text is cut into deltas depends on timing)."""
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    return [e.type for e in events if e not in deltas], "".join(e.delta for e in deltas)


def test_a_streamed_background_response_streams_what_the_foreground_streams(serve_app, client):
    foreground = list(client.responses.create(model=serve_app.model, **STREAMED, stream=True))
    background = list(client.responses.create(model=serve_app.model, **STREAMED, stream=True, background=True))
    assert stream_summary(background) == stream_summary(foreground)
    assert [e.sequence_number for e in background] == list(range(len(background)))
    first, last = background[0].response, background[-1].response
    assert first.background and first.status == "in_progress" and last.status == foreground[-1].response.status
    assert client.responses.retrieve(first.id).output_text == last.output_text == foreground[-1].response.output_text


def test_a_client_that_leaves_a_background_stream_leaves_it_running_and_can_follow_it_again(serve_app, client):
    whole = list(client.responses.create(model=serve_app.model, **STREAMED, stream=True, background=True))
    stream = client.responses.create(model=serve_app.model, **STREAMED, stream=True, background=True)
    read = [next(stream) for _ in range(4)]
    stream.close()  # the client leaves
    response_id = read[0].response.id
    done = polled(client, response_id)
    assert done.output_text == whole[-1].response.output_text  # it ran to its end
    again = list(client.responses.retrieve(response_id, stream=True, starting_after=2))
    everything = list(client.responses.retrieve(response_id, stream=True))
    assert [e.sequence_number for e in everything] == list(range(len(everything)))
    assert [e.sequence_number for e in again] == list(range(3, len(everything)))
    assert event_summary(read[:3] + again) == event_summary(everything)  # the same events, kept
    assert stream_summary(everything) == stream_summary(whole)


def test_cancelling_a_streamed_background_response_ends_its_stream_and_frees_its_kv(serve_app, client):
    before = generated_tokens(serve_app)
    stream = client.responses.create(model=serve_app.model, input="Count to a thousand", background=True,
                                     stream=True, max_output_tokens=LONG, temperature=0,
                                     extra_body={"ignore_eos": True})
    created = next(stream)
    assert created.type == "response.created"
    client.responses.cancel(created.response.id)
    rest = list(stream)  # ends where the run stopped, with no final event
    assert not any(e.type in ("response.completed", "response.incomplete") for e in rest)
    wait_for_free_kv(serve_app)
    assert generated_tokens(serve_app) - before < LONG
    assert client.responses.retrieve(created.response.id).status == "cancelled"
