"""Run the `specdraft` command in a fresh process, as a user's shell would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# torch.distributed's variables, should an earlier test have left them: a `specdraft train`
# that inherits them would try to join that group.
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def specdraft_cli(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """`specdraft ARGS` with one intra-op thread and no distributed variables; output captured."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "specdraft.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
