"""Managed-local runs: one `specdraft train` starts every service of a disaggregated run.

`run` starts the Mooncake master, the capture servers, the producer and the trainer ranks, each
as a child process running a package entry point; `supervisor` health-checks them, restarts a
crashed producer and stops the rest, with the dead service's log tail, when one dies.
"""

from .run import ManagedRunFailed, run_managed
from .supervisor import ServiceDied, ServiceSpec, Supervisor

__all__ = ["ManagedRunFailed", "ServiceDied", "ServiceSpec", "Supervisor", "run_managed"]
