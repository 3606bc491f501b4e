"""Acceptance length tau: the draft against its target's greedy decoding on held-out prompts.

Speculative decoding with greedy verification is simulated exactly, offline: the target's greedy
continuation of each prompt is generated once (an `EvalRecord`), with the target features of the
whole sequence. A verification step starts at the last accepted token p (the anchor): the draft
proposes tokens p+1 .. p+block_size-1 from the context strictly before p; the target accepts the
longest prefix that matches its own greedy tokens and adds one bonus token. tau is the mean number
of tokens a step advances (accepted + 1), so a perfect draft reaches block_size and a useless one 1.

Predictions for every possible anchor of a record come from one batched draft call, padded to a
length of the run's `ShapePolicy` and to `num_anchors` slots, so compiled blocks see the same
static shapes as in training (plus one no-grad graph per shape).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdraft.config import ShapePolicy

from ..runtime import DistContext, all_reduce_sum
from ..runtime.atomic import atomic_path

# predict(input_ids [1,S], hidden_states [1,S,F], anchors [1,N], keep [1,N]) -> [1, N, bs-1]
PredictFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class EvalRecord:
    """A held-out prompt with the target's greedy continuation and the sequence's features."""

    input_ids: torch.Tensor  # [T] prompt + greedy continuation
    prompt_len: int
    hidden_states: torch.Tensor  # [T, L*H]
    prompt_cut: int = 0  # tokens cut from the front of the prompt to fit data.max_length


@dataclass
class WalkStats:
    """Counts of one or more simulated decodes."""

    steps: int
    advanced: int  # tokens produced = sum over steps of (accepted + 1)
    attempts: list[int]  # per draft offset k = 1..bs-1: steps that reached offset k
    accepts: list[int]  # per offset: steps that accepted offset k

    @classmethod
    def empty(cls, block_size: int) -> WalkStats:
        """Zero counts for a block size."""
        return cls(0, 0, [0] * (block_size - 1), [0] * (block_size - 1))

    def add(self, other: WalkStats) -> None:
        """Accumulate another record's counts."""
        self.steps += other.steps
        self.advanced += other.advanced
        self.attempts = [a + b for a, b in zip(self.attempts, other.attempts, strict=True)]
        self.accepts = [a + b for a, b in zip(self.accepts, other.accepts, strict=True)]

    @property
    def tau(self) -> float:
        """Mean tokens per verification step, the bonus token included."""
        return self.advanced / self.steps if self.steps else 0.0


def simulate_acceptance(
    tokens: Sequence[int], prompt_len: int, predictions: torch.Tensor, block_size: int
) -> WalkStats:
    """Walk greedy verification over one record.

    `predictions[i]` are the draft tokens for offsets 1..bs-1 of the block anchored at position
    `prompt_len + i`; the first anchor is the first generated token (the prefill's bonus token).
    """
    stats = WalkStats.empty(block_size)
    total = len(tokens)
    position = prompt_len
    while position < total - 1:
        proposal = predictions[position - prompt_len].tolist()
        available = min(block_size - 1, total - 1 - position)
        accepted = 0
        for k in range(available):
            stats.attempts[k] += 1
            if proposal[k] != tokens[position + 1 + k]:
                break
            stats.accepts[k] += 1
            accepted += 1
        stats.steps += 1
        stats.advanced += accepted + 1
        position += accepted + 1
    return stats


def predictions_for_record(
    record: EvalRecord,
    predict: PredictFn,
    *,
    num_anchors: int,
    shapes: ShapePolicy,
) -> torch.Tensor:
    """Draft proposals for every anchor of a record, in chunks of `num_anchors` slots."""
    total = int(record.input_ids.shape[0])
    length = shapes.pad_length(total)
    ids = torch.zeros(1, length, dtype=torch.long)
    ids[0, :total] = record.input_ids
    feats = record.hidden_states.new_zeros(1, length, record.hidden_states.shape[-1])
    feats[0, :total] = record.hidden_states
    anchors_all = torch.arange(record.prompt_len, total - 1, dtype=torch.long)
    chunks = []
    for start in range(0, max(1, anchors_all.numel()), num_anchors):
        part = anchors_all[start : start + num_anchors]
        anchors = torch.zeros(1, num_anchors, dtype=torch.long)
        keep = torch.zeros(1, num_anchors, dtype=torch.bool)
        anchors[0, : part.numel()] = part
        keep[0, : part.numel()] = True
        out = predict(ids, feats, anchors, keep)
        chunks.append(out[0, : part.numel()].to("cpu"))
    return torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.long)


