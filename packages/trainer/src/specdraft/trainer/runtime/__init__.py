"""Process-level runtime that the subsystems share and none of them owns.

`distributed` is the context every rank runs in (process group, rank, device); `cache` the
specdraft cache folder and its build-once entries (tokenised data, tiny assets); `atomic` durable
atomic writes; `private` the run folder and the private modes of what a run writes;
`run_secret` the secret a run's processes share; `http_server` / `http_client` JSON over HTTP
(only the disaggregated runtime and `regenerate`'s chat endpoint client use them: the local
training path never imports an HTTP module, `tests/test_import_cycles.py` checks it);
`service_process` a child process stopped with its whole group (SIGTERM, grace, SIGKILL). Only
the distributed context is re-exported here; import the others from their modules.
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
