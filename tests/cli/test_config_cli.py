"""`specdraft config schema` and `specdraft config show`: output, overrides and errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tomli
from click.testing import CliRunner

from specdraft.cli.main import cli
from specdraft.config import load_config, validate_config
from specdraft.config.report import TEXT_LINE

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qwen3-8b-dspark-8192.toml"


@pytest.fixture(scope="module")
def config_cmd():
    """Run `specdraft config ARGS` in-process."""
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, ["config", *args], catch_exceptions=False)

    return invoke


def test_schema_prints_the_committed_json_schema(config_cmd):
    result = config_cmd("schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert {"model", "data", "training", "deployment", "tracking"} <= set(schema["properties"])
    assert result.stdout == (ROOT / "docs" / "config-schema.json").read_text(encoding="utf-8")


def test_show_prints_the_resolved_config_as_toml(config_cmd):
    result = config_cmd("show", str(EXAMPLE))
    assert result.exit_code == 0, result.stderr
    shown = validate_config(tomli.loads(result.stdout))
    assert shown == load_config(EXAMPLE)
    # Defaults the file leaves out are written out.
    assert "num_anchors = 512" in result.stdout
    assert 'attention_backend = "auto"' in result.stdout


def test_show_notes_the_shape_grid_and_anchor_widths(config_cmd):
    config = load_config(EXAMPLE)
    result = config_cmd("show", str(EXAMPLE), "--set", "training.static_anchor_buckets=[128, 256]")
    assert result.exit_code == 0, result.stderr
    header = [line.lstrip("# ").strip() for line in result.stdout.splitlines() if "#" in line]
    lengths = len(set(config.training.static_shape_buckets or []) | {config.data.max_length})
    assert f"anchor width: anchor buckets [128, 256, {config.training.num_anchors}]" in header
    assert f"shape grid: {lengths * 3} cell(s)" in header
    # The round trip still holds: the notes are comments, the values the resolved config.
    shown = validate_config(tomli.loads(result.stdout))
    assert shown.training.static_anchor_buckets == [128, 256]


def test_show_applies_overrides_and_prints_json(config_cmd):
    result = config_cmd(
        "show",
        str(EXAMPLE),
        "--set",
        "training.static_shape_buckets=[2048, 4096]",
        "--set",
        "run_id=tuned",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["training"]["static_shape_buckets"] == [2048, 4096]
    assert shown["run_id"] == "tuned"
    assert shown["data"]["max_length"] == 8192


def test_invalid_override_is_validated_like_the_file(config_cmd):
    item = "training.static_shape_buckets=[1000]"
    result = config_cmd("show", str(EXAMPLE), "--set", item)
    assert result.exit_code == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    match = re.match(TEXT_LINE, line)
    assert match and match["code"] == "SD201" and match["path"] == str(EXAMPLE)
    row = next(
        i for i, t in enumerate(EXAMPLE.read_text().splitlines(), 1) if "static_shape_buckets" in t
    )
    assert int(match["line"]) == row
    assert line.endswith(f"(from --set {item})")


def test_unknown_override_key_gets_did_you_mean(config_cmd):
    result = config_cmd("show", str(EXAMPLE), "--set", "training.num_anchor=64")
    assert result.exit_code == 1
    assert "did you mean 'num_anchors'?" in result.stderr


def test_malformed_override_and_missing_file_exit_2(config_cmd, tmp_path):
    malformed = config_cmd("show", str(EXAMPLE), "--set", "training")
    assert malformed.exit_code == 2 and " SD004 " in malformed.stderr
    missing = config_cmd("show", str(tmp_path / "absent.toml"))
    assert missing.exit_code == 2 and " SD002 " in missing.stderr
    assert "Traceback" not in missing.output


def test_help_lists_both_subcommands(config_cmd):
    result = config_cmd("--help")
    assert result.exit_code == 0
    assert "schema" in result.stdout and "show" in result.stdout
