"""Start the trainer ranks: join an existing torchrun group, or launch them with torch elastic.

`specdraft train` calls `launch(...)` with a picklable rank entry point. Under torchrun (the
environment already names RANK / WORLD_SIZE) the current process *is* a rank and runs the entry
point directly. Otherwise one rank on one node runs in-process, and more ranks are started through
PyTorch's elastic launcher with the same flags torchrun takes for multi-node. A rank that raises is
recorded (its traceback lands in the launcher's error file) and the launcher stops the others, so
a failure ends the run instead of hanging it.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .runtime.distributed import cpu_thread_env, free_port


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
    # The agent logs every child's traceback at ERROR; we print the first failure ourselves.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)

    port = plan.master_port or (free_port() if plan.nnodes == 1 else 29500)
    config = LaunchConfig(
        min_nodes=plan.nnodes,
        max_nodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node,
        run_id=f"specdraft-{uuid.uuid4().hex[:8]}" if plan.nnodes == 1 else "specdraft",
        # Static rendezvous: every node is told its rank, like torchrun --node-rank.
        rdzv_backend="static",
        rdzv_endpoint=f"{plan.master_addr}:{port}",
        rdzv_configs={"rank": plan.node_rank, "timeout": 900},
        max_restarts=0,  # a failed rank fails the run; resume from the last checkpoint instead
        monitor_interval=0.5,
        start_method="spawn",
    )
    try:
        results = elastic_launch(config, _recorded(entrypoint))(*args)
    except ChildFailedError as exc:
        raise RankFailed(_describe_failure(exc)) from None
    return results.get(0) if isinstance(results, dict) else results


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
