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
