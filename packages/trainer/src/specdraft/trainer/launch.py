"""Start the trainer ranks: join an existing torchrun group, or launch them with torch elastic.

`specdraft train` calls `launch(...)` with a picklable rank entry point. Under torchrun (the
environment already names RANK / WORLD_SIZE) the current process *is* a rank and runs the entry
point directly. Otherwise one rank on one node runs in-process, and more ranks are started through
PyTorch's elastic launcher with the same flags torchrun takes for multi-node. A rank that raises is
recorded (its traceback lands in the launcher's error file) and the launcher stops the others, so
a failure ends the run instead of hanging it.

The rendezvous store (a TCPStore on node 0 that every rank trusts) listens on 127.0.0.1 for a
single-node run and on `--master-addr` only for a multi-node one: torch's static rendezvous
would listen on every interface, where anyone could set its keys.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import signal
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .runtime.distributed import bind_listener, cpu_thread_env, free_port, store_on_listener

# Our static rendezvous: torch's, with the store's listening socket bound to one address.
RDZV_BACKEND = "specdraft-static"


@dataclass(frozen=True)
class LaunchPlan:
    """How many ranks to run, and where the rendezvous is."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None

    @property
    def world_size(self) -> int:
        """Total trainer ranks."""
        return self.nproc_per_node * self.nnodes


class RankFailed(RuntimeError):
    """A trainer rank raised; the message carries the failing rank's traceback."""


class StoppedAtOnce(RankFailed):
    """A second stop signal (or the stop deadline) ended the ranks without a checkpoint."""

    def __init__(self, signum: int) -> None:
        self.exit_code = 128 + signum
        super().__init__(
            f"stopped at once by a second {signal.Signals(signum).name}: nothing was saved since "
            "the last checkpoint (resume with --resume latest)"
        )


def under_torchrun() -> bool:
    """True when this process was started as a rank by torchrun or an elastic agent."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def launch(plan: LaunchPlan, entrypoint: Callable[..., Any], *args: Any) -> Any:
    """Run `entrypoint(*args)` on every rank of the plan; return rank 0's result."""
    if under_torchrun():
        return entrypoint(*args)
    if plan.world_size == 1:
        return entrypoint(*args)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # Ranks on one CPU machine must share its cores (the children inherit the environment).
    os.environ.update(cpu_thread_env(plan.nproc_per_node))
    if plan.nnodes == 1:
        # Gloo's pairs listen on the address of the host name, often a public interface; ranks
        # of one machine only need loopback. A value the user set wins.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # The agent logs every child's traceback at ERROR; we print the first failure ourselves.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)

    port = plan.master_port or (free_port() if plan.nnodes == 1 else 29500)
    _register_bound_rendezvous()
    config = LaunchConfig(
        min_nodes=plan.nnodes,
        max_nodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node,
        run_id=f"specdraft-{uuid.uuid4().hex[:8]}" if plan.nnodes == 1 else "specdraft",
        # Static rendezvous: every node is told its rank, like torchrun --node-rank.
        rdzv_backend=RDZV_BACKEND,
        rdzv_endpoint=f"{rendezvous_host(plan)}:{port}",
        rdzv_configs={"rank": plan.node_rank, "timeout": 900},
        max_restarts=0,  # a failed rank fails the run; resume from the last checkpoint instead
        monitor_interval=0.5,
        start_method="spawn",
        # Stop signals are ours, not the agent's: it would raise SignalException (a traceback)
        # and kill the ranks before they save. The launcher forwards them (_StopForwarder).
        signals_to_handle="SIGHUP,SIGQUIT",
    )
    forwarder = _StopForwarder()
    try:
        with forwarder:
            results = elastic_launch(config, _recorded(entrypoint))(*args)
    except ChildFailedError as exc:
        if forwarder.hard_signal is not None:
            raise StoppedAtOnce(forwarder.hard_signal) from None
        raise RankFailed(_describe_failure(exc)) from None
    return results.get(0) if isinstance(results, dict) else results


