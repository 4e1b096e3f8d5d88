"""A checkpoint's generation_config.json through the served API (the default
`sampling_defaults: model`, as vLLM's `--generation-config auto`): its sampling settings and
`max_new_tokens` fill what a request leaves unset, what a request gives wins, and a token only
it names as EOS ends a request as the model's EOS does."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tests.serve.conftest import start_serve_app, stop_serve_app

pytestmark = pytest.mark.slow

PROMPT = "x = [3, 1, 2]\nfor"
MAX_NEW_TOKENS = 6  # the checkpoint's default length: under completions' 16 and chat's whole context


@dataclass
class Case:
    prompt_ids: list[int]
    greedy: list[int]  # 8 tokens, EOS ignored
    seed: int  # one whose temperature-1 draw differs from greedy
    sampled: list[int]  # 8 tokens drawn with it, EOS ignored
    eos_at: int  # greedy[eos_at] is the token only generation_config.json names as EOS


@pytest.fixture(scope="module")
def case(checkpoints, tokenizer_of_target) -> Case:
    from app.config import EngineConfig
    from app.engine.engine import LLMEngine
    from app.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(checkpoints[0]), device="cpu", num_kv_blocks=64))
    ids = tokenizer_of_target.encode(PROMPT)

    def run(**params) -> list[int]:
        return engine.generate([ids], SamplingParams(max_tokens=8, ignore_eos=True, **params))[0]

    greedy = run(temperature=0)
    seed = next(s for s in range(10) if run(seed=s)[:MAX_NEW_TOKENS] != greedy[:MAX_NEW_TOKENS])
    eos = engine.model_config.eos_token_ids
    eos_at = next(j for j in range(2, MAX_NEW_TOKENS)
                  if greedy[j] not in greedy[:j] and not set(greedy[:j + 1]) & set(eos))
    return Case(ids, greedy, seed, run(seed=seed), eos_at)


@pytest.fixture(scope="module")
def tokenizer_of_target(checkpoints):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoints[0])


@pytest.fixture(scope="module")
def serve_app(checkpoints, case, tmp_path_factory):
    """The target checkpoint with a generation_config.json of an instruct model's kind: greedy
    by top_k 1, a default length, and one more EOS token."""
    target = checkpoints[0]
    path = tmp_path_factory.mktemp("generation_config") / target.name
    path.mkdir()
    for file in target.iterdir():
        if file.name != "generation_config.json":
            (path / file.name).symlink_to(file)
    written = json.loads((target / "generation_config.json").read_text())
    eos = written.get("eos_token_id", [])
    (path / "generation_config.json").write_text(json.dumps({
        **written, "eos_token_id": (eos if isinstance(eos, list) else [eos]) + [case.greedy[case.eos_at]],
        "do_sample": True, "top_k": 1, "max_new_tokens": MAX_NEW_TOKENS}))
    app = start_serve_app("generation_config", {"model": str(path), "device": "cpu", "num_kv_blocks": 128,
                                                "max_num_seqs": 16, "speculative_method": None})
    try:
        yield app
    finally:
        stop_serve_app()


def test_unset_fields_take_the_checkpoints_settings(serve_app, client, case, tokenizer_of_target):
    got = client.completions.create(model=serve_app.model, prompt=case.prompt_ids, seed=case.seed,
                                    extra_body={"ignore_eos": True})
    # top_k 1 (greedy, whatever the seed) and max_new_tokens, where OpenAI's defaults would draw
    # at temperature 1 for 16 tokens.
    assert got.usage.completion_tokens == MAX_NEW_TOKENS and got.choices[0].finish_reason == "length"
    assert got.choices[0].text == tokenizer_of_target.decode(case.greedy[:MAX_NEW_TOKENS])


def test_fields_a_request_gives_win(serve_app, client, case, tokenizer_of_target):
    got = client.completions.create(model=serve_app.model, prompt=case.prompt_ids, seed=case.seed,
                                    temperature=1.0, max_tokens=8, extra_body={"top_k": 0, "ignore_eos": True})
    assert got.usage.completion_tokens == 8
    assert got.choices[0].text == tokenizer_of_target.decode(case.sampled)


def test_chat_without_max_tokens_takes_the_checkpoints_length(serve_app, client):
    got = client.chat.completions.create(model=serve_app.model, messages=[{"role": "user", "content": PROMPT}],
                                         extra_body={"ignore_eos": True})
    assert got.usage.completion_tokens == MAX_NEW_TOKENS and got.choices[0].finish_reason == "length"


def test_a_token_only_generation_config_names_as_eos_ends_the_request(serve_app, client, case):
    got = client.completions.create(model=serve_app.model, prompt=case.prompt_ids, max_tokens=8,
                                    temperature=0)
    assert got.usage.completion_tokens == case.eos_at + 1
    assert (got.choices[0].finish_reason, got.choices[0].stop_reason) == ("stop", None)
