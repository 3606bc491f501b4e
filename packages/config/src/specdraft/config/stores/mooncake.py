"""The Mooncake feature store's settings, `[deployment.disaggregated.mooncake]` (torch-free)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..section import PositiveInt
from ..section import Section as _Section
from .base import StoreRules


class MooncakeConfig(_Section):
    """`[deployment.disaggregated.mooncake]`: the Mooncake feature store."""

    master_address: str = Field("127.0.0.1:50051", description="host:port of mooncake_master.")
    metadata_server: str = Field(
        "P2PHANDSHAKE",
        description="Transfer-engine metadata server ('P2PHANDSHAKE' or an http:// URL).",
    )
    protocol: Literal["tcp", "rdma"] = Field(
        "tcp", description="Transfer protocol: 'tcp' (CPU builds) or 'rdma'."
    )
    local_hostname: str = Field(
        "127.0.0.1", description="Address this process advertises to the store."
    )
    device_name: str = Field("", description="RDMA device names (empty for TCP).")
    global_segment_size_mb: PositiveInt = Field(
        512, description="Memory each client contributes to the store, MiB."
    )
    local_buffer_size_mb: PositiveInt = Field(128, description="Client-side transfer buffer, MiB.")
    manage_master: bool = Field(
        True,
        description="Start mooncake_master with the run (managed mode) and stop it at the end.",
    )
    metrics_port: PositiveInt = Field(
        9003,
        description="HTTP metrics port of mooncake_master (on the master's host); the store's "
        "bytes-resident counter reads master_allocated_bytes from it.",
    )


RULES = StoreRules("mooncake", "a Mooncake cluster, across machines", settings=MooncakeConfig)
