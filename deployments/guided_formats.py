"""Which output format a request asks for, and its canonical form (`OutputFormat`).

Clients spell it several ways: OpenAI's `response_format` (`json_schema`, `json_object`), vLLM's
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` (+ `guided_whitespace_pattern`),
and vLLM's newer `structured_outputs` ({json | regex | choice | grammar | json_object},
`disable_any_whitespace`). All become a format dict for `app.guided.compiler.regex_for_format`:
`{"type": "json_schema", "json_schema": {"schema": ...}}`, `{"type": "json_object"}`,
`{"type": "regex", "pattern": ...}`, `{"type": "choice", "choices": [...]}` or
`{"type": "grammar", "grammar": ...}` (GBNF or Lark, app/guided/ebnf.py and lark_grammar.py), plus
`whitespace_pattern` when the client set one. Asking for two formats at once is an error.
`RequestedFormat.output_format` turns that dict into the `OutputFormat` the rest of the server
knows (app/guided/output_format.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from app.guided.compiler import regex_for_format
from app.guided.output_format import OutputFormat


class FormatRequestError(ValueError):
    """A request whose format fields contradict each other; answered with a 400 on `param`."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class RequestedFormat:
    param: str  # the request field it came from (named in errors)
    format: dict[str, Any]

    def output_format(self, around: Callable[[str], str] | None = None) -> OutputFormat:
        """The canonical form; GuidedFormatError (a ValueError) for a format that cannot be one.
        `around`: the whole output's regex from the format's, where the output holds more than the
        format: a reasoning first (deployments/reasoning.py: thinking_then), or a harmony reply's
        messages (deployments/harmony.py: guided_reply)."""
        regex = regex_for_format(self.format)
        return OutputFormat(around(regex) if around is not None else regex)


def _json_schema(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"schema": schema}}


def _structured(so) -> list[RequestedFormat]:
    found = []
    if so.json_ is not None:
        found.append(_json_schema(so.json_))
    if so.regex is not None:
        found.append({"type": "regex", "pattern": so.regex})
    if so.choice is not None:
        found.append({"type": "choice", "choices": so.choice})
    if so.grammar is not None:
        found.append({"type": "grammar", "grammar": so.grammar})
    if so.json_object:
        found.append({"type": "json_object"})
    if len(found) > 1:
        raise FormatRequestError("structured_outputs: give only one of json, regex, choice, grammar, "
                                 "json_object", "structured_outputs")
    whitespace = "" if so.disable_any_whitespace else so.whitespace_pattern
    if found and whitespace is not None:
        found[0]["whitespace_pattern"] = whitespace
    return [RequestedFormat("structured_outputs", f) for f in found]


def requested_format(req) -> RequestedFormat | None:
    """The format `req` (a completions or chat request) asks for, or None for free text."""
    found: list[RequestedFormat] = []
    rf = req.response_format
    if rf is not None and rf.type == "json_schema":
        found.append(RequestedFormat("response_format", _json_schema(rf.json_schema.schema_)))
    elif rf is not None and rf.type == "json_object":
        found.append(RequestedFormat("response_format", {"type": "json_object"}))
    if req.guided_json is not None:
        found.append(RequestedFormat("guided_json", _json_schema(req.guided_json)))
    if req.guided_regex is not None:
        found.append(RequestedFormat("guided_regex", {"type": "regex", "pattern": req.guided_regex}))
    if req.guided_choice is not None:
        found.append(RequestedFormat("guided_choice", {"type": "choice",
                                                       "choices": req.guided_choice}))
    if req.guided_grammar is not None:
        found.append(RequestedFormat("guided_grammar", {"type": "grammar", "grammar": req.guided_grammar}))
    if req.structured_outputs is not None:
        found += _structured(req.structured_outputs)
    if len(found) > 1:
        names = ", ".join(f.param for f in found)
        raise FormatRequestError(f"ask for one output format at a time; got {names}", found[1].param)
    if not found:
        return None
    if req.guided_whitespace_pattern is not None and "whitespace_pattern" not in found[0].format:
        found[0].format["whitespace_pattern"] = req.guided_whitespace_pattern
    return found[0]
