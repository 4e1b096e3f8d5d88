"""Drafts from a request's predicted output (OpenAI's `prediction`): the text the client expects
most of the answer to be, as in a code edit that rewrites a few lines of a file it sends.

The output is followed through the prediction: while the tokens emitted since the last step are
the prediction's next ones, the drafts are the tokens after them. Where the output leaves the
prediction (the edit), it is found again by its last tokens: the longest match of at least
PREDICTION_MIN_MATCH of them, the first one at or after where the output last was in the
prediction (edits move forward through a file), else the last one before. Each search is one
numpy pass over the prediction.

The prediction's tokens found in the output so (where it followed them, and the match it was found
again by), each counted once, are what OpenAI's usage calls the accepted prediction tokens; the
rest of the prediction, the rejected ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from app.config import MAX_PROMPT_LOOKUP
from app.engine.spec.ngram_proposer import longest_match_ends

PREDICTION_MIN_MATCH = 2  # a wrong realignment costs one step's rejected drafts; a missed one, every step's


@dataclass
class _Place:
    prediction: np.ndarray
    at: int = 0  # the prediction's index the output has reached
    output_length: int = 0  # the output's length when `at` was found
    num_matched: int = 0  # the prediction's tokens found in the output, each once (code repeats its lines)
    matched: np.ndarray | None = None  # [len(prediction)] bool: those tokens
    not_found_at: int = -1  # the output's length when it was last searched for and not found


class PredictionLookup:
    def __init__(self, min_n: int = PREDICTION_MIN_MATCH, max_n: int = MAX_PROMPT_LOOKUP):
        self.min_n, self.max_n = min_n, max_n
        self._places: dict[str, _Place] = {}

    def propose_for(self, request_id: str, prediction: Sequence[int], token_ids: Sequence[int],
                    num_prompt_tokens: int, k: int) -> list[int]:
        """Up to k tokens of the prediction that should follow the output (token_ids after the
        prompt); empty where the output has passed the prediction's end or is not in it."""
        place = self._follow(request_id, prediction, token_ids, num_prompt_tokens)
        return [] if place is None else place.prediction[place.at:place.at + k].tolist()

    def num_matched(self, request_id: str, prediction: Sequence[int], token_ids: Sequence[int],
                    num_prompt_tokens: int) -> int:
        """The prediction's tokens found in the output so far, each once."""
        self._follow(request_id, prediction, token_ids, num_prompt_tokens)
        return self._places[request_id].num_matched

    def _follow(self, request_id: str, prediction: Sequence[int], token_ids: Sequence[int],
                num_prompt_tokens: int) -> _Place | None:
        """The request's place with the output's new tokens followed through the prediction, or
        found again; None (the place as it was) where they are not in it."""
        place = self._places.get(request_id)
        if place is None:
            place = self._places[request_id] = _Place(np.asarray(prediction, dtype=np.int64))
        predicted = place.prediction
        output_length = len(token_ids) - num_prompt_tokens
        num_new = output_length - place.output_length
        n = min(output_length, self.max_n)
        tail = token_ids[len(token_ids) - n:] if n else []
        at = place.at + num_new
        if n <= at <= len(predicted) and predicted[at - n:at].tolist() == list(tail):
            _count_matches(place, place.at, at, token_ids)  # (a span before the tail may be replaced in place)
        else:
            if output_length == place.not_found_at:  # the step's output and its drafts ask alike
                return None
            at = self._found_again(predicted, np.asarray(tail, dtype=np.int64), place.at)
            if at < 0:
                place.not_found_at = output_length
                return None
            in_place = at == place.at + num_new  # found where it would be had the edit kept its length
            start = place.at if in_place else at - min(num_new, _matched_before(predicted, at, tail))
            _count_matches(place, start, at, token_ids)
        place.at, place.output_length = at, output_length
        return place

    def _found_again(self, predicted: np.ndarray, tail: np.ndarray, last_at: int) -> int:
        """The index after the longest match (at least min_n) of the tail's end in the prediction,
        with something after it: the first at or after `last_at`, else the last before; -1: none."""
        if len(tail) < self.min_n:
            return -1
        longest = longest_match_ends(predicted, tail, self.min_n, len(tail))
        if not longest.size:
            return -1
        later = longest[longest + 1 >= last_at]
        return int(later[0] + 1) if later.size else int(longest[-1] + 1)

    def forget(self, request_id: str) -> None:
        self._places.pop(request_id, None)


def _matched_before(predicted: np.ndarray, at: int, tail: Sequence[int]) -> int:
    """How many of the tail's last tokens the prediction holds just before `at`."""
    n = 0
    while n < len(tail) and n < at and predicted[at - 1 - n] == tail[len(tail) - 1 - n]:
        n += 1
    return n


def _count_matches(place: _Place, start: int, stop: int, token_ids: Sequence[int]) -> None:
    """Count the prediction's tokens in [start, stop) that equal the output's last stop - start
    tokens there, and were not counted before."""
    if stop <= start:
        return
    if place.matched is None:
        place.matched = np.zeros(len(place.prediction), dtype=bool)
    output = np.asarray(token_ids[len(token_ids) - (stop - start):], dtype=np.int64)
    found = (place.prediction[start:stop] == output) & ~place.matched[start:stop]
    place.matched[start:stop] |= found
    place.num_matched += int(found.sum())
