"""Speculation schedule: batch size -> k as a step function, k = 0 at large batches, config
parsing (YAML/JSON string keys, a plain int) and validation of mistakes."""

import pytest

from app.engine.spec.schedule import SpeculationSchedule

GPU_DEFAULT = {1: 4, 8: 2, 32: 0}  # SpeculationSchedule.default(4) on a GPU


def test_step_function_boundaries():
    s = SpeculationSchedule({1: 4, 8: 3, 16: 2, 32: 0})
    expected = {0: 4, 1: 4, 7: 4, 8: 3, 15: 3, 16: 2, 31: 2, 32: 0, 64: 0, 10_000: 0}
    assert {b: s.k_for(b) for b in expected} == expected
    assert s.k_for(8) == 3 and s.max_k == 4


def test_largest_drafting_batch_sizes_the_verify_graphs():
    """The CUDA graphs for verifying steps cover the batch sizes that draft, no more."""
    assert SpeculationSchedule(GPU_DEFAULT).largest_drafting_batch(256) == 31
    assert SpeculationSchedule(GPU_DEFAULT).largest_drafting_batch(16) == 16
    assert SpeculationSchedule({1: 2}).largest_drafting_batch(64) == 64
    assert SpeculationSchedule.disabled().largest_drafting_batch(64) == 0


def test_default_turns_speculation_off_at_large_batches():
    s = SpeculationSchedule.default(4)
    assert s.as_dict() == GPU_DEFAULT
    assert s.k_for(1) > 0 and s.k_for(1024) == 0
    assert SpeculationSchedule.from_config(None, 4).as_dict() == GPU_DEFAULT
    assert SpeculationSchedule.from_config(None, 4, "cpu").as_dict() == {1: 4, 4: 0}
    assert SpeculationSchedule.default(0).max_k == 0


def test_from_config_forms():
    assert SpeculationSchedule.from_config({"1": 5, "4": 2, "16": 0}, 4).as_dict() == {1: 5, 4: 2, 16: 0}
    assert SpeculationSchedule.from_config({16: 0, 1: 3}, 4).k_for(20) == 0  # any key order
    constant = SpeculationSchedule.from_config(3, 4)
    assert constant.k_for(1) == constant.k_for(500) == 3
    disabled = SpeculationSchedule.disabled()
    assert disabled.max_k == 0 and disabled.k_for(1) == 0
    assert "1: 4" in repr(SpeculationSchedule.default(4))


@pytest.mark.parametrize("config", [
    {},  # empty
    {0: 4},  # batch size 0 is not a threshold
    {1: -1},  # negative k
    {1: 100},  # absurd k
    {1: 2, 8: 4},  # k grows with the batch
    {4: 2, 16: 0},  # batches 1-3 have no k
    {1: 2.5},  # not an integer
    {1.0: 2},
    {1: True},
    {"one": 2},
    {1: 4, "1": 3},  # the same threshold twice
])
def test_invalid_mappings(config):
    with pytest.raises(ValueError):
        SpeculationSchedule.from_config(config, 4)


@pytest.mark.parametrize("config", [True, "4", [1, 4], 2.0])
def test_invalid_config_types(config):
    with pytest.raises(ValueError):
        SpeculationSchedule.from_config(config, 4)


def test_negative_batch_size():
    with pytest.raises(ValueError):
        SpeculationSchedule.default(4).k_for(-1)
