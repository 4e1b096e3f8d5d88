"""Background responses (deployments/responses_background.py) through the served app and the real
`openai` client: the POST answers at once, a poll ends with what a foreground request answers,
`cancel` stops one and frees its KV, and what cannot run in the background is a 400 (streaming
it, or streaming a stored response again).

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
    ({"stream": True}, "stream"),
    ({"max_output_tokens": 10 ** 6}, "max_output_tokens"),  # refused by the POST, as in the foreground
])
def test_what_cannot_run_in_the_background_is_a_400(serve_app, client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=serve_app.model, input="hi", background=True, **kwargs)
    assert info.value.status_code == 400 and info.value.body["param"] == param
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nobody")
    kept = client.responses.create(model=serve_app.model, input="hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.retrieve(kept.id, stream=True)
    assert info.value.body["param"] == "stream"
