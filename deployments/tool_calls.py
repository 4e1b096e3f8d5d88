"""Tool calls: how a model writes them and the grammar they are generated under (they are read
back, whole or streamed, by deployments/tool_call_stream.py).

A model writes a call in the convention its chat template teaches (the table in
docs/tool_calling.md): a JSON object in tags or in a list (Hermes' `<tool_call>\\n{"name": ...,
"arguments": {...}}\\n</tool_call>`, Mistral's `[TOOL_CALLS][{...}, ...]`, Llama 3.1's
`{"name": ..., "parameters": {...}}` joined by `; `, Apertus' `{"name": {...}}`, ...), XML
parameters (Qwen3-Coder, GLM-4.5+, MiniMax-M2, Seed-OSS, Step 3: deployments/xml_tool_calls.py),
JSON arguments after a name between markers (DeepSeek V3 and V3.1, Kimi K2:
deployments/named_tool_calls.py), or Python calls (Llama 3.2+ under its pythonic templates, OLMo 3:
deployments/pythonic_tool_calls.py), or Gemma 4's own notation (deployments/gemma4_tool_calls.py), or
messages of their own (gpt-oss's harmony replies:
deployments/harmony.py); for templates with no tool convention (the default model)
`{"name": ..., "arguments": {...}}`, one per line. The app's `tool_call_parser` (vLLM's names)
chooses one instead of the template's. A syntax is the text around its calls and the notation each
call is written in (deployments/call_notations.py), which gives its grammar, text and reader.

The calls are generated under a regex built from the tools' parameter schemas by the guided
compiler (string formats included), so every call's arguments parse and validate:
- `required`: one call (up to MAX_PARALLEL_CALLS with `parallel_tool_calls`) of any tool;
- a named function: exactly one call of that function;
- `allowed_tools` (OpenAI's): `auto` or `required` over the tools it names only (the prompt holds them all);
- `auto`: text (not empty), calls under the same grammar as `required`, or (in conventions whose
  calls open with a tag: Hermes', Mistral's) text and then calls, as Qwen and Hermes models write
  them. The text cannot hold the tag, so the first tag opens the calls; in the other conventions
  the model chooses with its first character, and text cannot begin like a call;
- `none`: free text; tools still reach the template.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import string
from dataclasses import dataclass

from app.guided.compiler import escape_literal
from deployments import harmony
from deployments.call_notations import (GEMMA4_CALL, HARMONY_CALL, JSON_CALL, PYTHONIC_CALL, CallNotation,
                                        HarmonyNotation, JsonNotation, NamedNotation, XmlNotation)
from deployments.named_tool_calls import (DEEPSEEK_V3_CALL, DEEPSEEK_V31_CALL, KIMI_K2_CALL, MISTRAL_ARGS_CALL,
                                          MISTRAL_CALL_ID_CALL)
from deployments.text_regex import not_char, text_without
from deployments.tool_protocol import AllowedToolsChoice, NamedToolChoice, ToolDefinition
from deployments.xml_tool_calls import (DEEPSEEK_V32_PARAMETERS, GLM45_PARAMETERS, GLM47_PARAMETERS,
                                        MINIMAX_M2_PARAMETERS, QWEN3_PARAMETERS, SEED_OSS_PARAMETERS, STEP3_PARAMETERS)

MAX_PARALLEL_CALLS = 4


@dataclass(frozen=True)
class ToolCallSyntax:
    """A convention's calls: the text around them, and how each is written (its notation)."""
    name: str
    prefix: str  # before the first call
    separator: str  # between calls
    suffix: str  # after the last call
    notation: CallNotation = JSON_CALL
    tag: str = ""  # what opens the calls after text ("": calls can only be the whole answer)
    one_call: bool = False  # a reply holds one call at most (the template writes only the first)

    def __post_init__(self):
        if self.tag[:1] and self.tag[0] in self.tag[1:]:
            raise ValueError(f"{self.tag!r}: a tag's first character must not recur in it (text_without)")
        # `auto`'s text cannot begin with it (tool_format)
        if not self.tag and not self.harmony and len(self.start) != 1:
            raise ValueError(f"{self.name}: a syntax without a tag opens its calls with one character")

    @property
    def harmony(self) -> bool:
        """Its replies are harmony messages (deployments/harmony.py), each call one of them."""
        return isinstance(self.notation, HarmonyNotation)

    @property
    def start(self) -> str:
        """What every output that holds calls begins with (the call's own start when no prefix); a
        harmony reply has no such start (its calls are messages: deployments/harmony.py)."""
        return self.prefix or self.notation.start

    @property
    def markers(self) -> tuple[str, ...]:
        """The text this convention writes around calls and their parts (deployments/markup_tokens.py);
        a harmony reply's are its messages' (its separator, `<|call|>`, ends a reply)."""
        own = () if self.harmony else (self.prefix, self.separator, self.suffix, self.tag)
        return tuple(m for m in (*own, *self.notation.markers) if m)

    def render(self, calls: list[tuple[str, dict | str]]) -> str:
        """Calls as this convention writes them (assistant turns fed back to the template)."""
        written = [self.notation.render(name, arguments, number) for number, (name, arguments) in enumerate(calls)]
        return self.prefix + self.separator.join(written) + self.suffix


