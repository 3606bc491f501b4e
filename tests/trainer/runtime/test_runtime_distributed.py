"""A lone process's one-rank group: its store's listening descriptor belongs to the store alone,
so a run in a process that goes on (a library caller, the test suite) leaves no socket object
behind that would close a reused descriptor number later."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from specdraft.trainer.runtime.distributed import init_distributed, shutdown_distributed


@pytest.fixture
def no_torchrun_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def live_sockets_on(fd: int) -> list[socket.socket]:
    """Socket objects that still claim descriptor number `fd` (and would close it)."""
    gc.collect()
    return [
        obj
        for obj in gc.get_objects()
        # type(), not isinstance: that would read __class__ of torch's deprecated aliases.
        if issubclass(type(obj), socket.socket) and obj.fileno() == fd
    ]


def test_no_socket_object_claims_a_descriptor_the_store_gave_back(no_torchrun_env):
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    for _ in range(2):
        init_distributed()
        total = torch.ones(1)
        dist.all_reduce(total)
        assert total.item() == 1.0
        shutdown_distributed()
    gc.collect()
    # New descriptors take the lowest free numbers, those the destroyed stores closed among them.
    pipes = [os.pipe() for _ in range(8)]
    try:
        for read_fd, write_fd in pipes:
            assert live_sockets_on(read_fd) == [] and live_sockets_on(write_fd) == []
    finally:
        for read_fd, write_fd in pipes:
            os.close(read_fd)
            os.close(write_fd)


@pytest.mark.subprocess
def test_a_process_that_ran_several_groups_exits_cleanly():
    # The abort this guards against: a leftover socket object closed, at exit, the descriptor a
    # later gloo group's loop polls ("gloo::EnforceNotMet ... nfds != -1", exit status 134).
    code = (
        "import os, torch, torch.distributed as dist\n"
        "from specdraft.trainer.runtime.distributed import init_distributed, shutdown_distributed\n"
        "held = []\n"
        "for i in range(4):\n"
        "    init_distributed(); t = torch.ones(1); dist.all_reduce(t); shutdown_distributed()\n"
        "    held.append(os.open(os.devnull, os.O_RDONLY))\n"
        "for fd in held[:2]:\n"
        "    os.close(fd)\n"
        "init_distributed(); t = torch.ones(1); dist.all_reduce(t)\n"
        "print('done', flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "done"
