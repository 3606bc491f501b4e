"""Initialise torch.distributed for a trainer rank: gloo on CPU, NCCL on CUDA, or a lone rank."""

from __future__ import annotations

import datetime as dt
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    """Who this process is in the trainer group, and which device it computes on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (the one that writes shared files and logs)."""
        return self.rank == 0


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a single-process group or a launcher)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` only (for the store's master_listen_fd)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise OSError(
            f"cannot listen for the trainer rendezvous on {host}:{port}: {exc}; --master-addr "
            f"must be an address of this machine (node rank 0) and --master-port a free port"
        ) from exc
    return sock


def pick_device(local_rank: int) -> torch.device:
    """CUDA device `local_rank` when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(timeout_s: float = 1800.0) -> DistContext:
    """Join the process group named by the environment (torchrun / our launcher), or make one.

    A lone process still gets a one-rank group, so FSDP and every collective run the same code
    path with one rank as with many.
    """
    if not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = pick_device(local_rank)
        options = {
            "backend": "nccl" if device.type == "cuda" else "gloo",
            "timeout": dt.timedelta(seconds=timeout_s),
            "device_id": device if device.type == "cuda" else None,
        }
        if "RANK" in os.environ:
            dist.init_process_group(**options)  # env:// from torchrun or our launcher
        else:
            # A lone process: an explicit one-rank group, leaving the environment untouched so
            # a later launch in this process does not mistake itself for a torchrun rank. Its
            # store listens on loopback only (a tcp:// init_method would listen everywhere).
            store = _loopback_store(timeout_s)
            dist.init_process_group(store=store, rank=0, world_size=1, **options)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(local_rank)
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, device)


def _loopback_store(timeout_s: float) -> dist.TCPStore:
    """A one-rank TCPStore serving on a socket bound to loopback only."""
    listener = bind_listener("127.0.0.1", 0)
    port = int(listener.getsockname()[1])
    return store_on_listener(listener, "127.0.0.1", port, 1, True, dt.timedelta(seconds=timeout_s))


def store_on_listener(listener: socket.socket, *args: Any, **kwargs: Any) -> dist.TCPStore:
    """`TCPStore(*args, **kwargs)`, the master store, serving on the bound socket `listener`.

    The store owns the descriptor from then on and closes it when it is destroyed, so the socket
    object lets go of it (detach): otherwise it would close the same number again later (when
    collected, or at exit), by then reused by another descriptor, such as a later gloo group's
    epoll loop, which then aborts the process ("gloo::EnforceNotMet ... nfds != -1").
    """
    try:
        store = dist.TCPStore(*args, master_listen_fd=listener.fileno(), **kwargs)
    except BaseException:
        listener.close()
        raise
    listener.detach()
    return store


def shutdown_distributed() -> None:
    """Destroy the process group if one is up."""
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait for every rank; a no-op without a process group (a single-process run)."""
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks (in place) and return it."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def cpu_thread_env(processes: int) -> dict[str, str]:
    """OMP_NUM_THREADS that shares this machine's cores among `processes` compute processes.

    torch gives every process as many intra-op threads as there are cores; trainer ranks and
    capture servers on one machine then oversubscribe it, and OpenMP's spinning barriers make
    each forward many times slower (measured: a capture 10-50x slower on 2 cores). A value the
    user set wins; the empty dict leaves it alone.
    """
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"OMP_NUM_THREADS": str(max(1, (cores or 1) // max(1, processes)))}
