"""bench/peers.py's loss check: SpecForge's and speculators' own training steps on the fixture's
weights, batch and anchors give specdraft's loss (rel 1e-4) for DSpark, the family with the most
objective terms (CE, L1 or TV, Markov head, confidence BCE). The peers' venvs come from
scripts/specforge_venv.sh and scripts/speculators_venv.sh (`make test` builds both in the
background); the test waits for a build in progress and is skipped when a venv was never built.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.serve, pytest.mark.subprocess, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
VENVS = {
    "specforge": ("build/specforge-venv", "scripts/specforge_venv.sh"),
    "speculators": ("build/speculators-venv", "scripts/speculators_venv.sh"),
}


def require_built(venv: str, script: str) -> None:
    """Wait for a build of `venv` in progress (its script's lock), skip if it has no stamp."""
    lock = ROOT / f"{venv}.lock"
    if lock.is_file():
        with open(lock) as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
    if not (ROOT / venv / ".specdraft-stamp").is_file():
        pytest.skip(f"{venv} is not built: run {script} (make test builds it)")


def test_the_peers_losses_equal_specdraft_s_on_the_same_weights_and_batch(tmp_path):
    for venv, script in VENVS.values():
        require_built(venv, script)
    command = [sys.executable, str(ROOT / "bench" / "peers.py"), "--sizes", "tiny"]
    command += ["--families", "dspark", "--check-only", "--no-build", "--fixtures", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checks = [line for line in done.stdout.splitlines() if line.startswith("[tiny]")]
    assert [line.split(":")[0] for line in checks] == [
        "[tiny] specforge dspark",
        "[tiny] speculators dspark",
    ]
    assert all(": agree (" in line for line in checks), checks
