"""The layer probes and the selection on synthetic states: the layer that carries the labels
ranks first and is suggested, the last layer is never suggested, and the same rows give the same
scores and choices."""

from __future__ import annotations

import math

import pytest
import torch

from specdraft.trainer.layer_probe import (
    RidgeProbe,
    candidate_layers,
    greedy_layers,
    offset_weights,
    rank_layers,
)
from specdraft.trainer.layer_probe.probe import OUTSIDE, UNSUPERVISED, reduced_labels
from specdraft.trainer.layer_probe.select import selection_checks

LAYERS, HIDDEN, LABELS, OFFSETS = 6, 24, 8, 2


def synthetic_probe(signal_layer: int, *, seed: int = 0, fit: int = 600, held: int = 300):
    """A RidgeProbe whose layer `signal_layer` encodes the labels at both offsets (plus noise)
    and whose other layers, and the anchor's embedding, are noise."""
    gen = torch.Generator().manual_seed(seed)
    head = torch.randn(LABELS, HIDDEN, generator=gen)
    codes = [torch.randn(LABELS, HIDDEN, generator=gen) for _ in range(OFFSETS)]

    def split(rows: int):
        labels = torch.randint(0, LABELS, (rows, OFFSETS), generator=gen)
        features = torch.randn(LAYERS, rows, HIDDEN, generator=gen)
        signal = sum(codes[o][labels[:, o]] for o in range(OFFSETS))
        features[signal_layer] = signal + 0.3 * features[signal_layer]
        anchor = torch.randn(rows, HIDDEN, generator=gen)
        # The target's final state points at its label's head row.
        teacher = torch.stack([3 * head[labels[:, o]] for o in range(OFFSETS)], dim=1)
        return features, anchor, labels, teacher

    features, anchor, _, teacher = split(fit)
    held_features, held_anchor, held_labels, _ = split(held)
    weights = offset_weights(range(2, 2 + OFFSETS), gamma=4.0)
    return RidgeProbe(
        features, anchor, teacher, held_features, held_anchor, held_labels, head, weights
    )


@pytest.mark.parametrize("signal_layer", [0, 2, 4])
def test_the_layer_that_carries_the_labels_ranks_first_and_is_suggested(signal_layer):
    probe = synthetic_probe(signal_layer)
    scores = probe.extension_scores([], range(LAYERS))
    ranking = rank_layers({layer: scores[layer] for layer in candidate_layers(LAYERS)})
    assert ranking[0] == signal_layer
    best = scores[signal_layer]
    assert min(best.accuracy) > 0.9  # it reads both offsets' labels
    noise = [scores[layer] for layer in range(LAYERS) if layer != signal_layer]
    # Noise reads nothing: about chance (1/8), and a CE near log(8).
    assert max(max(s.accuracy) for s in noise) < 0.3
    assert min(s.score for s in noise) > best.score + 1
    steps = greedy_layers(probe, candidate_layers(LAYERS), 1, first=scores)
    assert [step.layer for step in steps] == [signal_layer]
    two = greedy_layers(probe, candidate_layers(LAYERS), 2)
    assert two[0].layer == signal_layer and len({step.layer for step in two}) == 2


def test_the_last_layer_is_never_suggested_even_when_it_reads_best():
    last = LAYERS - 1
    probe = synthetic_probe(last)
    scores = probe.extension_scores([], range(LAYERS))
    # The table shows it as the best reader, but it is no candidate.
    assert min(range(LAYERS), key=lambda layer: scores[layer].score) == last
    assert candidate_layers(LAYERS) == list(range(last))
    for count in (1, 3, LAYERS - 1):
        steps = greedy_layers(probe, candidate_layers(LAYERS), count)
        chosen = [step.layer for step in steps]
        assert last not in chosen and len(set(chosen)) == count
    with pytest.raises(ValueError, match="only 5 layers may be tapped"):
        greedy_layers(probe, candidate_layers(LAYERS), LAYERS)


def test_the_same_rows_give_the_same_scores_and_choices():
    first, second = synthetic_probe(3, seed=5), synthetic_probe(3, seed=5)
    a = first.extension_scores([], range(LAYERS))
    b = second.extension_scores([], range(LAYERS))
    assert a == b  # exact: closed form, no randomness
    steps_a = greedy_layers(first, candidate_layers(LAYERS), 3, first=a)
    steps_b = greedy_layers(second, candidate_layers(LAYERS), 3)
    assert steps_a == steps_b
    assert first.fit_score([3, 1]) == second.fit_score([3, 1])


def test_a_joint_fit_with_a_noise_layer_keeps_the_signal():
    probe = synthetic_probe(2)
    alone = probe.fit_score([2])
    with_noise = probe.fit_score([2, 4])
    # GCV picks the strength per fit, so added noise costs little.
    assert with_noise.score < alone.score + 0.1
    assert min(with_noise.accuracy) > 0.85


def test_ties_go_to_the_lower_layer_and_missing_scores_last():
    from specdraft.trainer.layer_probe import ProbeScore

    same = ProbeScore((1.0,), (0.5,), 1.0)
    nan = ProbeScore((math.nan,), (math.nan,), math.nan)
    assert rank_layers({4: same, 2: same, 0: nan, 3: ProbeScore((2.0,), (0.1,), 2.0)}) == [
        2,
        4,
        3,
        0,
    ]


def test_offset_weights_follow_the_draft_loss_decay():
    weights = offset_weights((2, 3, 5), gamma=4.0)
    assert weights.tolist() == pytest.approx([1.0, math.exp(-1 / 4), math.exp(-3 / 4)])


def test_reduced_labels_mark_unsupervised_and_outside():
    vocab = torch.tensor([7, 3, 9])
    labels = torch.tensor([[3, -1], [8, 9]])
    assert reduced_labels(labels, vocab, 10).tolist() == [[1, UNSUPERVISED], [OUTSIDE, 2]]


def test_selection_checks_count_the_candidate_fits():
    # 5 taps from 29 layers: 29 + 28 + 27 + 26 + 25 fits, the first step's 29 from the ranking.
    assert selection_checks(5, 29, first_known=False) == 135
    assert selection_checks(5, 29, first_known=True) == 106
