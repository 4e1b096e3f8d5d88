"""Microseconds to stream one call (fed 4 characters at a time, as tokens come) through the tree
on PYTHONPATH: `python stream_cost.py SYNTAX` prints the best of 5 x 200 runs."""
import sys
import timeit

from deployments.chat_protocol import ChatCompletionRequest
from deployments.tool_call_stream import ToolStream
import deployments.tool_calls as tc

syntax = getattr(tc, sys.argv[1])
tools = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=[
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": "integer"}}}}}]).tools
text = "Writing it.\n\n" + syntax.render([("write_file", {"path": "src/app.py", "content": "def f(x):\n    return x\n" * 20,
                                                         "mode": 644})])
pieces = [text[i:i + 4] for i in range(0, len(text), 4)]


def run():
    stream = ToolStream(syntax, tools) if "tools" in ToolStream.__init__.__code__.co_varnames else ToolStream(syntax)
    for p in pieces:
        stream.feed(p)
    stream.finish()


print(f"{sys.argv[1]} {len(text)} chars: {min(timeit.repeat(run, number=200, repeat=5)) / 200 * 1e6:.1f} us")
