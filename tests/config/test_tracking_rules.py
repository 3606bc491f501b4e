"""Tracking rules: the backends a config selects, and SD501 where a backend's package is missing.

Which packages are installed is the environment's business, so each test sets it up in
`sys.modules` (an entry of None is how Python spells "not installed": `find_spec` finds nothing
and `import` fails), whatever this venv happens to hold.
"""

from __future__ import annotations

import sys
import types
from importlib.machinery import ModuleSpec

import pytest
from config_cases import BASE, position_of

from specdraft.config import load_config
from specdraft.config.lint import lint_text
from specdraft.config.report import ExitCode
from specdraft.config.tracking import BACKEND_NAMES


def _installed(monkeypatch, name: str) -> None:
    module = types.ModuleType(name)
    module.__spec__ = ModuleSpec(name, None)
    monkeypatch.setitem(sys.modules, name, module)


def _absent(monkeypatch, name: str) -> None:
    monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture
def training_env(monkeypatch):
    """An environment with specdraft-trainer and every backend package installed."""
    for name in ("specdraft.trainer", *BACKEND_NAMES):
        _installed(monkeypatch, name)
    return monkeypatch


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_a_selected_backend_without_its_package_is_named_with_its_extra(training_env, name):
    _absent(training_env, name)
    text = BASE + f'\n[tracking]\nbackends = ["{name}"]\n'
    [finding] = lint_text(text, "c.toml")
    assert (finding.code, finding.severity) == ("SD501", "warning")
    assert f"pip install 'specdraft-trainer[{name}]'" in finding.message
    assert f"drop '{name}' from tracking.backends" in finding.message
    assert (finding.line, finding.col) == position_of(text, f'["{name}"]')
    # A warning: the run refuses to start, but a config linted elsewhere is not broken.
    assert ExitCode.of([finding]) == ExitCode.CLEAN


def test_tensorboard_flag_without_tensorboard_points_at_the_flag(training_env):
    _absent(training_env, "tensorboard")
    text = BASE + "\n[tracking]\ntensorboard = true\n"
    [finding] = lint_text(text, "c.toml")
    assert finding.code == "SD501"
    assert "tracking.tensorboard selects 'tensorboard'" in finding.message
    assert "set tracking.tensorboard = false" in finding.message
    assert (finding.line, finding.col) == position_of(text, "true", after="[tracking]")


def test_only_the_missing_backends_are_reported(training_env):
    _absent(training_env, "mlflow")
    text = BASE + '\n[tracking]\nbackends = ["wandb", "mlflow"]\ntensorboard = true\n'
    [finding] = lint_text(text, "c.toml")
    assert "'mlflow'" in finding.message and "'wandb'" not in finding.message
    for name in BACKEND_NAMES:
        _installed(training_env, name)
    assert lint_text(text, "c.toml") == []


def test_no_package_check_where_the_trainer_is_not_installed(monkeypatch):
    # A pre-commit or config-only env lints configs for a cluster it is not.
    _absent(monkeypatch, "specdraft.trainer")
    for name in BACKEND_NAMES:
        _absent(monkeypatch, name)
    assert lint_text(BASE + f"\n[tracking]\nbackends = {list(BACKEND_NAMES)}\n", "c.toml") == []


def test_an_unknown_backend_is_a_schema_error_listing_the_known_ones():
    text = BASE + '\n[tracking]\nbackends = ["wandbb"]\n'
    [finding] = lint_text(text, "c.toml")
    assert finding.code == "SD104"
    assert all(repr(name) in finding.message for name in BACKEND_NAMES)
    assert (finding.line, finding.col) == position_of(text, '"wandbb"')


def test_selected_backends_in_order_once_each_with_the_tensorboard_flag(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        BASE + '\n[tracking]\nbackends = ["mlflow", "wandb", "mlflow"]\ntensorboard = true\n'
    )
    assert load_config(path).tracking.selected_backends == ("mlflow", "wandb", "tensorboard")
    path.write_text(BASE)
    assert load_config(path).tracking.selected_backends == ()
