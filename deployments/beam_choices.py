"""Beam search's answer: each prompt's one engine request ends with its best beams, best first;
the first `n` become that prompt's choices, each detokenized as the prompt's choice would be."""

from __future__ import annotations

from dataclasses import dataclass

from deployments.choices import Choice


@dataclass
class BeamText:
    index: int  # the choice index: prompt by prompt, best beam first
    text: str
    finish_reason: str
    stop_reason: str | int | None  # the stop string or the request's own stop token that ended it
    token_ids: list[int]  # the beam's tokens (a reasoning split counts its reasoning's among them)


def beam_texts(choices: list[Choice], n: int) -> list[BeamText]:
    """`choices`: one per prompt, started (a beam search's only output is its first)."""
    texts = []
    for c in choices:
        final = c.first
        beams = final.beams[:n]
        for rank, beam in enumerate(beams):
            detok = c.detok.fresh()
            text = detok.add_tokens(beam.token_ids)
            reason = "stop" if detok.stopped else beam.finish_reason
            if not detok.stopped:
                text += detok.finish()
            stop_reason = detok.stop_reason if detok.stopped else beam.stop_token_id
            texts.append(BeamText(c.prompt_index * n + rank, text, reason, stop_reason, beam.token_ids))
        c.num_output_tokens = sum(len(beam.token_ids) for beam in beams)
        c.finish_reason = final.finish_reason
        c.close()
    return texts
