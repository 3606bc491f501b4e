"""The served-speed report: ratios against the target alone, identical outputs counted per
setting, and the three speculative settings vLLM is asked to run (no vLLM needed here)."""

from __future__ import annotations

from pathlib import Path

from specdraft.trainer.serve.speed import speed_lines, speed_settings


def setting(name, batch1_s, batch_s, accept=None, identical=4):
    return {
        "name": name,
        "batch1": {
            "prompts": 2,
            "tokens": 200,
            "seconds": batch1_s,
            "tokens_per_s": 200 / batch1_s,
        },
        "batch": {"prompts": 4, "tokens": 400, "seconds": batch_s, "tokens_per_s": 400 / batch_s},
        "acceptance_length": accept,
        "per_position": [],
        "identical": identical,
    }


def result(*settings):
    return {
        "stage": "done",
        "family": "dflash",
        "vllm_version": "0.32.0",
        "prompts": 4,
        "batch1_prompts": 2,
        "max_tokens": 100,
        "draft_tokens": 7,
        "settings": list(settings),
    }


def test_speedups_are_against_the_target_alone_at_each_batch():
    lines = speed_lines(
        result(
            setting("none", 10.0, 4.0),
            setting("draft", 5.0, 8.0, accept=2.5),
            setting("ngram", 8.0, 4.0, accept=1.3, identical=3),
        )
    )
    draft = next(line for line in lines if line.startswith("dflash draft"))
    ngram = next(line for line in lines if line.startswith("n-gram"))
    # Twice as fast at batch 1, half as fast at the batch.
    assert "2.500" in draft and "2.00x" in draft and "0.50x" in draft and "4/4" in draft
    assert "1.25x" in ngram and "1.00x" in ngram and "3/4" in ngram


def test_a_refused_measurement_says_why():
    lines = speed_lines({"stage": "serve", "vllm_version": "0.32.0", "error": "out of memory"})
    assert lines == ["vLLM 0.32.0 could not measure speed: out of memory"]


def test_the_settings_are_none_the_draft_and_ngram_with_the_same_token_budget():
    none, draft, ngram = speed_settings(Path("/d"), "dflash", 7, 7)
    assert "speculative_config" not in none
    assert draft["speculative_config"] == {
        "method": "dflash",
        "model": "/d",
        "num_speculative_tokens": 7,
    }
    assert ngram["speculative_config"]["method"] == "ngram"
    assert ngram["speculative_config"]["num_speculative_tokens"] == 7
    lookup = ngram["speculative_config"]
    assert 1 <= lookup["prompt_lookup_min"] <= lookup["prompt_lookup_max"]


def test_more_token_counts_add_the_draft_and_ngram_at_each_count_once():
    settings = speed_settings(Path("/d"), "dflash", 7, 7, more_tokens=[5, 3, 7, 3])
    names = [s["name"] for s in settings]
    # The draft's own count is not served twice; the others in increasing order.
    assert names == ["none", "draft", "ngram", "draft-3", "ngram-3", "draft-5", "ngram-5"]
    by_name = {s["name"]: s for s in settings}
    assert by_name["draft-3"]["speculative_config"]["num_speculative_tokens"] == 3
    assert by_name["draft-3"]["speculative_config"]["model"] == "/d"
    assert by_name["ngram-5"]["speculative_config"]["method"] == "ngram"
    assert by_name["ngram-5"]["speculative_config"]["num_speculative_tokens"] == 5


def test_the_table_names_each_token_count_and_the_fastest_honest_setting():
    rows = [
        setting("none", 10.0, 4.0),
        {**setting("draft", 12.0, 8.0, accept=1.2), "speculative_tokens": 7},
        {**setting("ngram", 8.0, 4.0, accept=3.1), "speculative_tokens": 7},
        {**setting("draft-3", 9.0, 6.0, accept=1.2), "speculative_tokens": 3},
        # The fastest, but one answer differs from the target's: never the pick.
        {**setting("ngram-3", 4.0, 4.0, accept=2.0, identical=3), "speculative_tokens": 3},
    ]
    lines = speed_lines(result(*rows))
    assert any(line.startswith("dflash draft, 3 tokens") for line in lines)
    assert any(line.startswith("n-gram 2-4, 7 tokens") for line in lines)
    assert lines[-1].startswith("fastest at batch 1: n-gram 2-4, 7 tokens (1.25x")
