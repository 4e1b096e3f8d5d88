"""Guided decoding inside the engine, on the default model with real outlines-core indexes:
every output matches its format, guided and unguided requests share a batch, speculation
(draft and n-gram) does not change greedy guided output, jump-forward keeps the format
while taking fewer steps, and a sampled row whose drafts end its format is verified."""

from __future__ import annotations

import json
import re

import pytest
from outlines_core.json_schema import build_regex_from_schema
from transformers import AutoTokenizer

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.engine.spec.proposal import DraftInput, Proposal
from app.guided.compiler import compile_regex
from app.guided.guide import GuidedDecoder
from app.guided.vocabulary import load_guided_vocabulary
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_DRAFT, DEFAULT_TARGET

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                    "maxItems": 3}},
          "required": ["name", "age", "tags"]}
REGEXES = {"json": build_regex_from_schema(json.dumps(PERSON), ""),
           "date": r"\d{4}-\d{2}-\d{2}",
           "choice": r"(yes|no|maybe)"}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_TARGET)


@pytest.fixture(scope="module")
def indexes():
    vocab = load_guided_vocabulary(DEFAULT_TARGET)
    return vocab, {name: compile_regex(regex, vocab) for name, regex in REGEXES.items()}


def run(indexes, tokenizer, method=None, jump_forward=True, temperature=0.0, seed=None):
    vocab, compiled = indexes
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), draft_model=str(DEFAULT_DRAFT),
                                    num_kv_blocks=256, speculative_method=method,
                                    speculation_schedule={1: 4}, enable_jump_forward=jump_forward))
    prompts = {"json": "person = ", "date": "today = ", "choice": "answer: "}
    params = SamplingParams(max_tokens=80, temperature=temperature, seed=seed)
    for name, text in prompts.items():
        engine.add_request(name, tokenizer.encode(text), params, GuidedDecoder(compiled[name], vocab, 4096))
    engine.add_request("free", tokenizer.encode("def f():"), SamplingParams(max_tokens=20, temperature=0))
    out: dict[str, list[int]] = {}
    reasons = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                reasons[o.request_id] = o.finish_reason
    assert engine.block_manager.num_used_blocks == 0
    return out, reasons, engine.num_steps


def text(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("jump_forward", [False, True])
def test_outputs_match_their_formats_beside_an_unguided_request(indexes, tokenizer, jump_forward):
    out, reasons, _ = run(indexes, tokenizer, jump_forward=jump_forward)
    for name, regex in REGEXES.items():
        assert re.fullmatch(regex, text(tokenizer, out[name])), (name, text(tokenizer, out[name]))
        assert reasons[name] == "stop"
    assert len(out["free"]) == 20 and reasons["free"] == "length"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_json_parses_and_validates(indexes, tokenizer, seed):
    jsonschema = pytest.importorskip("jsonschema")
    out, reasons, _ = run(indexes, tokenizer, temperature=1.0, seed=seed)
    assert reasons["json"] == "stop"
    jsonschema.validate(json.loads(text(tokenizer, out["json"])), PERSON)
    assert re.fullmatch(REGEXES["date"], text(tokenizer, out["date"]))


@pytest.mark.parametrize("method", ["draft", "ngram"])
@pytest.mark.parametrize("jump_forward", [False, True])
def test_speculation_does_not_change_greedy_guided_output(indexes, tokenizer, method, jump_forward):
    plain, _, _ = run(indexes, tokenizer, jump_forward=jump_forward)
    speculated, _, _ = run(indexes, tokenizer, method=method, jump_forward=jump_forward)
    assert speculated == plain


def test_jump_forward_takes_fewer_steps(indexes, tokenizer):
    _, _, steps_off = run(indexes, tokenizer, jump_forward=False)
    out, _, steps_on = run(indexes, tokenizer, jump_forward=True)
    assert steps_on < steps_off
    assert json.loads(text(tokenizer, out["json"]))["tags"] is not None


# -- the request's own token rules inside a format ---------------------------------------------
def guided_alone(indexes, tokenizer, name: str, prompt: str, method=None, jump_forward=True, **params) -> list[int]:
    """One request following format `name`, greedy, with `params`; its output ids."""
    vocab, compiled = indexes
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), draft_model=str(DEFAULT_DRAFT), num_kv_blocks=128,
                                    speculative_method=method, speculation_schedule={1: 4},
                                    enable_jump_forward=jump_forward))
    engine.add_request("r", tokenizer.encode(prompt), SamplingParams(max_tokens=40, temperature=0, **params),
                       GuidedDecoder(compiled[name], vocab, 4096))
    ids = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            ids += o.new_token_ids
    assert engine.block_manager.num_used_blocks == 0
    assert re.fullmatch(REGEXES[name], text(tokenizer, ids)), text(tokenizer, ids)
    return ids


