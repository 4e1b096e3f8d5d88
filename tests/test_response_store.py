"""The Responses API's store (deployments/response_store.py) without a server: it keeps the
newest responses and the items they hold, wakes a background run that a cancel or a DELETE
stops, keeps a streamed background response's events for a client that follows it again, and
fails a run that stopped asking; and the Ingress's run asks it again until the response ends."""

from __future__ import annotations

import asyncio

from deployments.response_items import request_items
from deployments.response_store import ResponseStore, StoredResponse
from deployments.responses_api_protocol import ResponseObject
from deployments.responses_background import BackgroundRuns


def test_the_store_keeps_the_newest_responses():
    store = ResponseStore.func_or_class(max_responses=2)

    def put(i: int) -> None:
        asyncio.run(store.put(StoredResponse(ResponseObject(id=f"resp_{i}", model="m"), [])))

    def get(i: int) -> StoredResponse | None:
        return asyncio.run(store.get(f"resp_{i}"))

    for i in (0, 1, 2):
        put(i)
    assert get(0) is None and get(1).response.id == "resp_1"
    put(1)  # stored again: now the newest
    put(3)
    assert get(2) is None and get(1) is not None
    assert asyncio.run(store.delete("resp_1")) and not asyncio.run(store.delete("resp_1")) and get(1) is None


def background_response(status: str = "in_progress") -> StoredResponse:
    return StoredResponse(ResponseObject(id="resp_bg", model="m", background=True, status=status), [])


async def a_waiting_run() -> tuple[ResponseStore, asyncio.Task]:
    """A store keeping a running background response, and its run's wait for a cancel."""
    store = ResponseStore.func_or_class(max_responses=4)
    await store.put(background_response())
    waiting = asyncio.create_task(store.wait_cancelled("resp_bg"))
    await asyncio.sleep(0)
    assert not waiting.done()
    return store, waiting


def test_a_cancel_wakes_the_run_that_waits_for_it_and_the_cancelled_response_stays_cancelled():
    async def scenario():
        store, waiting = await a_waiting_run()
        assert (await store.cancel("resp_bg")).status == "cancelled"
        assert await asyncio.wait_for(waiting, 1) is True
        assert not await store.put(background_response("completed"))  # the run's late final state
        assert (await store.get("resp_bg")).response.status == "cancelled"
        assert (await store.cancel("resp_bg")).status == "cancelled"  # again: the same answer
        assert await store.wait_cancelled("resp_bg") is True  # a run that starts late stops at once
    asyncio.run(scenario())


def test_a_run_that_ends_is_told_it_was_not_cancelled_and_cannot_be_cancelled_after():
    async def scenario():
        store, waiting = await a_waiting_run()
        assert await store.put(background_response("completed"))
        assert await asyncio.wait_for(waiting, 1) is False
        assert (await store.cancel("resp_bg")).status == "completed"  # the ingress answers 400 to this
    asyncio.run(scenario())


def test_deleting_a_running_response_stops_its_run_and_a_synchronous_one_is_never_cancelled():
    async def scenario():
        store, waiting = await a_waiting_run()
        assert await store.delete("resp_bg")
        assert await asyncio.wait_for(waiting, 1) is True
        await store.put(StoredResponse(ResponseObject(id="resp_sync", model="m"), []))  # in_progress, not background
        assert (await store.cancel("resp_sync")).status == "in_progress"
    asyncio.run(scenario())


def test_a_running_response_dropped_for_a_newer_one_stops_its_run_as_a_delete_does():
    async def scenario():
        store, waiting = await a_waiting_run()
        for i in range(4):  # the store keeps 4: resp_bg is dropped
            await store.put(StoredResponse(ResponseObject(id=f"resp_{i}", model="m"), []))
        assert await asyncio.wait_for(waiting, 1) is True and not store._runs and not store._ended
    asyncio.run(scenario())


async def a_streamed_run(events: list[str]) -> ResponseStore:
    """A store keeping a streamed background response that has sent `events` so far."""
    store = ResponseStore.func_or_class(max_responses=1)
    await store.put(background_response(), keep_events=True)
    await store.append_events("resp_bg", events, last=False)
    return store


