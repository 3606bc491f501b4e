"""Trainer.fit: the optimisation loop shared by every mode (local, offline features, disaggregated).

The loss is the exact token-weighted mean over an optimizer window: each micro-batch returns a
(numerator, denominator) pair; the numerators are back-propagated unscaled, the denominators are
summed over the window and the ranks, and the gradients are divided by that global sum once, before
clipping. The result equals one big batch, whatever the accumulation and world size.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from transformers import PretrainedConfig

from specdraft.collate import ANCHOR_WIDTH

from ..backends import (
    Backend,
    compiled_graph_count,
    explain_recompile_limit,
    forbid_recompiles,
)
from ..models.family import metric_ratios
from ..models.losses import LOSS_WEIGHT
from ..models.spec import DraftTrainSpec
from ..models.target import TargetHead
from ..runtime import DistContext, all_reduce_sum
from .checkpoint import LoadedCheckpoint, find_latest, save_checkpoint
from .checkpoint_policy import CheckpointPolicy
from .flops import FlopMeter
from .metrics import TRAIN_CPU_KEY, TRAIN_TIME_KEY, MetricsWriter, PerfClock, peak_memory_mb
from .sample_record import SampleRecord

log = logging.getLogger(__name__)


class BatchSource(Protocol):
    """Micro-batches for this rank, epoch by epoch, resumable at any optimizer window."""

    # What the data is (checkpoints record it, so a resume with other data is refused).
    fingerprint: str

    def micro_batches_per_epoch(self) -> int:
        """Micro-batches per rank per epoch (a multiple of grad_accum_steps)."""
        ...

    def windows(self, epoch: int, start_window: int) -> Iterator[list[Mapping[str, Any]]]:
        """Yield this rank's optimizer windows (lists of collated batches) from `start_window`."""
        ...

    def warmup_batches(self) -> list[Mapping[str, Any]]:
        """One dummy batch per static length (empty when lengths are dynamic)."""
        ...

    def acknowledge(self, epoch: int, window: int) -> None:
        """Tell the data side that a window was trained (disaggregated runs free its features)."""
        ...

    def data_state(self, epoch: int, window: int) -> dict[str, Any] | None:
        """The data position a checkpoint saves (None: the data side keeps its own)."""
        ...

    def restore_data_state(
        self, state: dict[str, Any] | None, *, allow_changed: Sequence[str], origin: Path
    ) -> tuple[int, int] | None:
        """Load a checkpoint's data position; the (epoch, window) to continue from, or None."""
        ...

    def stats(self) -> dict[str, float]:
        """Extra per-step metrics of the data side, logged by rank 0 (empty for local data)."""
        ...


class Evaluator(Protocol):
    """What Trainer.fit runs every eval_interval steps and at the end (tau on held-out data)."""

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        """Metrics of the draft `model`, the same on every rank."""
        ...


@dataclass(frozen=True)
class RunOutput:
    """Where a run writes and what every checkpoint of it records."""

    output_dir: Path
    writer: MetricsWriter
    # What a checkpoint must agree on with the config that resumes it (assembly.run_fingerprint).
    fingerprint: dict[str, Any]
    # The draft's HF config, saved next to the weights so SGLang can load a checkpoint.
    draft_config: PretrainedConfig
    # Saved into trainer_state.json as is (the export dtype, the run id).
    extra_state: dict[str, Any] = field(default_factory=dict)
    # The sample ids each optimizer step trained (local runs; `specdraft audit` reads it).
    samples: SampleRecord | None = None