def evaluate_acceptance(
    records: Sequence[EvalRecord],
    predict: PredictFn,
    *,
    block_size: int,
    num_anchors: int,
    shapes: ShapePolicy,
    ctx: DistContext,
) -> dict[str, float | list[float]]:
    """tau and per-position acceptance over `records`, split across ranks and summed.

    Every rank makes the same number of draft calls (sharded models run collectives in every
    forward), so a rank with fewer records repeats a dummy call and discards it.
    """
    mine = list(records[ctx.rank :: ctx.world_size])
    calls_needed = [
        max(1, -(-max(0, int(r.input_ids.shape[0]) - 1 - r.prompt_len) // num_anchors))
        for r in records
    ]
    per_rank = [sum(calls_needed[r :: ctx.world_size]) for r in range(ctx.world_size)]
    stats = WalkStats.empty(block_size)
    calls = 0
    for record in mine:
        predictions = predictions_for_record(
            record, predict, num_anchors=num_anchors, shapes=shapes
        )
        calls += max(1, -(-predictions.shape[0] // num_anchors))
        stats.add(
            simulate_acceptance(
                record.input_ids.tolist(), record.prompt_len, predictions, block_size
            )
        )
    if records:
        filler = records[0]
        dummy = EvalRecord(filler.input_ids[:2], 1, filler.hidden_states[:2])
        while calls < max(per_rank):
            predictions_for_record(dummy, predict, num_anchors=num_anchors, shapes=shapes)
            calls += 1
    vector = torch.tensor(
        [stats.steps, stats.advanced, *stats.attempts, *stats.accepts], dtype=torch.float64
    )
    all_reduce_sum(vector)
    values = vector.tolist()
    width = block_size - 1
    steps, advanced = values[0], values[1]
    attempts, accepts = values[2 : 2 + width], values[2 + width :]
    return {
        "tau": advanced / steps if steps else 0.0,
        "steps": steps,
        # Held-out prompts cut from the left so prompt + generation fit data.max_length.
        "capped_prompts": sum(1 for r in records if r.prompt_cut > 0),
        "accept_rate_per_pos": [
            a / t if t else 0.0 for a, t in zip(accepts, attempts, strict=True)
        ],
    }


# ------------------------------------------------------------------------------ eval records


def build_eval_records(
    target: torch.nn.Module,
    extract: Callable[[torch.Tensor], torch.Tensor],
    prompts: Sequence[torch.Tensor],
    *,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    max_length: int | None = None,
) -> list[EvalRecord]:
    """Generate each prompt's greedy continuation with the target and extract its features.

    With `max_length`, every record fits it (the pad policy has no longer shape): see
    `fit_eval_budget` for how a long prompt is cut.
    """
    records = []
    keep = None
    if max_length is not None:
        max_new_tokens, keep = fit_eval_budget(max_length, max_new_tokens)
    for prompt in prompts:
        cut = 0
        if keep is not None and prompt.shape[0] > keep:
            cut = int(prompt.shape[0]) - keep
            prompt = prompt[cut:]
        with torch.no_grad():
            out = target.generate(
                prompt[None].to(target.device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=list(eos_token_ids),
                pad_token_id=pad_token_id,
            )
            sequence = out[0].to("cpu")
            hidden = extract(sequence[None])[0].to("cpu")
        records.append(EvalRecord(sequence, int(prompt.shape[0]), hidden, cut))
    return records


def fit_eval_budget(max_length: int, max_new_tokens: int) -> tuple[int, int]:
    """(tokens to generate, prompt tokens to keep) so that prompt + generation <= max_length.

    The generation budget is kept (up to half of max_length), because tau is measured on the
    generated tokens; a longer prompt loses its oldest tokens instead: the draft conditions on
    the most recent context, and the cut record still pads to a shape that training uses.
    """
    new_tokens = max(1, min(max_new_tokens, max_length // 2))
    return new_tokens, max(1, max_length - new_tokens)


def prompt_of(input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor | None:
    """The prompt part of a tokenised conversation: everything before the first supervised token."""
    supervised = torch.nonzero(loss_mask, as_tuple=False)
    if supervised.numel() == 0:
        return None
    first = int(supervised[0, 0])
    return input_ids[:first] if first > 0 else None


def save_eval_records(records: Sequence[EvalRecord], path: Path) -> None:
    """Cache eval records as one safetensors file (tensors) — no pickles."""
    tensors: dict[str, torch.Tensor] = {}
    for i, record in enumerate(records):
        tensors[f"{i}.input_ids"] = record.input_ids.contiguous()
        tensors[f"{i}.hidden_states"] = record.hidden_states.contiguous()
        tensors[f"{i}.prompt_len"] = torch.tensor([record.prompt_len])
        tensors[f"{i}.prompt_cut"] = torch.tensor([record.prompt_cut])
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp))


def load_eval_records(path: Path) -> list[EvalRecord]:
    """Read eval records written by `save_eval_records`."""
    tensors = load_file(str(path))
    count = len({key.split(".")[0] for key in tensors})
    return [
        EvalRecord(
            tensors[f"{i}.input_ids"],
            int(tensors[f"{i}.prompt_len"][0]),
            tensors[f"{i}.hidden_states"],
            int(tensors[f"{i}.prompt_cut"][0]) if f"{i}.prompt_cut" in tensors else 0,
        )
        for i in range(count)
    ]
