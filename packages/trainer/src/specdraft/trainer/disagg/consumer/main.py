"""What the trainer ranks of a disaggregated run execute, and their process entry point:

    python -m specdraft.trainer.disagg.consumer REQUEST.json

The file is a `RunRequest` (`RunRequest.to_json` writes it, `from_json` reads it): the train
flags are parsed once, by `specdraft train`. `specdraft train` launches `rank_main` itself; the
managed run writes the request and starts this module for the trainer ranks once its services
are up (its caller has validated the config and the resume options already). Exit status:
0 trained, 1 a rank failed (its error is printed), 2 a bad command line, request file or config.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...request import RunRequest
from ...train import rank_entry
from .assembly import build_disaggregated_trainer

PROG = "python -m specdraft.trainer.disagg.consumer"


def rank_main(request: RunRequest) -> dict[str, Any]:
    """One trainer rank of a disaggregated run (picklable for the elastic launcher)."""
    return rank_entry.rank_main(request, build=build_disaggregated_trainer)


def main(argv: Sequence[str] | None = None) -> int:
    """Launch this node's trainer ranks for the request in the file named on the command line;
    the exit status."""
    from specdraft.config import ConfigError

    from ...launch import RankFailed, launch
    from ...train.environment import launch_environment_defaults

    parser = argparse.ArgumentParser(
        prog=PROG, description="Run this node's trainer ranks for a specdraft run request."
    )
    parser.add_argument("request", type=Path, help="the run request (JSON, RunRequest.to_json)")
    path = parser.parse_args(sys.argv[1:] if argv is None else argv).request
    try:
        request = RunRequest.from_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"Error: {path}: {exc}", file=sys.stderr)
        return 2
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
