"""Predicted outputs (OpenAI's `prediction`): drafts follow the output through the prediction and
find it again after an edit; in the engine greedy output stays plain decoding's whatever the
prediction, a right prediction is drafted and kept (fewer steps), a wrong one refused, and both
counted per request; a prediction row asks no other proposer and its place goes with it; the route
gives every choice the request's prediction, no longer than the context."""

from __future__ import annotations

import dataclasses

import pydantic
import pytest

from app.engine.request import Request
from app.engine.spec.prediction_lookup import PredictionLookup
from app.engine.spec.schedule import SpeculationSchedule
from app.engine.spec.speculator import Speculator
from app.models.generation_config import GenerationDefaults
from app.sampling_params import SamplingParams
from deployments.chat_protocol import ChatCompletionRequest
from deployments.engine_requests import engine_requests
from tests.spec.test_engine_speculation import (GREEDY, assert_nothing_allocated, engine, prompts,  # noqa: F401
                                                reference)
from tests.spec.test_prompt_lookup_first import Asked

PROMPT = [900, 901, 902]


def proposal(lookup: PredictionLookup, prediction: list[int], output: list[int], k: int = 3) -> list[int]:
    return lookup.propose_for("r", prediction, PROMPT + output, len(PROMPT), k)


def test_the_output_is_followed_through_the_prediction():
    lookup, predicted = PredictionLookup(), [1, 2, 3, 4, 5, 6, 7]
    assert proposal(lookup, predicted, []) == [1, 2, 3]  # before any output: the prediction's start
    assert proposal(lookup, predicted, [1, 2]) == [3, 4, 5]  # two kept
    assert proposal(lookup, predicted, [1, 2, 3, 4, 5, 6]) == [7]
    assert proposal(lookup, predicted, [1, 2, 3, 4, 5, 6, 7]) == []  # the prediction is used up
    lookup.forget("r")
    assert proposal(lookup, predicted, []) == [1, 2, 3]


def test_after_an_edit_the_prediction_is_found_again_forward():
    """Lines repeat in a file: the match at or after where the output was wins over an earlier one."""
    lookup, predicted = PredictionLookup(), [10, 11, 12, 13, 20, 21, 10, 11, 30, 31, 32]
    assert proposal(lookup, predicted, [10, 11, 12, 13]) == [20, 21, 10]
    assert proposal(lookup, predicted, [10, 11, 12, 13, 99, 98]) == []  # the edit: nothing matches
    assert proposal(lookup, predicted, [10, 11, 12, 13, 99, 98, 10, 11]) == [30, 31, 32]  # not [12, 13, 20]
    assert proposal(lookup, predicted, [10, 11, 12, 13, 99, 98, 10, 11, 30]) == [31, 32]  # followed again


def test_one_token_of_output_is_too_little_to_find_the_prediction_by():
    lookup, predicted = PredictionLookup(), [5, 6, 7, 8]
    assert proposal(lookup, predicted, [9, 7]) == []  # diverged at once; [7] alone matches nothing kept
    assert proposal(lookup, predicted, [9, 7, 8]) == []  # [7, 8] ends the prediction: nothing follows
    assert PredictionLookup().propose_for("s", predicted, PROMPT + [6, 7], len(PROMPT), 2) == [8]


def test_the_prediction_tokens_matched_are_those_followed_and_found_again():
    lookup, predicted = PredictionLookup(), [10, 11, 12, 13, 20, 21, 22, 23, 24, 30, 31]

    def matched(output: list[int]) -> int:
        return lookup.num_matched("r", predicted, PROMPT + output, len(PROMPT))

    assert matched([]) == 0 and matched([10, 11]) == 2 and matched([10, 11, 12]) == 3
    assert matched([10, 11, 12, 99, 98]) == 3  # the edit: 99, 98 are not in it
    assert matched([10, 11, 12, 99, 98, 22, 23]) == 5  # found again by 22, 23 (13, 20, 21 skipped)
    assert matched([10, 11, 12, 99, 98, 22, 23, 24, 30, 31]) == 8 == len(predicted) - 3
    assert proposal(lookup, predicted, [10, 11, 12, 99, 98, 22, 23, 24, 30, 31]) == []  # the end
    replaced = PredictionLookup()  # tokens replaced in place, seen only once the output is past them
    assert replaced.num_matched("r", predicted, PROMPT + predicted[:4], len(PROMPT)) == 4
    assert replaced.num_matched("r", predicted, PROMPT + predicted[:4] + [50, 60] + predicted[6:], len(PROMPT)) == 9
    found_in_place = PredictionLookup()  # found again where the replaced span ends: what came before it counts
    assert found_in_place.num_matched("r", predicted, PROMPT + predicted[:2], len(PROMPT)) == 2
    assert found_in_place.num_matched("r", predicted, PROMPT + predicted[:4] + [50, 60] + predicted[6:8],
                                      len(PROMPT)) == 6


def decoding(request_id: str, tokens: list[int], prediction: list[int] | None) -> Request:
    req = Request(request_id, tokens, SamplingParams(max_tokens=20, temperature=0.0,
                                                     prediction_token_ids=prediction))
    req.num_computed_tokens = req.num_tokens - 1
    return req