HERMES = ToolCallSyntax("hermes", "<tool_call>\n", "\n</tool_call>\n<tool_call>\n",
                        "\n</tool_call>", tag="<tool_call>")
MISTRAL = ToolCallSyntax("mistral", "[TOOL_CALLS][", ", ", "]", tag="[TOOL_CALLS]")
MISTRAL_ARGS = ToolCallSyntax("mistral_args", "", "", "", NamedNotation(MISTRAL_ARGS_CALL), tag="[TOOL_CALLS]")
MISTRAL_CALL_ID = dataclasses.replace(MISTRAL_ARGS, name="mistral_call_id",
                                      notation=NamedNotation(MISTRAL_CALL_ID_CALL))
MISTRAL_FORMS = (MISTRAL, MISTRAL_ARGS, MISTRAL_CALL_ID)  # vLLM's `mistral` parser reads them all
ALPHANUMERIC = string.ascii_letters + string.digits
QWEN3_CODER = ToolCallSyntax("qwen3_coder", HERMES.prefix, HERMES.separator, HERMES.suffix,
                             XmlNotation(QWEN3_PARAMETERS), tag="<tool_call>")
# GLM's calls are each a <tool_call> element, its name first: the XML's own start.
GLM45 = ToolCallSyntax("glm45", "", "\n", "", XmlNotation(GLM45_PARAMETERS), tag="<tool_call>")
GLM47 = ToolCallSyntax("glm47", "", "", "", XmlNotation(GLM47_PARAMETERS), tag="<tool_call>")
MINIMAX_M2 = ToolCallSyntax("minimax_m2", "<minimax:tool_call>\n", "\n", "\n</minimax:tool_call>",
                            XmlNotation(MINIMAX_M2_PARAMETERS), tag="<minimax:tool_call>")
SEED_OSS = ToolCallSyntax("seed_oss", "<seed:tool_call>\n", "\n</seed:tool_call>\n<seed:tool_call>\n",
                          "\n</seed:tool_call>", XmlNotation(SEED_OSS_PARAMETERS), tag="<seed:tool_call>")
DEEPSEEK_V32 = ToolCallSyntax("deepseek_v32", "<｜DSML｜function_calls>\n", "\n", "\n</｜DSML｜function_calls>",
                              XmlNotation(DEEPSEEK_V32_PARAMETERS), tag="<｜DSML｜function_calls>")
STEP3 = ToolCallSyntax("step3", "<｜tool_calls_begin｜>\n", "\n", "\n<｜tool_calls_end｜>",
                       XmlNotation(STEP3_PARAMETERS), tag="<｜tool_calls_begin｜>")
GRANITE = ToolCallSyntax("granite", "<|tool_call|>[", ", ", "]", tag="<|tool_call|>")
GIGACHAT31 = ToolCallSyntax("gigachat31", "<|function_call|>", "", "", tag="<|function_call|>", one_call=True)
JAMBA = ToolCallSyntax("jamba", "<tool_calls>[", ", ", "]</tool_calls>", tag="<tool_calls>")
NEMOTRON_V2 = ToolCallSyntax("nemotron_v2", "<TOOLCALL>[", ", ", "]</TOOLCALL>", tag="<TOOLCALL>")
XLAM = ToolCallSyntax("xlam", "[", ", ", "]")
PHI4_MINI = ToolCallSyntax("phi4_mini_json", "functools[", ", ", "]", tag="functools")
MINIMAX_M1 = ToolCallSyntax("minimax", "<tool_calls>\n", "\n", "\n</tool_calls>", tag="<tool_calls>")
APERTUS = ToolCallSyntax("apertus", "<|tools_prefix|>[", ", ", "]<|tools_suffix|>",
                         JsonNotation(name_is_key=True), tag="<|tools_prefix|>")
