"""`lint_file`: the examples are clean, and every kind of bad file is reported where it is."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import tomli
from config_cases import BASE, position_of, replace_once

from specdraft.config import lint as lint_module
from specdraft.config import load_config
from specdraft.config.families import FAMILY_RULES
from specdraft.config.lint import lint_file, lint_text
from specdraft.config.report import ExitCode

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))


@pytest.mark.parametrize("algorithm", sorted(FAMILY_RULES))
def test_there_is_an_example_for_every_family(algorithm):
    configs = [load_config(p) for p in EXAMPLES]
    assert any(c.model.algorithm == algorithm for c in configs)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_lint_clean(example):
    assert lint_file(example) == []


def test_missing_file_and_folder_are_io_errors(tmp_path):
    for path in (tmp_path / "absent.toml", tmp_path):
        [finding] = lint_file(path)
        assert (finding.code, finding.line, finding.col) == ("SD002", 1, 1)
        assert ExitCode.of([finding]) == ExitCode.FATAL


def test_non_utf8_file_is_an_io_error(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('run_id = "caf\xe9"\n'.encode("latin-1"))
    assert [f.code for f in lint_file(path)] == ["SD002"]


@pytest.mark.parametrize(
    "text",
    ["a = [1,\n2", "[model\n", 'x = "open', "a = 1\na = 2\n", "key without value\n", "= 3"],
)
def test_syntax_errors_use_the_parsers_line_and_column(tmp_path, text):
    with pytest.raises(tomli.TOMLDecodeError) as parsed:
        tomli.loads(text)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    [finding] = lint_file(path)
    assert finding.code == "SD001"
    assert (finding.line, finding.col) == (parsed.value.lineno, parsed.value.colno)
    assert ExitCode.of([finding]) == ExitCode.FATAL


def test_unknown_key_points_at_the_key_with_did_you_mean():
    text = replace_once(BASE, "max_length = 2048", "max_lenght = 2048")
    [finding] = lint_text(text)
    assert finding.code == "SD101"
    assert (finding.line, finding.col) == position_of(text, "max_lenght")
    assert "did you mean 'max_length'?" in finding.message
    assert finding.key == "data.max_lenght"


def test_key_in_the_wrong_table_says_where_it_belongs():
    text = BASE + "max_length = 4096\n"
    [finding] = lint_text(text)
    assert "belongs in [data]" in finding.message


def test_misspelled_table_is_an_unknown_key_at_its_header():
    text = BASE + "[trainig.x]\ny = 1\n"
    [finding] = lint_text(text)
    assert (finding.line, finding.col) == position_of(text, "[trainig.x]")
    assert "did you mean 'training'?" in finding.message


def test_missing_required_key_points_at_its_table_header():
    text = replace_once(BASE, "mask_token_id = 100\n", "")
    [finding] = lint_text(text)
    assert finding.code == "SD102"
    assert (finding.line, finding.col) == position_of(text, "[model]")
    assert "mask_token_id" in finding.message


def test_missing_required_table_points_at_the_start():
    text = BASE[: BASE.index("[data]")]
    [finding] = lint_text(text)
    assert (finding.code, finding.line, finding.col) == ("SD102", 1, 1)
    assert "missing required table [data]" in finding.message


def test_wrong_type_points_at_the_value():
    text = replace_once(BASE, "mask_token_id = 100", 'mask_token_id = "mask"')
    [finding] = lint_text(text)
    assert finding.code == "SD103"
    assert (finding.line, finding.col) == position_of(text, '"mask"')


def test_string_where_a_list_belongs_suggests_the_list():
    text = replace_once(BASE, 'train_paths = ["train.jsonl"]', 'train_paths = "train.jsonl"')
    [finding] = lint_text(text)
    assert 'write a list: ["train.jsonl"]' in finding.message


def test_every_schema_error_is_reported_at_once():
    text = replace_once(BASE, "max_length = 2048", "max_lenght = 2048\nbad_rows = 'drop'")
    assert [f.code for f in lint_text(text)] == ["SD101", "SD104"]


def test_strict_turns_warnings_into_errors_and_leaves_notes():
    text = replace_once(BASE, "static_shape_buckets = [512, 1024, 2048]", "")
    text = replace_once(text, "static_shapes = true", "compile_blocks = true")
    relaxed = lint_text(text)
    strict = lint_text(text, strict=True)
    assert [(f.code, f.severity) for f in relaxed] == [("SD212", "warning")]
    assert [(f.code, f.severity) for f in strict] == [("SD212", "error")]
    assert ExitCode.of(relaxed) == ExitCode.CLEAN
    assert ExitCode.of(strict) == ExitCode.FINDINGS
    noted = replace_once(BASE, "[512, 1024, 2048]", "[512]")
    assert [f.severity for f in lint_text(noted, strict=True)] == ["note"]


def test_a_bug_in_a_rule_is_reported_not_raised(monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(lint_module, "check_config", broken)
    path = tmp_path / "c.toml"
    path.write_text(BASE)
    [finding] = lint_file(path)
    assert finding.code == "SD003"
    assert "ZeroDivisionError: boom" in finding.message
    assert ExitCode.of([finding]) == ExitCode.FATAL


def test_fifty_files_lint_well_under_a_second(tmp_path):
    copies = []
    for i in range(50):
        copies.append(tmp_path / f"c{i}.toml")
        shutil.copy(EXAMPLES[i % len(EXAMPLES)], copies[-1])
    lint_file(copies[0])  # imports and pydantic's first validation are not the linter's cost
    start = time.perf_counter()
    findings = [f for path in copies for f in lint_file(path)]
    elapsed = time.perf_counter() - start
    assert findings == []
    # Measured ~0.05 s on two shared CPU cores; the bound leaves room for a loaded machine.
    assert elapsed < 1.0, f"linting 50 files took {elapsed:.2f} s"


def test_absurdly_deep_nesting_is_reported_not_raised(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    [finding] = lint_file(path)
    assert finding.code == "SD001"
    assert "nests too deeply" in finding.message
