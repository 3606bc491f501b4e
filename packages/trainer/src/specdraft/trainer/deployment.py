"""Run a `RunRequest` the way its config deploys it: the one place that dispatches on the mode.

- local: the trainer ranks (`train.rank_entry.rank_main`) on this node, the target in-process or
  offline features;
- disaggregated (`managed = false`): the ranks of a disaggregated run
  (`disagg.consumer.rank_main`), against a producer that already serves;
- managed: a whole disaggregated run on this machine (`disagg.managed.run_managed`): the
  store's services, capture servers, producer, then the ranks, stopped in reverse order.

Before any of them, the run holds its output folder (`train.run_folder`): a busy folder, or a
fresh run into a used one, is refused with `RunFolderError` (the CLI's exit 2). It sits above
`train` and `disagg` because it imports both (`disagg` imports `train`, never the reverse).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from .launch import under_torchrun
from .request import RunRequest

# What a managed run writes into output_dir besides the training run (--overwrite moves it too).
MANAGED_RUN_FILES = ("disagg", "logs")


def run_request(request: RunRequest) -> dict[str, Any] | None:
    """Run the request in its deployment mode, holding its output folder; rank 0's summary.

    Raises `RunFolderError` (busy or used folder), `RankFailed` / `StoppedAtOnce` (launch.py).
    """
    from .launch import launch
    from .train.environment import launch_environment_defaults

    launch_environment_defaults()
    with hold_output_folder(request):
        if request.deployment == "managed":
            from .disagg.managed.run import run_managed

            return run_managed(request)
        if request.deployment == "disaggregated":
            # The ranks of a disaggregated run read windows from the producer instead.
            from .disagg.consumer import rank_main as rank_entry
        else:
            from .train.rank_entry import rank_main as rank_entry
        return launch(request.launch, rank_entry, request)


@contextlib.contextmanager
def hold_output_folder(request: RunRequest) -> Iterator[None]:
    """Hold output_dir for the run (rank 0 of torchrun, or the launcher); refuse a busy folder,
    or a fresh run into a used one unless the request overwrites (the old run moved aside)."""
    from .train.run_folder import fresh_run_refusal, hold_run_folder, move_run_aside

    if under_torchrun() and os.environ.get("RANK") != "0":
        yield
        return
    output_dir = request.config.output_dir
    with hold_run_folder(output_dir):
        refusal = None if request.resuming else fresh_run_refusal(output_dir)
        if refusal and not request.overwrite:
            from .train.run_folder import RunFolderError

            raise RunFolderError(refusal)
        if refusal:
            extra = MANAGED_RUN_FILES if request.deployment == "managed" else ()
            moved = move_run_aside(output_dir, extra)
            # For the user, before any rank logs (logging is not configured yet).
            print(f"--overwrite: the previous run's files are now in {moved}", file=sys.stderr)
        yield
