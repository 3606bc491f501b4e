"""`specdraft explain-layers`: rank the target's layers by measurement, suggest target_layer_ids.

Reads a few training conversations the way training does (chat template, loss mask,
data.max_length), runs the target in-process over them and over held-out conversations
(data.eval_paths; without them, training rows not used for fitting), keeps every layer's state
at sampled positions (collect.py), scores each layer with the ridge probe and the early exit
(probe.py), and picks the configured number of taps by greedy forward selection (select.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .collect import LayerStates, collect_layer_states, load_target_model
from .probe import (
    COMPONENTS,
    UNSUPERVISED,
    ProbeScore,
    RidgeProbe,
    early_exit_scores,
    offset_weights,
    reduced_labels,
)
from .report import NOTES, finite
from .select import candidate_layers, greedy_layers, rank_layers, selection_checks

DEFAULT_SAMPLES = 64
DEFAULT_EVAL_SAMPLES = 32
DEFAULT_POSITIONS = 64
# Block slots 1, 2 and 3: the first drafted tokens, which decide most of the acceptance length.
DEFAULT_OFFSETS = (2, 3, 4)
DEFAULT_VOCAB = 4096


@dataclass(frozen=True)
class LayerProbeSettings:
    """What explain-layers measures on (the command's options)."""

    samples: int = DEFAULT_SAMPLES
    eval_samples: int = DEFAULT_EVAL_SAMPLES
    positions: int = DEFAULT_POSITIONS
    offsets: tuple[int, ...] = DEFAULT_OFFSETS
    vocab: int = DEFAULT_VOCAB
    count: int | None = None  # taps to suggest; None: len(model.target_layer_ids)
    seed: int | None = None  # None: training.seed


Rows = list[tuple[list[int], list[int]]]


def check_settings(settings: LayerProbeSettings, block_size: int) -> None:
    """Raise ValueError naming the option when a setting cannot be measured."""
    for name, value in (
        ("--samples", settings.samples),
        ("--eval-samples", settings.eval_samples),
        ("--positions", settings.positions),
        ("--vocab", settings.vocab),
    ):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, not {value}")
    if settings.count is not None and settings.count < 1:
        raise ValueError(f"--count must be at least 1, not {settings.count}")
    offsets = settings.offsets
    if not offsets or len(set(offsets)) != len(offsets):
        raise ValueError(f"--offsets must list distinct offsets, not {list(offsets)}")
    # Slot k = d - 1 exists for d <= block_size (DSpark's extra last slot is not probed).
    if min(offsets) < 2 or max(offsets) > block_size:
        raise ValueError(
            f"--offsets {list(offsets)}: the draft's slots predict x_(j+2) .. x_(j+{block_size}) "
            f"(model.block_size {block_size}) from the features at j, so offsets lie in "
            f"2..{block_size}"
        )


def shuffled(total: int, seed: int) -> list[int]:
    """0..total-1 in an order fixed by `seed`."""
    return torch.randperm(total, generator=torch.Generator().manual_seed(seed)).tolist()


def _dataset_rows(dataset: Any, indices: Sequence[int]) -> Rows:
    picked = dataset.select(sorted(indices))
    return [(list(r["input_ids"]), list(r["loss_mask"])) for r in picked]


def _shard_rows(shards: Any, indices: Sequence[int]) -> Rows:
    rows = []
    for index in sorted(indices):
        sample = shards[index]
        rows.append((sample["input_ids"].tolist(), sample["loss_mask"].tolist()))
    return rows


def corpus_rows(
    config: Any, settings: LayerProbeSettings, seed: int, *, progress: bool
) -> tuple[Rows, Rows, str]:
    """(fitting rows, held-out rows, where the held-out rows come from), read as training does.

    Offline feature shards hold only the configured taps, so only their tokens are read here.
    """
    data = config.data
    if data.format == "features":
        from ..features.meta import expected_feature_meta
        from ..features.shards import FeatureShardDataset

        shards = FeatureShardDataset(data.train_paths, expected=expected_feature_meta(config))
        total, read = len(shards), lambda idx: _shard_rows(shards, idx)
    else:
        from ..data import build_dataset

        dataset, _ = build_dataset(config, split="train", progress=progress)
        total, read = len(dataset), lambda idx: _dataset_rows(dataset, idx)
    order = shuffled(total, seed)
    if data.eval_paths:
        from ..data import build_dataset

        # data.eval_paths are always conversations, whatever data.format says of train_paths.
        conversations = config.model_copy(
            update={"data": data.model_copy(update={"format": "sharegpt"})}
        )
        held, _ = build_dataset(conversations, split="eval", progress=progress)
        held_order = shuffled(len(held), seed + 1)[: settings.eval_samples]
        return read(order[: settings.samples]), _dataset_rows(held, held_order), "data.eval_paths"
    # No held-out corpus: hold out training rows the probes never fit on.
    held_count = min(settings.eval_samples, max(1, total // 4))
    fit_count = min(settings.samples, total - held_count)
    if fit_count < 1:
        raise ValueError(f"the training corpus has {total} row(s): too few to fit and hold out")
    source = "training rows not used for fitting (data.eval_paths is empty)"
    return read(order[:fit_count]), read(order[fit_count : fit_count + held_count]), source


class Stopwatch:
    """Wall and CPU seconds per phase, and in all (the machines this runs on are often shared,
    so the CPU time says what the work costs and the wall time what it took)."""

    def __init__(self) -> None:
        self._start = self._last = (time.perf_counter(), time.process_time())
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        """Record the time since the last lap as `phase`, and the total so far."""
        now = (time.perf_counter(), time.process_time())
        self.wall[phase] = now[0] - self._last[0]
        self.cpu[phase] = now[1] - self._last[1]
        self.wall["total"] = now[0] - self._start[0]
        self.cpu["total"] = now[1] - self._start[1]
        self._last = now


def score_dict(score: ProbeScore) -> dict[str, Any]:
    """A ProbeScore as JSON: the weighted score, CE and accuracy per offset."""
    return {
        "score": finite(score.score),
        "ce": [finite(ce) for ce in score.ce],
        "accuracy": [finite(accuracy) for accuracy in score.accuracy],
    }


@dataclass
class Measured:
    """What the probes measured, before it is put into a report."""

    probe: RidgeProbe
    early: list[tuple[float, float]]  # (CE, accuracy) of the early exit per layer
    vocab_size: int  # the reduced head's tokens
    coverage: float  # share of supervised held-out labels inside it
    weights: torch.Tensor  # per offset, normalised
    rows: dict[str, Any]


def measure(
    model: Any,
    fit_rows: Rows,
    held_rows: Rows,
    fit: LayerStates,
    held: LayerStates,
    *,
    vocab: int,
    gamma: float,
    offsets: Sequence[int],
) -> Measured:
    """The early exit of every layer, and the ridge probe, on the collected states."""
    from ..vocab.choice import ranked_tokens
    from ..vocab.frequencies import supervised_token_counts

    vocab_size = int(model.config.get_text_config().vocab_size)
    ids = torch.cat([torch.as_tensor(r[0]) for r in fit_rows]).numpy()
    mask = torch.cat([torch.as_tensor(r[1]) for r in fit_rows]).numpy()
    counts = supervised_token_counts(ids, mask, vocab_size)
    # The most frequent supervised labels of the fitting rows, as a draft vocabulary is chosen.
    vocab_ids = torch.as_tensor(ranked_tokens(counts)[: min(vocab, vocab_size)].copy())
    head_rows = model.get_output_embeddings().weight.detach()[vocab_ids.to(model.device)]
    head_rows = head_rows.float().cpu()
    embed = model.get_input_embeddings()
    device = model.device
    norm = _final_norm(model)
    held_labels = reduced_labels(held.labels, vocab_ids, vocab_size)
    with torch.no_grad():
        early = early_exit_scores(
            held.features,
            lambda x: norm(x.to(device, dtype=model.dtype)).float().cpu(),
            head_rows,
            reduced_labels(held.anchor_ids, vocab_ids, vocab_size),
        )
        fit_anchor = embed(fit.anchor_ids.to(device)).float().cpu()
        held_anchor = embed(held.anchor_ids.to(device)).float().cpu()
    weights = offset_weights(offsets, gamma)
    supervised = int((held_labels != UNSUPERVISED).sum())
    probe = RidgeProbe(
        fit.features,
        fit_anchor,
        fit.teacher,
        held.features,
        held_anchor,
        held_labels,
        head_rows,
        weights,
    )
    return Measured(
        probe=probe,
        early=early,
        vocab_size=int(vocab_ids.numel()),
        coverage=float((held_labels >= 0).sum()) / max(1, supervised),
        weights=weights / weights.sum(),
        rows={
            name: {
                "conversations": len(source),
                "with_positions": states.samples,
                "positions": states.num_rows,
            }
            for name, source, states in (("fit", fit_rows, fit), ("held_out", held_rows, held))
        },
    )


def explain_layers(
    config: Any, settings: LayerProbeSettings, *, progress: bool = True
) -> dict[str, Any]:
    """Measure the target's layers on the config's data; the report as a JSON-ready dict."""
    from specdraft.config.target_info import suggest_target_layer_ids

    from ..data.dataset import load_tokenizer

    check_settings(settings, config.model.block_size)
    seed = config.training.seed if settings.seed is None else settings.seed
    count = settings.count or len(config.model.target_layer_ids)
    offsets = tuple(settings.offsets)
    clock = Stopwatch()
    load_tokenizer(config)  # a missing tokenizer fails here, before the corpus is read
    fit_rows, held_rows, held_source = corpus_rows(config, settings, seed, progress=progress)
    clock.lap("data")

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_target_model(config.model.target, device)
    num_layers = int(model.config.get_text_config().num_hidden_layers)
    candidates = candidate_layers(num_layers)
    if count > len(candidates):
        raise ValueError(
            f"{count} taps asked for, but the target's {num_layers} layers leave "
            f"{len(candidates)} a draft may tap (the last is not allowed)"
        )
    bar = _bar(progress, len(fit_rows) + len(held_rows), "target forward", "sample")
    update = None if bar is None else bar.update
    fit = collect_layer_states(
        model, fit_rows, offsets, per_sample=settings.positions, seed=seed, on_sample=update
    )
    held = collect_layer_states(
        model, held_rows, offsets, per_sample=settings.positions, seed=seed + 1, on_sample=update
    )
    if bar is not None:
        bar.close()
    clock.lap("target_forward")

    measured = measure(
        model,
        fit_rows,
        held_rows,
        fit,
        held,
        vocab=settings.vocab,
        gamma=config.loss_decay_gamma,
        offsets=offsets,
    )
    hidden_size = int(model.config.get_text_config().hidden_size)
    del model, fit, held  # the probe keeps its reduced copies only
    probe = measured.probe
    total_fits = num_layers + selection_checks(count, len(candidates), first_known=True)
    bar = _bar(progress, total_fits, "layer probes", "fit")
    tick = None if bar is None else (lambda _layer: bar.update(1))
    single = probe.extension_scores([], list(range(num_layers)), tick)
    clock.lap("probes")

    steps = greedy_layers(probe, candidates, count, first=single, on_candidate=tick)
    if bar is not None:
        bar.close()
    try:
        spread: list[int] | None = suggest_target_layer_ids(num_layers, count)
    except ValueError:
        spread = None
    compared = {}
    for name, layers in (
        ("configured", list(config.model.target_layer_ids)),
        ("depth_spread", spread),
    ):
        usable = layers is not None and all(layer in candidates for layer in layers)
        score = score_dict(probe.fit_score(layers)) if usable else {"score": None}
        compared[name] = {"layers": layers, **score}
    clock.lap("selection")

    ranking = rank_layers({layer: single[layer] for layer in candidates})
    suggested = sorted(step.layer for step in steps)
    return {
        "target": str(config.model.target),
        "num_layers": num_layers,
        "hidden_size": hidden_size,
        "seed": seed,
        "threads": torch.get_num_threads(),
        "device": device.type,
        **measured.rows,
        "held_out_source": held_source,
        "offsets": list(offsets),
        "slots": [d - 1 for d in offsets],
        "offset_weights": [float(w) for w in measured.weights],
        "loss_decay_gamma": config.loss_decay_gamma,
        "probe": {"kind": "ridge", "components": COMPONENTS, "alpha": "gcv per fit"},
        "vocab": {"size": measured.vocab_size, "held_out_coverage": measured.coverage},
        "layers": [
            {
                "layer": layer,
                "tap_allowed": layer in candidates,
                "rank": ranking.index(layer) + 1 if layer in candidates else None,
                "early_exit": {
                    "ce": finite(measured.early[layer][0]),
                    "accuracy": finite(measured.early[layer][1]),
                },
                "probe": score_dict(single[layer]),
            }
            for layer in range(num_layers)
        ],
        "ranking": ranking,
        "selection": [{"layer": step.layer, **score_dict(step.score)} for step in steps],
        "suggested": {"layers": suggested, **score_dict(steps[-1].score)},
        **compared,
        "config_line": f"target_layer_ids = {suggested}",
        "notes": list(NOTES),
        "seconds": clock.wall,
        "cpu_seconds": clock.cpu,
    }


def _final_norm(model: Any) -> Any:
    decoder = getattr(model, "model", model)
    norm = getattr(decoder, "norm", None)
    if norm is None:
        raise ValueError(
            f"{type(model).__name__}: no final norm (`model.norm`) found for the early exit"
        )
    return norm


def _bar(progress: bool, total: int, desc: str, unit: str) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit)
