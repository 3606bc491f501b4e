"""Managed SGLang capture servers: build the `launch_server` command, start it, health-check it,
stream its log to a file, stop it.

SGLang is an optional extra (it pulls CUDA wheels) and is imported nowhere: it runs as a child
`python -m <module>`. The module is a parameter so the tests start `sglang_stub` through this
very code path.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .http_json import HttpFailure, call_json
from .service_process import ServiceError, ServiceProcess

if TYPE_CHECKING:
    from specdraft.config import Config

SGLANG_MODULE = "sglang.launch_server"

# Every capture server gets these. --enable-return-hidden-states lets /generate return hidden
# states at all; --enable-return-aux-hidden-states asks for the tapped target layers (the
# DFlash family's features) instead of the last layer; --disable-radix-cache makes every
# prompt prefill in full, so no cached prefix is missing from the returned rows.
CAPTURE_FLAGS = (
    "--enable-return-hidden-states",
    "--enable-return-aux-hidden-states",
    "--disable-radix-cache",
)


def speculative_algorithm(algorithm: str) -> str:
    """SGLang's --speculative-algorithm for a draft family: DFLASH (dflash2) or DSPARK."""
    return {"dflash2": "DFLASH", "dspark": "DSPARK"}[algorithm]


def sglang_command(
    cfg: Config,
    *,
    port: int,
    module: str = SGLANG_MODULE,
    python: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """`python -m sglang.launch_server --model-path … --host 127.0.0.1 --port …` and the
    capture flags, then `deployment.disaggregated.sglang_args`, then `extra_args`."""
    return [
        python or sys.executable,
        "-m",
        module,
        "--model-path",
        str(cfg.model.target),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *CAPTURE_FLAGS,
        "--speculative-algorithm",
        speculative_algorithm(cfg.model.algorithm),
        *cfg.deployment.disaggregated.sglang_args,
        *extra_args,
    ]


class ManagedSGLang:
    """One SGLang server started by the run; `url` once `start` returned."""

    def __init__(
        self,
        cfg: Config,
        *,
        port: int,
        log_path: Path,
        module: str = SGLANG_MODULE,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.command = sglang_command(cfg, port=port, module=module, extra_args=extra_args)
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = Path(log_path)
        self.health_timeout_s = cfg.deployment.disaggregated.health_timeout_s
        self.shutdown_timeout_s = cfg.deployment.disaggregated.shutdown_timeout_s
        self.process: ServiceProcess | None = None

    def start(self) -> ManagedSGLang:
        """Start the server and wait until GET /health answers; ServiceError with the log tail."""
        self.process = ServiceProcess("SGLang capture server", self.command, self.log_path)
        try:
            self.process.wait_ready(
                self.healthy, timeout=self.health_timeout_s, what=f"healthy at {self.url}"
            )
        except ServiceError:
            self.stop()
            raise
        return self

    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether GET /health answers 200."""
        try:
            call_json("GET", f"{self.url}/health", timeout=timeout)
        except HttpFailure:
            return False
        return True

    def alive(self) -> bool:
        """Whether the server process still runs."""
        return self.process is not None and self.process.alive()

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after deployment.disaggregated.shutdown_timeout_s."""
        if self.process is None:
            return None
        return self.process.stop(grace=self.shutdown_timeout_s)

    def __enter__(self) -> ManagedSGLang:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
