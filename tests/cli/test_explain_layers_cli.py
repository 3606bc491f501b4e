"""`specdraft explain-layers` end to end on the tiny target: the ranking table, a suggestion of
the configured count that never holds the last layer, the same output for the same seed, the
text for people, and the errors a user can make."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from train_support import single_thread, tiny_run, write_config

from specdraft.cli.main import cli

# The tiny target has 4 decoder layers: 0..2 may be tapped, 3 is the last.
NUM_LAYERS = 4


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


def write_conversations(path: Path, first: int, count: int) -> Path:
    """ShareGPT records first..first+count as a JSONL file of role/content messages."""
    from specdraft.trainer.assets.corpus import sharegpt_conversations

    with path.open("w") as handle:
        for messages in sharegpt_conversations(first, count):
            handle.write(json.dumps({"messages": messages}) + "\n")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("explain-layers")
    return {
        # About half the records fit in 128 tokens: 40 give 12 to fit on and more to hold out.
        "train_paths": [str(write_conversations(root / "train.jsonl", 0, 40))],
        "eval_paths": [str(write_conversations(root / "eval.jsonl", 10000, 12))],
        "max_length": 128,
        "max_samples": 40,
        "cache_dir": str(root / "cache"),
    }


@pytest.fixture(scope="module")
def config(tiny_target_path, data, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("explain-layers-config")
    return write_config(root / "run.toml", tiny_run(tiny_target_path, root / "run", data=data))


def run(*args: str):
    return CliRunner().invoke(cli, ["explain-layers", *args], catch_exceptions=False)


def report_of(*args: str) -> dict:
    done = run(*args, "--format", "json", "--samples", "12", "--positions", "24")
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def test_json_ranks_every_layer_and_suggests_the_configured_count(config):
    report = report_of(str(config))
    assert report["num_layers"] == NUM_LAYERS and report["seed"] == 42
    assert report["offsets"] == [2, 3, 4] and report["slots"] == [1, 2, 3]
    assert report["held_out_source"] == "data.eval_paths"
    assert report["fit"]["conversations"] == 12 and report["held_out"]["conversations"] >= 4
    assert 0 < report["fit"]["positions"] <= 12 * 24
    rows = report["layers"]
    assert [row["layer"] for row in rows] == list(range(NUM_LAYERS))
    assert rows[-1]["tap_allowed"] is False and rows[-1]["rank"] is None
    assert sorted(row["rank"] for row in rows[:-1]) == [1, 2, 3]
    assert sorted(report["ranking"]) == [0, 1, 2]
    for row in rows:
        assert len(row["probe"]["ce"]) == 3 and row["early_exit"]["ce"] > 0
    # As many taps as the config's [0, 2], never the last layer, in the line to paste.
    suggested = report["suggested"]["layers"]
    assert len(suggested) == 2 and NUM_LAYERS - 1 not in suggested
    assert suggested == sorted(step["layer"] for step in report["selection"])
    assert report["selection"][0]["layer"] == report["ranking"][0]
    assert report["config_line"] == f"target_layer_ids = {suggested}"
    assert report["configured"]["layers"] == [0, 2] and report["configured"]["score"] > 0
    assert report["seconds"]["total"] > 0 and any("specdraft curves" in n for n in report["notes"])


def test_the_same_seed_gives_the_same_report(config):
    first = report_of(str(config), "--seed", "7")
    second = report_of(str(config), "--seed", "7")
    for report in (first, second):
        report.pop("seconds"), report.pop("cpu_seconds")
    assert first == second and first["seed"] == 7


def test_text_prints_the_table_the_suggestion_and_the_line_to_paste(config):
    done = run(str(config), "--samples", "8", "--set", "model.target_layer_ids=[1]")
    assert done.exit_code == 0, done.output
    text = done.stdout
    assert "target layers by measurement" in text and "seed 42" in text
    assert "last layer (HF's normed final state): not a tap" in text
    assert "greedy forward selection" in text and "1. layer" in text and "2. layer" not in text
    line = next(line.strip() for line in text.splitlines() if "target_layer_ids = [" in line)
    assert line.startswith("target_layer_ids = [") and line.count(",") == 0
    assert "specdraft curves" in text and "time:" in text


def test_without_held_out_data_training_rows_are_held_out(tiny_target_path, data, tmp_path):
    bare = {key: value for key, value in data.items() if key != "eval_paths"}
    config = write_config(tmp_path / "run.toml", tiny_run(tiny_target_path, tmp_path, data=bare))
    report = report_of(str(config), "--eval-samples", "4")
    assert report["held_out_source"].startswith("training rows not used for fitting")
    assert report["held_out"]["conversations"] == 4 and report["fit"]["conversations"] == 12


def test_feature_shards_give_the_same_rows_as_the_conversations(tiny_target_path, data, tmp_path):
    """Shards hold only the configured taps: their tokens are read, the target runs for every
    layer, and the report equals the one from the conversations the shards were made from."""
    from specdraft.config import validate_config
    from specdraft.trainer.features.prepare import prepare_features

    settings = tiny_run(tiny_target_path, tmp_path / "run", data=data)
    prepare_features(validate_config(settings), tmp_path / "shards", progress=False)
    shards = {**settings, "data": {**settings["data"], "format": "features"}}
    shards["data"]["train_paths"] = [str(tmp_path / "shards")]
    from_shards = report_of(str(write_config(tmp_path / "shards.toml", shards)))
    from_text = report_of(str(write_config(tmp_path / "text.toml", settings)))
    for report in (from_shards, from_text):
        report.pop("seconds"), report.pop("cpu_seconds")
    assert from_shards == from_text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--offsets", "1,2"], "offsets lie in 2..8"),
        (["--offsets", "two"], "not a comma-separated list of offsets"),
        (["--samples", "0"], "--samples must be at least 1"),
        (["--count", "4"], "4 taps asked for, but the target's 4 layers leave 3"),
        (["--set", "data.max_length=oops"], "data.max_length"),
    ],
)
def test_mistakes_are_named_with_exit_2(config, args, message):
    done = run(str(config), *args)
    assert done.exit_code == 2
    assert message in done.output