@pytest.mark.parametrize("method", [None, "ngram"])
def test_allowed_tokens_narrow_a_format_to_what_both_allow(indexes, tokenizer, method):
    """A date out of "1", "2" and "-" alone: the format's dashes are sampled (no jump-forward
    for such a request), and every digit is one of the two."""
    allowed = [tokenizer.encode(c)[0] for c in "12-"]
    ids = guided_alone(indexes, tokenizer, "date", "today = ", method, allowed_token_ids=allowed)
    assert set(ids) - {tokenizer.eos_token_id} <= set(allowed)


def test_where_the_request_allows_nothing_the_format_allows_the_format_alone_decides(indexes, tokenizer):
    """"7" never fits the format: every row keeps the format's mask alone, as a request without
    allowed tokens (and without jump-forward, which such a request does not take) gets it."""
    free = guided_alone(indexes, tokenizer, "choice", "answer: ", jump_forward=False)
    barred = guided_alone(indexes, tokenizer, "choice", "answer: ", allowed_token_ids=[tokenizer.encode("7")[0]])
    assert barred == free


def test_a_bad_word_is_never_written_inside_a_format(indexes, tokenizer):
    free = guided_alone(indexes, tokenizer, "choice", "answer: ")
    word = [t for t in free if t != tokenizer.eos_token_id][:1]
    ids = guided_alone(indexes, tokenizer, "choice", "answer: ", bad_words_token_ids=[word])
    assert word[0] not in ids


def test_min_tokens_cannot_keep_a_finished_format_from_ending(indexes, tokenizer):
    free = guided_alone(indexes, tokenizer, "choice", "answer: ")
    assert guided_alone(indexes, tokenizer, "choice", "answer: ", min_tokens=30) == free


class DraftsTheEnd:
    """A proposer whose drafts are EOS, then more: a guided row keeps the EOS where the format may end."""

    def __init__(self, eos_token_id: int):
        self.eos_token_id = eos_token_id

    def propose_batch(self, inputs: list[DraftInput]) -> list[Proposal]:
        return [Proposal([self.eos_token_id] + [5] * (i.k - 1)) for i in inputs]


@pytest.mark.parametrize("seed", range(6))
def test_a_sampled_guided_row_whose_drafts_end_its_format_is_verified(indexes, tokenizer, seed):
    """An EOS draft the format accepts puts a row after the end in the same pass. Its mask allowed
    nothing, and the CPU's draws refused the whole step (a 500 when served); it allows EOS now."""
    vocab, _ = indexes
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=256, speculative_method="draft",
                                    speculation_schedule={1: 4}, adaptive_speculation=False),
                       DraftsTheEnd(vocab.eos_token_id))
    pattern = r"[a-z]{1,12}"  # after each letter the format may end, and nothing is forced
    engine.add_request("r", tokenizer.encode("answer: "), SamplingParams(max_tokens=16, temperature=1.0, seed=seed),
                       GuidedDecoder(compile_regex(pattern, vocab), vocab, 4096))
    out, reasons = [], []
    while engine.has_unfinished_requests():
        for o in engine.step():
            out += o.new_token_ids
            reasons += [o.finish_reason] if o.finished else []
    assert re.fullmatch(pattern, text(tokenizer, out)) and reasons == ["stop"]
    assert engine.stats().spec.num_draft_tokens > 0
