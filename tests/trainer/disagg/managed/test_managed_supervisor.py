"""The supervisor of managed services: health-checked start, logs in the run folder, reverse
order stop with SIGKILL after the grace period, restarts, and a dead service's log tail."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from specdraft.trainer.disagg.managed.supervisor import (
    ServiceDied,
    ServiceSpec,
    Supervisor,
    producer_health,
    producer_service,
)
from specdraft.trainer.disagg.wire.windows import write_controller_address

# A stand-in service: says it is up, marks itself ready (with its pid), then runs until
# SIGTERM, which it records in a shared file. Options: "exit=<code>@<s>" exits by itself after
# s seconds with that code, "stubborn" ignores SIGTERM, "never-ready" never marks itself ready.
SERVICE = r"""
import os, signal, sys, time
from pathlib import Path

name, folder, opts = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]

def on_term(*_):
    with open(folder / "stopped.txt", "a") as f:
        f.write(name + "\n")
    sys.exit(0)

signal.signal(signal.SIGTERM, signal.SIG_IGN if "stubborn" in opts else on_term)
print(f"{name} up", flush=True)
if "never-ready" not in opts:
    (folder / f"{name}.ready").write_text(str(os.getpid()))
exit_at = next((o for o in opts if o.startswith("exit=")), None)
started = time.monotonic()
while True:
    time.sleep(0.02)
    if exit_at:
        code, after = exit_at[5:].split("@")
        if time.monotonic() - started > float(after):
            print(f"{name}: fatal: disk on fire", flush=True)
            sys.exit(int(code))