class _StopForwarder:
    """In the launcher: the first SIGTERM / SIGINT asks every rank to stop at the next optimizer
    step (SIGUSR1), a second one stops them at once (SIGUSR2); see train/preempt.py.

    The ranks inherit SIGUSR1 / SIGUSR2 ignored, so a request that lands while a rank still
    imports cannot kill it; the request is sent again every second until the ranks are done, so
    it reaches a rank as soon as its handler is in place.
    """

    RESEND_S = 1.0

    def __init__(self) -> None:
        self.count = 0
        self.hard_signal: int | None = None
        self.previous: dict[int, Any] = {}
        self.forwarded: int | None = None
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> _StopForwarder:
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            self.previous[sig] = signal.signal(sig, signal.SIG_IGN)
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count >= 2:
            self.hard_signal = signum
        self.forwarded = signal.SIGUSR1 if self.count == 1 else signal.SIGUSR2
        self._send()
        if self.thread is None:
            self.thread = threading.Thread(target=self._resend, name="stop-forward", daemon=True)
            self.thread.start()

    def _send(self) -> None:
        for pid in rank_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, self.forwarded or signal.SIGUSR1)

    def _resend(self) -> None:
        while not self.done.wait(self.RESEND_S):
            self._send()


def rank_pids(parent: int | None = None) -> list[int]:
    """The trainer ranks the elastic agent of this process started (its spawned children)."""
    parent = os.getpid() if parent is None else parent
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            if int(fields[1]) != parent:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read()
        except (OSError, IndexError, ValueError):
            continue
        # Multiprocessing's resource tracker is a child too; only spawned workers are ranks.
        if b"spawn_main" in command:
            pids.append(int(entry))
    return pids


def rendezvous_host(plan: LaunchPlan) -> str:
    """The address the rendezvous store binds: loopback unless other nodes must reach it."""
    return "127.0.0.1" if plan.nnodes == 1 else plan.master_addr


def _register_bound_rendezvous() -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    # The registry refuses a second registration of a name: once per process.
    if not getattr(_register_bound_rendezvous, "done", False):
        rendezvous_handler_registry.register(RDZV_BACKEND, _create_bound_rendezvous)
        _register_bound_rendezvous.done = True  # type: ignore[attr-defined]


def _create_bound_rendezvous(params: Any) -> Any:
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import (
        StaticTCPRendezvous,
        create_rdzv_handler,
    )

    class BoundStaticRendezvous(StaticTCPRendezvous):
        """Torch's static rendezvous, whose store on node 0 listens on master_addr only."""

        def get_backend(self) -> str:
            return RDZV_BACKEND

        def next_rendezvous(self) -> Any:
            if self._store is None and self.rank == 0:
                listener = bind_listener(self.master_addr, self.master_port)
                self._store = store_on_listener(
                    listener,
                    self.master_addr,
                    self.master_port,
                    self.world_size,
                    True,
                    self.timeout,
                    multi_tenant=True,
                )
            return super().next_rendezvous()

    base = create_rdzv_handler(params)
    return BoundStaticRendezvous(
        base.master_addr,
        base.master_port,
        base.rank,
        base.world_size,
        base.run_id,
        int(base.timeout / dt.timedelta(seconds=1)),
    )


def _recorded(entrypoint: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap the entry point so an exception's traceback reaches the launcher's error file."""
    return _RecordedEntrypoint(entrypoint)


class _RecordedEntrypoint:
    """Picklable wrapper applying torch elastic's `record` inside the child process."""

    def __init__(self, entrypoint: Callable[..., Any]) -> None:
        self.entrypoint = entrypoint
        self.__name__ = getattr(entrypoint, "__name__", "specdraft_rank")
        self.__qualname__ = self.__name__

    def __call__(self, *args: Any) -> Any:
        from torch.distributed.elastic.multiprocessing.errors import record

        return record(self.entrypoint)(*args)


def _describe_failure(exc: Any) -> str:
    """First failing rank, its exit code and its traceback, from a ChildFailedError."""
    failures = getattr(exc, "failures", {}) or {}
    if not failures:
        return str(exc)
    rank, failure = min(failures.items(), key=lambda item: getattr(item[1], "timestamp", 0))
    message = getattr(failure, "message", "")
    if isinstance(message, dict):
        message = (
            message.get("message", "") + "\n" + message.get("extraInfo", {}).get("py_callstack", "")
        )
    lines = [f"trainer rank {rank} failed (exit code {getattr(failure, 'exitcode', '?')})"]
    if message:
        lines.append(str(message).strip())
    others = sorted(r for r in failures if r != rank)
    if others:
        lines.append(f"(ranks {others} stopped as well)")
    return "\n".join(lines)
