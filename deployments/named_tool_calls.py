"""Tool calls whose name stands outside their JSON arguments, between marker tokens, as DeepSeek
V3.1 writes them (vLLM's `deepseek_v31` parser reads the same), here with a line break after
each marker that the model does not write:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>
    {"city": "Oslo"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

DeepSeek V3 (`deepseek_v3`) writes the call's type before the name and fences the arguments:

    <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Oslo"}
    ```<｜tool▁call▁end｜>

Kimi K2 (`kimi_k2`) names the call by its id, `functions.get_weather:0`:

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>

and Mistral's later models each call after `[TOOL_CALLS]` (vLLM's `mistral` parser reads these and
the JSON list before them), Devstral, Magistral and Ministral 3 (`mistral_args`):

    [TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_time[ARGS]{}

and Mistral Small 3.2 (`mistral_call_id`) with the call's id, nine letters and digits, that the
model writes after the name:

    [TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Oslo"}

The markers are special tokens in these models' tokenizers (deployments/markup_tokens.py). The
calls are generated under `named_call_regex`; they are read back by
deployments/named_tool_call_reader.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from app.guided.compiler import escape_literal, regex_for_format
from deployments.text_regex import one_of
from deployments.tool_protocol import ToolDefinition

CALL_NUMBER = "(?:0|[1-9][0-9]{0,3})"  # a count of calls in the conversation, which the model keeps (Kimi's, Cohere's)
MISTRAL_ID_REGEX = "[A-Za-z0-9]{9}"  # what Mistral's templates require of a call's id


@dataclass(frozen=True)
class NamedJsonCall:
    """The strings around a call's name and its JSON arguments."""
    call_open: str
    name_end: str
    call_end: str
    name_prefix: str = ""  # Kimi's "functions."
    numbered: bool = False  # the name is followed by `:N`, and the whole is the call's id (Kimi's)
    id_marker: str = ""  # the name is followed by this and the call's id (Mistral Small 3.2's `[CALL_ID]`)

    def render(self, name: str, arguments: dict | str, number: int) -> str:
        """A call as the chat templates write it; arguments that were not a JSON object go in as
        the client sent them."""
        body = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return self.call_open + self.written_name(name, number) + self.name_end + body + self.call_end

    def written_name(self, name: str, number: int) -> str:
        """The name as written, with the call's id made from its number where the model writes one."""
        id_part = f"{self.id_marker}{number:09d}" if self.id_marker else ""
        return self.name_prefix + name + (f":{number}" if self.numbered else "") + id_part

    def read_name(self, written: str) -> tuple[str, str | None]:
        """(the function's name, the call's id where the model writes one) of a written name."""
        name = written.removeprefix(self.name_prefix)
        if self.id_marker:
            name, _, call_id = name.partition(self.id_marker)
            return name, call_id or None
        return (name.rpartition(":")[0], written) if self.numbered else (name, None)


DEEPSEEK_V31_CALL = NamedJsonCall("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>")
DEEPSEEK_V3_CALL = NamedJsonCall("<｜tool▁call▁begin｜>function<｜tool▁sep｜>", "\n```json\n",
                                 "\n```<｜tool▁call▁end｜>")
KIMI_K2_CALL = NamedJsonCall("<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                             name_prefix="functions.", numbered=True)
MISTRAL_ARGS_CALL = NamedJsonCall("[TOOL_CALLS]", "[ARGS]", "")
MISTRAL_CALL_ID_CALL = NamedJsonCall("[TOOL_CALLS]", "[ARGS]", "", id_marker="[CALL_ID]")


def named_call_regex(tools: list[ToolDefinition], form: NamedJsonCall) -> str:
    """One call of any of `tools`; GuidedFormatError for a schema that cannot compile."""
    number = ":" + CALL_NUMBER if form.numbered else ""
    call_id = escape_literal(form.id_marker) + MISTRAL_ID_REGEX if form.id_marker else ""
    calls = [escape_literal(form.call_open + form.name_prefix + t.function.name) + number + call_id
             + escape_literal(form.name_end)
             + regex_for_format({"type": "json_schema", "json_schema": {"schema": t.function.schema_}})
             + escape_literal(form.call_end) for t in tools]
    return one_of(calls)
