"""Objective speed, before and after the fused objectives, side by side in one process.

The loss of both draft families starts where the backbone ends: draft hidden states
[B, N, bs, H] -> the frozen LM head -> full-vocabulary cross-entropy (+ the DFlash2 selector,
+ DSpark's Markov bias, L1 to the target distribution and confidence BCE). This script times
forward + backward of exactly that part on fixed random weights and batches, in fp32 on CPU:

- `objective`: the family's whole objective, the old implementation (kept below as reference
  functions, exactly as it was before the change) against `model.objective` of the package;
- `logits`: the logits path alone: the head on the strided slice `hidden[:, :, 1:]` and
  `logsumexp - gather`, against one contiguous mm and `F.cross_entropy`.

Every (size, case, implementation) runs once per round, round-robin, so drift on a shared
machine spreads evenly; the table reports medians and after/before ratios. Cases with a zero
weight (`selector_loss_weight = 0`, DSpark `l1_weight = 0` without confidence head) compare
against the old code doing the work the weight discards: that is the saving, not equal work.

Usage: python bench/objective_speed.py [--rounds 9] [--sizes cpu,wide] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specdraft.trainer.models import DraftTrainSpec
from specdraft.trainer.models.backbone import BlockTargets, DraftModel
from specdraft.trainer.models.dflash2 import DFlash2DraftModel
from specdraft.trainer.models.dflash2.hf_config import DFlash2Config
from specdraft.trainer.models.dflash2.selector import candidate_set
from specdraft.trainer.models.dspark.hf_config import DSparkConfig
from specdraft.trainer.models.dspark.model import Qwen3DSparkModel, block_slots
from specdraft.trainer.models.losses import (
    DraftLoss,
    chunked_sums,
    decay_weights,
    leading_run,
    upcast,
)
from specdraft.trainer.models.target import TargetHead

# --------------------------------------------------------------------------- old implementations
# The objectives as they were before the fused formulation (the "before" column, and the
# reference the tests compare the package against at 1e-6).


def old_dflash2_objective(
    model: DFlash2DraftModel,
    hidden: Tensor,
    targets: BlockTargets,
    head: TargetHead,
    spec: DraftTrainSpec,
) -> DraftLoss:
    """DFlash2's objective before: head on the strided slice, logsumexp - gather, always top-k."""
    block_size = model.block_size
    slots = block_size - 1
    loss_dtype = upcast(hidden).dtype
    decay = decay_weights(slots, spec.loss_decay_gamma, hidden.device, loss_dtype)
    labels = targets.gold[:, :, 1:block_size]
    previous = targets.gold[:, :, : block_size - 1]
    weights = targets.supervised[:, :, 1:block_size].to(loss_dtype) * decay
    config = model.config
    selector = model.candidate_selector

    def chunk_sums(hidden_c: Tensor, labels_c: Tensor, previous_c: Tensor, weights_c: Tensor):
        predicted = hidden_c[:, :, 1:]
        logits = upcast(head.logits(predicted))
        token_ce = torch.logsumexp(logits, -1) - logits.gather(-1, labels_c[..., None])[..., 0]
        supervised = weights_c > 0
        correct = (logits.argmax(-1) == labels_c) & supervised
        cands = candidate_set(logits, labels_c, config.selector_top_k, config.selector_gold_policy)
        scores = selector.score(predicted, previous_c, cands.tokens, cands.unary)
        selector_ce = (
            torch.logsumexp(scores, -1) - scores.gather(-1, cands.target[..., None])[..., 0]
        )
        selector_weights = weights_c * cands.usable
        dflash_sum = (token_ce * weights_c).sum()
        selector_sum = (selector_ce * selector_weights).sum()
        numerator = dflash_sum + config.selector_loss_weight * selector_sum
        used = supervised & cands.usable
        selector_correct = (scores.argmax(-1) == cands.target) & used
        return (
            numerator,
            dflash_sum.detach(),
            selector_sum.detach(),
            correct.sum((0, 1)).float(),
            supervised.sum((0, 1)).float(),
            leading_run(correct).sum().float(),
            (cands.hit & supervised).sum().float(),
            used.sum().float(),
            selector_correct.sum().float(),
        )

    sums = chunked_sums(chunk_sums, (hidden, labels, previous, weights), spec.logits_chunk_blocks)
    (numerator, dflash_sum, selector_sum, correct_pos, count_pos, accepted) = sums[:6]
    recall_hits, selector_count, selector_correct = sums[6:]
    metrics = {
        "weighted_ce": dflash_sum,
        "selector_weighted_ce": selector_sum,
        "correct": correct_pos.sum(),
        "count": count_pos.sum(),
        "correct_per_pos": correct_pos,
        "count_per_pos": count_pos,
        "accepted": accepted,
        "blocks": targets.keep.sum().float(),
        "selector_recall_hits": recall_hits,
        "selector_count": selector_count,
        "selector_correct": selector_correct,
    }
    return DraftLoss(numerator, weights.sum().detach(), metrics)


