"""Managed-local disaggregated training: one `specdraft train` runs every service on this machine.

Start order (each health-checked before the next): the feature store's own services (the
Mooncake master with store = "mooncake" and manage_master), the capture server(s) (the embedded
one, or a managed SGLang), the producer, then the trainer ranks. Each runs a package entry
point (`python -m specdraft.trainer.disagg.capture`, `... .producer`, `... .consumer`), never
the CLI, which depends on this package. The trainers run as one more process (the elastic
launcher needs its own main thread and signal handlers); their console output is passed
through. While they run, the supervisor restarts a crashed producer (it resumes from its ledger)
and stops the run, with the dead service's log tail, when any other service dies. Everything
stops in reverse order at the end, on error and on Ctrl-C, each process with its whole group
(`runtime.service_process`: SIGTERM, `shutdown_timeout_s`, SIGKILL). Service logs are under
`<output_dir>/logs/`.

The run folder is made private (0700) and the run's secret is created in it (0600) before the
first service starts; the capture servers, the producer and the trainers get it in
$SPECDRAFT_RUN_SECRET, and every request between them carries it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdraft.config import Config

from ...launch import RankFailed
from ...request import RunRequest
from ...runtime.distributed import cpu_thread_env, free_port
from ...runtime.http_client import HttpFailure, call_json
from ...runtime.private import private_dir, run_folder, write_private
from ...runtime.run_secret import SECRET_ENV, ensure_run_secret
from ...runtime.service_process import ChildProcess
from ..store.factory import store_services
from .supervisor import (
    ServiceDied,
    ServiceSpec,
    Supervisor,
    http_health,
    producer_service,
)

log = logging.getLogger(__name__)

# The trainer process's run request (`RunRequest.to_json`), in <output_dir>/disagg/.
TRAINER_REQUEST_NAME = "trainer-request.json"


class ManagedRunFailed(RuntimeError):
    """A service or the trainers failed; the message says which and shows the log tail."""


def capture_service(
    config_path: str, overrides: Sequence[str], index: int, *, env: dict[str, str] | None = None
) -> tuple[ServiceSpec, str]:
    """The embedded capture server `index` as a supervised service, and its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "specdraft.trainer.disagg.capture",
        config_path,
        "--port",
        str(port),
    ]
    for item in overrides:
        argv += ["--set", item]
    return ServiceSpec(name=f"capture{index}", argv=argv, health=http_health(url), env=env), url


def trainer_command(request: RunRequest) -> list[str]:
    """The trainer ranks' process (managed = false: the services already run), its request
    written as a file into the run's private disagg/ folder for it to read."""
    ranks = request.with_overrides("deployment.disaggregated.managed=false")
    folder = private_dir(Path(request.config.output_dir) / "disagg")
    path = write_private(folder / TRAINER_REQUEST_NAME, ranks.to_json().encode())
    return [sys.executable, "-m", "specdraft.trainer.disagg.consumer", str(path)]


