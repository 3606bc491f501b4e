"""The `specdraft` console script as installed: `--help` lists the commands, `lint` passes an
example and reports a broken copy of it with its exit code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from smoke_support import QUICKSTART, ROOT, assert_every_public_module_imports, broken_copy

pytestmark = pytest.mark.subprocess


def specdraft(*args: str) -> subprocess.CompletedProcess:
    """The console script next to this interpreter, as a shell would run it."""
    script = shutil.which("specdraft", path=str(Path(sys.executable).parent))
    assert script is not None, f"no specdraft script beside {sys.executable}"
    return subprocess.run(
        [script, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_every_public_module_imports():
    assert_every_public_module_imports("specdraft.cli")


def test_help_lists_the_commands():
    result = specdraft("--help")
    assert result.returncode == 0, result.stderr
    for command in ("lint", "explain-buckets", "train", "eval", "export"):
        assert f"  {command} " in result.stdout


def test_lint_passes_an_example_and_reports_a_broken_copy(tmp_path):
    clean = specdraft("lint", str(QUICKSTART.relative_to(ROOT)))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "1 file checked: 0 errors, 0 warnings" in clean.stderr
    new = "static_shape_buckets = [100, 256]"
    path, line, col = broken_copy(QUICKSTART, tmp_path, "static_shape_buckets = [128, 256]", new)
    broken = specdraft("lint", str(path))
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert f"{path}:{line}:{col + new.index('100')}: SD201 " in broken.stdout
