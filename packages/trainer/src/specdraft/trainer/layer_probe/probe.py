"""The probes that score target layers: a closed-form ridge probe and the early exit.

Ridge probe of a set of feature blocks (one or more layers at position j, and always the anchor
token's frozen embedding, the draft's slot-0 input). Each block is standardised per channel and
cut to its top principal components (COMPONENTS); a ridge map from the blocks' concatenation is
fitted in closed form to the target's normed final state at j + d - 1 for every probed offset
d, and read by the target's frozen head over a reduced vocabulary (the most frequent supervised
labels of the fitting rows; a label outside it counts as a miss). Scored on held-out rows by
cross-entropy (on in-vocabulary labels) and accuracy per offset, and one number: the CE
weighted over offsets as the draft's loss weights its slots, exp(-(d-2)/gamma).

The ridge strength is chosen per fit by generalised cross-validation on the fitting rows (from
one eigendecomposition, so every strength costs a few vector operations): a fixed strength
either over-fits a five-layer probe (held-out CE rising with every layer added) or
over-smooths a one-layer one. The component cut keeps a five-layer probe's system small
(6 x 128) against a few thousand rows. No optimiser, no randomness: the same rows give the
same scores.

Early exit ("logit lens"): the target's own final norm and head on layer l's state at j,
against x_{j+1}. Nothing is fitted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# Block id of the anchor token's embedding among the layer blocks.
ANCHOR = -1
# Principal components kept per block. On SmolLM2 (hidden 576, 64 ShareGPT conversations) 128
# components rank the layers as the full states do (Spearman 0.96 over 29 layers) and as a probe
# trained by gradient descent does (0.92 over 16; README: explain-layers).
COMPONENTS = 128
# Ridge strengths GCV chooses from, per fitting row: 10^-4 .. 10^3 in quarter decades.
ALPHA_GRID = tuple(10 ** (k / 4) for k in range(-16, 13))
# Label codes after mapping to the reduced vocabulary.
UNSUPERVISED = -1
OUTSIDE = -2


@dataclass(frozen=True)
class ProbeScore:
    """Held-out scores of one probe: per offset, and the decay-weighted CE."""

    ce: tuple[float, ...]  # mean CE over in-vocabulary supervised labels, per offset
    accuracy: tuple[float, ...]  # argmax == label over supervised labels (outside = miss)
    score: float  # sum_d w_d * ce_d / sum_d w_d (lower is better)


def offset_weights(offsets: Sequence[int], gamma: float) -> Tensor:
    """exp(-(d-2)/gamma) per offset d: the draft's loss weight of the slot that predicts x_{j+d}."""
    return torch.tensor([math.exp(-(d - 2) / gamma) for d in offsets], dtype=torch.float64)


def reduced_labels(labels: Tensor, vocab_ids: Tensor, vocab_size: int) -> Tensor:
    """Target ids -> reduced-vocabulary ids; UNSUPERVISED stays, ids outside become OUTSIDE."""
    lookup = torch.full((vocab_size,), OUTSIDE, dtype=torch.long)
    lookup[vocab_ids] = torch.arange(vocab_ids.numel())
    return torch.where(labels >= 0, lookup[labels.clamp(min=0)], labels)


def head_scores(logits: Tensor, labels: Tensor) -> tuple[float, float]:
    """(mean CE over labels >= 0, accuracy over labels != UNSUPERVISED) of [N, K] logits."""
    inside, supervised = labels >= 0, labels != UNSUPERVISED
    if not bool(supervised.any()):
        return math.nan, math.nan
    ce = math.nan
    if bool(inside.any()):
        ce = float(torch.nn.functional.cross_entropy(logits[inside], labels[inside]))
    correct = (logits.argmax(-1) == labels) & inside
    return ce, float(correct.sum()) / float(supervised.sum())


def early_exit_scores(
    features: Tensor, norm: Callable[[Tensor], Tensor], head_rows: Tensor, labels: Tensor
) -> list[tuple[float, float]]:
    """(CE, accuracy) of the target's final norm + head on each layer's state vs x_{j+1}.

    `features` [L, N, H] (the last entry is already normed), `labels` [N] in reduced ids.
    """
    out = []
    last = features.shape[0] - 1
    with torch.no_grad():
        for layer in range(features.shape[0]):
            state = features[layer]
            normed = state if layer == last else norm(state)
            out.append(head_scores(normed.float() @ head_rows.T, labels))
    return out


