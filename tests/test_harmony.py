"""gpt-oss's harmony replies (deployments/harmony.py): where each message's body goes, the same
whole or streamed in any pieces, and the grammars that guide them."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from types import SimpleNamespace

import jsonschema
import pytest
from transformers import AutoTokenizer

from app.guided.compiler import compile_regex, regex_for_format
from app.guided.vocabulary import load_guided_vocabulary
from app.models.generation_config import GenerationDefaults
from deployments.builder import text_conventions
from deployments.chat_protocol import ChatCompletionRequest
from deployments.choices import Choice
from deployments.detokenizer import IncrementalDetokenizer
from deployments.engine_requests import engine_requests
from deployments.guided_formats import RequestedFormat
from deployments.harmony import HarmonyReply, guided_reply, reply_end_ids
from deployments.tool_call_stream import parse_calls
from deployments.tool_calls import HARMONY, TOOL_CALL_PARSERS, requested_tool_format, syntax_for_template
from tests.checkpoints import DEFAULT_TARGET, write_tokenizer_with_special_tokens
from tests.guided.test_string_formats import CHECKER, accepts, distances_to_final, walk
from tests.test_chat_tool_stream import Routes, chunks, steps
from tests.test_choices import output
from tests.test_detokenizer import ByteTokenizer
from tests.test_tool_calls import SCHEMAS, TOOLS, request

ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
CALL = ('<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city": "Oslo", "unit": "celsius"}')
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny in Oslo."

def read(text: str, token_counts: list[int] | None = None) -> tuple[str, str, list, HarmonyReply]:
    """(reasoning, content, [(name, arguments)] as a client assembles them, the reader) of `text` in one piece."""
    reply = HarmonyReply()
    reasoning, content = reply.take(text, last=True, token_ids=range(sum(token_counts or [0])))
    calls = [(c.function.name, c.function.arguments) for c in reply.whole_calls() or []]
    return reasoning, content, calls, reply

@pytest.mark.parametrize("text, reasoning, content, calls", [
    (ANALYSIS + FINAL, "The user wants the weather.", "It is sunny in Oslo.", []),
    (ANALYSIS + CALL, "The user wants the weather.", "", [("get_weather", '{"city": "Oslo", "unit": "celsius"}')]),
    # the recipient with the role, and `json` without <|constrain|>, as vLLM renders a call fed back
    ('<|channel|>analysis<|message|>a<|end|><|start|>assistant to=functions.now<|channel|>commentary json'
     '<|message|>{}', "a", "", [("now", "{}")]),
    # a preamble, then the answer: both content, a newline apart; two analyses likewise
    ("<|channel|>commentary<|message|>Let me look.<|end|>" + FINAL, "", "Let me look.\nIt is sunny in Oslo.", []),
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>", "a\nb", "", []),
    # a built-in tool's call: reasoning on analysis, left out on commentary
    ('<|channel|>analysis to=browser.search code<|message|>{"query": "x"}<|end|>', '{"query": "x"}', "", []),
    ('<|channel|>commentary to=python<|message|>print(1)<|end|>' + FINAL, "", "It is sunny in Oslo.", []),
    ("<|channel|>final<|message|>Done.", "", "Done.", []),  # no analysis at all
    ("<|channel|>final<|message|>cut at <|en", "", "cut at <|en", []),  # max_tokens inside a marker
    ("Plain text, no harmony.", "", "Plain text, no harmony.", []),  # not harmony at all: content
    ("<|channel|>analysis<|message|>thinking, cut", "thinking, cut", "", []),
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin", "x", "", []),  # cut in a header
])
def test_each_body_goes_where_its_header_says(text, reasoning, content, calls):
    assert read(text)[:3] == (reasoning, content, calls)

def streamed(text: str, cuts: tuple[int, ...]) -> tuple[str, str, list]:
    reply, reasoning, content, calls = HarmonyReply(), "", "", []
    bounds = [0, *cuts, len(text)]
    for start, end in zip(bounds, bounds[1:]):
        more_reasoning, more_content = reply.take(text[start:end], last=end == len(text))
        reasoning, content = reasoning + more_reasoning, content + more_content
        for piece in reply.pieces():
            if piece.opens:
                assert piece.index == len(calls)
                calls.append([reply.calls[piece.index].call.function.name, ""])
            calls[piece.index][1] += piece.arguments
    return reasoning, content, [tuple(c) for c in calls]

TWO_CALLS = ANALYSIS + CALL + "<|call|>" + CALL  # as HARMONY.render writes them

@pytest.mark.parametrize("text", [ANALYSIS + FINAL, ANALYSIS + CALL, "<|channel|>commentary<|message|>a<|end|>" + FINAL,
                                  "Plain <|text", TWO_CALLS])
def test_every_division_into_two_or_three_pieces_streams_the_whole_read(text):
    whole = read(text)[:3]
    for cuts in itertools.chain(itertools.combinations(range(1, len(text)), 1),
                                itertools.combinations(range(1, len(text), 5), 2)):
        assert streamed(text, cuts) == whole, cuts

def test_reasoning_tokens_are_those_of_the_analysis_messages_headers_and_ends_included():
    pieces = ["<|channel|>", "analysis", "<|message|>", "Hmm", ".", "<|end|>", "<|start|>", "assistant",
              "<|channel|>", "final", "<|message|>", "Yes", "."]
    reply = HarmonyReply()
    for i, piece in enumerate(pieces):
        reply.take(piece, last=i == len(pieces) - 1, token_ids=[i])
    assert reply.reasoning_tokens == 6

def test_the_app_reads_harmony_from_a_template_that_writes_channels_or_from_tool_call_parser_openai():
    assert syntax_for_template("{{- '<|start|>assistant<|channel|>final<|message|>' }}") is HARMONY
    assert TOOL_CALL_PARSERS["openai"] is HARMONY

def test_a_rendered_call_reads_back_as_itself():
    written = HARMONY.render([("get_weather", {"city": "Oslo"}), ("now", {})])
    _, calls = parse_calls(written, HARMONY)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [("get_weather", {"city": "Oslo"}), ("now", {})]
    assert len({c.id for c in calls}) == 2

@pytest.fixture(scope="module")
def vocab():
    return load_guided_vocabulary(DEFAULT_TARGET)

@pytest.mark.parametrize("choice", ["required", "auto", {"type": "function", "function": {"name": "book_meeting"}}],
                         ids=["required", "auto", "named"])
def test_sampled_replies_hold_one_valid_call_or_with_auto_an_answer(vocab, choice):
    fmt = requested_tool_format(request(tool_choice=choice, parallel_tool_calls=True), HARMONY).format
    index = compile_regex(regex_for_format(fmt), vocab)
    dist = distances_to_final(index)
    kinds = set()
    for seed in range(25):
        text = walk(index, vocab, dist, random.Random(seed), stop_p=0.3).decode()
        reasoning, content, calls, _ = read(text)
        assert "<|" not in reasoning + content, text
        if not calls:
            assert choice == "auto" and content and text.split("<|channel|>")[-1].startswith("final"), text
            kinds.add("answer")
            continue
        [(name, arguments)] = calls  # one call a reply
        assert content == "" and (name == "book_meeting" or not isinstance(choice, dict))
        jsonschema.validate(json.loads(arguments), SCHEMAS[name], format_checker=CHECKER)
        kinds.add("call")
    assert kinds == ({"call", "answer"} if choice == "auto" else {"call"})

def test_the_call_grammar_lets_an_analysis_come_first_and_nothing_after_the_call(vocab):
    """Checked on the compiled automaton: uniform walks seldom take the analysis."""
    def index(choice):
        fmt = requested_tool_format(request(tool_choice=choice), HARMONY).format
        return compile_regex(regex_for_format(fmt), vocab)
    required, auto = index("required"), index("auto")
    call_first = CALL.removeprefix("<|start|>assistant")
    for text in [ANALYSIS + CALL, call_first]:
        assert accepts(required, vocab, text) and accepts(auto, vocab, text), text
    assert accepts(auto, vocab, ANALYSIS + FINAL) and accepts(auto, vocab, FINAL.removeprefix("<|start|>assistant"))
    for text in [ANALYSIS + FINAL, ANALYSIS.replace("weather", "<|weather") + CALL, ANALYSIS,
                 TWO_CALLS, CALL,  # CALL alone: the prompt's `<|start|>assistant` again
                 call_first.replace("Oslo", "Oslo, Norway, NO")]:  # longer than the schema's maxLength
        assert not accepts(required, vocab, text), text
    preamble = "<|channel|>commentary<|message|>Let me look.<|end|>" + CALL
    assert not accepts(auto, vocab, preamble) and not accepts(auto, vocab, "It is sunny.")

def test_a_guided_answer_is_a_final_message_after_any_analysis(vocab):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    requested = RequestedFormat("response_format", {"type": "json_schema", "json_schema": {"schema": schema}})
    index = compile_regex(requested.output_format(guided_reply).regex, vocab)
    dist = distances_to_final(index)
    for seed in range(15):
        text = walk(index, vocab, dist, random.Random(seed), stop_p=0.3).decode()
        reasoning, content, calls, _ = read(text)
        assert calls == [] and "<|" not in reasoning
        jsonschema.validate(json.loads(content), schema)

def test_an_app_reading_harmony_has_the_openai_gptoss_reasoning_parser_and_its_markers_as_text():
    # the default tokenizer holds `<|end|>` as a special token, so it is markup here
    assert text_conventions(str(DEFAULT_TARGET), "openai", None) == (HARMONY, "openai_gptoss", ("<|end|>",))
    with pytest.raises(ValueError, match="use openai_gptoss"):
        text_conventions(str(DEFAULT_TARGET), "openai", "qwen3")
    with pytest.raises(ValueError, match="set tool_call_parser: openai"):
        text_conventions(str(DEFAULT_TARGET), "hermes", "openai_gptoss")

class HarmonyRoutes(Routes):
    tool_syntax, reasoning_parser = HARMONY, "openai_gptoss"

def harmony_choice(text: str, steps_of: int) -> Choice:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    outputs = [output(ids[i:i + steps_of], min(i + steps_of, len(ids))) for i in range(0, len(ids), steps_of)]
    outputs.append(output([tok.EOS], len(ids) + 1, finished=True))  # <|call|> or <|return|>: EOS, no text
    return Choice(0, 0, [], stream=steps(outputs), detok=IncrementalDetokenizer(tok),
                  timer=SimpleNamespace(on_tokens=lambda n: None, on_finish=lambda *args: None))

@pytest.mark.parametrize("text", [ANALYSIS + CALL, ANALYSIS + FINAL], ids=["call", "answer"])
def test_a_chat_reply_carries_the_reasoning_the_content_and_the_calls_whole_and_streamed(text):
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS)
    reasoning, content, calls, _ = read(text)
    whole = asyncio.run(HarmonyRoutes()._whole_chat("chatcmpl-1", 0, body, [harmony_choice(text, 7)], True, True))
    [choice] = whole.choices
    assert (choice.message.reasoning, choice.message.content) == (reasoning, content or None)
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []] == calls
    assert choice.finish_reason == ("tool_calls" if calls else "stop")
    sent = asyncio.run(chunks(HarmonyRoutes(), body.model_copy(update={"stream": True}), harmony_choice(text, 5),
                              thinking=True))
    deltas = [c["choices"][0]["delta"] for c in sent]
    assert "".join(d.get("reasoning") or "" for d in deltas) == reasoning
    assert "".join(d.get("content") or "" for d in deltas) == content
    streamed_calls = [[d["function"]["name"], ""] for delta in deltas for d in delta.get("tool_calls") or []
                      if d.get("id")]
    for delta in deltas:
        for d in delta.get("tool_calls") or []:
            streamed_calls[d["index"]][1] += d["function"]["arguments"]
    assert [tuple(c) for c in streamed_calls] == calls
    assert sent[-1]["choices"][0]["finish_reason"] == choice.finish_reason

def test_a_reply_stops_at_call_and_return_whatever_generation_config_names(tmp_path):
    """gpt-oss's first checkpoints named `<|return|>` EOS but not `<|call|>`."""
    path = write_tokenizer_with_special_tokens(tmp_path, DEFAULT_TARGET, ["<|call|>", "<|return|>"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    ends = reply_end_ids(tokenizer)
    assert ends == tuple(tokenizer.convert_tokens_to_ids(["<|call|>", "<|return|>"]))
    assert reply_end_ids(AutoTokenizer.from_pretrained(DEFAULT_TARGET)) == ()
    [started] = engine_requests(request(stop_token_ids=[7, ends[0]]), [[1, 2]], 8, None, None, "messages", 64,
                                len(tokenizer), GenerationDefaults(), reply_end_ids=ends)
    assert started.params.stop_token_ids == [7, *ends]
