"""The A/B table's paired ratio: per round, so a machine that drifts during a run does not
decide which side looks faster."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.compare_refs import paired_ratio

# Served mean e2e ms at concurrency 1, five rounds (benchmarks/RESULTS.md, 2026-11-28): the
# machine sped up by a fifth during the run, and the sides' order rotated each round.
WORK_TREE = [208, 207, 210, 181, 169]
SIDE = [221, 202, 187, 183, 178]


def test_the_paired_ratio_is_the_median_of_each_rounds_ratio():
    # The rounds' ratios are 1.06, 0.98, 0.89, 1.01, 1.05: the work tree won 3 of 5.
    assert paired_ratio(WORK_TREE, SIDE, higher_is_better=False) == pytest.approx(183 / 181)
    # The medians of the sides would say it is 10% slower.
    assert statistics.median(SIDE) / statistics.median(WORK_TREE) == pytest.approx(187 / 207)
    assert paired_ratio([2 * w for w in WORK_TREE], WORK_TREE) == pytest.approx(2.0)  # throughput: higher is better
