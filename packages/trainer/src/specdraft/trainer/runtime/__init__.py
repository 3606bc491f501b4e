"""Process-level runtime: the distributed context every rank runs in."""

from .distributed import DistContext, all_reduce_sum, init_distributed, shutdown_distributed

__all__ = ["DistContext", "all_reduce_sum", "init_distributed", "shutdown_distributed"]