# InternLM2's chat format; its `<|plugin|>` names the kind of action
INTERNLM = ToolCallSyntax("internlm", "<|action_start|><|plugin|>\n", "<|action_end|>\n<|action_start|><|plugin|>\n",
                          "<|action_end|>", JsonNotation("parameters"), tag="<|action_start|>")
GRANITE_20B_FC = ToolCallSyntax("granite-20b-fc", "<function_call> ", "\n<function_call> ", "", tag="<function_call>")
LONGCAT = ToolCallSyntax("longcat", "<longcat_tool_call>", "</longcat_tool_call>\n<longcat_tool_call>",
                         "</longcat_tool_call>", tag="<longcat_tool_call>")
LLAMA3 = ToolCallSyntax("llama3_json", "", "; ", "", JsonNotation("parameters"))
PYTHONIC = ToolCallSyntax("pythonic", "[", ", ", "]", PYTHONIC_CALL)
OLMO3 = ToolCallSyntax("olmo3", "<function_calls>\n", "\n", "\n</function_calls>",
                       PYTHONIC_CALL, tag="<function_calls>")
LFM2 = ToolCallSyntax("lfm2", "<|tool_call_start|>[", ", ", "]<|tool_call_end|>",
                      PYTHONIC_CALL, tag="<|tool_call_start|>")
GEMMA4 = ToolCallSyntax("gemma4", "<|tool_call>call:", "<tool_call|><|tool_call>call:", "<tool_call|>", GEMMA4_CALL,
                        tag="<|tool_call>")
PLAIN = ToolCallSyntax("json", "", "\n", "")
DEEPSEEK_V31 = ToolCallSyntax("deepseek_v31", "<｜tool▁calls▁begin｜>", "", "<｜tool▁calls▁end｜>",
                              NamedNotation(DEEPSEEK_V31_CALL), tag="<｜tool▁calls▁begin｜>")
DEEPSEEK_V3 = dataclasses.replace(DEEPSEEK_V31, name="deepseek_v3", separator="\n",
                                  notation=NamedNotation(DEEPSEEK_V3_CALL))
# Command R7B's and Command A's: `tool_call_id` is the call's number in the conversation, as a string.
COHERE_COMMAND3 = ToolCallSyntax("cohere_command3", "<|START_ACTION|>[\n    ", ",\n    ", "\n]<|END_ACTION|>",
                                 JsonNotation("parameters", name_key="tool_name", number_key="tool_call_id"),
                                 tag="<|START_ACTION|>")
# Calls one after another: each ends the reply (`<|call|>`, EOS) and the next is the next reply's.
HARMONY = ToolCallSyntax("openai", "", "<|call|><|start|>assistant", "", HARMONY_CALL)
KIMI_K2 = ToolCallSyntax("kimi_k2", "<|tool_calls_section_begin|>", "", "<|tool_calls_section_end|>",
                         NamedNotation(KIMI_K2_CALL), tag="<|tool_calls_section_begin|>")
# The app's `tool_call_parser`, by vLLM's parser names (Hunyuan A13B writes Jamba's tags), and Mistral's later
# forms by names of their own (vLLM's `mistral` names them all: tool_call_syntax).
# vLLM's qwen3_xml reads what its qwen3_coder reads, its llama4_pythonic what its pythonic reads; ERNIE 4.5 writes
# Hermes' calls.
TOOL_CALL_PARSERS = {s.name: s for s in (
    HERMES, QWEN3_CODER, GLM45, GLM47, MINIMAX_M2, SEED_OSS, STEP3, DEEPSEEK_V32, *MISTRAL_FORMS, GRANITE,
    GRANITE_20B_FC, XLAM, PHI4_MINI, APERTUS, INTERNLM, GIGACHAT31, JAMBA, NEMOTRON_V2, MINIMAX_M1, LONGCAT, LLAMA3,
    PYTHONIC, OLMO3, LFM2, GEMMA4, DEEPSEEK_V3, DEEPSEEK_V31, KIMI_K2, COHERE_COMMAND3, HARMONY, PLAIN)} | {
    "hunyuan_a13b": JAMBA, "qwen3_xml": QWEN3_CODER, "llama4_pythonic": PYTHONIC, "ernie45": HERMES}


