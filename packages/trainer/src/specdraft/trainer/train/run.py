"""Entry points of a training run: the per-rank main (a `RunRequest` in, rank 0's summary out),
the dry-run plan, the checks a run makes before any rank starts."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specdraft.config import Config, ShapePolicy
from specdraft.config.sampler_mode import SamplerMode, sampler_mode

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


@dataclass(frozen=True)
class DryRunPlan:
    """What `specdraft train --dry-run` prints."""

    lines: list[str]


def dry_run_plan(config: Config, *, world_size: int) -> DryRunPlan:
    """Validate set-up without the cluster: build the draft on the meta device and plan."""
    from ..models import build_draft, family_of, load_target_config
    from .flops import plan_line as flops_plan_line

    target_config = load_target_config(config.model.target)
    draft = build_draft(config.model, target_config, dtype=torch.float32, device="meta")
    params = sum(p.numel() for p in draft.parameters())
    training = config.training
    # The dry run's one shape policy: the lines below and the compile plan read it.
    shapes = ShapePolicy.from_config(config)
    plan = shapes.compile_plan(
        compile_blocks=training.compile_blocks,
        with_eval=bool(config.data.eval_paths),
        num_blocks=config.model.num_draft_layers,
    )
    # fp32 master weights + fp32 grads + two AdamW moments, sharded over the ranks.
    state_bytes = params * 16 / world_size
    device = "cuda (NCCL)" if torch.cuda.is_available() else "cpu (gloo)"
    text = target_config.get_text_config()
    vocab = int(text.vocab_size)
    hidden = int(text.hidden_size)
    bs = config.model.block_size
    tokens = training.num_anchors * bs * training.micro_batch_size
    # The largest transient: one chunk of full-vocabulary fp32 logits (and its gradient).
    chunk_blocks = min(training.logits_chunk_blocks, training.num_anchors)
    logits_bytes = 2 * chunk_blocks * bs * training.micro_batch_size * vocab * 4
    dtype_bytes = 2 if device.startswith("cuda") else 4  # bf16 on GPU, fp32 on CPU
    frozen_bytes = 2 * vocab * hidden * dtype_bytes
    # Each rank's micro-batch features: [micro, max_length, L*H (+ H for DSpark)].
    width = family_of(config).input_width(hidden, len(config.model.target_layer_ids))
    features_bytes = training.micro_batch_size * config.data.max_length * width * dtype_bytes
    lines = [
        f"config:      {config.run_id} ({config.model.algorithm}, block {bs}, "
        f"{config.model.num_draft_layers} draft layer(s), layers {config.model.target_layer_ids})",
        f"ranks:       {world_size} ({config.deployment.nnodes} node(s) x "
        f"{config.deployment.nproc_per_node}) on {device}",
        f"backend:     {training.backend}, mixed precision {training.mixed_precision}, "
        f"reshard_after_forward={training.reshard_after_forward}",
        f"pad policy:  {shapes.describe_lengths()}",
        f"anchors:     {shapes.describe_anchors()}",
        f"shape grid:  {_grid_line(shapes)}",
        f"compile:     {plan.describe()}",
        f"packing:     {_packing_line(config, shapes)}",
        f"data order:  {_order_line(config)}",
        f"batch:       micro {training.micro_batch_size} x accum {training.grad_accum_steps} x "
        f"{world_size} ranks = {training.micro_batch_size * training.grad_accum_steps * world_size}"
        f" {'rows' if shapes.packing else 'samples'} per optimizer step; {tokens} draft tokens "
        f"per micro-batch",
        f"draft:       {params / 1e6:.1f}M trainable parameters",
        f"memory/rank: ~{memory(state_bytes)} weights+grads+AdamW (sharded), "
        f"~{memory(frozen_bytes)} frozen embedding+LM head, ~{memory(logits_bytes)} logits "
        f"chunk, ~{memory(features_bytes)} target features per micro-batch",
        f"target:      {in_process_target_line(config, target_config, dtype_bytes)}",
        f"flops:       {flops_plan_line(draft.config, config)}",
        f"output:      {config.output_dir}",
    ]
    return DryRunPlan(lines)


def _order_line(config: Config) -> str:
    """How the sampler orders and groups the samples of an epoch (seeded, same on every rank)."""
    window = f"mega-batches of {config.data.mega_batch_multiplier} micro-batches"
    sync = "bucket-synchronized: every rank draws from one shape bucket per micro-step"
    # One line per sampler mode: the mode already applied the options' precedence.
    lines: dict[SamplerMode, str] = {
        "random": "random (seeded shuffle)",
        "length_grouped": f"length-grouped: shuffled {window}, each sorted by length",
        "anchor_grouped": (
            f"anchor-grouped: shuffled {window}, each sorted by (shape bucket, anchor count), "
            f"optimizer windows shuffled; a micro-batch's rows need similar anchor widths"
        ),
        "bucket_synchronized": sync,
        "length_grouped_bucket_synchronized": (
            f"length-grouped {sync}, its rows cut from shuffled {window}, each sorted by length"
        ),
        "packed": "packed windows: shuffled conversations packed first-fit-decreasing into rows",
    }
    return lines[sampler_mode(config)]


def _packing_line(config: Config, shapes: ShapePolicy) -> str:
    """Whether conversations are packed into rows, and what that changes."""
    if not shapes.packing:
        return "off (one conversation per row)"
    return (
        f"on: whole conversations packed into rows of {shapes.row_capacity} tokens "
        f"(first-fit-decreasing, seeded), document-aware attention, "
        f"{config.training.num_anchors} anchors per row shared by its conversations; "
        f"evaluation stays unpacked"
    )


def _grid_line(shapes: ShapePolicy) -> str:
    """The static (length x anchor width) cells, or why there are none."""
    if not shapes.grid:
        return "dynamic (pad to the longest sample, the batch's largest anchor count)"
    cells = ", ".join(f"{length}x{width}" for length, width in shapes.grid)
    return f"{len(shapes.grid)} cell(s) (length x anchors): {cells}"


def memory(num_bytes: float) -> str:
    """A byte count for the plan: GiB, or MiB below a tenth of a GiB (tiny runs stay readable)."""
    if num_bytes >= 2**30 / 10:
        return f"{num_bytes / 2**30:.2f} GiB"
    return f"{num_bytes / 2**20:.1f} MiB"


def in_process_target_line(config: Config, target_config: Any, dtype_bytes: int) -> str:
    """Where the target runs, and the weight memory it costs each rank when it runs there."""
    if config.deployment.mode == "disaggregated":
        return "on the capture servers (no target weights on the trainer ranks)"
    if config.data.format == "features":
        return "not loaded (offline feature files)"
    try:
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            target = AutoModelForCausalLM.from_config(target_config)
        params = sum(p.numel() for p in target.parameters())
    except Exception as exc:  # an architecture transformers cannot build: say so, plan anyway
        return f"in-process on every rank (size unknown: {exc})"
    return (
        f"in-process on every rank for features: {params / 1e6:.1f}M parameters, "
        f"~{memory(params * dtype_bytes)} per rank"
    )


def runtime_check_errors(config: Config) -> list[str]:
    """Config checks that need this machine: the tracking backends' packages; fp8_linear needs
    CUDA, FSDP2 and torchao."""
    from .tracking.registry import tracking_errors

    errors = tracking_errors(config)
    return errors + _fp8_errors(config)


def _fp8_errors(config: Config) -> list[str]:
    if not config.training.fp8_linear:
        return []
    from ..backends import Fp8Unavailable, backend_options_from_config, check_fp8_supported
    from ..runtime.distributed import pick_device

    # fp8 support does not depend on shapes: a pad-only policy keeps this check torch-light.
    options = backend_options_from_config(config, pick_device(0), shapes=ShapePolicy())
    try:
        check_fp8_supported(options)
    except Fp8Unavailable as exc:
        return [f"training.fp8_linear = true: {exc}"]
    return []


def target_check_errors(config: Config) -> list[str]:
    """Config checks that need the target (layer ids in range, mask token id, widths)."""
    from specdraft.config.codes import get as code_info
    from specdraft.config.rules import target_problems
    from specdraft.config.target_info import TargetUnreadable, read_target_info

    try:
        info = read_target_info(config.model.target)
    except TargetUnreadable as exc:
        return [
            f"model.target = {config.model.target!r}: cannot read the target ({exc}); "
            "point it at a local HF model folder"
        ]
    errors = []
    for problem in target_problems(config, info):
        if code_info(problem.code).severity == "error":
            key = ".".join(str(p) for p in problem.key)
            errors.append(f"{problem.code} {key}: {problem.message}")
    return errors


def data_path_errors(config: Config) -> list[str]:
    """The data paths a run cannot read (a folder, a missing file), before the target loads."""
    if config.data.format == "features" or config.deployment.mode == "disaggregated":
        return []  # feature folders are checked by their reader; a producer reads its own data
    from ..data.sources import check_source

    errors = []
    for field, specs in (
        ("data.train_paths", config.data.train_paths),
        ("data.eval_paths", config.data.eval_paths),
    ):
        for spec in specs or ():
            if not spec.startswith("pkg:") and Path(spec).expanduser().is_dir():
                errors.append(
                    f"{field}: {spec!r} is a folder; name the .json / .jsonl conversation files "
                    "in it (or, for offline feature shards, set data.format = 'features')"
                )
                continue
            try:
                check_source(spec, field)
            except (ValueError, OSError) as exc:
                errors.append(str(exc))
    return errors


def target_weight_errors(config: Config) -> list[str]:
    """The target's weights against its config.json (embedding and LM head shapes), read from
    the safetensors headers only: a mismatch is refused before any weight loads."""
    if config.deployment.mode == "disaggregated":
        return []  # the trainer ranks read only the target's head; the capture servers load it
    from ..models.target import _EMBED_KEYS, _HEAD_KEYS, _tensor_files

    folder = Path(config.model.target)
    try:
        text = json.loads((folder / "config.json").read_text())
        text = text.get("text_config", text)
        files = _tensor_files(folder)
    except (OSError, ValueError) as exc:
        return [f"model.target = {str(folder)!r}: cannot read its weights ({exc})"]
    vocab, hidden = text.get("vocab_size"), text.get("hidden_size")
    errors = []
    for names in (_EMBED_KEYS, _HEAD_KEYS):
        name = next((n for n in names if n in files), None)
        if name is None:
            continue
        shape = safetensors_shape(files[name], name)
        if shape is not None and shape != [vocab, hidden]:
            errors.append(
                f"model.target = {str(folder)!r}: {name} in {files[name].name} has shape "
                f"{shape}, its config.json says [vocab_size, hidden_size] = [{vocab}, {hidden}]; "
                "the folder mixes two models: copy the target's config.json and weights together"
            )
    return errors


def safetensors_shape(path: Path, name: str) -> list[int] | None:
    """A tensor's shape from a safetensors file's JSON header (no tensor is read)."""
    try:
        with path.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        return [int(d) for d in header[name]["shape"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def launch_environment_defaults() -> None:
    """Environment every rank inherits: offline hub, quiet tokenizers."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
