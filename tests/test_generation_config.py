"""A checkpoint's generation_config.json, as vLLM and transformers read it: the EOS tokens it
adds end requests (with no stop reason, as the model's own), and its sampling settings fill
what a request leaves unset, unless `sampling_defaults: openai`."""

from __future__ import annotations

import json

import pytest

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.models.config import ModelConfig
from app.models.generation_config import GenerationDefaults
from app.sampling_params import SamplingParams
from deployments.app_args import AppArgs
from deployments.builder import request_defaults
from deployments.chat_protocol import ChatCompletionRequest
from deployments.protocol import CompletionRequest
from tests.checkpoints import write_random_qwen2

# Qwen2.5-7B-Instruct's generation_config.json, less its bos/pad ids.
QWEN25_INSTRUCT = {"do_sample": True, "eos_token_id": [151645, 151643], "repetition_penalty": 1.05,
                   "temperature": 0.7, "top_p": 0.8, "top_k": 20}


def test_reads_eos_tokens_and_sampling_settings_but_not_do_sample():
    defaults = GenerationDefaults.from_dict(QWEN25_INSTRUCT)
    assert defaults.eos_token_ids == (151645, 151643)
    assert defaults.sampling == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    assert defaults.max_tokens is None
    single = GenerationDefaults.from_dict({"eos_token_id": 2, "max_new_tokens": 512, "top_p": None})
    assert (single.eos_token_ids, single.sampling, single.max_tokens) == ((2,), {}, 512)


def test_model_eos_tokens_are_config_json_then_generation_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "eos_token_id": 151645}))
    assert ModelConfig.from_dir(tmp_path).eos_token_ids == (151645,)
    (tmp_path / "generation_config.json").write_text(json.dumps(QWEN25_INSTRUCT))
    assert ModelConfig.from_dir(tmp_path).eos_token_ids == (151645, 151643)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_qwen2(tmp_path_factory.mktemp("qwen2"))


def test_a_token_only_generation_config_names_ends_the_request_as_eos(checkpoint):
    def engine():
        return LLMEngine(EngineConfig(model=str(checkpoint), num_kv_blocks=64))

    prompt = [5, 17, 230, 99, 41]
    free_run = engine().generate([prompt], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))[0]
    file = checkpoint / "generation_config.json"
    written = file.read_text()
    try:
        file.write_text(json.dumps({**json.loads(written), "eos_token_id": [1, free_run[3]]}))
        eos_engine = engine()
        eos_engine.add_request("r", prompt, SamplingParams(max_tokens=10, temperature=0))
        outs = []
        while eos_engine.has_unfinished_requests():
            outs += eos_engine.step()
        ignoring = eos_engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))[0]
    finally:
        file.write_text(written)
    assert sum((o.new_token_ids for o in outs), []) == free_run[:free_run.index(free_run[3]) + 1]
    assert (outs[-1].finish_reason, outs[-1].stop_token_id) == ("stop", None)
    assert ignoring == free_run


def test_the_offline_engine_without_params_takes_the_model_defaults(checkpoint):
    prompt = [5, 17, 230, 99, 41]
    engine = LLMEngine(EngineConfig(model=str(checkpoint), num_kv_blocks=64))
    assert engine.default_sampling_params() == SamplingParams()  # the file sets no sampling field
    file = checkpoint / "generation_config.json"
    written = file.read_text()
    try:
        file.write_text(json.dumps({**json.loads(written), "temperature": 0.0, "max_new_tokens": 7}))
        assert engine.default_sampling_params() == SamplingParams(temperature=0.0, max_tokens=7)
        assert engine.generate([prompt]) == engine.generate([prompt], SamplingParams(temperature=0, max_tokens=7))
    finally:
        file.write_text(written)


def test_unset_request_fields_take_the_model_defaults_and_given_ones_win():
    model = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    unset = CompletionRequest(prompt="x").with_defaults(model)
    assert (unset.temperature, unset.top_p, unset.top_k, unset.repetition_penalty) == (0.7, 0.8, 20, 1.05)
    given = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "x"}], "temperature": 0, "top_k": None, "min_p": 0.1,
    }).with_defaults(model)
    # temperature was given (0: greedy); a null field counts as unset, as in vLLM.
    assert (given.temperature, given.top_p, given.top_k, given.min_p) == (0.0, 0.8, 20, 0.1)
    assert CompletionRequest(prompt="x").with_defaults({}).temperature == 1.0  # OpenAI's own
    beams = CompletionRequest(prompt="x", n=2, use_beam_search=True).with_defaults(model)
    assert (beams.temperature, beams.top_k) == (1.0, 0)  # beam search takes the model's logprobs


def test_max_tokens_given_counts_either_spelling():
    chat = {"messages": [{"role": "user", "content": "x"}]}
    assert not ChatCompletionRequest.model_validate(chat).max_tokens_given
    assert ChatCompletionRequest.model_validate({**chat, "max_completion_tokens": 5}).max_tokens_given
    assert ChatCompletionRequest.model_validate({**chat, "max_tokens": 5}).max_tokens_given
    assert not CompletionRequest(prompt="x").max_tokens_given  # OpenAI's default of 16 is not given


def test_the_server_checks_the_model_defaults_at_start_up_or_leaves_them_out(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9}))
    model = str(tmp_path)
    assert request_defaults(AppArgs.model_validate({"model": model}), model).sampling == {
        "temperature": 0.6, "top_p": 0.9}
    assert request_defaults(AppArgs.model_validate({"model": model, "sampling_defaults": "openai"}),
                            model) == GenerationDefaults()
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 0}))
    with pytest.raises(ValueError, match="generation_config.json: top_p must be in"):
        request_defaults(AppArgs.model_validate({"model": model}), model)


def test_the_tokenizers_eos_token_is_the_models_too(tmp_path):
    """A fine-tune that moved to ChatML names `<|im_end|>` in tokenizer_config.json alone."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "eos_token_id": 2}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (tmp_path / "tokenizer.json").write_text(json.dumps({
        "added_tokens": [{"id": 2, "content": "</s>"}, {"id": 32000, "content": "<|im_end|>"}],
        "model": {"vocab": {"</s>": 2, "a": 3}}}))
    assert ModelConfig.from_dir(tmp_path).eos_token_ids == (2, 32000)
    # transformers 4's spellings: an AddedToken dict, and the ids in added_tokens_decoder
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": {"content": "<|im_end|>"}, "added_tokens_decoder": {"7": {"content": "<|im_end|>"}}}))
    assert ModelConfig.from_dir(tmp_path).eos_token_ids == (2, 7)


@pytest.mark.parametrize("make", ["shipped", "trained tokenizer"])
def test_the_tokenizers_eos_token_is_the_one_transformers_loads(make, tmp_path):
    from transformers import AutoTokenizer

    from app.models.tokenizer_eos import tokenizer_eos_token_id
    from tests.checkpoints import DEFAULT_TARGET
    from tests.serve.conftest import write_checkpoint_with_tokenizer

    path = DEFAULT_TARGET if make == "shipped" else write_checkpoint_with_tokenizer(tmp_path / "ckpt")
    assert tokenizer_eos_token_id(path) == AutoTokenizer.from_pretrained(path).eos_token_id is not None
