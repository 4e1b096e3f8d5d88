"""Configuration flows one way: the app's arguments are the engine's and the front's configs
(derived, not copied), every argument `serve_config.yaml` gives reaches the config it belongs
to, an unknown one is refused by name, and the context length is resolved once, by the builder,
from the checkpoint."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from app.config import EngineConfig
from app.engine.front_config import FrontConfig
from deployments.app_args import DERIVED_FIELDS, AppArgs
from deployments.builder import engine_config, resolve_checkpoint

ROOT = Path(__file__).resolve().parent.parent
# A value other than the default for every field the configs have.
NON_DEFAULT = {"dtype": "float16", "device": "cpu", "block_size": 32, "num_kv_blocks": 77,
               "kv_cache_memory_gib": 0.5, "max_model_len": 1000, "max_num_seqs": 9,
               "max_num_batched_tokens": 333, "scheduling_policy": "priority", "enable_prefix_caching": False, "seed": 5,
               "attention_backend": "torch", "enable_cuda_graphs": False, "speculative_method": "ngram",
               "num_speculative_tokens": 2, "speculation_schedule": {1: 2, 4: 0}, "adaptive_speculation": False,
               "draft_model": "checkpoints/tiny-draft", "enable_jump_forward": False, "overlap_scheduling": True,
               "prompt_lookup_first": False, "prompt_lookup_min": 3,
               "lookup_recent_output_tokens": 1024,
               "max_num_waiting_requests": 3, "stream_interval_ms": 25.0}


def yaml_args() -> dict:
    return yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]


def settings(config_class: type) -> list[dataclasses.Field]:
    """A config's fields that an app's arguments set (not those the builder derives from the checkpoint)."""
    return [f for f in dataclasses.fields(config_class) if f.name not in DERIVED_FIELDS]


def test_every_engine_and_front_setting_is_an_argument_with_its_default():
    for config in (EngineConfig, FrontConfig):
        for f in settings(config):
            assert f.name in AppArgs.model_fields, f.name
            if f.default is not dataclasses.MISSING:
                assert AppArgs.model_fields[f.name].default == f.default, f.name
    assert set(NON_DEFAULT) | {"model"} == {f.name for c in (EngineConfig, FrontConfig) for f in settings(c)}
    assert not set(DERIVED_FIELDS) & set(AppArgs.model_fields)  # what the checkpoint decides is not an argument


def test_serve_config_arguments_reach_the_engine_and_the_front():
    given = yaml_args()
    args = AppArgs.model_validate(given)
    model = resolve_checkpoint(args.model)
    config = engine_config(args, model, "cpu", draft_model=None)
    for name, value in given.items():  # what the shipped file sets arrives as set
        if name in {f.name for f in dataclasses.fields(EngineConfig)} - {"model", "device", "draft_model", "max_model_len"}:
            assert getattr(config, name) == value, name
    overridden = AppArgs.model_validate({**given, **NON_DEFAULT})
    config = engine_config(overridden, model, "cpu")
    for f in settings(EngineConfig):
        if f.name != "model":
            assert getattr(config, f.name) == NON_DEFAULT[f.name], f.name
    assert overridden.front_config() == FrontConfig(max_num_waiting_requests=3, stream_interval_ms=25.0)


def test_command_line_strings_coerce():
    args = AppArgs.model_validate({"model": "m", "max_num_seqs": "12", "enable_prefix_caching": "false",
                                   "speculation_schedule": "1:4,8:2,32:0", "max_model_len": "none",
                                   "api_keys": "a, b"})
    assert (args.max_num_seqs, args.enable_prefix_caching, args.max_model_len, args.api_keys) == (12, False, None, ["a", "b"])
    assert args.speculation_schedule == {1: 4, 8: 2, 32: 0}


@pytest.mark.parametrize("bad,words", [({"max_num_seq": 4}, "max_num_seq"),  # a typo is named, not dropped
                                       ({"speculative_method": "magic"}, "speculative_method"),
                                       ({"block_size": 12}, "block_size"),
                                       ({"stream_interval_ms": -1}, "stream_interval_ms"),
                                       ({"reasoning_parser": "deepseek"}, "reasoning_parser"),
                                       ({"tool_call_parser": "no_such_parser"}, "tool_call_parser"),
                                       ({"speculative_method": "draft", "draft_model": None}, "draft_model")])
def test_bad_arguments_are_refused_by_name(bad, words):
    with pytest.raises(ValidationError, match=words):
        AppArgs.model_validate({**yaml_args(), **bad})


def test_context_length_is_resolved_once_from_the_checkpoint():
    model = resolve_checkpoint("checkpoints/tiny-target")
    assert engine_config(AppArgs(model=model), model, "cpu").max_model_len == 2048  # config.json's
    assert engine_config(AppArgs(model=model, max_model_len=512), model, "cpu").max_model_len == 512
    with pytest.raises(ValueError, match="over the model's limit 2048"):
        engine_config(AppArgs(model=model, max_model_len=4096), model, "cpu")