def test_a_streamed_background_response_is_read_again_after_any_event_and_followed_to_its_end():
    async def scenario():
        store = await a_streamed_run(["e0", "e1"])
        assert await store.events_after("resp_bg", -1) == (["e0", "e1"], False)
        assert await store.events_after("resp_bg", 0) == (["e1"], False)
        follower = asyncio.create_task(store.events_after("resp_bg", 1))  # waits for what comes next
        await asyncio.sleep(0)
        assert not follower.done()
        await store.append_events("resp_bg", ["e2", "e3"], last=False)
        assert await asyncio.wait_for(follower, 1) == (["e2", "e3"], False)
        await store.append_events("resp_bg", ["e4"], last=True)
        assert await store.events_after("resp_bg", 3) == (["e4"], True)
        assert await store.events_after("resp_bg", 4) == ([], True)  # past the end: nothing to wait for
        assert await store.events_after("resp_sync", -1) is None  # kept no events
    asyncio.run(scenario())


def test_a_cancel_ends_the_stream_where_the_run_stopped_and_dropping_the_response_its_readers():
    async def scenario():
        store = await a_streamed_run(["e0"])
        follower = asyncio.create_task(store.events_after("resp_bg", 0))
        await asyncio.sleep(0)
        await store.cancel("resp_bg")
        assert await asyncio.wait_for(follower, 1) == ([], True)
        await store.append_events("resp_bg", ["late"], last=True)  # what the stopped run still sent
        assert await store.events_after("resp_bg", -1) == (["e0"], True)

        store = await a_streamed_run(["e0"])
        follower = asyncio.create_task(store.events_after("resp_bg", 0))
        await asyncio.sleep(0)
        await store.put(StoredResponse(ResponseObject(id="resp_newer", model="m"), []))  # drops resp_bg (1 kept)
        assert await asyncio.wait_for(follower, 1) is None
        assert await store.events_after("resp_bg", -1) is None
    asyncio.run(scenario())


def test_the_oldest_ended_streams_events_go_past_the_budget_and_no_running_stream_is_cut():
    async def scenario():
        event = "é" * 50  # 100 bytes in UTF-8: the budget counts bytes, not characters
        store = ResponseStore.func_or_class(max_responses=8, max_event_bytes=1000, ended_events_kept_s=0)
        for i in range(3):  # three streams of 300 bytes, two of them ended
            stored = StoredResponse(ResponseObject(id=f"resp_{i}", model="m", background=True, status="in_progress"), [])
            await store.put(stored, keep_events=True)
            await store.append_events(f"resp_{i}", [event] * 3, last=i < 2)
        assert [await store.events_after(f"resp_{i}", -1) is not None for i in range(3)] == [True] * 3
        await store.append_events("resp_2", [event] * 2, last=False)  # 1,100 bytes: the oldest ended goes
        assert await store.events_after("resp_0", -1) is None
        assert await store.events_after("resp_1", -1) == ([event] * 3, True)
        assert (await store.get("resp_0")).response.id == "resp_0"  # still read whole
        await store.append_events("resp_2", [event] * 6, last=False)  # the running one alone passes it
        assert await store.events_after("resp_1", -1) is None
        assert await store.events_after("resp_2", 9) == ([event], False)  # kept, all 11 of them
        assert store._event_bytes == 1100
        await store.append_events("resp_2", [], last=True)  # ended: now it goes too
        assert await store.events_after("resp_2", -1) is None and store._event_bytes == 0
    asyncio.run(scenario())


def test_a_client_following_a_stream_over_the_budget_as_it_ends_still_reads_its_last_events():
    async def scenario():
        store = ResponseStore.func_or_class(max_responses=2, max_event_bytes=1)
        for response_id in ("resp_bg", "resp_other"):
            await store.put(StoredResponse(ResponseObject(id=response_id, model="m", background=True,
                                                          status="in_progress"), []), keep_events=True)
        await store.append_events("resp_bg", ["e0"], last=False)
        follower = asyncio.create_task(store.events_after("resp_bg", 0))  # as the POST's own stream does
        await asyncio.sleep(0)
        await store.append_events("resp_bg", ["e1", "done"], last=True)
        assert await asyncio.wait_for(follower, 1) == (["e1", "done"], True)
        store.ended_events_kept_s = 0
        await store.append_events("resp_other", ["x"], last=False)  # a later append finds it ended long enough
        assert await store.events_after("resp_bg", -1) is None
    asyncio.run(scenario())


