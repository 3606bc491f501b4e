"""Lint output: the text and JSON forms, the exit status, and a failed load rendered in place."""

from __future__ import annotations

import json
import re

import pytest
from config_cases import BASE, position_of, replace_once

from specdraft.config.finding import Finding
from specdraft.config.loader import ConfigError, load_config
from specdraft.config.report import (
    TEXT_LINE,
    ExitCode,
    format_config_error,
    render_json,
    render_text,
    summary,
)


def _finding(code="SD201", severity="error", message="bucket 1000 is bad", line=3, col=7):
    return Finding("c.toml", line, col, code, severity, message, "training.static_shape_buckets[1]")


def test_text_is_one_path_line_col_code_message_line_per_finding():
    text = render_text([_finding(), _finding("SD210", "note", "appended\nover two lines")])
    first, second = text.splitlines()
    assert first == "c.toml:3:7: SD201 bucket 1000 is bad"
    assert second == "c.toml:3:7: SD210 note: appended over two lines"
    assert all(re.match(TEXT_LINE, line) for line in text.splitlines())


def test_json_is_a_list_of_objects_with_every_field():
    [obj] = json.loads(render_json([_finding()]))
    assert obj == {
        "path": "c.toml",
        "line": 3,
        "col": 7,
        "code": "SD201",
        "severity": "error",
        "message": "bucket 1000 is bad",
        "key": "training.static_shape_buckets[1]",
    }
    assert json.loads(render_json([])) == []


@pytest.mark.parametrize(
    ("findings", "status"),
    [
        ([], ExitCode.CLEAN),
        ([_finding("SD210", "note"), _finding("SD212", "warning")], ExitCode.CLEAN),
        ([_finding("SD212", "warning"), _finding()], ExitCode.FINDINGS),
        ([_finding(), _finding("SD001")], ExitCode.FATAL),
        ([_finding("SD002")], ExitCode.FATAL),
    ],
)
def test_exit_status(findings, status):
    assert ExitCode.of(findings) == status


def test_summary_counts_each_severity():
    line = summary([_finding(), _finding(), _finding("SD210", "note")], 1)
    assert line == "1 file checked: 2 errors, 0 warnings, 1 note"


def _error(tmp_path, text, overrides=()):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides)
    return path, caught.value


def test_invalid_config_error_is_rendered_at_file_line_col(tmp_path):
    text = replace_once(BASE, "[512, 1024, 2048]", "[512, 1000]")
    path, err = _error(tmp_path, text)
    line, col = position_of(text, "1000")
    assert format_config_error(err).startswith(f"{path}:{line}:{col}: SD201 bucket 1000")


def test_override_errors_name_the_override(tmp_path):
    path, err = _error(tmp_path, BASE, ["training.static_shape_buckets=[384, 100]"])
    [line] = format_config_error(err, ["training.static_shape_buckets=[384, 100]"]).splitlines()
    expected = position_of(BASE, "static_shape_buckets")
    assert line.startswith(f"{path}:{expected[0]}:{expected[1]}: SD201 bucket 100 ")
    assert line.endswith("(from --set training.static_shape_buckets=[384, 100])")


def test_syntax_io_and_override_errors_render_too(tmp_path):
    path, err = _error(tmp_path, "a = [1,\n")
    assert re.match(rf"^{re.escape(str(path))}:\d+:\d+: SD001 TOML syntax error", str(
        format_config_error(err)))  # fmt: skip
    _, err = _error(tmp_path, BASE, ["no-equals-sign"])
    assert " SD004 " in format_config_error(err)
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "absent.toml")
    assert format_config_error(caught.value).startswith(f"{tmp_path / 'absent.toml'}:1:1: SD002")