@dataclass
class TrainSettings:
    """The narrow slice of the config the loop needs."""

    grad_accum_steps: int
    num_epochs: int
    max_steps: int | None
    max_grad_norm: float
    log_interval: int
    save_interval: int
    eval_interval: int
    micro_batch_size: int
    fail_on_recompile: bool = False
    compile_blocks: bool = False
    progress_bar: bool = True
    nonfinite_loss: str = "stop"  # 'stop' or 'skip' (training.nonfinite_loss)
    peak_tflops: float | None = None  # tracking.peak_tflops (perf/mfu's peak; None: detected)

    def total_steps(self, micro_batches_per_epoch: int) -> int:
        """Optimizer steps of a run whose source yields `micro_batches_per_epoch` per epoch."""
        total = (micro_batches_per_epoch // self.grad_accum_steps) * self.num_epochs
        if self.max_steps is not None:
            total = min(total, self.max_steps)
        return total


class NonFiniteLossError(RuntimeError):
    """A step's loss or gradient norm was NaN or infinite under training.nonfinite_loss = 'stop'."""

    def __init__(self, step: int, loss: float, grad_norm: float, last_good: Path | None) -> None:
        self.step = step
        self.last_good = last_good
        where = (
            f"the last good checkpoint is {last_good} (resume with --resume latest)"
            if last_good is not None
            else "no checkpoint was written before it"
        )
        super().__init__(
            f"step {step}: the loss is {loss} and the gradient norm {grad_norm}, not finite; "
            f"the step was not applied and nothing was saved from it; {where}. Fix: lower "
            f"training.learning_rate or check the data of this step, or set "
            f"training.nonfinite_loss = 'skip' to drop such steps and go on"
        )


@dataclass
class StepRecord:
    """What one optimizer step measured (kept for the result and for benchmarks)."""

    step: int
    loss: float
    samples: int
    train_compute_ms: float
    data_wait_ms: float
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class FitResult:
    """The outcome of Trainer.fit."""

    final_step: int
    history: list[StepRecord]
    evals: list[dict[str, Any]]
    compile_graphs: int
    recompiles_after_warmup: int
    last_checkpoint: Path | None
    # Why the run ended early: "signal" (preempted, saved) or "save_failed"; None when done.
    stopped: str | None = None
    stop_message: str = ""

    def summary(self) -> dict[str, Any]:
        """What a run writes to summary.json (`specdraft train` and the benchmark alike)."""
        stopped = {"stopped": self.stopped, "stop_message": self.stop_message}
        return {
            **(stopped if self.stopped else {}),
            "final_step": self.final_step,
            "first_loss": self.history[0].loss if self.history else None,
            "last_loss": self.history[-1].loss if self.history else None,
            "evals": self.evals,
            "compile_graphs": self.compile_graphs,
            "recompiles_after_warmup": self.recompiles_after_warmup,
            "checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
        }


def prediction_batch(batch: Mapping[str, Any], num_anchors: int) -> dict[str, torch.Tensor]:
    """A one-row evaluation batch shaped like `batch` (evaluation predicts one record at a time)."""
    from ..models.backbone import PREDICT_ANCHORS, PREDICT_KEEP

    ids = batch["input_ids"][:1]
    return {
        "input_ids": ids,
        "hidden_states": batch["hidden_states"][:1],
        PREDICT_ANCHORS: torch.zeros(1, num_anchors, dtype=torch.long, device=ids.device),
        PREDICT_KEEP: torch.zeros(1, num_anchors, dtype=torch.bool, device=ids.device),
    }


def _sum_metrics(acc: dict[str, torch.Tensor], metrics: Mapping[str, torch.Tensor]) -> None:
    for key, value in metrics.items():
        value = value.detach().float()
        acc[key] = acc[key] + value if key in acc else value.clone()


@dataclass
class _FitProgress:
    """What one `fit` call accumulates as it goes."""

    total: int  # optimizer steps of the run
    clock: PerfClock
    bar: Any  # a tqdm bar on rank 0, else None
    history: list[StepRecord] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)


