"""Resume a run from a checkpoint and check what it resumes.

Beyond restoring weights, optimizer and RNG (`checkpoint.load_checkpoint`, which also verifies
checksums and refuses changed settings), a resume must continue the *same* run: the sampler's
saved position is loaded through the sampler, which refuses a data order that changed unless the
user allowed it; a learning rate changed in the config is applied from the resumed step on (the
scheduler's saved `base_lrs` would otherwise keep the old one, silently); and the metrics of the
steps after the checkpoint, which the crashed run logged and the resumed run logs again, are cut
from `metrics.jsonl`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..integrity import CorruptFile
from ..runtime import DistContext
from .checkpoint import (
    CheckpointMismatch,
    complete_checkpoints,
    load_checkpoint,
    resolve_resume,
    verify_checkpoint,
)
from .trainer import Trainer

log = logging.getLogger(__name__)


def resume_trainer(
    trainer: Trainer,
    resume_from: str | None,
    *,
    ctx: DistContext,
    learning_rate: float,
    allow_changed: Sequence[str] = (),
    required: bool = False,
) -> Path | None:
    """Restore `trainer` from `resume_from` ('latest', a folder or None); return the folder.

    `required` makes 'latest' with no checkpoint an error (the user asked to resume); otherwise
    the run starts fresh and says so.
    """
    allowed = tuple(allow_changed)
    checkpoint = resolve_resume(resume_from, trainer.output_dir, required=required)
    verified = False
    if checkpoint is not None and resume_from == "latest":
        checkpoint = newest_that_verifies(trainer.output_dir, ctx)
        verified = True
    if checkpoint is None:
        if resume_from == "latest" and ctx.is_main:
            log.info(
                "training.resume_from = 'latest': no checkpoint in %s yet, starting a new run",
                trainer.output_dir / "checkpoints",
            )
        return None
    loaded = load_checkpoint(
        checkpoint,
        model=trainer.model,
        optimizer=trainer.optimizer,
        ctx=ctx,
        fingerprint=trainer.fingerprint,
        allow_changed=allowed,
        verified=verified,
    )
    check_draft_vocab(checkpoint, trainer.output.draft_config)
    trainer.restore(loaded)
    # Never pruned by this run, and not saved again if the run has no step left.
    trainer.checkpoints.protected = checkpoint
    trainer.checkpoints.saved_step = trainer.step
    trainer.checkpoints.last_saved = checkpoint
    for change in loaded.changes:
        if ctx.is_main:
            log.warning("resuming with a changed data order (--allow-changed): %s", change)
    # Local data checks and restores the sampler's position; a disaggregated source keeps its
    # own (the producer's ledger) and leaves the checkpoint's (epoch, window) as they are.
    position = trainer.source.restore_data_state(
        loaded.state.get("sampler"), allow_changed=allowed, origin=checkpoint
    )
    if position is not None:
        trainer.epoch, trainer.window = position
    apply_learning_rate(trainer, learning_rate, ctx=ctx)
    if ctx.is_main and trainer.output.samples is not None:
        trainer.output.samples.truncate_after(trainer.step)
    if ctx.is_main:
        dropped = trainer.writer.truncate_after(trainer.step)
        if dropped:
            log.info(
                "metrics: dropped %d line(s) logged after step %d by the interrupted run "
                "(the resumed run logs those steps again)",
                dropped,
                trainer.step,
            )
    return checkpoint


def check_draft_vocab(checkpoint: Path, draft_config: Any) -> None:
    """Refuse a checkpoint whose draft vocabulary differs from the one this run chose.

    The size is in the run fingerprint; the tokens follow from the training data, so they differ
    only when the data changed (`--allow-changed data`): the checkpoint's head rows would then
    be other tokens' rows.
    """
    config_file = checkpoint / "config.json"
    if draft_config is None or not config_file.is_file():
        return
    saved = json.loads(config_file.read_text()).get("draft_vocab_ids")
    current = getattr(draft_config, "draft_vocab_ids", None)
    if saved == current:
        return
    differ = len(set(saved or ()) ^ set(current or ()))
    raise CheckpointMismatch(
        f"cannot resume from {checkpoint}: its draft vocabulary differs from the one chosen "
        f"from this run's training data ({differ} tokens differ; the data changed since the "
        "checkpoint), so its head rows belong to other tokens\nresume with the original "
        "training data, or start a new run (new output_dir)"
    )


def newest_that_verifies(output_dir: Path, ctx: DistContext) -> Path:
    """`--resume latest`: the newest complete checkpoint whose files match their checksums.

    A corrupt newer one (a bit flip, a copy cut short) is skipped with a warning that names it
    and why; when none verifies, CorruptFile lists every one.
    """
    skipped: list[str] = []
    for path in complete_checkpoints(output_dir)[::-1]:
        try:
            verify_checkpoint(path, ctx)
        except CorruptFile as exc:
            problems = [line.strip() for line in str(exc).splitlines()[1:-1]]
            reason = "; ".join(problems) or str(exc)
            skipped.append(f"{path.name}: {reason}")
            if ctx.is_main:
                log.warning("--resume latest: skipping %s, it does not verify (%s)", path, reason)
            continue
        if skipped and ctx.is_main:
            log.warning(
                "--resume latest: resuming from %s, the newest checkpoint that verifies "
                "(%d newer skipped)",
                path,
                len(skipped),
            )
        return path
    raise CorruptFile(
        f"--resume latest: no checkpoint in {output_dir / 'checkpoints'} verifies: "
        + "; ".join(skipped)
        + "; copy a good checkpoint back, or start a new run (drop --resume, use --overwrite)"
    )


def apply_learning_rate(trainer: Trainer, learning_rate: float, *, ctx: DistContext) -> None:
    """Make the config's peak learning rate the schedule's, from the resumed step on."""
    scheduler = trainer.scheduler
    saved = list(scheduler.base_lrs)
    if all(base == learning_rate for base in saved):
        return
    scheduler.base_lrs = [learning_rate] * len(saved)
    # The schedule continues at the resumed step with the new peak: the same warmup and decay
    # factors, a different scale.
    step = scheduler.last_epoch
    lrs = [learning_rate * factor(step) for factor in scheduler.lr_lambdas]
    for group, lr in zip(trainer.optimizer.param_groups, lrs, strict=True):
        group["initial_lr"] = learning_rate
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() reports (and metrics log) until the next step
    if ctx.is_main:
        log.warning(
            "training.learning_rate changed from %s (checkpoint) to %s: applied from step %d on "
            "(the schedule keeps its shape; the learning rate is now %s)",
            saved[0],
            learning_rate,
            trainer.step,
            lrs[0],
        )