def old_dspark_objective(
    model: Qwen3DSparkModel,
    hidden: Tensor,
    targets: BlockTargets,
    target_last: Tensor,
    head: TargetHead,
    spec: DraftTrainSpec,
) -> DraftLoss:
    """DSpark's objective before: the target softmax always, the head on 4-D (strided) chunks."""
    block = model.block_size
    # The slot targets did not change; only what follows them did.
    labels, previous, target_positions, weights = block_slots(
        targets, block, spec.loss_decay_gamma, hidden
    )
    config = model.config
    markov, confidence = model.markov_head, model.confidence_head

    def chunk_sums(hidden_c, labels_c, previous_c, positions_c, weights_c):
        batch_size, chunk, slots, width = hidden_c.shape
        bias = upcast(markov.block_bias(hidden_c, previous_c))
        logits = upcast(head.logits(hidden_c)) + bias
        log_probs = torch.log_softmax(logits, -1)
        token_ce = -log_probs.gather(-1, labels_c[..., None])[..., 0]
        index = positions_c.reshape(batch_size, chunk * slots, 1).expand(-1, -1, width)
        target_hidden = torch.gather(target_last, 1, index).view(hidden_c.shape)
        with torch.no_grad():
            target_probs = torch.softmax(upcast(head.logits(target_hidden)), -1)
        l1 = (log_probs.exp() - target_probs).abs().sum(-1)
        accept = (1.0 - l1.detach() / 2.0).clamp(0.0, 1.0)
        per_token = config.ce_weight * token_ce + config.l1_weight * l1
        bce = torch.zeros_like(l1)
        if confidence is not None:
            logit = upcast(confidence(hidden_c, markov.embed(previous_c)))
            bce = F.binary_cross_entropy_with_logits(logit, accept, reduction="none")
            per_token = per_token + config.confidence_weight * bce
        supervised = weights_c > 0
        correct = (logits.argmax(-1) == labels_c) & supervised

        def masked(values: Tensor) -> Tensor:
            return (values.detach() * supervised).sum()

        return (
            (per_token * weights_c).sum(),
            masked(token_ce),
            masked(l1),
            masked(accept),
            masked(bce),
            correct.sum((0, 1)).float(),
            supervised.sum((0, 1)).float(),
            leading_run(correct).sum().float(),
        )

    sums = chunked_sums(
        chunk_sums,
        (hidden, labels, previous, target_positions, weights),
        spec.logits_chunk_blocks,
    )
    numerator, ce_sum, l1_sum, accept_sum, bce_sum, correct_pos, count_pos, accepted = sums
    metrics = {
        "ce_sum": ce_sum,
        "l1_sum": l1_sum,
        "accept_sum": accept_sum,
        "confidence_bce_sum": bce_sum,
        "correct": correct_pos.sum(),
        "count": count_pos.sum(),
        "correct_per_pos": correct_pos,
        "count_per_pos": count_pos,
        "accepted": accepted,
        "blocks": targets.keep.sum().float(),
    }
    return DraftLoss(numerator, weights.sum().detach(), metrics)


def old_objective(model: DraftModel, hidden: Tensor, targets: BlockTargets, batch, head, spec):
    """The old objective of either family."""
    if isinstance(model, DFlash2DraftModel):
        return old_dflash2_objective(model, hidden, targets, head, spec)
    return old_dspark_objective(
        model, hidden, targets, batch["target_last_hidden_states"], head, spec
    )


