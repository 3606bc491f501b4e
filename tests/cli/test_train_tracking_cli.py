"""`specdraft train` with a tracking backend whose package is missing: refused before any rank
starts, in one line that names the extra to install."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner
from train_support import tiny_run, write_config

from specdraft.cli.main import cli


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_missing_tracking_package_is_refused_before_any_rank_starts(
    tiny_target_path, tmp_path, monkeypatch, dry_run
):
    import specdraft.trainer.launch as launch_module

    def refuse(*args, **kwargs):
        raise AssertionError("train started ranks")

    monkeypatch.setattr(launch_module, "launch", refuse)
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python spells "not installed"
    settings = tiny_run(tiny_target_path, tmp_path / "run", tracking={"backends": ["wandb"]})
    config = write_config(tmp_path / "c.toml", settings)
    args = ["train", str(config), *(["--dry-run"] if dry_run else [])]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 1, result.output
    [line] = [x for x in result.output.splitlines() if "tracking.backends" in x]
    assert "selects 'wandb', but the wandb package is not installed here" in line
    assert "pip install 'specdraft-trainer[wandb]'" in line
    assert str(config) in result.output
    assert not (tmp_path / "run").exists()  # nothing of a run was made
