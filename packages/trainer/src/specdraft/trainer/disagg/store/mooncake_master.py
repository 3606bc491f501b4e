"""Start and stop `mooncake_master` (from mooncake-transfer-engine) for a managed run.

The master only keeps metadata (which client's segment holds which object); the bytes live in
the memory the clients mount. It binds its RPC and metrics servers to the host of
`deployment.disaggregated.mooncake.master_address` (127.0.0.1 by default), not all interfaces.
"""

from __future__ import annotations

import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ...runtime.service_process import ServiceError, ServiceProcess, ServiceSpec, tcp_health

if TYPE_CHECKING:
    from specdraft.config import Config
    from specdraft.config.stores.mooncake import MooncakeConfig


def split_address(address: str, *, field: str) -> tuple[str, int]:
    """`host:port` -> (host, port); ValueError naming the config field otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{field} = {address!r} is not host:port (e.g. 127.0.0.1:50051)")
    return host, int(port)


def port_open(host: str, port: int, *, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to host:port is accepted within `timeout`."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def master_binary() -> str:
    """The `mooncake_master` executable: next to this Python first, then on PATH."""
    beside = Path(sys.executable).parent / "mooncake_master"
    if beside.is_file():
        return str(beside)
    found = shutil.which("mooncake_master")
    if found is None:
        raise ServiceError(
            "mooncake_master is not installed: pip install 'specdraft-trainer[mooncake]' "
            "(mooncake-transfer-engine-non-cuda on CPU machines), or set "
            "deployment.disaggregated.mooncake.manage_master = false and start it yourself"
        )
    return found


def master_command(
    host: str,
    port: int,
    *,
    metrics_port: int,
    binary: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The mooncake_master command line bound to `host`."""
    return [
        binary or master_binary(),
        f"-rpc_address={host}",
        f"-rpc_port={port}",
        f"-metrics_host={host}",
        f"-metrics_port={metrics_port}",
        # The HTTP metadata server would bind 0.0.0.0:8080; P2P handshakes need none.
        "-enable_http_metadata_server=false",
        *extra_args,
    ]


class MooncakeMaster:
    """A `mooncake_master` child process; `address` is what clients connect to."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        metrics_port: int,
        log_path: Path,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.host, self.port, self.metrics_port = host, port, metrics_port
        self.log_path = Path(log_path)
        self.command = master_command(host, port, metrics_port=metrics_port, extra_args=extra_args)
        self.process: ServiceProcess | None = None

    @property
    def address(self) -> str:
        """host:port of the master's RPC server."""
        return f"{self.host}:{self.port}"

    def start(self, *, timeout: float = 60.0) -> MooncakeMaster:
        """Start it and wait until its RPC port accepts connections."""
        if port_open(self.host, self.port, timeout=0.5):
            raise ServiceError(
                f"{self.address} is already taken: another mooncake_master (or service) runs "
                f"there; stop it or change deployment.disaggregated.mooncake.master_address"
            )
        self.process = ServiceProcess("mooncake_master", self.command, self.log_path)
        self.process.wait_ready(
            lambda: port_open(self.host, self.port, timeout=0.5),
            timeout=timeout,
            what=f"accepting connections on {self.address}",
        )
        return self

    def alive(self) -> bool:
        """Whether the master process still runs."""
        return self.process is not None and self.process.alive()

    def stop(self, *, grace: float = 30.0) -> int | None:
        """Stop the master (objects it tracked are gone with it)."""
        if self.process is None:
            return None
        return self.process.stop(grace=grace)

    def __enter__(self) -> MooncakeMaster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_master(cfg: MooncakeConfig, log_path: Path, *, timeout: float) -> MooncakeMaster:
    """Start the master at `cfg.master_address` with metrics on `cfg.metrics_port`."""
    host, port = split_address(
        cfg.master_address, field="deployment.disaggregated.mooncake.master_address"
    )
    return MooncakeMaster(host, port, metrics_port=cfg.metrics_port, log_path=log_path).start(
        timeout=timeout
    )


def master_services(config: Config) -> list[ServiceSpec]:
    """mooncake_master as a managed run's service (bound to the configured address), when the
    run manages it (`mooncake.manage_master`)."""
    cfg = config.deployment.disaggregated.mooncake
    if not cfg.manage_master:
        return []
    host, port = split_address(
        cfg.master_address, field="deployment.disaggregated.mooncake.master_address"
    )
    spec = ServiceSpec(
        name="mooncake_master",
        argv=master_command(host, port, metrics_port=cfg.metrics_port),
        health=tcp_health(host, port),
    )
    return [spec]