# What a chat template holds -> the convention it teaches: the first entry whose strings are all in
# the template. Order matters where one convention's markers hold another's: Seed-OSS's and
# Qwen3-Coder's calls open with <tool_call> too, GLM's are <tool_call> elements, DeepSeek V3 fences
# its arguments where V3.1 does not, the pythonic templates hold Llama 3's `ipython`, and Apriel
# 1.5's asks for <tool_call> tags in its instructions and writes Jamba's <tool_calls>[...] list.
# LFM2's first templates write no calls, only the tools between <|tool_list_start|> and its end.
# DeepSeek V3.2's templates spell their markers from a `｜DSML｜` piece.
TEMPLATE_MARKERS = (
    (("｜DSML｜",), DEEPSEEK_V32), (("<｜tool▁sep｜>", "```json"), DEEPSEEK_V3), (("<｜tool▁sep｜>",), DEEPSEEK_V31),
    (("<|channel|>",), HARMONY), (("<|tool_call>call:",), GEMMA4), (("<|tool_calls_section_begin|>",), KIMI_K2),
    (("<minimax:tool_call>",), MINIMAX_M2),
    (("<steptml:invoke",), STEP3), (("<function_calls>",), OLMO3), (("<seed:tool_call>",), SEED_OSS),
    (("<function=",), QWEN3_CODER), (("</arg_key><arg_value>",), GLM47), (("<arg_key>",), GLM45),
    (("<tool_calls>[",), JAMBA), (("<tool_call>",), HERMES), (("[CALL_ID]",), MISTRAL_CALL_ID),
    (("[ARGS]",), MISTRAL_ARGS), (("[TOOL_CALLS]",), MISTRAL), (("<|tool_call|>",), GRANITE),
    (("<|function_call_library|>",), GRANITE_20B_FC), (("<tool_calls>", "MiniMax"), MINIMAX_M1),
    (("<tool_calls>",), JAMBA), (("<TOOLCALL>",), NEMOTRON_V2), (("<|function_call|>",), GIGACHAT31),
    (("<|tool_call_start|>",), LFM2), (("<|tool_list_start|>",), LFM2), (("functools",), PHI4_MINI),
    (("<|tools_prefix|>",), APERTUS),
    (("<|plugin|>",), INTERNLM), (("<|START_ACTION|>",), COHERE_COMMAND3), (("[func_name1(",), PYTHONIC),
    (("<|python_tag|>",), LLAMA3),
    (("ipython",), LLAMA3),
)


def syntax_for_template(template: str | None) -> ToolCallSyntax:
    text = template or ""
    return next((syntax for markers, syntax in TEMPLATE_MARKERS if all(m in text for m in markers)), PLAIN)


def tool_call_syntax(parser: str | None, template: str | None) -> ToolCallSyntax:
    """The convention the app's `tool_call_parser` names, else the template's; "mistral" is the
    form of Mistral's that the template writes, as vLLM's `mistral` parser reads every form."""
    from_template = syntax_for_template(template)
    if parser == "mistral" and from_template in MISTRAL_FORMS:
        return from_template
    return TOOL_CALL_PARSERS[parser] if parser else from_template


def template_knows_tools(template: str | None) -> bool:
    """A template that renders `tools` and assistant `tool_calls` itself (Qwen2.5, Llama 3.1+,
    Mistral's); otherwise specserve writes them into the messages (render_messages)."""
    return bool(template) and "tools" in template and "tool_calls" in template


def tool_format(tools: list[ToolDefinition], choice, parallel: bool,
                syntax: ToolCallSyntax) -> dict | None:
    """The format (for the ConstraintService) a request's `tool_choice` asks for, or None."""
    if not tools or choice == "none":
        return None
    chosen = chosen_functions(choice)
    if chosen:
        tools = [t for t in tools if t.function.name in chosen]
    if isinstance(choice, AllowedToolsChoice):
        choice = choice.allowed_tools.mode
    one = isinstance(choice, NamedToolChoice) or not parallel or syntax.one_call
    most = 1 if one else MAX_PARALLEL_CALLS
    call = syntax.notation.regex(tools)
    if syntax.harmony:  # one call a reply, whatever `parallel`: `<|call|>` ends it
        return {"type": "regex", "pattern": _harmony_reply(call, choice)}
    calls = (escape_literal(syntax.prefix) + f"(?:{call})"
             + (f"(?:{escape_literal(syntax.separator)}(?:{call})){{0,{most - 1}}}" if most > 1 else "")
             + escape_literal(syntax.suffix))
    # `auto` leaves out the empty answer, which a compiled grammar cannot hold anyway
    # (app/guided/compiler.py: compile_regex).
    if choice == "auto" and syntax.tag:
        calls = f"(?:{text_without(syntax.tag)}{calls}|{text_without(syntax.tag, empty=False)})"
    elif choice == "auto":  # no tag: `start` is one character (`{`, or the pythonic list's `[`)
        calls = f"(?:{calls}|{not_char(syntax.start)}[\\s\\S]*)"
    return {"type": "regex", "pattern": calls}


