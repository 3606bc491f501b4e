"""Evaluation wiring for a run: held-out records (built once, cached) and the tau evaluator."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from specdraft.config import Config, ShapePolicy

from ..models.backbone import PREDICT_ANCHORS, PREDICT_KEEP
from ..models.spec import DraftTrainSpec
from ..models.target import TargetHead
from ..runtime import DistContext
from .evaluation import (
    EvalRecord,
    build_eval_records,
    evaluate_acceptance,
    load_eval_records,
    prompt_of,
    save_eval_records,
)

if TYPE_CHECKING:
    from ..models.target import TargetFeatureExtractor
    from .assembly import RunData

log = logging.getLogger(__name__)


def eval_new_tokens(config: Config) -> int:
    """Tokens the target generates per held-out prompt (training.eval_max_new_tokens)."""
    return int(config.training.eval_max_new_tokens)


def records_path(config: Config, data_fingerprint: str) -> Path:
    """Cache file of the eval records, keyed by what makes them."""
    key = json.dumps(
        {
            "data": data_fingerprint,
            "target": config.model.target,
            "target_files": target_identity(config.model.target),
            "layers": list(config.model.target_layer_ids),
            "new_tokens": eval_new_tokens(config),
            "max_length": config.data.max_length,
            "samples": config.data.max_eval_samples,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(config.output_dir) / "eval" / f"records-{digest}.safetensors"


def target_identity(target: str) -> list[list[Any]]:
    """Name, size and mtime of the target folder's config and weights: a rebuilt target at the
    same path makes new records, an unchanged one reuses them."""
    folder = Path(target)
    files = [*sorted(folder.glob("*.safetensors")), folder / "config.json"]
    return [
        [f.name, f.stat().st_size, f.stat().st_mtime_ns] if f.is_file() else [f.name, None]
        for f in files
    ]


class NoEvalPrompts(ValueError):
    """The eval set has no row with a prompt before its first assistant turn."""


def assistant_header_length(config: Config) -> int:
    """Tokens the chat template puts before an assistant's answer (0 when unknown)."""
    from ..data.chat_template import render_chat, resolve_chat_template
    from ..data.dataset import load_tokenizer

    try:
        tokenizer, path = load_tokenizer(config)
        template = resolve_chat_template(config.data.chat_template, tokenizer, tokenizer_path=path)
        messages = [{"role": "user", "content": "x"}]
        rendered = [
            render_chat(template, messages, tokenizer, add_generation_prompt=flag)
            for flag in (True, False)
        ]
        with_header, without = (
            tokenizer(text, add_special_tokens=False)["input_ids"] for text in rendered
        )
    except Exception:  # a template that cannot render this: keep every prompt
        return 0
    return max(0, len(with_header) - len(without))


def eval_prompts(config: Config, *, progress: bool = False) -> tuple[list[torch.Tensor], str]:
    """The held-out prompts (token ids) and the data fingerprint of the eval set; no target."""
    from ..data import build_dataset

    if config.data.format != "sharegpt":
        # data.eval_paths are always conversations, whatever data.format says of train_paths.
        data = config.data.model_copy(update={"format": "sharegpt"})
        config = config.model_copy(update={"data": data})
    dataset, report = build_dataset(config, split="eval", progress=progress)
    prompts = []
    # A prompt of the assistant header alone (a row that opens with the assistant) asks the
    # target nothing: such rows are left out, and an eval set of only those is refused.
    header = assistant_header_length(config)
    for row in dataset:
        prompt = prompt_of(torch.tensor(row["input_ids"]), torch.tensor(row["loss_mask"]))
        if prompt is not None and len(prompt) > header:
            prompts.append(prompt)
        if len(prompts) >= config.data.max_eval_samples:
            break
    if not prompts:
        # Without a prompt there is nothing to verify drafts against: a tau would be made up.
        raise NoEvalPrompts(
            f"data.eval_paths: none of the {len(dataset)} usable rows has a prompt (a user or "
            "system turn before the first assistant turn), so there is nothing to evaluate. "
            "Fix: give the eval rows a user turn before the assistant's, or drop data.eval_paths"
        )
    return prompts, report.fingerprint


def make_eval_records(
    config: Config, *, extractor: TargetFeatureExtractor | None = None, progress: bool = False
) -> tuple[list[EvalRecord], str]:
    """The target's greedy continuations of the held-out prompts with features, and the data
    fingerprint of the eval set."""
    prompts, fingerprint = eval_prompts(config, progress=progress)
    return generate_records(config, prompts, extractor), fingerprint


def generate_records(
    config: Config, prompts: list[torch.Tensor], extractor: TargetFeatureExtractor | None
) -> list[EvalRecord]:
    """Run the target on the prompts: greedy continuations and their features."""
    from ..models import TargetFeatureExtractor, target_dtype

    if extractor is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        extractor = TargetFeatureExtractor(
            config.model.target,
            list(config.model.target_layer_ids),
            device=device,
            dtype=target_dtype(device),
        )
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
    return records