def test_a_prediction_row_asks_no_proposer_and_is_not_sent_ahead():
    proposer = Asked()
    speculator = Speculator(proposer, SpeculationSchedule({1: 4}), max_model_len=64, vocab_width=1000)
    predicted, plain = decoding("p", [1, 2, 3], [40, 41, 42, 43, 44]), decoding("q", [1, 2, 3], None)
    speculator.propose([predicted, plain])
    assert predicted.spec_token_ids == [40, 41, 42, 43] and predicted.spec_from_prediction
    assert plain.spec_token_ids == [7, 7, 7, 7] and not plain.spec_from_prediction
    assert proposer.asked == [["q"]]
    speculator.send_ahead({predicted: 5, plain: 5})
    assert proposer.sent_ahead == [["q"]]
    assert speculator.stats.num_drafts_from_prediction == 1 and speculator.stats.num_drafts_looked_up == 0
    speculator.forget(predicted)
    assert not speculator.predictions._places


def with_prediction(prediction: list[int]) -> SamplingParams:
    return dataclasses.replace(GREEDY, prediction_token_ids=prediction)


def test_greedy_output_is_plain_decodings_and_a_right_prediction_takes_fewer_steps(prompts, reference):
    plain, predicted, mispredicted = engine("ngram", 4), engine("ngram", 4), engine("ngram", 4)
    assert plain.generate(prompts, GREEDY) == reference
    assert predicted.generate(prompts, [with_prediction(out) for out in reference]) == reference
    wrong = [list(reversed(out)) for out in reference]  # the same tokens, in an order never written
    assert mispredicted.generate(prompts, [with_prediction(out) for out in wrong]) == reference
    assert predicted.stats().spec.num_drafts_from_prediction > 0
    assert predicted.num_steps < plain.num_steps
    for e in (plain, predicted, mispredicted):
        assert_nothing_allocated(e)


def test_each_request_counts_its_predictions_tokens_the_output_holds_and_the_rest(prompts, reference):
    """OpenAI's accepted and rejected prediction tokens: the first token, which no step drafts,
    and the tokens the target wrote beyond the drafts it kept are in the output too."""
    e = engine("ngram", 4)
    prompt, out = prompts[0], reference[0]
    wrong_after_one = out[:1] + [max(out) + 1] * 8  # the first token is the prompt step's, never drafted
    for rid, prediction in [("right", out), ("wrong", wrong_after_one)]:
        e.add_request(rid, prompt, with_prediction(prediction))
    last = {}
    while e.has_unfinished_requests():
        for o in e.step():
            last[o.request_id] = o
    right, wrong = last["right"], last["wrong"]
    assert (right.num_accepted_prediction_tokens, right.num_rejected_prediction_tokens) == (len(out), 0)
    assert (wrong.num_accepted_prediction_tokens, wrong.num_rejected_prediction_tokens) == (1, 8)
    assert_nothing_allocated(e)


def test_a_prediction_drafts_the_schedules_k_when_adaptive_speculation_chose_0():
    """Adaptive speculation turns n-gram drafts off where they do not pay; a prediction still drafts,
    that step is none of adaptive speculation's samples, and its drafts' acceptance is not the others'."""
    speculator = Speculator(Asked(), SpeculationSchedule({1: 4}), max_model_len=64, vocab_width=1000, adaptive=True)
    predicted, plain = decoding("p", [1, 2, 3], [40, 41, 42, 43, 44]), decoding("q", [1, 2, 3], None)
    speculator.propose([predicted, plain], k=0)
    assert predicted.spec_token_ids == [40, 41, 42, 43] and plain.spec_token_ids == []
    assert speculator._step is None and speculator.stats.steps_by_k == {4: 1}
    reached = list(speculator.adaptive.acceptance.reached)
    speculator.record_verified(4, 4, from_prediction=True)
    assert speculator.adaptive.acceptance.reached == reached and speculator.stats.num_accepted_tokens == 4
    used_up = decoding("u", [1, 2, 3], [40, 41, 42])
    used_up.all_token_ids += [40, 41, 42]  # its output has passed the prediction's end
    used_up.num_computed_tokens = used_up.num_tokens - 1
    speculator.propose([used_up, plain], k=0)
    assert used_up.spec_token_ids == [] and speculator._step == (2, 0, 0.0)
    assert speculator.drafts_predictions([used_up, plain]) and not speculator.drafts_predictions([plain])


@pytest.mark.parametrize("overlap", [False, True])
def test_with_adaptive_speculation_at_k_0_a_right_prediction_still_takes_fewer_steps(prompts, reference, overlap):
    plain, predicted = (engine("ngram", 4, adaptive_speculation=True, overlap_scheduling=overlap) for _ in range(2))
    for e in (plain, predicted):
        e.speculator.adaptive.k_for = lambda batch_size: 0  # n-gram drafts judged not to pay
    assert plain.generate(prompts, GREEDY) == reference
    assert predicted.generate(prompts, [with_prediction(out) for out in reference]) == reference
    assert plain.stats().spec.num_draft_tokens == 0 < predicted.stats().spec.num_drafts_from_prediction
    assert predicted.num_steps < plain.num_steps
    for e in (plain, predicted):
        assert_nothing_allocated(e)


def test_a_requests_prediction_reaches_every_choice_cut_to_the_context():
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], n=2, prediction={
        "type": "content", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    assert body.prediction.text() == "ab"
    started = engine_requests(body, [[1, 2]], 8, None, None, "messages", 64, 1000, GenerationDefaults(),
                              prediction_token_ids=list(range(100)))
    assert [s.params.prediction_token_ids for s in started] == [list(range(64))] * 2
    assert not body.ignored_fields  # read, not logged as ignored
    with pytest.raises(pydantic.ValidationError):
        ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], prediction={"type": "file", "content": "x"})
