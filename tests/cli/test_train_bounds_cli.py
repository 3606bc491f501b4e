"""`specdraft train` refuses an absurd size (SD108) before any work starts, from the file or
from `--set`, naming the key, without a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from specdraft.cli.main import cli
from specdraft.config import ConfigError, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.toml"


def test_train_refuses_an_absurd_size_before_starting(tmp_path):
    config = tmp_path / "run.toml"
    text = EXAMPLE.read_text()
    assert "\nmicro_batch_size = 4\n" in text
    config.write_text(text.replace("\nmicro_batch_size = 4\n", "\nmicro_batch_size = 1e23\n"))
    with pytest.raises(ConfigError):
        load_config(str(config), [])
    done = CliRunner().invoke(cli, ["train", str(config), "--dry-run"])
    assert done.exit_code != 0
    assert "SD108" in done.output and "training.micro_batch_size" in done.output
    assert "Traceback" not in done.output
    overridden = CliRunner().invoke(
        cli, ["train", str(EXAMPLE), "--set", "data.max_length=1e12", "--dry-run"]
    )
    assert overridden.exit_code != 0 and "SD108" in overridden.output
