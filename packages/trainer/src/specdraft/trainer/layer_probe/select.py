"""Which layers to tap: a ranking, and greedy forward selection with the joint probe.

The draft reads the concatenation of its taps, so the best set is not the best layers one by
one (neighbouring layers carry nearly the same features). Greedy forward selection adds, at each
step, the layer whose concatenation with the chosen ones most improves the joint probe's
held-out score. The last layer is never a candidate: its HF state is the normed final one, and
lint refuses it as a tap (SD311, config/rules.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .probe import ProbeScore


class JointProbe(Protocol):
    """What the selection needs of a probe (probe.RidgeProbe)."""

    def extension_scores(
        self,
        chosen: Sequence[int],
        candidates: Sequence[int],
        on_candidate: Callable[[int], None] | None = None,
    ) -> dict[int, ProbeScore]:
        """Joint scores of `chosen` plus each candidate."""
        ...


@dataclass(frozen=True)
class SelectionStep:
    """One greedy step: the layer added and the joint probe's score with it."""

    layer: int
    score: ProbeScore


def candidate_layers(num_layers: int) -> list[int]:
    """The layers a draft may tap: every decoder layer but the last."""
    return list(range(num_layers - 1))


def _order_key(score: ProbeScore, layer: int) -> tuple[float, int]:
    # Lower score first; a probe without a score (no held-out label) last; ties by layer id, so
    # the order is total and the same on every run.
    value = score.score
    return (math.inf if value != value else value, layer)


def rank_layers(scores: Mapping[int, ProbeScore]) -> list[int]:
    """Layers best first (lowest decay-weighted held-out CE; ties by the lower id)."""
    return sorted(scores, key=lambda layer: _order_key(scores[layer], layer))


def greedy_layers(
    probe: JointProbe,
    candidates: Sequence[int],
    count: int,
    *,
    first: Mapping[int, ProbeScore] | None = None,
    on_candidate: Callable[[int], None] | None = None,
) -> list[SelectionStep]:
    """`count` layers of `candidates` by greedy forward selection, in the order chosen.

    `first` gives the single-layer scores when they are already known (the ranking's), which
    saves the first step's fits.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")
    if count > len(candidates):
        raise ValueError(
            f"{count} taps asked for, but only {len(candidates)} layers may be tapped "
            "(every decoder layer but the last)"
        )
    chosen: list[int] = []
    steps: list[SelectionStep] = []
    for step in range(count):
        remaining = [layer for layer in candidates if layer not in chosen]
        if step == 0 and first is not None:
            scores = {layer: first[layer] for layer in remaining}
        else:
            scores = probe.extension_scores(chosen, remaining, on_candidate)
        best = min(remaining, key=lambda layer: _order_key(scores[layer], layer))
        chosen.append(best)
        steps.append(SelectionStep(best, scores[best]))
    return steps


def selection_checks(count: int, steps_total: int, first_known: bool) -> int:
    """Candidate fits the greedy selection runs (for a progress bar's total)."""
    return sum(steps_total - step for step in range(1 if first_known else 0, count))
