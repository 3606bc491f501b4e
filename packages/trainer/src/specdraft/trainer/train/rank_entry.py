"""What every trainer rank runs: a `RunRequest` in, rank 0's summary out (and summary.json);
the refusals a user can fix come back as one error, not a traceback."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # The request is handed in: the root module imports train/ (preempt), never the reverse.
    from ..request import RunRequest

log = logging.getLogger("specdraft")


def configure_logging(rank: int) -> None:
    """Log INFO from rank 0 and warnings from the others, with the rank in every line."""
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(
        level=level,
        format=f"[rank{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )


def rank_main(request: RunRequest, build: Callable[..., Any] | None = None) -> dict[str, Any]:
    """What every trainer rank runs (picklable for the elastic launcher): the request's run.

    `build` makes the trainer (`build_trainer`'s signature; default: the local data path); a
    disaggregated run's ranks pass theirs (`specdraft.trainer.disagg.consumer.rank_main`), so
    this package never imports the runtime that imports it.
    """
    from ..runtime.private import private_files
    from .preempt import stop_on_signals

    # A rank's process is the run: checkpoints (torch's DCP writer), metrics.jsonl and
    # summary.json are written by code that takes the umask's mode, so set a private one here,
    # at the entry point, not at import (library callers keep theirs once this returns).
    # SIGTERM / Ctrl-C stop the run at the next optimizer step with a checkpoint (preempt.py).
    with private_files(), stop_on_signals(request.stop_timeout_s):
        try:
            return _run_rank(request, build)
        except user_error_types() as exc:
            # Every rank meets the same refusal (they all check the same files): each returns
            # it, and `specdraft train` prints it as one error with exit 2, no traceback.
            return {USER_ERROR: str(exc)}


# The summary key of a refusal a user can fix (a resume mismatch, a corrupt checkpoint).
USER_ERROR = "user_error"


def user_error_types() -> tuple[type[BaseException], ...]:
    """Errors a user causes and can fix (bad resume, corrupt or mismatched files, bad data)."""
    from specdraft.collate.samplers import SamplerStateMismatch

    from ..data.dataset import EmptyCorpusError
    from ..features.meta import FeatureMismatch
    from ..integrity import CorruptFile
    from .checkpoint import CheckpointMismatch, NothingToResume
    from .eval_run import NoEvalPrompts
    from .tracking.base import TrackingUnavailable

    return (
        NoEvalPrompts,
        CheckpointMismatch,
        CorruptFile,
        NothingToResume,
        SamplerStateMismatch,
        FeatureMismatch,
        EmptyCorpusError,
        TrackingUnavailable,
    )


def _run_rank(request: RunRequest, build: Callable[..., Any] | None) -> dict[str, Any]:
    """`rank_main` under the private umask: build the trainer, fit, write summary.json."""
    from ..runtime import init_distributed, shutdown_distributed

    config = request.config
    if build is None and config.deployment.mode == "disaggregated":
        raise ValueError(
            f"{request.config_path}: deployment.mode = 'disaggregated': the ranks read windows "
            f"from a producer; run them with specdraft.trainer.disagg.consumer.rank_main "
            f"(`specdraft train` does)"
        )
    ctx = init_distributed()
    configure_logging(ctx.rank)
    try:
        if build is None:
            from .assembly import build_trainer

            build = build_trainer
        trainer = build(
            config,
            ctx,
            resume=request.resume,
            progress=request.progress,
            allow_changed=request.allow_changed,
        )
        result = trainer.fit()
        summary = result.summary()
        if ctx.is_main:
            from ..runtime.atomic import atomic_write

            try:
                atomic_write(
                    Path(config.output_dir) / "summary.json", json.dumps(summary, indent=2)
                )
            except OSError as exc:  # the checkpoint holds the run; the summary is a report
                log.error("summary.json not written: %s", exc)
        trainer.writer.log_summary(summary)
        trainer.writer.close()
        return summary
    finally:
        shutdown_distributed()