def test_a_run_that_stops_asking_is_lost_and_its_response_failed_but_one_that_asks_is_not():
    async def scenario():
        store = ResponseStore.func_or_class(max_responses=4, run_poll_s=0.05, run_lost_s=0.2)
        await store.put(background_response(), keep_events=True)
        await store.append_events("resp_bg", ["e0"], last=False)
        for _ in range(8):  # an alive run: its waits return (None: still running) and it asks again
            assert await store.wait_cancelled("resp_bg") is None
        assert (await store.get("resp_bg")).response.status == "in_progress"
        follower = asyncio.create_task(store.events_after("resp_bg", 0))
        await asyncio.sleep(0.4)  # the run asks no more: its replica died
        stored = await store.get("resp_bg")
        assert stored.response.status == "failed" and "lost" in stored.response.error.message
        events, ended = await asyncio.wait_for(follower, 1)
        assert ended and len(events) == 1 and '"sequence_number": 1' in events[0] and "response.failed" in events[0]
        assert (await store.cancel("resp_bg")).status == "failed"  # the ingress answers 400 to this
    asyncio.run(scenario())


def test_a_run_asks_the_store_again_until_its_response_ends():
    class Method:
        def __init__(self, answers):
            self.answers, self.calls = list(answers), 0

        async def remote(self, response_id):
            self.calls += 1
            return self.answers.pop(0)

    runs = BackgroundRuns()
    runs.response_store = type("Store", (), {})()
    for answers, stop in (([None, None, True], True), ([None, False], False)):
        runs.response_store.wait_cancelled = Method(answers)
        assert asyncio.run(runs._stop_asked("resp_bg")) is stop
        assert runs.response_store.wait_cancelled.calls == len(answers)


def test_a_conversations_responses_share_the_items_they_repeat_and_keep_their_own_copies_of_changed_ones():
    async def scenario():
        store = ResponseStore.func_or_class(max_responses=4)
        turn = request_items([{"id": "msg_a", "role": "user", "content": "Hi"}])
        await store.put(StoredResponse(ResponseObject(id="resp_1", model="m"), turn))
        first = (await store.get("resp_1")).input_items
        sent_again = [dict(item) for item in first]  # as a follow-up's request brings them: copies
        await store.put(StoredResponse(ResponseObject(id="resp_2", model="m"), sent_again))
        assert (await store.get("resp_2")).input_items[0] is first[0]  # kept once, not once a response
        changed = [{**first[0], "content": [{"type": "input_text", "text": "Bye"}]}]  # same id, other content
        await store.put(StoredResponse(ResponseObject(id="resp_3", model="m"), changed))
        assert (await store.get("resp_3")).input_items == changed
        assert (await store.get("resp_1")).input_items[0]["content"] == first[0]["content"]
    asyncio.run(scenario())


def test_the_store_finds_the_items_of_the_responses_it_keeps_and_forgets_those_of_none():
    async def scenario():
        store = ResponseStore.func_or_class(max_responses=2)
        first = StoredResponse(ResponseObject(id="resp_1", model="m"), request_items([{"id": "msg_a", "role": "user",
                                                                                        "content": "Hi"}]))
        await store.put(first)
        await store.put(StoredResponse(ResponseObject(id="resp_2", model="m"), first.conversation +
                                       request_items([{"id": "msg_b", "role": "user", "content": "More"}])))
        assert set(await store.items(["msg_a", "msg_b", "msg_z"])) == {"msg_a", "msg_b"}
        await store.delete("resp_2")
        assert set(await store.items(["msg_a", "msg_b"])) == {"msg_a"}  # resp_1 still holds it
        await store.put(StoredResponse(ResponseObject(id="resp_3", model="m"), []))
        await store.put(StoredResponse(ResponseObject(id="resp_4", model="m"), []))  # resp_1 dropped
        assert await store.items(["msg_a"]) == {} and not store._items
    asyncio.run(scenario())
