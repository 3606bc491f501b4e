"""What the trainer ranks of a disaggregated run execute, and their process entry point:

    python -m specdraft.trainer.disagg.consumer CONFIG [--set key=value ...] \\
        [--nproc-per-node N] [--nnodes M] [--resume DIR|latest] [--allow-changed F,G] \\
        [--no-progress]

`specdraft train` launches `rank_main` itself; the managed run starts this module for the
trainer ranks once its services are up (its caller has validated the config and the resume
options already). Exit status: 0 trained, 1 a rank failed (its error is printed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from ...train.run import rank_main as _train_rank_main
from .trainer import build_disaggregated_trainer


def rank_main(
    config_path: str,
    overrides: list[str],
    resume: str | None,
    progress: bool = True,
    allow_changed: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One trainer rank of a disaggregated run (picklable for the elastic launcher)."""
    return _train_rank_main(
        config_path, overrides, resume, progress, allow_changed, build=build_disaggregated_trainer
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Launch this node's trainer ranks; the exit status."""
    from ...launch import LaunchPlan, RankFailed, launch
    from ...train.run import launch_environment_defaults

    parser = argparse.ArgumentParser(
        prog="python -m specdraft.trainer.disagg.consumer",
        description="Run the trainer ranks of a disaggregated run (its producer already serves).",
    )
    parser.add_argument("config", help="specdraft TOML config")
    parser.add_argument("--set", action="append", default=[], help="config override key=value")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="trainer ranks here")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes")
    parser.add_argument("--resume", default=None, help="checkpoint folder or 'latest'")
    parser.add_argument(
        "--allow-changed", default="", help="comma-separated data-order fields a resume may change"
    )
    parser.add_argument("--no-progress", action="store_true", help="logs only")
    args = parser.parse_args(argv)
    allowed = tuple(name for name in args.allow_changed.split(",") if name)
    launch_environment_defaults()
    plan = LaunchPlan(nproc_per_node=args.nproc_per_node, nnodes=args.nnodes)
    try:
        launch(
            plan, rank_main, args.config, list(args.set), args.resume, not args.no_progress, allowed
        )
    except RankFailed as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0