def old_logits_ce(hidden: Tensor, labels: Tensor, head: TargetHead) -> Tensor:
    """The old logits path: the head on the strided slice, CE as logsumexp - gather (summed)."""
    logits = upcast(head.logits(hidden[:, :, 1:]))
    return (torch.logsumexp(logits, -1) - logits.gather(-1, labels[..., None])[..., 0]).sum()


def new_logits_ce(hidden: Tensor, labels: Tensor, head: TargetHead) -> Tensor:
    """The new logits path: one contiguous [rows, H] mm, fused F.cross_entropy (summed)."""
    rows = hidden[:, :, 1:].reshape(-1, hidden.shape[-1])
    logits = upcast(head.logits(rows))
    return F.cross_entropy(logits, labels.reshape(-1), reduction="sum")


# ----------------------------------------------------------------------------- models and data


@dataclass(frozen=True)
class Size:
    """One problem size: target width and vocabulary, micro-batch and anchor blocks."""

    name: str
    hidden: int
    vocab: int
    batch: int
    anchors: int
    block_size: int
    chunk_blocks: int
    length: int

    def describe(self) -> str:
        """A one-line description for the table header."""
        return (
            f"`{self.name}`: H={self.hidden}, V={self.vocab}, B={self.batch}, "
            f"{self.anchors} anchors x {self.block_size}, chunk {self.chunk_blocks} blocks"
        )


SIZES = {
    # The cpu preset's shape (tiny target: hidden 128, vocab 4096; 64 anchors, one chunk).
    "cpu": Size("cpu", 128, 4096, 2, 64, 16, 64, 1024),
    # Wider and with a larger vocabulary, 2 chunks: the slice and the softmax weigh more.
    "wide": Size("wide", 256, 16384, 2, 32, 16, 16, 1024),
    # Seconds in total: the smoke test's size.
    "toy": Size("toy", 32, 256, 2, 4, 4, 2, 64),
}

# (case name, algorithm, draft config overrides). The zero-weight cases compare skipping the
# work against doing it: the old code has no way to skip.
CASES: tuple[tuple[str, str, dict], ...] = (
    ("dflash2", "dflash2", {"selector_loss_weight": 0.1}),
    ("dflash2 selector_loss_weight=0", "dflash2", {"selector_loss_weight": 0.0}),
    ("dspark", "dspark", {}),
    (
        "dspark l1_weight=0, no confidence",
        "dspark",
        {
            "l1_weight": 0.0,
            "enable_confidence_head": False,
        },
    ),
)


