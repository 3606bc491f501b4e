"""`specdraft lint` as users and pre-commit run it: exit codes, stdout, stderr, no torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdraft.cli.main import cli
from specdraft.config.report import TEXT_LINE

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*.toml"))
GOOD = (ROOT / "examples" / "qwen3-8b-dflash2-2048.toml").read_text()


@pytest.fixture(scope="module")
def lint():
    """Run `specdraft lint ARGS` in-process from the repository root."""
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, ["lint", *args], catch_exceptions=False)

    return invoke


@pytest.fixture
def in_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _write(tmp_path, text: str, name: str = "c.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_examples_pass_with_a_summary_on_stderr(lint, in_root):
    result = lint(*EXAMPLES)
    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr.strip() == f"{len(EXAMPLES)} files checked: 0 errors, 0 warnings, 0 notes"


def test_findings_exit_1_with_one_line_each(lint, tmp_path):
    text = GOOD.replace("[512, 1024, 1536, 2048]", "[512, 1000, 1536, 2048]")
    path = _write(tmp_path, text)
    result = lint(path)
    assert result.exit_code == 1
    [line] = result.stdout.splitlines()
    match = re.match(TEXT_LINE, line)
    assert match and match["code"] == "SD201" and match["path"] == path
    row = next(i for i, t in enumerate(text.splitlines(), 1) if "1000" in t)
    assert (int(match["line"]), int(match["col"])) == (
        row,
        text.splitlines()[row - 1].index("1000") + 1,
    )
    assert "1 error" in result.stderr


def test_json_format_lists_objects_across_files(lint, tmp_path, in_root):
    bad = _write(tmp_path, GOOD.replace("selector_top_k", "selector_topk"))
    result = lint("--format", "json", EXAMPLES[0], bad)
    assert result.exit_code == 1
    [finding] = json.loads(result.stdout)
    assert set(finding) == {"path", "line", "col", "code", "severity", "message", "key"}
    assert (finding["path"], finding["code"], finding["key"]) == (
        bad,
        "SD101",
        "model.dflash2.selector_topk",
    )
    assert "did you mean 'selector_top_k'?" in finding["message"]


def test_io_and_syntax_errors_exit_2(lint, tmp_path):
    missing = lint(str(tmp_path / "absent.toml"))
    assert missing.exit_code == 2 and " SD002 " in missing.stdout
    broken = lint(_write(tmp_path, "[model\n"))
    assert broken.exit_code == 2 and re.match(r".+:1:7: SD001 TOML syntax error", broken.stdout)
    clean_and_broken = lint(_write(tmp_path, GOOD, "good.toml"), str(tmp_path / "absent.toml"))
    assert clean_and_broken.exit_code == 2


def test_no_file_is_a_usage_error(lint):
    result = lint()
    assert result.exit_code == 2
    assert "Missing argument" in result.stderr


def test_strict_fails_on_warnings_only(lint, tmp_path):
    text = GOOD.replace("static_shape_buckets = [512, 1024, 1536, 2048]\n", "").replace(
        "static_shapes = true", "static_shapes = false"
    )
    path = _write(tmp_path, text)
    relaxed, strict = lint(path), lint("--strict", path)
    assert relaxed.exit_code == 0 and " SD212 warning: " in relaxed.stdout
    assert strict.exit_code == 1 and " SD212 compile_blocks" in strict.stdout


def test_target_option_checks_against_that_model(lint, tmp_path):
    target = tmp_path / "tiny"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "vocab_size": 10}))
    result = lint("--target", str(target), _write(tmp_path, GOOD))
    assert result.exit_code == 1
    codes = [re.match(TEXT_LINE, line)["code"] for line in result.stdout.splitlines()]
    assert codes == ["SD310", "SD312"]  # layer 33 of 30, mask id 151669 of a vocab of 10


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=120))
def test_any_bytes_give_exit_0_1_or_2_and_no_traceback(lint, tmp_path, data):
    path = tmp_path / "fuzz.toml"
    path.write_bytes(data)
    result = lint(str(path))
    assert result.exit_code in (0, 1, 2)
    assert "Traceback" not in result.output
    assert all(re.match(TEXT_LINE, line) for line in result.stdout.splitlines())


@pytest.mark.subprocess
def test_lint_never_imports_torch():
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "specdraft.cli", "lint", *EXAMPLES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    imported = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    assert len(imported) > 20  # importtime did report
    torch_lines = [line for line in imported if "torch" in line]
    assert torch_lines == [], torch_lines[:5]


# ---------------------------------------------------------------------------- pre-commit hook


def test_pre_commit_hook_file_matches_the_configs_and_nothing_else():
    yaml = pytest.importorskip("yaml")
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    [hook] = [h for h in hooks if h["id"] == "specdraft-lint"]
    assert hook["language"] == "python"
    assert hook["entry"] == "specdraft lint"
    assert hook["types"] == ["toml"]
    pattern = re.compile(hook["files"])
    assert pattern.pattern.startswith("^") and pattern.pattern.endswith("$")
    assert EXAMPLES
    for example in EXAMPLES:
        assert pattern.search(example), example
    for name in ("specdraft.toml", "configs/run.specdraft.toml", "a/b/specdraft-8b.toml"):
        assert pattern.search(name), name
    others = [
        "pyproject.toml",
        "packages/config/pyproject.toml",
        "examples/nested/pyproject.toml",
        "tox.toml",
        "src/specdraft/pyproject.toml",
        "examples/notes.md",
    ]
    for name in others:
        assert not pattern.search(name), name
