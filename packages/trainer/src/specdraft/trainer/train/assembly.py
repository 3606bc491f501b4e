"""Run assembly: turn a validated Config into a ready Trainer on this rank.

The order matters and is explicit: seed; target head; the one shape policy (pad lengths x anchor
widths, built once and handed to the sampler, the batch builder, the backend and evaluation);
data; sampler; model.init_from's weights (read and checked); the draft vocabulary (from the
data, or the folder's); draft (fp32 master weights, then the folder's); backend
options; prepare (compile blocks in place, then shard); optimizer and schedule; evaluation;
resume.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specdraft.collate import sampler_from_config
from specdraft.config import Config, ShapePolicy
from specdraft.config.resume_contract import run_fingerprint as contract_fingerprint
from specdraft.config.sampler_mode import sampler_mode

from ..backends import BackendOptions, backend_options_from_config, prepare
from ..runtime import DistContext, barrier
from ..runtime.private import run_folder
from ..vocab import draft_vocab_for_run, write_vocab_record
from .checkpoint_policy import CheckpointPolicy
from .metrics import metrics_writer
from .resume import resume_trainer
from .sample_record import RECORD_NAME, SampleRecord
from .schedule import build_scheduler
from .sources import BatchBuilder, BatchShape, LocalBatchSource
from .trainer import BatchSource, RunOutput, Trainer, TrainSettings

if TYPE_CHECKING:
    from datasets import Dataset

    from ..features.shards import FeatureShardDataset
    from ..models.target import TargetFeatureExtractor, TargetHead
    from ..models.target_labels import TargetLabeler

log = logging.getLogger(__name__)


@dataclass
class RunData:
    """The training data of a run as the trainer sees it."""

    dataset: Dataset | FeatureShardDataset  # tokenised conversations, or offline features
    lengths: list[int]
    fingerprint: str
    # The in-process target (it makes each batch's features), or None (offline features).
    features: TargetFeatureExtractor | None
    # Valid anchors per sample, when the sampler mode is anchor_grouped.
    anchor_counts: list[int] | None = None


def run_fingerprint(
    config: Config, data_fingerprint: str, init_weights: str | None = None
) -> dict[str, Any]:
    """What a checkpoint must agree on with the config that resumes it (the resume contract);
    `init_weights`: the sha256 of model.init_from's weights."""
    return contract_fingerprint(config, data=data_fingerprint, init_weights=init_weights)


def load_run_data(config: Config, ctx: DistContext, *, progress: bool) -> RunData:
    """Training data: tokenised conversations (+ the in-process target) or offline features."""
    grouped = sampler_mode(config) == "anchor_grouped"  # only that plan reads anchor counts
    if config.data.format == "features":
        from ..features.meta import expected_feature_meta
        from ..features.shards import FeatureShardDataset
        from ..models.target_labels import LabelSettings

        dataset = FeatureShardDataset(
            config.data.train_paths,
            expected=expected_feature_meta(config),
            labels=LabelSettings.from_config(config),
        )
        counts = dataset.anchor_counts() if grouped else None
        return RunData(dataset, list(dataset.lengths), str(dataset.meta.get("data")), None, counts)

    from ..data import build_dataset, sample_anchor_counts, sample_lengths
    from ..models import TargetFeatureExtractor, target_dtype

    # Rank 0 tokenises (and fills the cache) first; the others then read the cache.
    if not ctx.is_main:
        barrier()
    dataset, report = build_dataset(config, split="train", progress=progress and ctx.is_main)
    if ctx.is_main:
        barrier()
        log.info("training data: %s", report.describe())
    lengths = sample_lengths(dataset)
    extractor = TargetFeatureExtractor(
        config.model.target,
        list(config.model.target_layer_ids),
        dtype=target_dtype(ctx.device),
        device=ctx.device,
    )
    counts = sample_anchor_counts(dataset) if grouped else None
    return RunData(dataset, lengths, report.fingerprint, extractor, counts)


