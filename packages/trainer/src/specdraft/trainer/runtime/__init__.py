"""Process-level runtime that the subsystems share and none of them owns.

`distributed` is the context every rank runs in (process group, rank, device); `cache` the
specdraft cache folder and its build-once entries (tokenised data, tiny assets); `http_json` the
small JSON-over-HTTP server and client with the run secret (used by `regenerate` and `disagg`);
`service_process` a child service started and stopped with its run. Only the distributed
context is re-exported here; import the others from their modules.
"""

from .distributed import (
    DistContext,
    all_reduce_sum,
    barrier,
    init_distributed,
    shutdown_distributed,
)

__all__ = [
    "DistContext",
    "all_reduce_sum",
    "barrier",
    "init_distributed",
    "shutdown_distributed",
]
