"""Evaluation wiring for a run: held-out records (built once, cached) and the tau evaluator."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from specdraft.config import Config, ShapePolicy

from ..models.backbone import PREDICT_ANCHORS, PREDICT_KEEP
from ..runtime import DistContext
from .evaluation import (
    EvalRecord,
    build_eval_records,
    evaluate_acceptance,
    load_eval_records,
    prompt_of,
    save_eval_records,
)

log = logging.getLogger(__name__)

DEFAULT_EVAL_NEW_TOKENS = 64


def eval_new_tokens(config: Config) -> int:
    """Tokens the target generates per held-out prompt."""
    return int(getattr(config.training, "eval_max_new_tokens", DEFAULT_EVAL_NEW_TOKENS))


def records_path(config: Config, data_fingerprint: str) -> Path:
    """Cache file of the eval records, keyed by what makes them."""
    key = json.dumps(
        {
            "data": data_fingerprint,
            "target": config.model.target,
            "layers": list(config.model.target_layer_ids),
            "new_tokens": eval_new_tokens(config),
            "max_length": config.data.max_length,
            "samples": config.data.max_eval_samples,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(config.output_dir) / "eval" / f"records-{digest}.safetensors"


def make_eval_records(
    config: Config, *, extractor: Any | None = None, progress: bool = False
) -> tuple[list[EvalRecord], str]:
    """The target's greedy continuations of the held-out prompts with features, and the data
    fingerprint of the eval set."""
    from ..data import build_dataset
    from ..models import TargetFeatureExtractor

    if config.data.format != "sharegpt":
        # data.eval_paths are always conversations, whatever data.format says of train_paths.
        data = config.data.model_copy(update={"format": "sharegpt"})
        config = config.model_copy(update={"data": data})
    dataset, report = build_dataset(config, split="eval", progress=progress)
    if extractor is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        extractor = TargetFeatureExtractor(
            config.model.target,
            list(config.model.target_layer_ids),
            device=device,
            dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
        )
    prompts = []
    for row in dataset:
        prompt = prompt_of(torch.tensor(row["input_ids"]), torch.tensor(row["loss_mask"]))
        if prompt is not None:
            prompts.append(prompt)
        if len(prompts) >= config.data.max_eval_samples:
            break
    target = extractor.model
    generation = getattr(target, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None) or getattr(target.config, "eos_token_id", 0)
    eos_ids = eos if isinstance(eos, list) else [eos]
    pad = getattr(generation, "pad_token_id", None)
    records = build_eval_records(
        target,
        lambda ids: extractor(ids.to(extractor.model.device), torch.ones_like(ids))[0],
        prompts,
        max_new_tokens=eval_new_tokens(config),
        eos_token_ids=eos_ids,
        pad_token_id=pad if pad is not None else eos_ids[0],
        max_length=config.data.max_length,
    )
    capped = sum(1 for r in records if r.prompt_cut > 0)
    if capped:
        log.info(
            "evaluation: %d of %d held-out prompts cut from the left to fit data.max_length %d",
            capped,
            len(records),
            config.data.max_length,
        )
    return records, report.fingerprint


def load_or_make_records(
    config: Config, ctx: DistContext, *, extractor: Any | None
) -> list[EvalRecord]:
    """Rank 0 makes (or finds) the records; every rank then reads the same file."""
    marker = Path(config.output_dir) / "eval" / "latest.json"
    if ctx.is_main:
        records, fingerprint = make_eval_records(config, extractor=extractor)
        path = records_path(config, fingerprint)
        if not path.is_file():
            save_eval_records(records, path)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"path": str(path)}))
    if dist.is_initialized():
        dist.barrier()
    path = Path(json.loads(marker.read_text())["path"])
    return load_eval_records(path)


def predictor(
    model: nn.Module, head: nn.Module, spec: Any, device: torch.device, dtype: torch.dtype
) -> Callable[..., torch.Tensor]:
    """A predict function that goes through the (sharded, compiled) model's forward."""

    def predict(ids, feats, anchors, keep):
        batch = {
            "input_ids": ids.to(device),
            "hidden_states": feats.to(device, dtype),
            PREDICT_ANCHORS: anchors.to(device),
            PREDICT_KEEP: keep.to(device),
        }
        return model(batch, head=head, spec=spec)

    return predict


def build_evaluator(
    config: Config,
    ctx: DistContext,
    *,
    model: nn.Module,
    head: nn.Module,
    spec: Any,
    shapes: ShapePolicy,
    data: Any | None,
) -> Callable[[nn.Module], dict[str, Any]]:
    """The callable Trainer.fit runs every eval_interval steps and at the end."""
    extractor = getattr(data, "features", None)
    records = load_or_make_records(config, ctx, extractor=extractor)
    dtype = head.embed_tokens.weight.dtype if hasattr(head, "embed_tokens") else torch.float32
    if ctx.is_main:
        log.info("evaluation: %d held-out prompts", len(records))

    def evaluate(current: nn.Module) -> dict[str, Any]:
        return evaluate_acceptance(
            records,
            predictor(current, head, spec, ctx.device, dtype),
            block_size=config.model.block_size,
            num_anchors=config.training.num_anchors,
            pad_to=shapes.pad_to,  # the run's policy: eval pads like training
            ctx=ctx,
        )

    return evaluate


def evaluate_checkpoint(config: Config, checkpoint: str) -> dict[str, Any]:
    """tau of a checkpoint's draft (or of a fresh draft for 'init') in this one process."""
    from ..models import DraftTrainSpec, build_draft, load_target_config, load_target_head
    from ..runtime.distributed import pick_device
    from .export import load_checkpoint_draft

    device = pick_device(0)
    ctx = DistContext(0, 1, 0, device)
    if checkpoint == "init":
        torch.manual_seed(config.training.seed)
        model = build_draft(
            config.model, load_target_config(config.model.target), dtype=torch.float32
        )
    else:
        model = load_checkpoint_draft(checkpoint, action="evaluate")
    model = model.to(device).eval()
    head = load_target_head(config.model.target, dtype=torch.float32).to(device)
    records, _ = make_eval_records(config)
    spec = DraftTrainSpec.from_config(config, device)
    with torch.no_grad():
        return evaluate_acceptance(
            records,
            predictor(model, head, spec, device, torch.float32),
            block_size=config.model.block_size,
            num_anchors=config.training.num_anchors,
            # This process's one shape policy (a standalone evaluation, not a training run).
            pad_to=ShapePolicy.from_config(config).pad_to,
            ctx=ctx,
        )
