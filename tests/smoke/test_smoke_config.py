"""specdraft-config as installed: every public module imports (in tox.ini's config env, without
torch), the examples lint clean, and a broken bucket is reported where it is."""

from __future__ import annotations

import pytest
from smoke_support import EXAMPLES, QUICKSTART, assert_every_public_module_imports, broken_copy

from specdraft.config.lint import lint_file
from specdraft.config.report import ExitCode


def test_every_public_module_imports():
    assert_every_public_module_imports("specdraft.config")


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_the_examples_lint_clean(example):
    assert lint_file(example) == []


def test_a_bucket_off_the_128_grid_is_reported_at_its_position(tmp_path):
    new = "static_shape_buckets = [100, 256]"
    path, line, col = broken_copy(QUICKSTART, tmp_path, "static_shape_buckets = [128, 256]", new)
    [finding] = lint_file(path)
    assert (finding.code, finding.line, finding.col) == ("SD201", line, col + new.index("100"))
    assert finding.key == "training.static_shape_buckets[0]"
    assert ExitCode.of([finding]) == ExitCode.FINDINGS
