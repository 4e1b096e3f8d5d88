"""What every tool-call parser makes of the same tools, as JSON: the formats it asks for (required, auto,
a named function; parallel or not), its render, markers, start, tool description and a parse. Run at two
trees and compare the files: a refactor that changes none of them is byte for byte the same.

    PYTHONPATH=TREE python benchmarks/results/call_notations_2026-12-07/fingerprint.py OUT.json
"""
import json, sys
from deployments import tool_calls as tc
from deployments.tool_call_stream import parse_calls
from deployments.tool_protocol import NamedToolChoice
from tests.test_tool_calls import TOOL_DEFINITIONS
out = {}
for key, s in sorted(tc.TOOL_CALL_PARSERS.items()):
    d = {"start": s.start, "markers": list(s.markers), "harmony": s.harmony,
         "render": s.render([("get_weather", {"city": "Oslo", "n": [1, None, True]}), ("now", "raw{")]),
         "describe": tc.describe_tools(TOOL_DEFINITIONS, s)}
    for choice in ("required", "auto", NamedToolChoice(type="function", function={"name": TOOL_DEFINITIONS[0].function.name})):
        for par in (True, False):
            d[f"{choice}-{par}"] = tc.tool_format(TOOL_DEFINITIONS, choice, par, s)
    text = s.render([("get_weather", {"city": "Oslo"}), ("now", {})])
    content, calls = parse_calls("Hi " + s.tag + text[len(s.tag):] if s.tag else text, s, TOOL_DEFINITIONS)
    d["parse"] = [content, [(c.function.name, c.function.arguments) for c in calls or []]]
    out[key] = d
json.dump(out, open(sys.argv[1], "w"), indent=1, default=str, sort_keys=True)