"""


def service(name: str, folder: Path, *opts: str, max_restarts: int = 0) -> ServiceSpec:
    """A stand-in service that is healthy once this very process has marked itself ready."""

    def ready(process) -> bool:
        marker = folder / f"{name}.ready"
        return marker.exists() and marker.read_text() == str(process.pid)

    return ServiceSpec(
        name=name,
        argv=[sys.executable, "-c", SERVICE, name, str(folder), *opts],
        health=ready,
        max_restarts=max_restarts,
        restarts_field="deployment.disaggregated.max_producer_restarts",
    )


def test_services_stop_in_reverse_start_order_and_log_to_the_run_folder(tmp_path):
    supervisor = Supervisor(tmp_path, health_timeout_s=20, shutdown_timeout_s=5)
    with supervisor:
        for name in ("store", "capture", "producer"):
            supervisor.start(service(name, tmp_path))
        supervisor.check()  # all alive: nothing happens
    assert (tmp_path / "stopped.txt").read_text().split() == ["producer", "capture", "store"]
    assert supervisor.stop_order == ["producer", "capture", "store"]
    for name in ("store", "capture", "producer"):
        assert f"{name} up" in (tmp_path / "logs" / f"{name}.log").read_text()


def test_a_service_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    supervisor = Supervisor(tmp_path, health_timeout_s=20, shutdown_timeout_s=0.5)
    started = supervisor.start(service("stubborn", tmp_path, "stubborn"))
    began = time.monotonic()
    supervisor.stop_all()
    elapsed = time.monotonic() - began
    assert started.process.popen.returncode == -signal.SIGKILL
    assert 0.5 <= elapsed < 10


def test_a_dead_service_stops_the_run_with_its_log_tail(tmp_path):
    supervisor = Supervisor(tmp_path, health_timeout_s=20, shutdown_timeout_s=5)
    with supervisor:
        supervisor.start(service("store", tmp_path))
        supervisor.start(service("capture", tmp_path, "exit=3@0.3"))
        with pytest.raises(ServiceDied) as info:
            supervisor.watch(lambda: False, timeout=30)
    message = str(info.value)
    assert info.value.name == "capture"
    assert "'capture' exited with code 3" in message
    assert "fatal: disk on fire" in message and str(tmp_path / "logs" / "capture.log") in message
    # The others were still stopped, in reverse order.
    assert supervisor.stop_order == ["capture", "store"]


def test_a_crashed_service_is_restarted_until_its_restarts_run_out(tmp_path):
    supervisor = Supervisor(tmp_path, health_timeout_s=20, shutdown_timeout_s=5)
    with supervisor:
        started = supervisor.start(service("producer", tmp_path, "exit=1@0.3", max_restarts=1))
        first_pid = started.process.pid
        deadline = time.monotonic() + 30
        while started.restarts == 0:
            supervisor.check()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert started.process.pid != first_pid
        with pytest.raises(ServiceDied, match=r"after 1 restarts \(deployment\.disaggregated"):
            supervisor.watch(lambda: False, timeout=30)
    assert (tmp_path / "logs" / "producer.log").read_text().count("producer up") == 2


@pytest.mark.parametrize("max_restarts", [1, 3])
def test_a_restart_that_exits_while_starting_uses_another_restart(tmp_path, max_restarts):
    # A restarted producer can serve (and be killed) before the health poll sees it up: that
    # exit uses another restart while restarts remain, not end the run as a failed start.
    spec = service("producer", tmp_path, "exit=1@0.3", max_restarts=max_restarts)
    marker_ready, pids = spec.health, []

    def first_restart_never_ready(process) -> bool:
        if process.pid not in pids:
            pids.append(process.pid)
        return len(pids) != 2 and marker_ready(process)

    spec = ServiceSpec(**{**spec.__dict__, "health": first_restart_never_ready})
    supervisor = Supervisor(tmp_path, health_timeout_s=20, shutdown_timeout_s=5, poll_s=0.05)
    with supervisor:
        started = supervisor.start(spec)
        deadline = time.monotonic() + 30
        if max_restarts == 1:
            with pytest.raises(ServiceDied, match="exited with code 1 while starting"):
                supervisor.watch(lambda: False, timeout=30)
            return
        while started.restarts == 0:
            supervisor.check()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # The first restart exited while starting; the second came up.
        assert started.restarts == 2 and len(pids) == 3
        assert started.process.pid == pids[2]


def test_a_service_that_never_becomes_healthy_fails_naming_the_timeout(tmp_path):
    supervisor = Supervisor(tmp_path, health_timeout_s=0.5, shutdown_timeout_s=5)
    with pytest.raises(ServiceDied, match=r"within 0.5 s \(deployment.disaggregated.health_"):
        supervisor.start(service("capture", tmp_path, "never-ready"))
    assert not supervisor.services[0].process.alive()


def test_a_service_that_exits_while_starting_shows_why(tmp_path):
    spec = ServiceSpec(
        name="master",
        argv=[sys.executable, "-c", "import sys; print('bad flag --x'); sys.exit(2)"],
        health=lambda process: False,
    )
    with pytest.raises(ServiceDied, match=r"(?s)exited with code 2 while starting.*bad flag"):
        Supervisor(tmp_path, health_timeout_s=20, shutdown_timeout_s=5).start(spec)


def test_the_producer_service_runs_the_producer_module_and_is_healthy_only_as_itself(tmp_path):
    spec = producer_service(
        tmp_path / "c.toml",
        tmp_path,
        max_restarts=3,
        overrides=["training.seed=3"],
        capture_urls=["http://127.0.0.1:9"],
    )
    assert spec.argv[1:3] == ["-m", "specdraft.trainer.disagg.producer"]
    assert spec.argv[7:9] == ["--set", "training.seed=3"]
    assert spec.argv[-2:] == ["--capture-url", "http://127.0.0.1:9"]
    assert spec.max_restarts == 3

    class Process:
        pid = 4242

    check = producer_health(tmp_path, timeout=0.2)
    assert not check(Process())  # no address yet
    write_controller_address(tmp_path, "http://127.0.0.1:9")
    address = json.loads((tmp_path / "disagg" / "controller.json").read_text())
    assert address["url"] == "http://127.0.0.1:9"
    # Written by another process (a dead predecessor): not this producer's health.
    assert not check(Process())
