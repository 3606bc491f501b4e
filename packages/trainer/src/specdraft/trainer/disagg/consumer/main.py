"""What the trainer ranks of a disaggregated run execute, and their process entry point:

    python -m specdraft.trainer.disagg.consumer CONFIG [--set key=value ...] \\
        [--nproc-per-node N] [--nnodes M] [--resume DIR|latest] [--allow-changed F] \\
        [--stop-timeout S] [--no-progress]

The command line is a `RunRequest`'s (`RunRequest.argv` writes it, `from_argv` reads it).
`specdraft train` launches `rank_main` itself; the managed run starts this module for the
trainer ranks once its services are up (its caller has validated the config and the resume
options already). Exit status: 0 trained, 1 a rank failed (its error is printed), 2 a bad
command line or config.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from ...train.request import RunRequest
from ...train.run import rank_main as _train_rank_main
from .trainer import build_disaggregated_trainer

PROG = "python -m specdraft.trainer.disagg.consumer"


def rank_main(request: RunRequest) -> dict[str, Any]:
    """One trainer rank of a disaggregated run (picklable for the elastic launcher)."""
    return _train_rank_main(request, build=build_disaggregated_trainer)


def main(argv: Sequence[str] | None = None) -> int:
    """Launch this node's trainer ranks for the request on the command line; the exit status."""
    from specdraft.config import ConfigError

    from ...launch import RankFailed, launch
    from ...train.run import launch_environment_defaults

    try:
        request = RunRequest.from_argv(sys.argv[1:] if argv is None else argv, prog=PROG)
    except ConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    launch_environment_defaults()
    try:
        launch(request.launch, rank_main, request)
    except RankFailed as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0
