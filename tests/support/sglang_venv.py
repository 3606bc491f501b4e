"""build/sglang-venv (the released sglang==0.5.23 on this interpreter's CPU torch, made by
scripts/sglang_venv.sh) for the tests that run SGLang's own code, and its source files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# SPECDRAFT_SGLANG_VENV: another folder (a venv built on other packages than .venv's, so that it
# never replaces the one `make test` builds on top of .venv).
VENV = Path(os.environ.get("SPECDRAFT_SGLANG_VENV") or ROOT / "build" / "sglang-venv")


def build_sglang_python() -> str:
    """The venv's python, the venv built (or found up to date) by the repo's script; a venv
    that cannot be built fails the test (these tests are the only check against SGLang)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "sglang_venv.sh"), str(VENV)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        pytest.fail(f"scripts/sglang_venv.sh could not build {VENV}:\n{tail}")
    return str(VENV / "bin" / "python")


def sglang_source_path(python: str, relative: str) -> Path:
    """A file of the venv's SGLang, e.g. 'managers/schedule_batch.py' (under sglang/srt)."""
    site = Path(python).parents[1] / "lib"
    return next(site.glob(f"python3*/site-packages/sglang/srt/{relative}"))


# The plugin's source tree, importable in the tests' own interpreter too (the venv installs it).
PLUGIN_SRC = ROOT / "packages" / "sglang-plugin" / "src"
if str(PLUGIN_SRC) not in sys.path:
    sys.path.insert(0, str(PLUGIN_SRC))
