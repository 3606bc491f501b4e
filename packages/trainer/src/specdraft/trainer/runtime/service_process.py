"""Child processes specdraft starts, stopped one way: SIGTERM to the child's whole process
group, SIGKILL after a grace period, so no worker it forked outlives it.

`ChildProcess` is any child in a session of its own (the managed run's trainer ranks, whose
console output passes through); `ServiceProcess` a service (SGLang, mooncake_master, the
runtime's own) that logs to a file, is waited on until ready and shows its log tail when it
fails; `run_to_end` runs a child to completion under a timeout, stopped the same way when it
runs over.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .private import private_dir

# Seconds a child may take to exit after SIGKILL before `stop` gives up waiting.
KILL_WAIT_S = 10.0


class ServiceError(RuntimeError):
    """A service that did not start, died, or never became ready (the log tail is included)."""


class ChildProcess:
    """A started child in a new session (its own process group); `stop` ends the whole group."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        **popen: Any,
    ) -> None:
        self.name = name
        self.command = list(command)
        full_env = {**os.environ, **(env or {})}
        # A session of its own: stopping the child stops the workers it forks too, and a
        # terminal's Ctrl-C reaches it only through whoever started it. OSError if it cannot
        # start.
        self.popen: subprocess.Popen[Any] = subprocess.Popen(
            self.command, env=full_env, cwd=cwd, start_new_session=True, **popen
        )

    @property
    def pid(self) -> int:
        """Process id of the service."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code, or None while it runs."""
        return self.popen.poll()

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the child itself (not its group): e.g. a stop request it forwards."""
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(sig)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to exit; its exit code (TimeoutExpired after `timeout`)."""
        return self.popen.wait(timeout=timeout)

    def stop(self, *, grace: float = 30.0) -> int | None:
        """SIGTERM the child's process group, SIGKILL it after `grace` s; the exit code."""
        return stop_process_group(self.popen, grace=grace)


def stop_process_group(popen: subprocess.Popen[Any], *, grace: float) -> int | None:
    """SIGTERM the process group `popen` leads, SIGKILL the group after `grace` s; the exit
    code (None if it outlives even SIGKILL's wait)."""
    if popen.poll() is not None:
        _signal_group(popen.pid, signal.SIGKILL)  # workers its leader left behind
        return popen.returncode
    _signal_group(popen.pid, signal.SIGTERM)
    try:
        code = popen.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _signal_group(popen.pid, signal.SIGKILL)
        try:
            return popen.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            return None
    # The leader exited on SIGTERM; a worker that ignored it must not outlive it.
    _signal_group(popen.pid, signal.SIGKILL)
    return code


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class ServiceProcess(ChildProcess):
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
        self.log_path = Path(log_path)
        # Logs show prompts, paths and errors: only the run's owner reads them (0700 / 0600).
        private_dir(self.log_path.parent)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "ab") as log:
            log.write(f"$ {' '.join(command)}\n".encode())
            log.flush()
            try:
                super().__init__(
                    name,
                    command,
                    env=env,
                    cwd=cwd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            except OSError as exc:
                raise ServiceError(f"cannot start {name} ({command[0]}): {exc}") from exc

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


def run_to_end(
    command: Sequence[str],
    *,
    timeout: float,
    grace: float = 5.0,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    capture_output: bool = False,
    **popen: Any,
) -> subprocess.CompletedProcess[Any]:
    """Run `command` to completion, like `subprocess.run`; past `timeout` its whole group is
    stopped (SIGTERM, `grace`, SIGKILL) and TimeoutExpired raised. `env` is added to this
    process's environment."""
    if capture_output:
        popen.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child = ChildProcess(str(command[0]), command, env=env, cwd=cwd, **popen)
    try:
        out, err = child.popen.communicate(timeout=timeout)
    except BaseException:  # the timeout, or Ctrl-C while it runs
        child.stop(grace=grace)
        raise
    finally:
        # Workers the finished leader left in its group do not outlive the call.
        _signal_group(child.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(child.command, child.popen.returncode, out, err)


HealthCheck = Callable[[ServiceProcess], bool]


@dataclass
class ServiceSpec:
    """How to run one service and how to know it is up."""

    name: str
    argv: Sequence[str]
    health: HealthCheck | None = None
    env: dict[str, str] | None = None
    cwd: str | Path | None = None
    # Restarts after a crash before the run fails (0: the first exit fails the run).
    max_restarts: int = 0
    # The config field behind max_restarts, for the error message.
    restarts_field: str = ""


def tcp_health(host: str, port: int, *, timeout: float = 2.0) -> HealthCheck:
    """Healthy when a TCP connection to host:port succeeds (e.g. mooncake_master)."""

    def check(_process: ServiceProcess) -> bool:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except OSError:
            return False

    return check