class RidgeProbe:
    """Closed-form ridge probes over layer blocks, scored through the frozen head."""

    def __init__(
        self,
        train: Tensor,
        train_anchor: Tensor,
        teacher: Tensor,
        held_out: Tensor,
        held_out_anchor: Tensor,
        held_out_labels: Tensor,
        head_rows: Tensor,
        weights: Tensor,
        components: int = COMPONENTS,
    ) -> None:
        """train [L, N, H], train_anchor [N, H], teacher [N, O, H]; held_out [L, M, H],
        held_out_anchor [M, H], held_out_labels [M, O] (reduced ids); head_rows [K, H]."""
        self.num_layers, rows, self.hidden = train.shape
        self.offsets = teacher.shape[1]
        if rows < 2:
            raise ValueError(f"{rows} fitting row(s): a probe needs at least 2")
        self.rows = rows
        self.components = components
        self._blocks: dict[int, tuple[Tensor, Tensor]] = {
            ANCHOR: self._reduce(train_anchor, held_out_anchor)
        }
        for layer in range(self.num_layers):
            self._blocks[layer] = self._reduce(train[layer], held_out[layer])
        flat = teacher.reshape(rows, -1).float()
        self._teacher_mean = flat.mean(0)
        self._teacher = flat - self._teacher_mean
        self._teacher_energy = float(self._teacher.double().pow(2).sum())
        self.labels = held_out_labels
        self.head_rows = head_rows.float()
        self.weights = weights
        self._gram: dict[tuple[int, int], Tensor] = {}
        self._cross: dict[int, Tensor] = {}

    def _reduce(self, train: Tensor, held_out: Tensor) -> tuple[Tensor, Tensor]:
        """Standardised per channel, then projected on the top principal components."""
        train, held_out = train.float(), held_out.float()
        # Per channel, from the fitting rows: SmolLM2's outlier channels (state norms of
        # ~13,000 at some layers) would otherwise take every component.
        mean = train.mean(0)
        std = train.std(0).clamp_min(1e-6)
        train = (train - mean) / std
        held_out = (held_out - mean) / std
        if train.shape[1] <= self.components:
            return train, held_out
        _, vectors = torch.linalg.eigh((train.T @ train).double())
        # eigh sorts ascending; the sign of each vector is arbitrary but fixed by the input.
        basis = vectors[:, -self.components :].flip(1).float()
        return train @ basis, held_out @ basis

    def width(self, block: int) -> int:
        """Channels of a block after the component cut."""
        return int(self._block(block).shape[1])

    def _block(self, block: int, held: bool = False) -> Tensor:
        if block not in self._blocks:
            raise ValueError(f"layer {block} is outside 0..{self.num_layers - 1}")
        return self._blocks[block][1 if held else 0]

    def gram(self, a: int, b: int) -> Tensor:
        """X_a^T X_b (float64), cached."""
        key = (min(a, b), max(a, b))
        if key not in self._gram:
            self._gram[key] = (self._block(key[0]).T @ self._block(key[1])).double()
        block = self._gram[key]
        return block if (a, b) == key else block.T

    def cross(self, block: int) -> Tensor:
        """X_block^T Y (Y the centred teacher states), cached."""
        if block not in self._cross:
            self._cross[block] = self._block(block).T @ self._teacher
        return self._cross[block]

    def score(self, prediction: Tensor) -> ProbeScore:
        """Held-out scores of predicted (centred) teacher states [M, O * H]."""
        states = (prediction.float() + self._teacher_mean).view(-1, self.offsets, self.hidden)
        ces, accuracies = [], []
        for offset in range(self.offsets):
            ce, accuracy = head_scores(states[:, offset] @ self.head_rows.T, self.labels[:, offset])
            ces.append(ce)
            accuracies.append(accuracy)
        valid = [(w, ce) for w, ce in zip(self.weights.tolist(), ces, strict=True) if ce == ce]
        total = sum(w for w, _ in valid)
        weighted = sum(w * ce for w, ce in valid) / total if total else math.nan
        return ProbeScore(tuple(ces), tuple(accuracies), weighted)

    def choose_alpha(self, eigenvalues: Tensor, projected: Tensor) -> float:
        """The ridge strength of ALPHA_GRID (times the rows) with the lowest GCV error.

        With X^T X = Q diag(l) Q^T and c = Q^T X^T Y, the fit's residual energy is
        |Y|^2 - sum_i |c_i|^2 (l_i + 2a) / (l_i + a)^2 and its degrees of freedom
        sum_i l_i / (l_i + a); GCV = residual / (1 - dof / N)^2.
        """
        energy = projected.double().pow(2).sum(1)
        best: tuple[float, float] | None = None
        for relative in ALPHA_GRID:
            alpha = relative * self.rows
            shrunk = eigenvalues + alpha
            residual = self._teacher_energy - float((energy * (shrunk + alpha) / shrunk**2).sum())
            dof = float((eigenvalues / shrunk).sum())
            if dof >= self.rows:
                continue
            gcv = residual / (1 - dof / self.rows) ** 2
            if best is None or gcv < best[0]:
                best = (gcv, alpha)
        assert best is not None, "the largest ridge strength leaves fewer dof than rows"
        return best[1]

    def fit_score(self, layers: Sequence[int]) -> ProbeScore:
        """The joint probe of `layers` and the anchor token, fitted, scored on held-out rows."""
        blocks = [ANCHOR, *layers]
        matrix = torch.cat([torch.cat([self.gram(a, b) for b in blocks], 1) for a in blocks], 0)
        eigenvalues, vectors = torch.linalg.eigh(matrix)
        eigenvalues = eigenvalues.clamp_min(0)
        basis = vectors.float()
        projected = basis.T @ torch.cat([self.cross(b) for b in blocks], 0)
        alpha = self.choose_alpha(eigenvalues, projected)
        held = torch.cat([self._block(b, held=True) for b in blocks], 1) @ basis
        scale = (1 / (eigenvalues + alpha)).float()
        return self.score((held * scale) @ projected)

    def extension_scores(
        self,
        chosen: Sequence[int],
        candidates: Sequence[int],
        on_candidate: Callable[[int], None] | None = None,
    ) -> dict[int, ProbeScore]:
        """The joint probe's scores of `chosen` plus each candidate, one at a time."""
        scores: dict[int, ProbeScore] = {}
        for candidate in candidates:
            scores[candidate] = self.fit_score([*chosen, candidate])
            if on_candidate is not None:
                on_candidate(candidate)
        return scores