def build_case(
    size: Size, algorithm: str, overrides: dict, seed: int = 0
) -> tuple[DraftModel, TargetHead, dict[str, Tensor], DraftTrainSpec]:
    """A draft, a frozen head and a batch of random tokens and features, fp32."""
    torch.manual_seed(seed)
    common = {
        "vocab_size": size.vocab,
        "hidden_size": size.hidden,
        "intermediate_size": 2 * size.hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": size.hidden // 4,
        "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"},
        "tie_word_embeddings": False,
        "block_size": size.block_size,
        "target_layer_ids": [0],
        "mask_token_id": size.vocab - 1,
    }
    if algorithm == "dflash2":
        config = DFlash2Config(
            conv_group_size=16,
            selector_rank=64,
            selector_top_k=16,
            selector_gold_policy="insert",
            **common,
            **overrides,
        )
        model: DraftModel = DFlash2DraftModel(config)
    else:
        model = Qwen3DSparkModel(DSparkConfig(markov_rank=64, **common, **overrides))
    model = model.float()
    scale = size.hidden**-0.5
    head = TargetHead(
        torch.randn(size.vocab, size.hidden) * scale, torch.randn(size.vocab, size.hidden) * scale
    )
    input_ids = torch.randint(0, size.vocab - 1, (size.batch, size.length))
    loss_mask = torch.ones(size.batch, size.length, dtype=torch.long)
    loss_mask[:, : size.length // 4] = 0  # a prompt
    batch = {
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "sample_id": torch.arange(size.batch),
        "target_last_hidden_states": torch.randn(size.batch, size.length, size.hidden),
    }
    spec = DraftTrainSpec(
        num_anchors=size.anchors, loss_decay_gamma=7.0, logits_chunk_blocks=size.chunk_blocks
    )
    return model, head, batch, spec


def objective_runner(
    model: DraftModel, head: TargetHead, batch: dict[str, Tensor], spec: DraftTrainSpec, old: bool
) -> Callable[[], None]:
    """Forward + backward of the objective on fixed draft hidden states."""
    targets = model.place_blocks(batch, spec)
    shape = (*targets.anchors.shape, model.block_size, model.config.hidden_size)
    hidden = torch.randn(shape, requires_grad=True)

    def run() -> None:
        model.zero_grad(set_to_none=True)
        hidden.grad = None
        if old:
            out = old_objective(model, hidden, targets, batch, head, spec)
        else:
            out = model.objective(hidden, targets, batch, head, spec)
        out.numerator.backward()

    return run


def logits_runner(size: Size, head: TargetHead, old: bool) -> Callable[[], None]:
    """Forward + backward of the logits path alone (head + CE) on one chunk of blocks."""
    shape = (size.batch, size.chunk_blocks, size.block_size, size.hidden)
    hidden = torch.randn(shape, requires_grad=True)
    labels = torch.randint(0, size.vocab, (size.batch, size.chunk_blocks, size.block_size - 1))
    path = old_logits_ce if old else new_logits_ce

    def run() -> None:
        hidden.grad = None
        path(hidden, labels, head).backward()

    return run


# ------------------------------------------------------------------------------- timing, table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The script's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="timed round-robin passes")
    parser.add_argument("--warmup", type=int, default=2, help="untimed passes first")
    parser.add_argument("--sizes", default="cpu,wide", help=f"comma list of {sorted(SIZES)}")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    return parser.parse_args(argv)


def build_runners(sizes: list[Size]) -> dict[tuple[str, str, str], Callable[[], None]]:
    """(size, case, 'before' | 'after') -> a timed closure, for every size and case."""
    runners: dict[tuple[str, str, str], Callable[[], None]] = {}
    for size in sizes:
        head = None
        for case, algorithm, overrides in CASES:
            model, head, batch, spec = build_case(size, algorithm, overrides)
            for label, old in (("before", True), ("after", False)):
                runners[size.name, f"objective: {case}", label] = objective_runner(
                    model, head, batch, spec, old
                )
        assert head is not None
        for label, old in (("before", True), ("after", False)):
            runners[size.name, "logits path (head + CE)", label] = logits_runner(size, head, old)
    return runners


def time_round_robin(
    runners: dict[tuple[str, str, str], Callable[[], None]], rounds: int, warmup: int
) -> dict[tuple[str, str, str], list[float]]:
    """Milliseconds of every runner per round; each round runs every runner once."""
    for _ in range(warmup):
        for run in runners.values():
            run()
    times: dict[tuple[str, str, str], list[float]] = {key: [] for key in runners}
    for _ in range(rounds):
        for key, run in runners.items():
            start = time.perf_counter()
            run()
            times[key].append((time.perf_counter() - start) * 1e3)
    return times


def table(times: dict[tuple[str, str, str], list[float]], sizes: list[Size]) -> str:
    """Markdown: median before / after per (size, case), their ratio and the speed-up."""
    lines = [
        "| size | what (forward + backward) | before ms | after ms | after / before | faster by |",
        "|---|---|---:|---:|---:|---:|",
    ]
    cases = dict.fromkeys(case for _, case, _ in times)
    for size in sizes:
        for case in cases:
            before = statistics.median(times[size.name, case, "before"])
            after = statistics.median(times[size.name, case, "after"])
            lines.append(
                f"| {size.name} | {case} | {before:.1f} | {after:.1f} | {after / before:.3f} "
                f"| {100 * (1 - after / before):+.1f}% |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Build every case, time them round-robin and print the table."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    unknown = [name for name in args.sizes.split(",") if name not in SIZES]
    if unknown:
        print(f"--sizes: unknown {unknown}; choose from {sorted(SIZES)}", file=sys.stderr)
        return 2
    sizes = [SIZES[name] for name in args.sizes.split(",")]
    runners = build_runners(sizes)
    times = time_round_robin(runners, args.rounds, args.warmup)
    header = [
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, "
        f"{args.rounds} rounds (medians), round-robin in one process",
        *(f"- {size.describe()}" for size in sizes),
        "",
    ]
    text = "\n".join(header) + "\n" + table(times, sizes)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