def cached_eval_records(
    config: Config, *, extractor: TargetFeatureExtractor | None = None
) -> tuple[list[EvalRecord], Path]:
    """The held-out records from the run folder's cache, made (and saved) only when missing:
    `train` and `eval` of the same run and target then generate them once, not every time."""
    prompts, fingerprint = eval_prompts(config)
    path = records_path(config, fingerprint)
    if path.is_file():
        log.info("evaluation: held-out records reused from %s", path)
        return load_eval_records(path), path
    records = generate_records(config, prompts, extractor)
    save_eval_records(records, path)
    return records, path


def load_or_make_records(
    config: Config, ctx: DistContext, *, extractor: TargetFeatureExtractor | None
) -> list[EvalRecord]:
    """Rank 0 makes (or finds) the records; every rank then reads the same file."""
    marker = Path(config.output_dir) / "eval" / "latest.json"
    if ctx.is_main:
        _, path = cached_eval_records(config, extractor=extractor)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"path": str(path)}))
    if dist.is_initialized():
        dist.barrier()
    path = Path(json.loads(marker.read_text())["path"])
    return load_eval_records(path)


def predictor(
    model: nn.Module,
    head: TargetHead,
    spec: DraftTrainSpec,
    device: torch.device,
    dtype: torch.dtype,
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


@dataclass(frozen=True)
class AcceptanceEvaluator:
    """tau of the draft on the run's held-out records, padded with the run's shape policy."""

    records: list[EvalRecord]
    head: TargetHead
    spec: DraftTrainSpec
    ctx: DistContext
    dtype: torch.dtype  # the features' dtype (the head's)
    block_size: int
    num_anchors: int
    shapes: ShapePolicy  # the run's policy: eval pads like training

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        """Acceptance metrics of `model` (the sharded draft), the same on every rank."""
        return evaluate_acceptance(
            self.records,
            predictor(model, self.head, self.spec, self.ctx.device, self.dtype),
            block_size=self.block_size,
            num_anchors=self.num_anchors,
            shapes=self.shapes,
            ctx=self.ctx,
        )


def build_evaluator(
    config: Config,
    ctx: DistContext,
    *,
    head: TargetHead,
    spec: DraftTrainSpec,
    shapes: ShapePolicy,
    data: RunData | None,
) -> AcceptanceEvaluator:
    """The evaluator Trainer.fit runs every eval_interval steps and at the end."""
    extractor = data.features if data is not None else None
    records = load_or_make_records(config, ctx, extractor=extractor)
    if ctx.is_main:
        log.info("evaluation: %d held-out prompts", len(records))
    return AcceptanceEvaluator(
        records=records,
        head=head,
        spec=spec,
        ctx=ctx,
        dtype=head.embed_tokens.weight.dtype,
        block_size=config.model.block_size,
        num_anchors=config.training.num_anchors,
        shapes=shapes,
    )


def evaluate_checkpoint(
    config: Config, checkpoint: str, records: list[EvalRecord] | None = None
) -> dict[str, Any]:
    """tau of a checkpoint's draft (or, for 'init', of the draft a run starts from: fresh, or
    model.init_from's) in this one process, on `records` (default: the config's held-out
    records, made here)."""
    from ..export import load_checkpoint_draft
    from ..models import DraftTrainSpec, build_draft, load_target_config, load_target_head
    from ..runtime.distributed import pick_device

    device = pick_device(0)
    ctx = DistContext(0, 1, 0, device)
    head = load_target_head(config.model.target, dtype=torch.float32).to(device)
    if checkpoint == "init":
        from ..models.init_from import load_init_weights, read_init_weights
        from ..vocab import draft_vocab_for_run

        # The draft a run starts from: model.init_from's weights when set.
        init = read_init_weights(config.model) if config.model.init_from is not None else None
        given = None if init is None else init.draft_vocab_ids
        vocab = draft_vocab_for_run(config, None, head.vocab_size, given=given)
        torch.manual_seed(config.training.seed)
        model = build_draft(
            config.model,
            load_target_config(config.model.target),
            dtype=torch.float32,
            draft_vocab=None if vocab is None else vocab.ids,
        )
        model.init_draft_head(head)
        if init is not None:
            load_init_weights(model, init)
    else:
        model = load_checkpoint_draft(checkpoint, action="evaluate")
    model = model.to(device).eval()
    if records is None:
        records, _ = cached_eval_records(config)
    spec = DraftTrainSpec.from_config(config, device)
    with torch.no_grad():
        return evaluate_acceptance(
            records,
            predictor(model, head, spec, device, torch.float32),
            block_size=config.model.block_size,
            num_anchors=config.training.num_anchors,
            # This process's one shape policy (a standalone evaluation, not a training run).
            shapes=ShapePolicy.from_config(config),
            ctx=ctx,
        )
