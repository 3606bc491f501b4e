"""specdraft's estimate next to llama.cpp's at fewer draft tokens than the block proposes, and
the names of the speed settings a measurement can be limited to (no server needed here)."""

from __future__ import annotations

import pytest

from specdraft.trainer.serve.llama_served import estimate_summary
from specdraft.trainer.serve.llama_settings import SPEED_SETTINGS, check_speed_settings

ESTIMATE = {"tau": 2.0, "steps": 100.0, "accept_rate_per_pos": [0.6, 0.5, 0.5, 0.4]}


def test_the_whole_block_keeps_the_walk_s_own_tau_and_tokens():
    summary = estimate_summary(ESTIMATE, 4)
    assert summary["acceptance_length"] == 2.0 and summary["tokens"] == 200
    assert summary["per_position_given_previous"] == [0.6, 0.5, 0.5, 0.4]
    assert "block_acceptance_length" not in summary


def test_fewer_draft_tokens_cut_the_estimate_to_the_block_s_first_positions():
    summary = estimate_summary(ESTIMATE, 2)
    assert summary["acceptance_length"] == pytest.approx(1 + 0.6 + 0.3)
    assert summary["per_position_given_previous"] == [0.6, 0.5]
    assert summary["block_acceptance_length"] == 2.0 and summary["steps"] == 100.0
    assert "tokens" not in summary  # the walk's tokens are the whole block's


def test_speed_settings_are_checked_by_name():
    check_speed_settings(["ngram-simple", "ngram-mod", "draft"])
    assert SPEED_SETTINGS[:2] == ("none", "draft")
    with pytest.raises(ValueError, match=r"unknown llama\.cpp speed setting.*ngram-fast"):
        check_speed_settings(["ngram-fast", "none"])
