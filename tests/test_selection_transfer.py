"""What crosses to the host in a decode step: one copy, of the chosen tokens, the accepted
counts and the logprobs requests asked for, whatever the mix of rows (greedy, sampled, guided,
verifying drafts); and nothing in selection turns a tensor into Python values on the way."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from outlines_core.json_schema import build_regex_from_schema
from transformers import AutoTokenizer

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.engine.selection import transfer
from app.guided.compiler import compile_regex
from app.guided.guide import GuidedDecoder
from app.guided.vocabulary import load_guided_vocabulary
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_DRAFT, DEFAULT_TARGET

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}}, "required": ["name", "age"]}


@contextlib.contextmanager
def host_conversions_counted(counts: dict[str, int], allowed: list[torch.Tensor] | None = None):
    """Count tensor -> host conversions (.item(), .cpu(), .tolist()) made outside
    transfer.to_host and on anything but what it returned. (`.numpy()` is not one: it only
    views a tensor already on the host, and raises on a device tensor.)"""
    originals = {name: getattr(torch.Tensor, name) for name in ("item", "cpu", "tolist")}
    allowed = [] if allowed is None else allowed  # kept alive, so no other tensor takes their id
    real_to_host = transfer.to_host

    def to_host(payload):
        counts["to_host"] = counts.get("to_host", 0) + 1
        counts["bytes"] = counts.get("bytes", 0) + payload.numel() * payload.element_size()
        out = real_to_host(payload)
        allowed.append(out.tensor)
        return out

    def counting(name):
        def method(self, *args, **kwargs):
            if not any(self is a for a in allowed):
                counts[name] = counts.get(name, 0) + 1
            return originals[name](self, *args, **kwargs)
        return method

    for name in originals:
        setattr(torch.Tensor, name, counting(name))
    transfer.to_host = to_host
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)
        transfer.to_host = real_to_host


def test_one_copy_per_step_of_the_expected_size():
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    vocab = load_guided_vocabulary(DEFAULT_TARGET)
    index = compile_regex(build_regex_from_schema(json.dumps(SCHEMA), ""), vocab)
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), draft_model=str(DEFAULT_DRAFT),
                                    num_kv_blocks=256, speculative_method="draft",
                                    speculation_schedule={1: 3}, enable_jump_forward=True))
    engine.add_request("guided", tokenizer.encode("person = "), SamplingParams(max_tokens=40, temperature=0),
                       GuidedDecoder(index, vocab, 4096))
    engine.add_request("greedy", tokenizer.encode("def f():"), SamplingParams(max_tokens=40, temperature=0,
                                                                             logprobs=2))
    engine.add_request("seeded", tokenizer.encode("The cat"), SamplingParams(max_tokens=40, temperature=0.8,
                                                                            top_p=0.95, seed=3))
    engine.add_request("sampled", tokenizer.encode("Once upon"), SamplingParams(max_tokens=40, temperature=1.0,
                                                                               logprobs=3))
    layouts = []  # (layout, what crossed to the host from selecting on the device to unpacking, drafts)
    real_on_device, real_to_host = engine._select_on_device, engine._to_host

    allowed = []  # what transfer.to_host returned, carried from selecting to unpacking

    def on_device(logits, layout, argmax):
        counts = {}
        with host_conversions_counted(counts, allowed):
            selection = real_on_device(logits, layout, argmax)
        if layout is not None:
            layouts.append((layout, counts, [(list(r.spec_token_ids), r.spec_forced) for r in layout.requests]))
        return selection

    def to_host(flight):
        with host_conversions_counted(layouts[-1][1], allowed):
            return real_to_host(flight)

    engine._select_on_device, engine._to_host = on_device, to_host
    kinds_seen = set()
    while engine.has_unfinished_requests():
        engine.step()
    for layout, counts, drafts in layouts:
        n = len(layout.requests)
        logprob_rows = sum(1 + len(d) for r, (d, _) in zip(layout.requests, drafts)
                           if r.params.logprobs is not None)
        top = max((r.params.logprobs for r in layout.requests if r.params.logprobs is not None), default=1)
        # float64 each: accepted count and token per request; per asked-for row, the token's
        # logprob and the top-n (id, logprob) pairs.
        assert counts == {"to_host": 1, "bytes": 8 * (2 * n + logprob_rows * (1 + 2 * top))}, counts
        for req, (d, forced) in zip(layout.requests, drafts):
            if req.guide is not None:
                kinds_seen.add("guided")
            if d and not forced:
                kinds_seen.add("speculative")
            kinds_seen.add("greedy" if req.params.greedy else "sampled")
        if len(layout.requests) == 4 and any(d and not forced for d, forced in drafts):
            kinds_seen.add("mixed step")
    assert kinds_seen == {"guided", "speculative", "greedy", "sampled", "mixed step"}


@pytest.mark.parametrize("extra", ["cpu", "item"])
def test_the_count_sees_an_extra_copy(extra):
    """The instrument above does catch a second copy or a per-row .item() in selection."""
    with host_conversions_counted({}) as counts:
        transfer.to_host(torch.arange(4)).wait().tolist()
        getattr(torch.arange(1), extra)()
    assert counts.get(extra) == 1 and counts["to_host"] == 1