def build_trainer(
    config: Config,
    ctx: DistContext,
    *,
    resume: str | None = None,
    progress: bool = True,
    source: BatchSource | None = None,
    shapes: ShapePolicy | None = None,
    allow_changed: Sequence[str] = (),
) -> Trainer:
    """Assemble everything for `Trainer.fit` on this rank.

    `shapes` is the run's shape policy when the caller already built it (with its own `source`);
    otherwise it is built here, once.
    """
    from ..models import (
        DraftTrainSpec,
        build_draft,
        load_target_config,
        load_target_head,
        target_dtype,
    )
    from ..models.init_from import load_init_weights, read_init_weights

    training = config.training
    torch.manual_seed(training.seed)
    output_dir = Path(config.output_dir)
    # Created 0700 when new (also for library callers without a private umask); an existing
    # output_dir keeps the mode the user gave it.
    run_folder(output_dir)

    target_config = load_target_config(config.model.target)
    head = load_target_head(config.model.target, dtype=target_dtype(ctx.device)).to(ctx.device)
    with_eval = bool(config.data.eval_paths)
    if shapes is None:
        shapes = ShapePolicy.from_config(config)
    options = backend_options_from_config(config, ctx.device, shapes=shapes, with_eval=with_eval)

    data = None
    if source is None:
        data = load_run_data(config, ctx, progress=progress)
        sampler = sampler_from_config(
            config,
            data.lengths,
            num_replicas=ctx.world_size,
            rank=ctx.rank,
            shapes=shapes,
            anchor_counts=data.anchor_counts,
        )
        shape = batch_shape(config, target_config, options)
        source = LocalBatchSource(
            data.dataset,
            sampler,
            builder=BatchBuilder(shapes=shapes, shape=shape, device=ctx.device),
            grad_accum_steps=training.grad_accum_steps,
            rank=ctx.rank,
            features=data.features,
            fingerprint=data.fingerprint,
            labels=target_labeler(config, head),
        )

    # model.init_from: read and checked before the draft exists (its vocabulary comes first).
    init = read_init_weights(config.model) if config.model.init_from is not None else None
    # The draft vocabulary (model.draft_vocab_size) from the training data's supervised labels,
    # or the one model.init_from's head rows belong to.
    vocab = draft_vocab_for_run(
        config,
        None if data is None else data.dataset,
        head.vocab_size,
        progress=progress,
        given=None if init is None else init.draft_vocab_ids,
    )
    # fp32 master weights; the backend computes in options.param_dtype.
    torch.manual_seed(training.seed)
    draft = build_draft(
        config.model,
        target_config,
        dtype=torch.float32,
        device=ctx.device,
        draft_vocab=None if vocab is None else vocab.ids,
    )
    draft.init_draft_head(head)
    if init is not None:
        load_init_weights(draft, init)
    draft_config = draft.config
    backend = prepare(draft, options)
    optimizer = torch.optim.AdamW(
        backend.model.parameters(), lr=training.learning_rate, weight_decay=training.weight_decay
    )
    settings = train_settings(config, progress=progress)
    scheduler = build_scheduler(
        optimizer,
        total_steps=max(1, settings.total_steps(source.micro_batches_per_epoch())),
        warmup_ratio=training.warmup_ratio,
        kind=training.lr_scheduler,
    )
    spec = DraftTrainSpec.from_config(config, ctx.device)
    evaluator = None
    if with_eval:
        from .eval_run import build_evaluator

        evaluator = build_evaluator(config, ctx, head=head, spec=spec, shapes=shapes, data=data)
    output = RunOutput(
        output_dir=output_dir,
        writer=metrics_writer(config, output_dir, ctx),
        fingerprint=run_fingerprint(
            config, source.fingerprint, None if init is None else init.sha256
        ),
        draft_config=draft_config,
        # Export casts the fp32 master weights to the dtype the config asks for.
        extra_state={"model_dtype": config.model.dtype, "run_id": config.run_id},
        # Local data: which samples each step trained (a disaggregated run has its ledger).
        samples=(
            SampleRecord(output_dir / RECORD_NAME, enabled=ctx.is_main)
            if data is not None
            else None
        ),
    )
    trainer = Trainer(
        backend=backend,
        head=head,
        spec=spec,
        optimizer=optimizer,
        scheduler=scheduler,
        source=source,
        settings=settings,
        ctx=ctx,
        output=output,
        evaluator=evaluator,
        checkpoints=CheckpointPolicy(
            keep_last=training.keep_last_checkpoints, keep_every=training.keep_every_n_steps
        ),
    )
    # Checks what it resumes (checksums, settings, data order), applies a changed learning rate.
    resume_trainer(
        trainer,
        resume or training.resume_from,
        ctx=ctx,
        learning_rate=training.learning_rate,
        allow_changed=allow_changed,
        required=resume is not None,
    )
    if vocab is not None and ctx.is_main:
        # Recorded once the resume checks passed: a refused resume leaves the run's record.
        write_vocab_record(output_dir, vocab, config)
    return trainer


def train_settings(config: Config, *, progress: bool) -> TrainSettings:
    """The narrow slice of the config the training loop reads."""
    training = config.training
    return TrainSettings(
        grad_accum_steps=training.grad_accum_steps,
        num_epochs=training.num_epochs,
        max_steps=training.max_steps,
        max_grad_norm=training.max_grad_norm,
        log_interval=training.log_interval,
        save_interval=training.save_interval,
        eval_interval=training.eval_interval,
        micro_batch_size=training.micro_batch_size,
        fail_on_recompile=training.fail_on_recompile,
        compile_blocks=training.compile_blocks,
        progress_bar=config.tracking.progress_bar and progress,
        nonfinite_loss=training.nonfinite_loss,
        peak_tflops=config.tracking.peak_tflops,
    )


def target_labeler(config: Config, head: TargetHead) -> TargetLabeler | None:
    """What puts the target's predictions into the batches as labels; None when the run
    trains on the tokens alone. The head computes them with the in-process target."""
    from ..models.target_labels import LabelSettings, TargetLabeler

    settings = LabelSettings.from_config(config)
    return TargetLabeler(settings, head.lm_head.weight) if settings.active else None


def batch_shape(config: Config, target_config: Any, options: BackendOptions) -> BatchShape:
    """Widths and dtype of this run's batches."""
    from ..models import family_of
    from ..models.config import target_text_config
    from ..models.target_labels import LabelSettings

    hidden = int(target_text_config(target_config).hidden_size)
    family = family_of(config)
    labels = LabelSettings.from_config(config)
    return BatchShape(
        micro_batch_size=config.training.micro_batch_size,
        feature_width=family.feature_width(hidden, len(config.model.target_layer_ids)),
        hidden_size=hidden,
        with_last_hidden=family.needs_last_hidden,
        feature_dtype=options.param_dtype,
        static=config.training.static_shapes,
        target_labels=labels.argmax,
        soft_topk=labels.soft_topk,
    )