class Trainer:
    """Runs the optimisation loop on a prepared (sharded, maybe compiled) draft.

    Built whole from its collaborators; `fit` reads top-down: `fit` -> `train_epoch` ->
    `train_step` -> `forward_backward` and `optimizer_step`.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        head: TargetHead,
        spec: DraftTrainSpec,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        source: BatchSource,
        settings: TrainSettings,
        ctx: DistContext,
        output: RunOutput,
        evaluator: Evaluator | None = None,
        checkpoints: CheckpointPolicy | None = None,
    ) -> None:
        self.backend = backend
        self.head = head
        self.spec = spec
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.source = source
        self.settings = settings
        self.ctx = ctx
        self.output = output
        self.evaluator = evaluator
        # Saves that fail, the retention of old checkpoints, the stop after a signal.
        self.checkpoints = checkpoints or CheckpointPolicy()
        self.step = 0
        self.epoch = 0
        self.window = 0  # next optimizer window inside the epoch
        self.graphs_after_warmup = 0
        self.skipped_steps = 0  # steps dropped for a non-finite loss (nonfinite_loss = 'skip')
        # Seconds inside optimizer steps (data wait included; eval and saves not): TRAIN_TIME_KEY.
        self.train_seconds = 0.0
        self.train_cpu_seconds = 0.0  # the same interval in process CPU time: TRAIN_CPU_KEY
        # Padded length of each micro-batch of the last window (logged as data/pad_lengths):
        # shows the pad policy at work, the same whichever source built the batches.
        self.pad_lengths: list[int] = []
        # Anchor blocks each micro-batch of the last window computed (data/anchor_widths).
        self.anchor_widths: list[int] = []
        # When the current step started (perf/step_ms and samples/s measure from here).
        self._step_start = time.perf_counter()
        # Model FLOPs of each window (perf/model_tflops_per_s, perf/mfu); see flops.py.
        self.flop_meter = FlopMeter.for_model(self.model, settings.peak_tflops, ctx.device)

    @property
    def model(self) -> nn.Module:
        """The sharded draft the backend wraps."""
        return self.backend.model

    @property
    def output_dir(self) -> Path:
        """The run's folder (checkpoints, metrics)."""
        return self.output.output_dir

    @property
    def writer(self) -> MetricsWriter:
        """The run's metrics writer (rank 0 writes)."""
        return self.output.writer

    @property
    def fingerprint(self) -> dict[str, Any]:
        """The run fingerprint every checkpoint records."""
        return self.output.fingerprint

    # ------------------------------------------------------------------ plan

    def total_steps(self) -> int:
        """Optimizer steps the run will take (counted from where it stands: an epoch resumed
        with changed sizes has its own number of windows)."""
        settings = self.settings
        total = settings.total_steps(self.source.micro_batches_per_epoch())
        windows_in_epoch = getattr(self.source, "windows_in_epoch", None)
        if windows_in_epoch is not None:
            per_epoch = self.source.micro_batches_per_epoch() // settings.grad_accum_steps
            later = per_epoch * max(0, settings.num_epochs - self.epoch - 1)
            total = self.step + max(0, windows_in_epoch(self.epoch) - self.window) + later
            if settings.max_steps is not None:
                total = min(total, settings.max_steps)
        return total

    # ------------------------------------------------------------------- fit

    def fit(self) -> FitResult:
        """Train until the epochs or max_steps are done; checkpoint, evaluate and log on the way."""
        total = self.total_steps()
        self.model.train()
        self.warmup()
        run = _FitProgress(total, PerfClock(self.ctx.device), self._progress_bar(total))
        if self.evaluator is not None and self.step == 0:
            run.evals.append(self._run_eval())  # tau before training, the baseline of the run
        self._step_start = time.perf_counter()
        while self.step < total and self.epoch < self.settings.num_epochs:
            self.train_epoch(run)
            if self.step >= total or self.checkpoints.stopping:
                break
            self.epoch += 1
            self.window = 0
        if run.bar is not None:
            run.bar.close()
        stopping = self.checkpoints.stopping
        if (
            self.evaluator is not None
            and not stopping
            and (not run.evals or run.evals[-1].get("step") != self.step)
        ):
            run.evals.append(self._run_eval())
        if self.checkpoints.stopped != "save_failed" and self.checkpoints.saved_step != self.step:
            self.checkpoints.save(self)
        last_ckpt = self.checkpoints.last_saved
        graphs = compiled_graph_count()
        return FitResult(
            final_step=self.step,
            history=run.history,
            evals=run.evals,
            compile_graphs=graphs,
            recompiles_after_warmup=graphs - self.graphs_after_warmup,
            last_checkpoint=last_ckpt,
            stopped=self.checkpoints.stopped,
            stop_message=self.checkpoints.stop_message,
        )

    def train_epoch(self, run: _FitProgress) -> None:
        """Train the windows of the current epoch from `self.window` on, or until `run.total`."""
        spec = self.spec.for_epoch(self.epoch)
        windows = self.source.windows(self.epoch, self.window)
        while self.step < run.total:
            start, start_cpu = time.perf_counter(), time.process_time()
            with run.clock.data_wait():
                window = next(windows, None)
            if window is None:
                self.train_seconds += time.perf_counter() - start
                self.train_cpu_seconds += time.process_time() - start_cpu
                return
            record = self.train_step(window, spec, run.clock)
            # Measured here, not from perf/step_ms: that interval also holds the previous
            # step's logging, evaluation and checkpoint save.
            self.train_seconds += time.perf_counter() - start
            self.train_cpu_seconds += time.process_time() - start_cpu
            record.metrics[TRAIN_TIME_KEY] = self.train_seconds
            record.metrics[TRAIN_CPU_KEY] = self.train_cpu_seconds
            run.history.append(record)
            if run.bar is not None:
                run.bar.update(1)
                run.bar.set_postfix(
                    loss=f"{record.loss:.4f}", sps=f"{record.metrics['perf/samples_per_s']:.1f}"
                )
            self._after_step(record, run)
            if self.checkpoints.stopping:
                return

    def train_step(
        self, window: list[Mapping[str, Any]], spec: DraftTrainSpec, clock: PerfClock
    ) -> StepRecord:
        """One optimizer step on one window: forward/backward, all-reduce, step, record."""
        settings = self.settings
        with forbid_recompiles(settings.fail_on_recompile and settings.compile_blocks):
            packed, sums, samples = self.forward_backward(window, spec, clock)
            with clock.train_compute():
                names = sorted(sums)
                # The stop flag rides on the step's one all-reduce: every rank sees a signal
                # any rank got at the same step boundary, for no extra collective.
                flag = self.checkpoints.stop_flag(packed.device)
                vector = torch.cat([packed] + [sums[k].reshape(-1) for k in names] + [flag])
                all_reduce_sum(vector)
                self.checkpoints.agree_on_stop(float(vector[-1]))
                vector = vector[:-1]
                grad_norm = self.optimizer_step(vector[1], vector[0])
        self.source.acknowledge(self.epoch, self.window)
        self._record_samples()
        self.step += 1
        self.window += 1
        perf = clock.reset()
        elapsed = time.perf_counter() - self._step_start
        self._step_start = time.perf_counter()
        return self._record(vector, names, sums, samples, perf, grad_norm, elapsed)

    def _record_samples(self) -> None:
        """Append this step's sample ids to the run's record (rank 0, local data)."""
        window_samples = getattr(self.source, "window_samples", None)
        if self.output.samples is None or window_samples is None or not self.ctx.is_main:
            return
        ids, of = window_samples(self.epoch, self.window)
        self.output.samples.append(self.step + 1, self.epoch, of, ids)

    def _after_step(self, record: StepRecord, run: _FitProgress) -> None:
        """Log, evaluate and checkpoint at their intervals."""
        settings = self.settings
        if self.step % settings.log_interval == 0 or self.step == run.total:
            self.writer.write(self.step, {"epoch": self.epoch, **record.metrics})
        if self.checkpoints.stopping:
            self.checkpoints.save(self)  # preempted: this step's checkpoint, then fit returns
            return
        if settings.eval_interval and self.step % settings.eval_interval == 0:
            run.evals.append(self._run_eval())
        if self.step % settings.save_interval == 0 and self.step < run.total:
            self.checkpoints.save(self)

    # ------------------------------------------------------------------ step

    def forward_backward(
        self, window: list[Mapping[str, Any]], spec: DraftTrainSpec, clock: PerfClock
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        """Forward/backward every micro-batch of a window; return summed (num, den), metrics."""
        device = self.ctx.device
        numerator = torch.zeros((), device=device)
        denominator = torch.zeros((), device=device)
        sums: dict[str, torch.Tensor] = {}
        samples = 0
        last = len(window) - 1
        self.pad_lengths = [int(batch["input_ids"].shape[1]) for batch in window]
        self.anchor_widths = [int(batch.get(ANCHOR_WIDTH, spec.num_anchors)) for batch in window]
        self.flop_meter.count(window, spec.num_anchors)
        for index, batch in enumerate(window):
            with clock.train_compute(), self.backend.gradient_sync(index == last):
                out = self.model(batch, head=self.head, spec=spec)
                out.numerator.backward()
            numerator += out.numerator.detach().float()
            denominator += out.denominator.detach().float()
            _sum_metrics(sums, out.metrics)
            # Real samples: documents under packing, rows otherwise (padding rows excluded).
            samples += int(batch.get("num_real", batch["input_ids"].shape[0]))
        return torch.stack([numerator, denominator]), sums, samples

    def optimizer_step(
        self, global_den: torch.Tensor, global_num: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Scale gradients to the exact token-weighted mean, clip, and step (unless the loss or
        the gradient norm is not finite: then stop or skip, per settings.nonfinite_loss)."""
        # FSDP averaged the gradients over ranks; the exact mean divides the rank sum by the
        # global weight sum instead: multiply by world / global_den.
        den = float(global_den)
        factor = self.ctx.world_size / den if den > 0 else 0.0
        for param in self.model.parameters():
            if param.grad is not None:
                param.grad.mul_(factor)
        max_norm = self.settings.max_grad_norm if self.settings.max_grad_norm > 0 else math.inf
        norm = self.backend.clip_grad_norm(max_norm)
        # The loss and norm are all-reduced, so every rank takes the same branch here.
        num = float(global_num) if global_num is not None else 0.0
        if not (math.isfinite(num) and bool(torch.isfinite(norm))):
            self._skip_nonfinite_step(num / den if den > 0 else num, float(norm))
            self.scheduler.step()  # the schedule follows the step count, applied or not
            return norm.detach().float()
        if den > 0:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm.detach().float()

    def _skip_nonfinite_step(self, loss: float, grad_norm: float) -> None:
        """Drop this step's gradients; stop the run unless training.nonfinite_loss = 'skip'."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.settings.nonfinite_loss != "skip":
            raise NonFiniteLossError(self.step + 1, loss, grad_norm, find_latest(self.output_dir))
        self.skipped_steps += 1
        if self.ctx.is_main:
            log.warning(
                "step %d: loss %s, gradient norm %s: not finite, step skipped (%d so far)",
                self.step + 1,
                loss,
                grad_norm,
                self.skipped_steps,
            )

    # ---------------------------------------------------------------- warmup

    def warmup(self) -> None:
        """Pre-warm every static (length, anchor width) cell: forward/backward, no step.

        So no compile lands inside training: each cell's graphs (grad and no-grad block input)
        and each length's no-grad evaluation forward (at num_anchors slots) are built here, on
        dummy data with no loss weight.
        """
        batches = self.source.warmup_batches()
        if not self.settings.compile_blocks or not batches:
            self.graphs_after_warmup = compiled_graph_count()
            return
        start = time.perf_counter()
        spec = self.spec.for_epoch(self.epoch)
        with explain_recompile_limit():
            for batch in batches:
                out = self.model(batch, head=self.head, spec=spec)
                out.numerator.backward()
                # Drop the gradients before the next graph is traced: under FSDP1 the blocks'
                # parameters are views of the flat parameter, whose gradient is sharded after
                # backward, and Dynamo cannot fake a view whose base has a gradient of another
                # size (training never traces with a sharded gradient: steps end with zero_grad).
                self.optimizer.zero_grad(set_to_none=True)
                # Evaluation predicts at num_anchors slots whatever the training width: one
                # no-grad graph per length, built with that length's widest cell.
                width = batch.get(ANCHOR_WIDTH, spec.num_anchors)
                if self.evaluator is not None and width == spec.num_anchors:
                    with torch.no_grad():
                        predict = prediction_batch(batch, spec.num_anchors)
                        self.model(predict, head=self.head, spec=spec)
        self.graphs_after_warmup = compiled_graph_count()
        if self.ctx.is_main:
            log.info(
                "pre-warmed %d static shape cell(s) in %.1f s: %d graphs compiled",
                len(batches),
                time.perf_counter() - start,
                self.graphs_after_warmup,
            )

    # ---------------------------------------------------------------- resume

    def restore(self, loaded: LoadedCheckpoint) -> None:
        """Continue from a loaded checkpoint's step, epoch and data position."""
        state = loaded.state
        self.step = int(state["step"])
        self.epoch = int(state["epoch"])
        self.window = int(state["window"])
        # A checkpoint of an older version has none: its resumed curve restarts the clock.
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.train_cpu_seconds = float(state.get("train_cpu_seconds", 0.0))
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ctx.is_main:
            log.info("resumed from %s at step %d (epoch %d)", loaded.path, self.step, self.epoch)

    def trainer_state(self) -> dict[str, Any]:
        """Everything besides weights and optimizer that an exact resume needs."""
        # The sampler's own state (local data), so a resume can check the data order it restores.
        data_state = self.source.data_state(self.epoch, self.window)
        sampler = {"sampler": data_state} if data_state is not None else {}
        return {
            **self.output.extra_state,
            **sampler,
            "epoch": self.epoch,
            "window": self.window,
            "train_seconds": self.train_seconds,
            "train_cpu_seconds": self.train_cpu_seconds,
            "scheduler": self.scheduler.state_dict(),
            "fingerprint": self.fingerprint,
        }

    def save(self) -> Path:
        """Checkpoint the current step."""
        return save_checkpoint(
            self.output_dir,
            self.step,
            model=self.model,
            optimizer=self.optimizer,
            state=self.trainer_state(),
            ctx=self.ctx,
            draft_config=self.output.draft_config,
        )

    # --------------------------------------------------------------- logging

    def _run_eval(self) -> dict[str, Any]:
        self.model.eval()
        # Evaluation runs the graphs the warm-up built too: the same recompile rules apply.
        fail = self.settings.fail_on_recompile and self.settings.compile_blocks
        with torch.no_grad(), forbid_recompiles(fail):
            result = dict(self.evaluator.evaluate(self.model)) if self.evaluator else {}
        self.model.train()
        result["step"] = self.step
        metrics = {f"eval/{k}": v for k, v in result.items() if k != "step"}
        clocks = {TRAIN_TIME_KEY: self.train_seconds, TRAIN_CPU_KEY: self.train_cpu_seconds}
        self.writer.write(self.step, {**metrics, **clocks})
        return result

    def _record(
        self,
        vector: torch.Tensor,
        names: list[str],
        sums: dict[str, torch.Tensor],
        samples: int,
        perf: dict[str, float],
        grad_norm: torch.Tensor,
        elapsed_s: float,
    ) -> StepRecord:
        values = vector.tolist()
        num, den = values[0], values[1]
        loss = num / den if den > 0 else 0.0
        metrics: dict[str, Any] = {
            "loss": loss,
            "lr": self.scheduler.get_last_lr()[0],
            "grad_norm": float(grad_norm),
            "loss_weight": den,
        }
        if self.settings.nonfinite_loss == "skip":
            metrics["train/skipped_steps"] = self.skipped_steps
        offset = 2
        reduced: dict[str, list[float]] = {}
        for key in names:
            width = sums[key].numel()
            reduced[key] = values[offset : offset + width]
            offset += width
        metrics.update(_derived_metrics(reduced, den))
        global_samples = int(all_reduce_sum(torch.tensor(float(samples))).item())
        metrics["perf/train_compute_ms"] = perf["train_compute_ms"]
        metrics["perf/data_wait_ms"] = perf["data_wait_ms"]
        metrics["perf/step_ms"] = elapsed_s * 1e3
        metrics["perf/samples_per_s"] = global_samples / elapsed_s if elapsed_s > 0 else 0.0
        metrics.update(self.flop_meter.metrics(elapsed_s))
        if "blocks" in reduced and global_samples > 0:
            # Kept draft blocks per conversation: packing shares a row's anchors between its
            # documents, so this is what a conversation gets (samples count documents).
            metrics["data/anchors_per_conversation"] = sum(reduced["blocks"]) / global_samples
        metrics["perf/peak_memory_mb"] = peak_memory_mb(self.ctx.device)
        metrics["data/pad_lengths"] = list(self.pad_lengths)
        metrics["data/anchor_widths"] = list(self.anchor_widths)
        if self.settings.compile_blocks:
            graphs = compiled_graph_count()
            metrics["compile/graphs"] = graphs
            metrics["compile/recompiles_after_warmup"] = graphs - self.graphs_after_warmup
        if self.ctx.is_main:
            # Only rank 0 logs, and the data side's counters may cost a request to fetch.
            metrics.update(self.source.stats())
        return StepRecord(
            step=self.step,
            loss=loss,
            samples=global_samples,
            train_compute_ms=perf["train_compute_ms"],
            data_wait_ms=perf["data_wait_ms"],
            metrics=metrics,
        )

    def _progress_bar(self, total: int) -> Any:
        if not (self.settings.progress_bar and self.ctx.is_main):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=self.step, desc="train", unit="step", dynamic_ncols=True)


# Logged metric -> (summed numerator, summed denominator): the rates every family reports and
# each family's own (models/losses.py MetricRatios, declared with the family).
METRIC_RATIOS: dict[str, tuple[str, str]] = metric_ratios()


def _derived_metrics(reduced: dict[str, list[float]], loss_weight: float) -> dict[str, Any]:
    """Turn all-reduced sums into the rates of METRIC_RATIOS (vectors become lists)."""
    out: dict[str, Any] = {}
    for name, (num_key, den_key) in METRIC_RATIOS.items():
        if num_key not in reduced:
            continue
        numerators = reduced[num_key]
        if den_key == LOSS_WEIGHT:
            denominators = [loss_weight] * len(numerators)
        elif den_key in reduced:
            denominators = reduced[den_key]
        else:
            continue
        rates = [n / d if d > 0 else 0.0 for n, d in zip(numerators, denominators, strict=True)]
        out[name] = rates[0] if len(rates) == 1 else rates
    return out


def median_step_ms(history: list[StepRecord], last: int) -> float:
    """Median train compute of the last `last` steps (benchmarks' steady step time)."""
    window = history[-last:] if last else history
    return statistics.median(r.train_compute_ms for r in window) if window else 0.0