def run_managed(request: RunRequest) -> dict[str, Any] | None:
    """Run a whole disaggregated training on this machine; return the trainers' summary."""
    config, plan = request.config, request.launch
    config_path, overrides = request.config_path, request.overrides
    dis = config.deployment.disaggregated
    run_dir = Path(config.output_dir)
    # output_dir keeps its mode (it may be `.`); what the run writes inside it is private.
    run_folder(run_dir)
    # Handed to every process this run starts; a request without it changes nothing.
    secret_env = {SECRET_ENV: ensure_run_secret(run_dir)}
    # The services start one after the other and each may take a while to load its model:
    # say what is happening (a no-op when the caller configured logging already).
    logging.basicConfig(
        level=logging.INFO,
        format="[managed] %(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    supervisor = Supervisor(
        run_dir, health_timeout_s=dis.health_timeout_s, shutdown_timeout_s=dis.shutdown_timeout_s
    )
    trainers: ChildProcess | None = None
    stop = _StopTrainers()
    previous = stop.install()
    try:
        for spec in store_services(config):
            supervisor.start(spec)
        urls = list(dis.capture_urls)
        embedded = 0 if urls or dis.capture != "embedded" else dis.num_capture_servers
        threads = cpu_thread_env(plan.nproc_per_node + embedded)
        if not urls:
            urls = start_capture_servers(
                supervisor, config, config_path, overrides, env={**threads, **secret_env}
            )
        producer = producer_service(
            config_path,
            run_dir,
            max_restarts=dis.max_producer_restarts,
            overrides=overrides,
            capture_urls=urls,
        )
        producer.env = {**(producer.env or {}), **secret_env}
        supervisor.start(producer)
        log.info(
            "services up (%s); starting %d trainer rank(s) (OMP_NUM_THREADS=%s)",
            ", ".join(s.spec.name for s in supervisor.services),
            plan.world_size,
            {**os.environ, **threads}.get("OMP_NUM_THREADS", "torch's default"),
        )
        # Their stdout carries only their own summary, which this function returns for the
        # caller to print: dropped, so the summary is printed once. Logs go to stderr.
        # In a session of their own: a Ctrl-C reaches them once, forwarded by _StopTrainers
        # (a second copy from the terminal would stop them at once, without a checkpoint).
        trainers = ChildProcess(
            "trainer ranks",
            trainer_command(request),
            env={**threads, **secret_env},
            stdout=subprocess.DEVNULL,
        )
        stop.trainers = trainers
        while trainers.alive():
            supervisor.check()  # restarts the producer; raises ServiceDied for the others
            time.sleep(supervisor.poll_s)
        code = trainers.returncode
        log.info("trainer ranks exited with status %s; stopping the services", code)
        if code != 0:
            raise RankFailed(
                f"the trainer ranks exited with status {code} (their error is printed above; "
                f"service logs are in {supervisor.log_dir})"
            )
    except BaseException as exc:
        # Ctrl-C and SIGTERM too: the services run in sessions of their own and would outlive
        # this process if it did not stop them. The ranks first: SIGTERM makes them save at
        # the next step, and the services must serve until they have.
        if trainers is not None:
            trainers.stop(grace=dis.shutdown_timeout_s)
        if isinstance(exc, RankFailed):
            raise
        if isinstance(exc, ServiceDied):
            raise RankFailed(f"service {exc.name} died: {exc}") from None
        raise
    finally:
        supervisor.stop_all()
        log.info("services stopped (%s)", ", ".join(supervisor.stop_order) or "none started")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary_file = run_dir / "summary.json"
    return json.loads(summary_file.read_text()) if summary_file.is_file() else None


class _StopTrainers:
    """SIGTERM / Ctrl-C of a managed run: before the trainers start, stop (SystemExit, the
    services are stopped); once they run, pass each signal on to them: the first makes them
    save at the next optimizer step and exit (the services keep serving until they have), a
    second stops them at once (train/preempt.py)."""

    def __init__(self) -> None:
        self.trainers: ChildProcess | None = None

    def install(self) -> dict[int, Any]:
        """Handle SIGTERM and SIGINT; the previous handlers."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum: int, _frame: object) -> None:
        trainers = self.trainers
        if trainers is None or not trainers.alive():
            raise SystemExit(128 + signum)
        log.info("%s: asking the trainer ranks to stop", signal.Signals(signum).name)
        # To their launcher only: it forwards the request to every rank (launch.py).
        trainers.send_signal(signal.SIGTERM)


def start_capture_servers(
    supervisor: Supervisor,
    config: Config,
    config_path: str,
    overrides: Sequence[str],
    *,
    env: dict[str, str] | None = None,
) -> list[str]:
    """Start num_capture_servers capture servers (embedded or SGLang); return their URLs.

    `env` goes to the embedded ones (their CPU thread share)."""
    dis = config.deployment.disaggregated
    urls = []
    for index in range(dis.num_capture_servers):
        if dis.capture == "sglang":
            spec, url = sglang_service(config, index, secret=(env or {}).get(SECRET_ENV))
        else:
            spec, url = capture_service(config_path, overrides, index, env=env)
        supervisor.start(spec)
        urls.append(url)
    return urls


def sglang_service(
    config: Config, index: int, *, secret: str | None = None
) -> tuple[ServiceSpec, str]:
    """A real SGLang server (python -m sglang.launch_server ...) as a supervised service; with
    the specdraft plugin installed and the run's secret, the plugin writes the features."""
    from ..capture.sglang_launcher import plugin_environment, plugin_version, sglang_command

    plugin_env = plugin_environment(config, secret) if secret and plugin_version() else {}

    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def answers(_process: object) -> bool:
        # SGLang's /health answers 200 with an empty body once the model is loaded.
        try:
            call_json("GET", f"{url}/health", timeout=2.0)
        except HttpFailure:
            return False
        return True

    spec = ServiceSpec(
        name=f"sglang{index}",
        argv=sglang_command(config, port=port, plugin=bool(plugin_env)),
        health=answers,
        env=plugin_env or None,
    )
    return spec, url
