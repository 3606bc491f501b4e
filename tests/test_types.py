"""Type checking in CI: mypy on the torch-free config, the collators and the trainer's seams.

The settings live in pyproject.toml's `[tool.mypy]` (config and collate fully annotated; the
trainer checked at the modules named below, the rest of it read for types only). The cache sits
under build/, so a warm run takes seconds; the first run on a fresh checkout reads torch's types
and takes a minute or two on two cores.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("specdraft.config", "specdraft.collate")
# The trainer's seams: the draft family registry and its spec, the backend protocol, the Trainer,
# the producer's exactly-once state machine; the dry-run plan.
SEAM_MODULES = (
    "specdraft.trainer.models.family",
    "specdraft.trainer.models.family_spec",
    "specdraft.trainer.backends.base",
    "specdraft.trainer.train.dry_run",
    "specdraft.trainer.train.trainer",
    "specdraft.trainer.disagg.producer.machine",
)


def run_mypy(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m mypy ARGS` from the repository root, with the project's settings."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    if "No module named mypy" in done.stderr:
        pytest.fail(f"mypy is missing from {sys.executable}: run `make setup` (DEV_DEPS lists it)")
    return done


def module_path(name: str) -> Path:
    """The source file of a dotted module name under packages/*/src."""
    relative = Path(*name.split("."))
    for candidate in ROOT.glob(f"packages/*/src/{relative}"):
        if (candidate / "__init__.py").is_file():
            return candidate / "__init__.py"
    for candidate in ROOT.glob(f"packages/*/src/{relative}.py"):
        return candidate
    raise AssertionError(f"{name}: no such module under packages/*/src; update SEAM_MODULES")


def test_config_collate_and_trainer_seams_type_check():
    """mypy reports nothing on config, collate and the seams, and it did read all of them."""
    for name in SEAM_MODULES:
        module_path(name)
    args = [arg for package in PACKAGES for arg in ("-p", package)]
    args += [arg for module in SEAM_MODULES for arg in ("-m", module)]
    done = run_mypy(*args)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # An empty selection would also "succeed": count the files mypy says it checked.
    expected = sum(
        len(list(ROOT.glob(f"packages/*/src/{Path(*package.split('.'))}/**/*.py")))
        for package in PACKAGES
    ) + len(SEAM_MODULES)
    checked = re.search(r"no issues found in (\d+) source files", output)
    assert checked and int(checked.group(1)) == expected, output


def test_the_settings_reject_an_unannotated_config_function(tmp_path):
    """The config package's strictness is live: an unannotated function there is an error."""
    real = module_path("specdraft.config.show")
    shadow = tmp_path / "show.py"
    shadow.write_text(real.read_text() + "\n\ndef untyped(value):\n    return value\n")
    # mypy reads the shadow's text as specdraft.config.show, under that module's settings; a
    # private cache keeps the doctored module out of the shared one.
    done = run_mypy(
        "--cache-dir",
        str(tmp_path / "cache"),
        "--shadow-file",
        str(real),
        str(shadow),
        "-m",
        "specdraft.config.show",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"show\.py:\d+: error: Function is missing a type annotation", done.stdout)