def chosen_functions(choice) -> list[str]:
    """The functions a `tool_choice` lets calls be of, where it names them (a named function,
    `allowed_tools`); empty where any of the tools may be called."""
    if isinstance(choice, AllowedToolsChoice):
        return [t.function.name for t in choice.allowed_tools.tools]
    return [choice.function.name] if isinstance(choice, NamedToolChoice) else []


def _harmony_reply(call: str, choice) -> str:
    """A harmony reply with one call (`call`: its regex), or with `auto` that or a final answer
    (deployments/harmony.py)."""
    if choice == "auto":
        call = f"(?:{call}|{escape_literal(harmony.FINAL_HEADER)}{text_without('<|', empty=False)})"
    return harmony.guided_reply(call, header="")


def render_messages(messages, tools: list[ToolDefinition] | None, syntax: ToolCallSyntax,
                    native: bool, arguments_as_text: bool = False) -> list[dict]:
    """Chat messages as dicts for `apply_chat_template`. A template that knows tools gets
    assistant `tool_calls` (arguments as objects, as HF templates expect, or with
    `arguments_as_text` as the client's JSON text, for templates that add them to strings:
    DeepSeek's) and `tool` messages as they are; for one that does not, calls become the
    assistant's text in `syntax` and the tools are described in a system message."""
    out = []
    call_id = mistral_call_id if syntax in MISTRAL_FORMS else str
    for m in messages:
        item = {"role": m.role, "content": m.text()}
        if m.role == "tool" and m.tool_call_id is not None:
            item["tool_call_id"] = call_id(m.tool_call_id)
        if m.name is not None:
            item["name"] = m.name
        if m.reasoning is not None:  # by each name templates read: Qwen3's and Kimi's, gpt-oss's `thinking`
            item["reasoning_content"] = item["reasoning"] = item["thinking"] = m.reasoning
        if m.tool_calls:
            calls = [(c.function.name, _loads_or_text(c.function.arguments)) for c in m.tool_calls]
            if native:
                item["tool_calls"] = [{"id": call_id(c.id), "type": "function", "function": {
                    "name": n, "arguments": c.function.arguments if arguments_as_text else a}}
                    for c, (n, a) in zip(m.tool_calls, calls)]
            else:
                item["content"] += syntax.render(calls)
        out.append(item)
    if tools and not native:
        out.insert(0, {"role": "system", "content": describe_tools(tools, syntax)})
    return out


def mistral_call_id(call_id: str) -> str:
    """A call's id as Mistral's templates require it, nine letters and digits: the id itself where it
    is one, else nine drawn from its hash, the same for the call and the tool message that answers it
    (a client's ids are OpenAI's `call_...`, or this server's)."""
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    number = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    return "".join(ALPHANUMERIC[number // len(ALPHANUMERIC) ** k % len(ALPHANUMERIC)] for k in range(9))


def _loads_or_text(arguments: str):
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def describe_tools(tools: list[ToolDefinition], syntax: ToolCallSyntax) -> str:
    listing = json.dumps([t.model_dump(exclude_none=True) for t in tools], ensure_ascii=False)
    example = syntax.render([("function_name", {"argument": "value"})])
    return (f"You can call these functions:\n{listing}\nTo call one, reply with only:\n{example}")


def requested_tool_format(req, syntax: ToolCallSyntax):
    """The RequestedFormat of a chat request's tool calls, or None; FormatRequestError (a 400
    on `tools` or `tool_choice`) for a choice that names no tool or a schema that cannot compile."""
    from app.guided.errors import GuidedFormatError
    from deployments.guided_formats import FormatRequestError, RequestedFormat

    choice, tools = req.effective_tool_choice, req.tools or []
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise FormatRequestError("tools: function names must be unique", "tools")
    if choice != "none" and not tools:
        raise FormatRequestError("tool_choice needs tools", "tool_choice")
    for name in chosen_functions(choice):
        if name not in names:
            raise FormatRequestError(f"tool_choice names the function {name!r}, "
                                     f"which is not in tools ({', '.join(names)})", "tool_choice")
    try:
        fmt = tool_format(tools, choice, req.parallel_tool_calls, syntax)
    except GuidedFormatError as exc:
        raise FormatRequestError(f"tools: a parameters schema cannot be enforced: {exc}",
                                 "tools") from None
    return None if fmt is None else RequestedFormat("tools", fmt)
