"""One `llama-server` process for a measurement: started on 127.0.0.1, waited for, stopped.

The server binds a port of its own choosing (`--port 0`) and prints it once the models are
loaded ("listening on http://127.0.0.1:PORT"), so there is no race for a free port; /health then
confirms it answers. An API key, when given, goes in through the environment
(`LLAMA_API_KEY`), not the command line that other users can read. The process runs in a
session of its own and is stopped with its group (SIGTERM, then SIGKILL); its output goes to a
log file that is kept, and whose lines say why a model or draft was refused.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.http_client import HttpFailure, call_bytes, call_json
from ..runtime.service_process import ServiceError, ServiceProcess

HOST = "127.0.0.1"
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
# Lines of llama-server's log that state why it stopped: its error-level lines, failed asserts,
# the loaders' errors and an uncaught exception's what().
REASON = re.compile(
    r"GGML_ASSERT|error|failed|what\(\)|invalid|unsupported|exceeds|mismatch", re.IGNORECASE
)
# Lines that match REASON without being a reason: the build's feature list, and what every
# draft-model start logs while llama.cpp sizes its memory ("this warning is normal").
NOISE = re.compile(
    r"^(system_info|print_info|build:)|this warning is normal|fitting without it", re.IGNORECASE
)
# The log's prefix: seconds since start and the level letter (E error, W warning, I info).
STAMP = re.compile(r"^\d+\.\d+\.\d+\.\d+ ([A-Z]) ")


class LlamaServerFailed(RuntimeError):
    """llama-server exited, or was not healthy in time; `reason` is its own words (log lines)."""

    def __init__(self, message: str, reason: str, log: Path) -> None:
        super().__init__(message)
        self.reason = reason
        self.log = log


@dataclass(frozen=True)
class ServerOptions:
    """How to start one llama-server: the target, threads, context, slots, extra flags."""

    model: Path
    threads: int = 1
    ctx_size: int = 4096
    parallel: int = 1
    # The speculative flags of a setting (--spec-type, -md, ...), appended as given.
    extra: tuple[str, ...] = ()
    api_key: str | None = None
    # LLAMA_TRACE=1: one log line per verification step ("accepted A/D draft tokens").
    trace: bool = False


def server_command(binary: Path, options: ServerOptions) -> list[str]:
    """The llama-server command line of `options` (loopback, own port, metrics on)."""
    return [
        str(binary),
        *("-m", str(options.model)),
        *("--host", HOST, "--port", "0"),
        *("-t", str(options.threads)),
        *("-c", str(options.ctx_size)),
        *("-np", str(options.parallel)),
        # /metrics carries the verification steps and the per-position acceptance.
        "--metrics",
        # No prompt reuse: a repeated prompt would skip its prefill and skew the timing.
        *("--cache-ram", "0", "--no-cache-prompt"),
        *options.extra,
    ]


def failure_reason(log_text: str) -> str:
    """llama-server's own statement of why it stopped: the log's error lines (or its tail)."""
    lines, picked = [], []
    for raw in log_text.splitlines():
        if not raw.strip() or raw.startswith("$ "):
            continue
        stamp = STAMP.match(raw)
        line = raw[stamp.end() :].strip() if stamp else raw.strip()
        lines.append(line)
        error = (stamp is not None and stamp.group(1) == "E") or REASON.search(line)
        if error and not NOISE.search(line):
            picked.append(line)
    chosen = picked[:3] if picked else lines[-3:]
    return "\n".join(chosen) if chosen else "no output"


class LlamaServer:
    """A started llama-server (a context manager: started on enter, stopped on exit)."""

    def __init__(
        self,
        binary: Path,
        options: ServerOptions,
        log: Path,
        *,
        name: str = "llama-server",
        timeout: float = 300.0,
        request_timeout: float = 1800.0,
    ) -> None:
        self.binary = Path(binary)
        self.options = options
        self.log = Path(log)
        self.name = name
        self.timeout = timeout
        self.request_timeout = request_timeout
        self.process: ServiceProcess | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        """The server's base address."""
        if self.port is None:
            raise RuntimeError(f"{self.name} is not started")
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the process and wait until it listens and /health answers."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        # A fresh log: the port is read from it, and an earlier run's line would name another.
        self.log.unlink(missing_ok=True)
        env = {"LLAMA_API_KEY": self.options.api_key} if self.options.api_key else {}
        if self.options.trace:
            env["LLAMA_TRACE"] = "1"
        try:
            self.process = ServiceProcess(
                self.name, server_command(self.binary, self.options), self.log, env=env
            )
        except ServiceError as exc:
            raise LlamaServerFailed(str(exc), str(exc), self.log) from None
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.timeout
        delay = 0.05
        while True:
            if not self.process.alive():
                self._fail(f"exited with code {self.process.returncode} while starting")
            if self.port is None:
                found = LISTENING.search(self._log_text())
                if found:
                    self.port = int(found.group(1))
            if self.port is not None and self._healthy():
                return
            if time.monotonic() >= deadline:
                self._fail(f"was not healthy within {self.timeout:g} s")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _healthy(self) -> bool:
        try:
            answer = call_json("GET", f"{self.url}/health", timeout=5.0)
        except HttpFailure:
            return False
        return isinstance(answer, dict) and answer.get("status") == "ok"

    def _log_text(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def _fail(self, what: str) -> None:
        text = self._log_text()
        reason = failure_reason(text)
        tail = "\n".join(text.splitlines()[-25:])
        raise LlamaServerFailed(
            f"{self.name} {what}; log {self.log}:\n{tail}", reason=reason, log=self.log
        )

    def stop(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL); a no-op when stopped."""
        if self.process is not None:
            self.process.stop(grace=10.0)

    def complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST /completion; its JSON answer (LlamaServerFailed if the server died on it)."""
        try:
            answer = call_json(
                "POST",
                f"{self.url}/completion",
                payload,
                timeout=self.request_timeout,
                secret=self.options.api_key,
            )
        except HttpFailure as exc:
            if self.process is not None and not self.process.alive():
                self._fail(f"exited with code {self.process.returncode} during a request")
            raise LlamaServerFailed(f"{self.name}: {exc}", reason=str(exc), log=self.log) from None
        return answer

    def metrics_text(self) -> str:
        """GET /metrics: the Prometheus text of the server's counters."""
        try:
            body = call_bytes(
                "GET", f"{self.url}/metrics", timeout=60.0, secret=self.options.api_key
            )
        except HttpFailure as exc:
            raise LlamaServerFailed(f"{self.name}: {exc}", reason=str(exc), log=self.log) from None
        return body.decode("utf-8", errors="replace")
