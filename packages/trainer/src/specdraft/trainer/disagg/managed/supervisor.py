"""Supervisor of a managed run's services: store master, capture servers, producer.

Each service is a `ServiceProcess` (its own process group, stdout and stderr streamed to
`<run_dir>/logs/<name>.log`). `start` waits until the service's health check passes; `check`
(called in the launcher's loop, or via `watch`) restarts a service that exited while it has
restarts left (the producer: `max_producer_restarts`; it resumes from its ledger) and otherwise
raises `ServiceDied` with the tail of its log; `stop_all` stops the services in reverse start
order: SIGTERM to the group, then SIGKILL after `shutdown_timeout_s`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...runtime.http_client import HttpFailure, call_json
from ...runtime.service_process import (
    HealthCheck,
    ServiceError,
    ServiceProcess,
    ServiceSpec,
    tcp_health,
)
from ..wire.windows import controller_address_path, read_controller_address

log = logging.getLogger(__name__)

__all__ = [
    "HealthCheck",
    "ServiceDied",
    "ServiceSpec",
    "Supervisor",
    "http_health",
    "producer_health",
    "producer_service",
    "tcp_health",
]

# Lines of a dead service's log shown in the error.
TAIL_LINES = 40


class ServiceDied(RuntimeError):
    """A service exited (or never became healthy); the message ends with its log tail."""

    def __init__(self, name: str, message: str, log_path: Path, tail: str) -> None:
        super().__init__(f"{message}\n--- last lines of {log_path} ---\n{tail}")
        self.name = name
        self.log_path = log_path
        self.tail = tail


@dataclass
class Service:
    """A supervised service and its current process."""

    spec: ServiceSpec
    process: ServiceProcess
    restarts: int = 0
    stopped: bool = False


class Supervisor:
    """Starts, health-checks, restarts and stops a run's services."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        health_timeout_s: float,
        shutdown_timeout_s: float,
        poll_s: float = 0.2,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.log_dir = self.run_dir / "logs"
        self.health_timeout_s = health_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.poll_s = poll_s
        self.services: list[Service] = []
        # Names in the order they were stopped (for the launcher's log, and tests).
        self.stop_order: list[str] = []

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def log_path(self, name: str) -> Path:
        """The log file of a service."""
        return self.log_dir / f"{name}.log"

    def start(self, spec: ServiceSpec) -> Service:
        """Start a service and wait until it is healthy; raises ServiceDied if it is not."""
        if any(s.spec.name == spec.name for s in self.services):
            raise ValueError(f"a service named {spec.name!r} is already running")
        service = Service(spec, self._spawn(spec))
        self.services.append(service)
        log.info("starting %s (log %s)", spec.name, self.log_path(spec.name))
        self._wait_healthy(service)
        return service

    def check(self) -> None:
        """Restart services that exited and may be restarted; raise ServiceDied otherwise."""
        for service in self.services:
            if service.stopped or service.process.alive():
                continue
            spec = service.spec
            code = service.process.popen.returncode
            if service.restarts >= spec.max_restarts:
                hint = ""
                if spec.restarts_field:
                    hint = (
                        f" after {service.restarts} restarts "
                        f"({spec.restarts_field} = {spec.max_restarts})"
                    )
                raise ServiceDied(
                    spec.name,
                    f"service {spec.name!r} exited with code {code}{hint}; stopping the run",
                    service.process.log_path,
                    service.process.log_tail(TAIL_LINES),
                )
            self._restart(service, code)

    def _restart(self, service: Service, code: int | None) -> None:
        """Restart an exited service; one that exits again while starting uses another restart.

        The restarted service can serve its clients before the health poll sees it up, so an
        exit then is an exit like any other (a killed producer resumes from its ledger), not a
        failed start; only the restart budget, or a health timeout, ends the run.
        """
        spec = service.spec
        while True:
            service.restarts += 1
            log.warning(
                "service %s exited with code %s: restart %d of %d",
                spec.name,
                code,
                service.restarts,
                spec.max_restarts,
            )
            service.process = self._spawn(spec)
            try:
                self._wait_healthy(service)
                return
            except ServiceDied:
                if service.stopped or service.restarts >= spec.max_restarts:
                    raise
                code = service.process.popen.returncode

    def watch(self, until: Callable[[], bool], *, timeout: float | None = None) -> None:
        """Check the services every poll interval until `until()` is true (or timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not until():
            self.check()
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"services still running after {timeout:g} s")
            time.sleep(self.poll_s)

    def stop_all(self) -> None:
        """Stop every service in reverse start order: SIGTERM, then SIGKILL after the grace."""
        for service in reversed(self.services):
            if not service.stopped:
                self._stop(service)

    def _spawn(self, spec: ServiceSpec) -> ServiceProcess:
        env = None if spec.env is None else dict(spec.env)
        cwd = None if spec.cwd is None else Path(spec.cwd)
        try:
            return ServiceProcess(spec.name, spec.argv, self.log_path(spec.name), env=env, cwd=cwd)
        except ServiceError as exc:
            raise ServiceDied(spec.name, str(exc), self.log_path(spec.name), "") from exc

    def _wait_healthy(self, service: Service) -> None:
        spec, process = service.spec, service.process
        deadline = time.monotonic() + self.health_timeout_s
        while True:
            if not process.alive():
                raise ServiceDied(
                    spec.name,
                    f"service {spec.name!r} exited with code {process.popen.returncode} while "
                    f"starting",
                    process.log_path,
                    process.log_tail(TAIL_LINES),
                )
            if spec.health is None or _safe_health(spec.health, process):
                log.info("service %s is up (pid %d)", spec.name, process.pid)
                return
            if time.monotonic() >= deadline:
                self._stop(service)
                raise ServiceDied(
                    spec.name,
                    f"service {spec.name!r} did not become healthy within "
                    f"{self.health_timeout_s:g} s (deployment.disaggregated.health_timeout_s)",
                    process.log_path,
                    process.log_tail(TAIL_LINES),
                )
            time.sleep(self.poll_s)

    def _stop(self, service: Service) -> None:
        service.stopped = True
        self.stop_order.append(service.spec.name)
        service.process.stop(grace=self.shutdown_timeout_s)


def _safe_health(check: HealthCheck, process: ServiceProcess) -> bool:
    try:
        return bool(check(process))
    except Exception as exc:  # a health check that throws means "not healthy yet"
        log.debug("health check failed: %s", exc)
        return False


# ----------------------------------------------------------------------------- health checks


def http_health(url: str, *, timeout: float = 2.0, secret: str | None = None) -> HealthCheck:
    """Healthy when GET {url}/health answers 200 with status 'ok' (the one route that needs no
    secret; `secret` is sent if given)."""

    def check(_process: ServiceProcess) -> bool:
        try:
            body = call_json("GET", f"{url.rstrip('/')}/health", timeout=timeout, secret=secret)
        except HttpFailure:
            return False
        return isinstance(body, dict) and body.get("status") == "ok"

    return check


def producer_health(run_dir: str | Path, *, timeout: float = 2.0) -> HealthCheck:
    """Healthy when this very process wrote the controller address and its /health is ok."""

    def check(process: ServiceProcess) -> bool:
        # A restarted producer must not pass on the address its dead predecessor left behind.
        try:
            data = json.loads(controller_address_path(run_dir).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        if data.get("pid") != process.pid:
            return False
        url = read_controller_address(run_dir)
        return url is not None and http_health(url, timeout=timeout)(process)

    return check


def producer_service(
    config_path: str | Path,
    run_dir: str | Path,
    *,
    max_restarts: int,
    overrides: Sequence[str] = (),
    capture_urls: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> ServiceSpec:
    """The producer as a supervised service (`python -m specdraft.trainer.disagg.producer`)."""
    argv = [
        python,
        "-m",
        "specdraft.trainer.disagg.producer",
        "--config",
        str(config_path),
        "--run-dir",
        str(run_dir),
    ]
    for item in overrides:
        argv += ["--set", item]
    for url in capture_urls:
        argv += ["--capture-url", url]
    argv += list(extra_args)
    return ServiceSpec(
        name="producer",
        argv=argv,
        health=producer_health(run_dir),
        max_restarts=max_restarts,
        restarts_field="deployment.disaggregated.max_producer_restarts",
    )
