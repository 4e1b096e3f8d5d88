"""The A/B table's paired ratio: per round, so a machine that drifts during a run does not
decide which side looks faster."""

from __future__ import annotations

import statistics
import subprocess

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


def test_the_work_tree_side_is_a_worktree_of_head_with_the_checkouts_changes(tmp_path):
    from benchmarks.compare_refs import add_worktree, copy_working_changes

    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    (repo / "engine.py").write_text("step = 1\n")
    (repo / "kept.py").write_text("kept = True\n")
    (repo / ".gitignore").write_text("ignored/\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    (repo / "engine.py").write_text("step = 2\n")  # changed, not committed
    (repo / "new_dir").mkdir()
    (repo / "new_dir" / "new.py").write_text("new = True\n")  # untracked
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big.bin").write_text("x")  # ignored: stays behind

    side = add_worktree(tmp_path / "work-tree", "HEAD", repo=repo)
    copy_working_changes(side, repo=repo)
    assert (side / "engine.py").read_text() == "step = 2\n"
    assert (side / "kept.py").read_text() == "kept = True\n"
    assert (side / "new_dir" / "new.py").read_text() == "new = True\n"
    assert not (side / "ignored").exists()
