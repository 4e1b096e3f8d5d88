"""The ingress reads each target stream with `MergedOutputs`: a reader that keeps up gets every
output as it came; outputs that arrive while it is busy come out as one; errors and the end
come after what arrived before them; closing stops the reading task."""

from __future__ import annotations

import asyncio

import pytest

from app.outputs import RequestOutput
from deployments.choices import MergedOutputs


class Stream:
    """A target stream the test feeds by hand."""

    def __init__(self):
        self.items: asyncio.Queue = asyncio.Queue()

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        item = await self.items.get()
        if isinstance(item, BaseException):
            raise item
        return item


def out(*tokens: int, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", list(tokens), finished=finished, num_output_tokens=tokens[-1] if tokens else 0)


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_reader_that_keeps_up_gets_each_output():
    async def main():
        stream = Stream()
        merged = MergedOutputs(stream)
        got = []
        for i in (1, 2, 3):
            stream.items.put_nowait(out(i, finished=i == 3))
            got.append((await merged.__anext__()).new_token_ids)
        stream.items.put_nowait(StopAsyncIteration())
        with pytest.raises(StopAsyncIteration):
            await merged.__anext__()
        return got

    assert asyncio.run(main()) == [[1], [2], [3]]


def test_outputs_that_arrive_while_the_reader_is_busy_come_as_one():
    async def main():
        stream = Stream()
        merged = MergedOutputs(stream)
        for i in (1, 2, 3):
            stream.items.put_nowait(out(i))
        await settle()  # the reader is busy elsewhere
        first = await merged.__anext__()
        stream.items.put_nowait(out(4, finished=True))
        stream.items.put_nowait(StopAsyncIteration())
        await settle()
        second = await merged.__anext__()
        rest = [o async for o in merged]
        return first, second, rest

    first, second, rest = asyncio.run(main())
    assert first.new_token_ids == [1, 2, 3] and first.num_output_tokens == 3 and not first.finished
    assert second.new_token_ids == [4] and second.finished and rest == []


def test_an_error_comes_after_the_outputs_before_it():
    async def main():
        stream = Stream()
        merged = MergedOutputs(stream)
        stream.items.put_nowait(out(1))
        stream.items.put_nowait(RuntimeError("replica lost"))
        await settle()
        first = await merged.__anext__()
        with pytest.raises(RuntimeError, match="replica lost"):
            await merged.__anext__()
        return first

    assert asyncio.run(main()).new_token_ids == [1]


def test_stop_ends_the_reading_task():
    async def main():
        merged = MergedOutputs(Stream())
        await settle()
        merged.stop()
        await settle()
        return merged.task

    task = asyncio.run(main())
    assert task.cancelled()
