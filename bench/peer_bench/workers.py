"""The worker processes of the peer benchmark: one per (side, family), each in its side's venv.

A worker loads the fixture once, then runs one command at a time (protocol.py); while one
worker steps, the others wait on their stdin, so the timed steps never overlap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# Side -> (its venv's python, relative to the repository; the builder script; the families
# both it and specdraft have). specdraft runs in the interpreter that runs the benchmark.
PEERS = {
    "specforge": (
        "build/specforge-venv/bin/python",
        "scripts/specforge_venv.sh",
        ("dflash", "dspark"),
    ),
    "speculators": (
        "build/speculators-venv/bin/python",
        "scripts/speculators_venv.sh",
        ("dflash", "dflash2", "dspark"),
    ),
}


def side_python(side: str) -> Path:
    """The interpreter a side's worker runs under."""
    if side == "specdraft":
        return Path(sys.executable)
    return ROOT / PEERS[side][0]


def build_venv(side: str) -> None:
    """Build (or keep, when its stamp is current) a peer's venv with its script."""
    script = ROOT / PEERS[side][1]
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{script.name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


@dataclass
class Worker:
    """One side's training step for one family, in its own process."""

    side: str
    family: str
    fixture: Path
    threads: int
    log: Path
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        """`side family`, as the tables show it."""
        return f"{self.side} {self.family}"

    def start(self) -> None:
        """Start the process (it loads the fixture; `wait_ready` reads its first line)."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/tmp"),
            "OMP_NUM_THREADS": str(self.threads),
            "MKL_NUM_THREADS": str(self.threads),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            "PYTHONWARNINGS": "ignore",
        }
        script = HERE / f"{self.side}_worker.py"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                str(side_python(self.side)),
                str(script),
                str(self.fixture),
                self.family,
                str(self.threads),
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
            text=True,
        )

    def read(self) -> dict:
        """The worker's next JSON line (other stdout lines, e.g. a library's print, skipped)."""
        assert self.process is not None and self.process.stdout is not None
        while True:
            line = self.process.stdout.readline()
            if not line:
                tail = self.log.read_text()[-3000:] if self.log.is_file() else ""
                raise RuntimeError(f"worker {self.name} exited; its log {self.log}:\n{tail}")
            if line.startswith("{"):
                record = json.loads(line)
                if "error" in record:
                    raise RuntimeError(f"worker {self.name}: {record['error']}")
                return record

    def wait_ready(self) -> dict:
        """The worker's ready line (it has loaded its side's model and the batch)."""
        return self.read()

    def command(self, name: str) -> dict:
        """Send one command and return its answer."""
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(name + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        """Ask the worker to quit, and wait for it."""
        if self.process is None:
            return
        try:
            if self.process.poll() is None and self.process.stdin is not None:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
            self.process.wait(timeout=30)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        self.process = None
