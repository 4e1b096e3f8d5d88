"""Allowed tokens, logit bias, bad words, presence, frequency and repetition penalties, and min_tokens: on
known logits they change each row exactly as defined (vLLM's semantics), the sampled
distribution follows the penalised logits, the rows that verify drafts count the drafts before
them, and greedy decoding with penalties equals transformers' (repetition penalty) and stays
exact under speculation."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.engine.request import Request
from app.engine.selection.layout import RowLayout
from app.engine.selection.penalties import apply_penalties
from app.engine.selection.selector import Selector
from app.outputs import RequestRejected
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_DRAFT, DEFAULT_TARGET
from tests.test_selection import chi2_pvalue

LOGITS = torch.tensor([2.0, -1.5, 1.0, 0.5, 0.0, -0.5, 1.5, -3.0])
V = len(LOGITS)
PROMPT = [1, 4]
OUTPUT = [2, 2, 3, 5]


def decoding(params: SamplingParams, output: list[int] = OUTPUT, drafts: list[int] = ()) -> Request:
    req = Request("r", PROMPT, params)
    for t in output:
        req.append_token(t)
    req.num_computed_tokens = req.num_tokens - 1
    req.set_spec(list(drafts))
    return req


def expected_row(logits: list[float], params: SamplingParams, prompt: list[int], output: list[int]) -> list[float]:
    """The definition, token by token: bias; repetition over prompt + output; frequency x count
    and presence over the output."""
    out = []
    for token, x in enumerate(logits):
        x += (params.logit_bias or {}).get(token, 0.0)
        if token in prompt or token in output:
            x = x / params.repetition_penalty if x > 0 else x * params.repetition_penalty
        x -= params.frequency_penalty * output.count(token)
        x -= params.presence_penalty * (token in output)
        out.append(x)
    return out


def penalised(requests: list[Request], logits: torch.Tensor) -> torch.Tensor:
    layout = RowLayout.build({r: r.num_tokens_with_spec - r.num_computed_tokens for r in requests}, logits.device)
    return apply_penalties(logits, layout.penalties)


@pytest.mark.parametrize("params", [
    SamplingParams(presence_penalty=0.5),
    SamplingParams(frequency_penalty=0.3),
    SamplingParams(frequency_penalty=-0.7, presence_penalty=-1.0),
    SamplingParams(repetition_penalty=1.8),
    SamplingParams(repetition_penalty=0.6),
    SamplingParams(logit_bias={0: -100, 7: 4.5}),
    SamplingParams(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.3,
                   logit_bias={3: 1.0, 6: -2.0}, temperature=0),
])
def test_penalties_change_each_row_exactly_as_defined(params):
    plain = decoding(SamplingParams())
    req = decoding(params)
    logits = torch.stack([LOGITS, LOGITS])
    out = penalised([plain, req], logits)
    assert torch.equal(out[0], LOGITS)  # an unpenalised row of the same batch is untouched
    assert torch.allclose(out[1], torch.tensor(expected_row(LOGITS.tolist(), params, PROMPT, OUTPUT)),
                          atol=1e-6, rtol=0)
    assert not torch.equal(out[1], LOGITS)
    assert torch.equal(logits[1], LOGITS)  # out of place: the raw logits stay for logprobs


def test_draft_rows_count_the_drafts_before_them():
    params = SamplingParams(presence_penalty=0.4, frequency_penalty=0.25, repetition_penalty=1.5,
                            logit_bias={6: 1.0})
    drafts = [6, 2, 0]
    req = decoding(params, drafts=drafts)
    logits = LOGITS.repeat(len(drafts) + 1, 1) + torch.arange(len(drafts) + 1.0)[:, None]
    out = penalised([req], logits)
    for j in range(len(drafts) + 1):
        expected = expected_row(logits[j].tolist(), params, PROMPT, OUTPUT + drafts[:j])
        assert torch.allclose(out[j], torch.tensor(expected), atol=1e-6, rtol=0), j


def test_allowed_token_ids_leave_only_those_on_every_row_of_the_request():
    params = SamplingParams(allowed_token_ids=[1, 4, 6], logit_bias={4: 2.0, 5: 9.0})
    req = decoding(params, drafts=[4, 1])
    plain = decoding(SamplingParams())
    out = penalised([req, plain], LOGITS.repeat(4, 1))
    expected = torch.full((V,), -torch.inf)
    expected[[1, 4, 6]] = LOGITS[[1, 4, 6]] + torch.tensor([0.0, 2.0, 0.0])  # the bias on what is allowed
    for row in out[:3]:
        assert torch.equal(row, expected)
    assert torch.equal(out[3], LOGITS)  # the other request's row is untouched


def test_bad_words_bar_the_token_that_would_complete_them_on_each_row():
    """OUTPUT ends with 5: the word [5, 6] bars 6 after it, and again after the drafts [1, 5];
    the one-token word [7] is barred everywhere; [3, 5, 0] needs the 3 just before the 5."""
    params = SamplingParams(bad_words_token_ids=[[5, 6], [7], [3, 5, 0], [2, 2, 3, 5, 4]])
    req = decoding(params, drafts=[1, 5])
    out = penalised([req], LOGITS.repeat(3, 1))
    barred_per_row = [{6, 7, 0, 4}, {7}, {6, 7}]  # after ..., 3, 5 | ..., 5, 1 | ..., 1, 5
    for row, barred in zip(out, barred_per_row):
        expected = LOGITS.clone()
        expected[list(barred)] = -torch.inf
        assert torch.equal(row, expected), (row, barred)


def drawn(params: SamplingParams, n: int, seed: int) -> torch.Tensor:
    """[V] float64: how often each token was drawn, one row of LOGITS for each of n requests."""
    requests = [decoding(params) for _ in range(n)]
    for i, r in enumerate(requests):
        r.request_id = f"r{i}"
    layout = RowLayout.build({r: 1 for r in requests}, LOGITS.device)
    tokens = [c.token_ids[0] for c in Selector(seed=seed)(LOGITS.repeat(n, 1), layout, step=0)]
    return torch.bincount(torch.tensor(tokens), minlength=V).double()


def test_sampling_keeps_to_the_allowed_tokens_in_proportion():
    n = 6000
    observed = drawn(SamplingParams(temperature=1.0, allowed_token_ids=[1, 3, 5]), n, seed=5)
    assert observed.sum() == observed[[1, 3, 5]].sum()
    probs = LOGITS.double()[[1, 3, 5]].softmax(-1)
    assert chi2_pvalue(observed[[1, 3, 5]], probs * n) > 1e-3


def test_rows_before_min_tokens_bar_every_stop_token_and_later_rows_do_not():
    """Output so far: 4 tokens; rows verify 3 drafts, so they choose tokens 5 to 8. With
    min_tokens 6 the first two rows bar the request's stop tokens and the model's EOS (-inf);
    the rows after are the raw logits (no other penalty here)."""
    req = Request("r", PROMPT, SamplingParams(min_tokens=6, stop_token_ids=[3]), eos_token_ids=(7,))
    for t in OUTPUT:
        req.append_token(t)
    req.num_computed_tokens = req.num_tokens - 1
    req.set_spec([6, 2, 0])
    logits = LOGITS.repeat(4, 1)
    out = penalised([req], logits)
    barred = LOGITS.clone()
    barred[[3, 7]] = -torch.inf
    for j, row in enumerate(out):
        assert torch.equal(row, barred if j < 2 else LOGITS), j
    assert req.penalised
    for t in [6, 2]:
        req.append_token(t)
    assert not req.penalised  # nothing to change once min_tokens are out: no penalties built


def test_bars_that_would_leave_a_row_empty_give_way_to_the_allowed_tokens():
    """Allowed: 3 and 6. On the first row (the 5th output token) min_tokens bars the stop 3 and a
    bad word bars 6: nothing would be left, so the row keeps the allowed tokens (the bias and
    penalties still on them). On the second (the 6th) min_tokens is out: 6 alone is barred and
    3 is left, as the bars say."""
    params = SamplingParams(allowed_token_ids=[3, 6], min_tokens=5, stop_token_ids=[3],
                            bad_words_token_ids=[[6]], logit_bias={6: 1.0}, presence_penalty=0.5)
    out = penalised([decoding(params, drafts=[1])], LOGITS.repeat(2, 1))
    allowed = torch.full((V,), -torch.inf)
    allowed[[3, 6]] = torch.tensor(expected_row(LOGITS.tolist(), params, PROMPT, OUTPUT))[[3, 6]]
    assert torch.equal(out[0], allowed)
    only_3 = allowed.clone()
    only_3[6] = -torch.inf
    assert torch.equal(out[1], only_3)


def test_bad_words_that_bar_the_whole_vocabulary_give_way_too():
    everything = SamplingParams(bad_words_token_ids=[[t] for t in range(V)])
    all_but_one = SamplingParams(bad_words_token_ids=[[t] for t in range(1, V)])
    out = penalised([decoding(everything), decoding(all_but_one)], LOGITS.repeat(2, 1))
    assert torch.equal(out[0], LOGITS)
    assert torch.isfinite(out[1]).tolist() == [True] + [False] * (V - 1)


def test_greedy_min_tokens_with_only_stop_tokens_allowed_stops_on_one(prompts):
    """Every allowed token stops the request: min_tokens cannot hold it, and the output is the
    best allowed token, not one from outside them."""
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64))
    [free] = engine.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    stops = [free[0] + 1, free[0] + 2]
    [out] = engine.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0, min_tokens=3,
                                                        allowed_token_ids=stops, stop_token_ids=stops))
    [alone] = engine.generate(prompts[:1], SamplingParams(max_tokens=1, temperature=0, allowed_token_ids=stops))
    assert out == alone and out[0] in stops
    assert not engine.has_unfinished_requests()


def test_greedy_min_tokens_takes_the_best_token_that_does_not_stop(prompts):
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=128))
    [free] = engine.generate(prompts[:1], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    stop = free[2]
    [stopped] = engine.generate(prompts[:1], SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop]))
    assert stopped == free[:free.index(stop) + 1]
    [held] = engine.generate(prompts[:1], SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop],
                                                          min_tokens=8))
    [biased] = engine.generate(prompts[:1], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                            logit_bias={stop: -100}))
    assert len(held) >= 8 and stop not in held[:8]
    assert held[:3] == biased[:3] and held[:2] == free[:2]  # at token 3 the next best, as if barred
    assert held[8:].count(stop) <= 1 and (stop not in held[8:] or held[-1] == stop)  # then it may stop


def test_sampling_follows_the_penalised_distribution():
    params = SamplingParams(temperature=0.9, presence_penalty=0.8, frequency_penalty=0.4,
                            repetition_penalty=1.2, logit_bias={7: 3.0})
    n = 6000
    observed = drawn(params, n, seed=3)
    probs = (torch.tensor(expected_row(LOGITS.tolist(), params, PROMPT, OUTPUT), dtype=torch.float64)
             / params.temperature).softmax(-1)
    assert chi2_pvalue(observed, probs * n) > 1e-3
    unpenalised = (LOGITS.double() / params.temperature).softmax(-1)
    assert chi2_pvalue(observed, unpenalised * n) < 1e-6  # the test tells the two apart


def test_out_of_range_values_and_ids_are_refused():
    for bad in (dict(presence_penalty=2.5), dict(frequency_penalty=-2.1), dict(repetition_penalty=0),
                dict(repetition_penalty=5e-324),
                dict(logit_bias={3: 101}), dict(logit_bias={-1: 1})):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64))
    vocab = engine.model_config.vocab_size
    with pytest.raises(RequestRejected, match="logit_bias"):
        engine.add_request("x", [1, 2], SamplingParams(logit_bias={vocab: 1.0}))
    assert not engine.has_unfinished_requests()


PROMPTS = ["The cat sat on the", "def main():\n    return", "Once upon a time, there",
           "the the the the the the the", "1, 2, 3, 1, 2, 3, 1, 2, 3,"]
GREEDY = dict(max_tokens=40, temperature=0, ignore_eos=True)
# The frequency penalties are the settings that caught a verification which forgot the drafts
# before each row (on these prompts, with the default draft model).
GREEDY_PENALISED = [
    SamplingParams(**GREEDY, repetition_penalty=1.3),
    SamplingParams(**GREEDY, frequency_penalty=-2.0),
    SamplingParams(**GREEDY, frequency_penalty=0.5, presence_penalty=0.5, logit_bias={13: -100}),
    SamplingParams(**GREEDY, frequency_penalty=2.0, repetition_penalty=0.8, logit_bias={100: 3.0}),
    SamplingParams(max_tokens=40, temperature=0, min_tokens=30, stop_token_ids=[13, 203]),
    SamplingParams(**GREEDY, allowed_token_ids=list(range(0, 1000, 3))),
    SamplingParams(**GREEDY, frequency_penalty=-1.0, bad_words_token_ids=[[13], [262, 262], [11, 220]]),
]


@pytest.fixture(scope="module")
def prompts():
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    return [tok.encode(p) for p in PROMPTS]


def test_greedy_repetition_penalty_equals_transformers(prompts):
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_TARGET, dtype=torch.float32).eval()
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=128))
    params = GREEDY_PENALISED[0]
    outputs = engine.generate(prompts, params)
    for prompt, out in zip(prompts, outputs):
        ids = torch.tensor([prompt])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=params.max_tokens,
                             min_new_tokens=params.max_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=0, repetition_penalty=params.repetition_penalty)
        assert out == gen[0, len(prompt):].tolist()
    assert engine.generate(prompts, SamplingParams(**GREEDY)) != outputs  # the penalty changed something


def test_greedy_with_penalties_is_exact_under_speculation(prompts):
    config = dict(model=str(DEFAULT_TARGET), num_kv_blocks=256)
    plain = LLMEngine(EngineConfig(**config))
    spec = LLMEngine(EngineConfig(**config, draft_model=str(DEFAULT_DRAFT), speculative_method="draft",
                                  num_speculative_tokens=4, speculation_schedule={1: 4}))
    for params in GREEDY_PENALISED:
        expected = [plain.generate([p], params)[0] for p in prompts]
        assert spec.generate(prompts[:1], params) == expected[:1]  # alone
        assert spec.generate(prompts, params) == expected  # batched
    stats = spec.stats().spec
    assert stats.num_accepted_tokens > 0, stats  # drafts were verified, and some kept


def test_a_bad_word_from_the_greedy_output_is_never_written(prompts):
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=128))
    greedy = dict(max_tokens=24, temperature=0, ignore_eos=True)
    [plain] = engine.generate(prompts[:1], SamplingParams(**greedy))
    word = plain[3:5]  # two tokens the model writes

    def first(seq, part) -> int | None:
        return next((i for i in range(len(seq) - len(part) + 1) if seq[i:i + len(part)] == part), None)

    [without] = engine.generate(prompts[:1], SamplingParams(**greedy, bad_words_token_ids=[word]))
    at = first(plain, word)
    assert first(without, word) is None
    assert without[:at + 1] == plain[:at + 1] != without[:at + 2]  # the same until the word would end


def test_logit_bias_removes_and_forces_tokens_under_greedy(prompts):
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=128))
    greedy = dict(max_tokens=12, temperature=0, ignore_eos=True)
    [plain] = engine.generate(prompts[:1], SamplingParams(**greedy))
    banned = plain[0]
    [without] = engine.generate(prompts[:1], SamplingParams(**greedy, logit_bias={banned: -100}))
    assert banned in plain and banned not in without
    [forced] = engine.generate(prompts[:1], SamplingParams(**greedy, logit_bias={777: 100}))
    assert forced == [777] * 12
