"""A child process that runs a service (SGLang, mooncake_master): log to a file, wait until it
is ready, stop it with a grace period, and show its log tail when it fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .private import private_dir


class ServiceError(RuntimeError):
    """A service that did not start, died, or never became ready (the log tail is included)."""


class ServiceProcess:
    """One started service; its stdout and stderr go to `log_path`."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.log_path = Path(log_path)
        # Logs show prompts, paths and errors: only the run's owner reads them (0700 / 0600).
        private_dir(self.log_path.parent)
        full_env = {**os.environ, **(env or {})}
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "ab") as log:
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            try:
                # A session of its own: stopping the service stops the workers it forks too.
                self.popen = subprocess.Popen(
                    self.command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=full_env,
                    cwd=cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServiceError(f"cannot start {name} ({self.command[0]}): {exc}") from exc

    @property
    def pid(self) -> int:
        """Process id of the service."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the service's log."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, ready: Callable[[], bool], *, timeout: float, what: str) -> None:
        """Poll `ready()` until it is true; ServiceError if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            if not self.alive():
                raise ServiceError(
                    f"{self.name} exited with code {self.popen.returncode} before {what}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if ready():
                return
            if time.monotonic() >= deadline:
                self.stop(grace=5.0)
                raise ServiceError(
                    f"{self.name} was not {what} within {timeout:g} s (raise "
                    f"deployment.disaggregated.health_timeout_s if it only needs longer); "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def stop(self, *, grace: float = 30.0) -> int | None:
        """SIGTERM the service's process group, SIGKILL it after `grace` s; the exit code."""
        if self.popen.poll() is not None:
            return self.popen.returncode
        self._signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            return self.popen.wait(timeout=10)

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
