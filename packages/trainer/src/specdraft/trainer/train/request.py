"""The run request: what `specdraft train` was asked to run, built once and handed whole to
every layer that runs it (the deployment dispatch, the managed run, the trainer ranks).

A request carries the validated `Config` (with the launch's rank counts applied) and the file and
`--set` overrides it came from, because the processes a run starts (capture servers, producer,
the managed run's trainer ranks) load the same config from the same file. It crosses a process
boundary in two ways: pickled to the ranks of the elastic launcher, and as the command line of
`python -m specdraft.trainer.disagg.consumer` (`argv` / `from_argv`, which round-trip).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from specdraft.config import Config, load_config

from ..launch import LaunchPlan
from .preempt import DEFAULT_STOP_TIMEOUT as DEFAULT_STOP_TIMEOUT_S

Deployment = Literal["local", "disaggregated", "managed"]


@dataclass(frozen=True)
class RunRequest:
    """One training run as asked for: the config, where it came from, and how to launch it."""

    config: Config
    config_path: str
    overrides: tuple[str, ...] = ()
    # A checkpoint folder or "latest"; None starts fresh (unless training.resume_from is set).
    resume: str | None = None
    # Data-order fields a resume may find changed (--allow-changed).
    allow_changed: tuple[str, ...] = ()
    launch: LaunchPlan = field(default_factory=lambda: LaunchPlan(nproc_per_node=1))
    progress: bool = True
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S
    # A fresh run into a used output_dir moves the old run aside instead of being refused.
    overwrite: bool = False

    @classmethod
    def create(
        cls,
        config_path: str,
        overrides: Sequence[str] = (),
        *,
        launch: LaunchPlan | None = None,
        resume: str | None = None,
        allow_changed: Sequence[str] = (),
        progress: bool = True,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        overwrite: bool = False,
    ) -> RunRequest:
        """Load the config once and fix the launch; a launch whose rank counts differ from the
        config's becomes two more overrides, so every process of the run reads the same config.

        Raises `ConfigError` for a bad config (or rank counts outside its bounds).
        """
        overrides = tuple(overrides)
        config = load_config(config_path, overrides)
        deployment = config.deployment
        if launch is None:
            launch = LaunchPlan(nproc_per_node=deployment.nproc_per_node, nnodes=deployment.nnodes)
        if (launch.nproc_per_node, launch.nnodes) != (deployment.nproc_per_node, deployment.nnodes):
            overrides = (
                *overrides,
                f"deployment.nproc_per_node={launch.nproc_per_node}",
                f"deployment.nnodes={launch.nnodes}",
            )
            config = load_config(config_path, overrides)
        return cls(
            config=config,
            config_path=str(config_path),
            overrides=overrides,
            resume=resume,
            allow_changed=tuple(allow_changed),
            launch=launch,
            progress=progress,
            stop_timeout_s=stop_timeout_s,
            overwrite=overwrite,
        )

    @property
    def deployment(self) -> Deployment:
        """How the run is deployed: local ranks, ranks of a disaggregated run whose services
        already run, or a managed disaggregated run that starts its services itself."""
        deployment = self.config.deployment
        if deployment.mode != "disaggregated":
            return "local"
        return "managed" if deployment.disaggregated.managed else "disaggregated"

    @property
    def resuming(self) -> bool:
        """Whether the run continues from a checkpoint (--resume or training.resume_from)."""
        return self.resume is not None or self.config.training.resume_from is not None

    def with_overrides(self, *more: str) -> RunRequest:
        """The same request with more `--set` overrides (the config reloaded with them)."""
        overrides = (*self.overrides, *more)
        return replace(self, overrides=overrides, config=load_config(self.config_path, overrides))

    def argv(self) -> list[str]:
        """This request as the command line `from_argv` reads (the consumer entry point's)."""
        plan = self.launch
        argv = [self.config_path]
        for item in self.overrides:
            argv += ["--set", item]
        argv += ["--nproc-per-node", str(plan.nproc_per_node), "--nnodes", str(plan.nnodes)]
        argv += ["--node-rank", str(plan.node_rank), "--master-addr", plan.master_addr]
        if plan.master_port is not None:
            argv += ["--master-port", str(plan.master_port)]
        if self.resume is not None:
            argv += ["--resume", self.resume]
        for name in self.allow_changed:
            argv += ["--allow-changed", name]
        argv += ["--stop-timeout", repr(self.stop_timeout_s)]
        if not self.progress:
            argv.append("--no-progress")
        if self.overwrite:
            argv.append("--overwrite")
        return argv

    @classmethod
    def from_argv(cls, argv: Sequence[str], *, prog: str | None = None) -> RunRequest:
        """Parse a command line `argv` wrote (argparse's usage error, exit 2, for a bad one)."""
        args = _parser(prog).parse_args(list(argv))
        launch = LaunchPlan(
            nproc_per_node=args.nproc_per_node,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            master_addr=args.master_addr,
            master_port=args.master_port,
        )
        return cls.create(
            args.config,
            args.set,
            launch=launch,
            resume=args.resume,
            allow_changed=[name for item in args.allow_changed for name in item.split(",") if name],
            progress=not args.no_progress,
            stop_timeout_s=args.stop_timeout,
            overwrite=args.overwrite,
        )


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Run this node's trainer ranks for a specdraft config."
    )
    parser.add_argument("config", help="specdraft TOML config")
    parser.add_argument("--set", action="append", default=[], help="config override key=value")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="trainer ranks here")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank")
    parser.add_argument("--master-addr", default="127.0.0.1", help="rendezvous host")
    parser.add_argument("--master-port", type=int, default=None, help="rendezvous port")
    parser.add_argument("--resume", default=None, help="checkpoint folder or 'latest'")
    parser.add_argument(
        "--allow-changed",
        action="append",
        default=[],
        help="data-order field a resume may find changed (repeatable, or comma-separated)",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=DEFAULT_STOP_TIMEOUT_S,
        help="seconds a stop (step + checkpoint) may take",
    )
    parser.add_argument("--no-progress", action="store_true", help="logs only")
    parser.add_argument("--overwrite", action="store_true", help="move a previous run aside")
    return parser
