"""Padding is inert: the same samples padded to longest, a bucket or max_length, and computing any
anchor width that holds their anchors (the batch's largest count, an anchor bucket, num_anchors),
train the same."""

from __future__ import annotations

import pytest
import torch

from specdraft.collate import ANCHOR_WIDTH, anchor_counts
from specdraft.config import ShapePolicy
from specdraft.trainer.models import (
    DraftTrainSpec,
    build_draft,
    load_target_config,
    load_target_head,
)

LENGTHS = [23, 17, 9]
PAD_LENGTHS = [23, 32, 128]  # longest, a bucket, max_length
# random_samples gives these lengths 15, 10 and 6 valid anchors: the batch's largest count is 15.
LARGEST_COUNT = 15
NUM_ANCHORS = 24
WIDTHS = [LARGEST_COUNT, 16, 20, NUM_ANCHORS]  # exactly the count, two anchor buckets, the max


def _draft(algorithm, draft_model_config, **overrides):
    torch.manual_seed(0)
    cfg = draft_model_config(algorithm, **overrides)
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
    return draft, load_target_head(cfg.target, torch.float32)


def _run(draft, head, batch, spec):
    draft.zero_grad(set_to_none=True)
    out = draft(batch, head, spec)
    out.numerator.backward()
    grads = {name: p.grad.clone() for name, p in draft.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize(
    ("algorithm", "overrides"),
    [
        ("dflash", {}),
        ("dflash2", {"dflash2": {"selector_gold_policy": "insert"}}),
        ("dflash2", {"dflash2": {"selector_gold_policy": "exclude"}}),
        ("dspark", {"dspark": {"markov_type": "rnn", "confidence_uses_markov": True}}),
        ("dspark", {}),
    ],
)
def test_same_samples_padded_differently_give_same_loss_and_gradients(
    algorithm, overrides, draft_model_config, make_draft_batch, random_samples
):
    draft, head = _draft(algorithm, draft_model_config, **overrides)
    samples = random_samples(LENGTHS, seed=1)
    spec = DraftTrainSpec(num_anchors=8, loss_decay_gamma=4.0, logits_chunk_blocks=3, seed=9)
    results = [_run(draft, head, make_draft_batch(samples, pad), spec) for pad in PAD_LENGTHS]
    (reference, reference_grads), *others = results
    assert reference.denominator > 0
    assert len(reference_grads) == len(list(draft.parameters()))
    for out, grads in others:
        torch.testing.assert_close(out.numerator, reference.numerator, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.denominator, reference.denominator)
        for key, value in reference.metrics.items():
            torch.testing.assert_close(out.metrics[key], value, rtol=1e-5, atol=1e-5)
        assert grads.keys() == reference_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, reference_grads[name], rtol=1e-4, atol=1e-6)


ALGORITHMS = [
    ("dflash", {}),
    ("dflash2", {"dflash2": {"selector_gold_policy": "insert"}}),
    ("dspark", {"dspark": {"markov_type": "rnn", "confidence_uses_markov": True}}),
]


@pytest.mark.parametrize(("algorithm", "overrides"), ALGORITHMS)
def test_every_anchor_width_that_holds_the_anchors_gives_same_loss_and_gradients(
    algorithm, overrides, draft_model_config, make_draft_batch, random_samples
):
    draft, head = _draft(algorithm, draft_model_config, **overrides)
    samples = random_samples(LENGTHS, seed=1)
    spec = DraftTrainSpec(
        num_anchors=NUM_ANCHORS, loss_decay_gamma=4.0, logits_chunk_blocks=3, seed=9
    )
    # The host-side count the collator uses, on the real masks: the widths below all hold it.
    counts = anchor_counts(make_draft_batch(samples, PAD_LENGTHS[0])["loss_mask"])
    assert max(counts) == LARGEST_COUNT
    policy = ShapePolicy(pad_to=(32, 128), num_anchors=NUM_ANCHORS, anchor_buckets=(16, 20, 24))
    assert policy.anchor_width(max(counts)) == 16
    # Reference: no width key (num_anchors blocks), padded to the longest sample.
    reference, reference_grads = _run(draft, head, make_draft_batch(samples, 23), spec)
    assert reference.denominator > 0
    for pad in PAD_LENGTHS:  # with and without length padding
        for width in WIDTHS:
            batch = {**make_draft_batch(samples, pad), ANCHOR_WIDTH: width}
            assert draft.place_blocks(batch, spec).anchors.shape == (len(LENGTHS), width)
            out, grads = _run(draft, head, batch, spec)
            torch.testing.assert_close(out.numerator, reference.numerator, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out.denominator, reference.denominator)
            assert out.metrics.keys() == reference.metrics.keys()
            for key, value in reference.metrics.items():
                torch.testing.assert_close(out.metrics[key], value, rtol=1e-5, atol=1e-5)
            assert grads.keys() == reference_grads.keys()
            for name, grad in grads.items():
                torch.testing.assert_close(grad, reference_grads[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("algorithm", "overrides"), ALGORITHMS)
def test_a_width_below_the_largest_count_would_drop_anchors(
    algorithm, overrides, draft_model_config, make_draft_batch, random_samples
):
    # Why the width must come from the loss masks: one slot too few loses supervised blocks.
    draft, head = _draft(algorithm, draft_model_config, **overrides)
    samples = random_samples(LENGTHS, seed=1)
    spec = DraftTrainSpec(num_anchors=NUM_ANCHORS, loss_decay_gamma=4.0, seed=9)
    batch = make_draft_batch(samples, 32)
    with torch.no_grad():
        full = draft(batch, head, spec)
        short = draft({**batch, ANCHOR_WIDTH: LARGEST_COUNT - 1}, head, spec)
    assert short.denominator < full.denominator


@pytest.mark.parametrize("algorithm", ["dflash", "dflash2", "dspark"])
def test_context_at_or_after_every_anchor_is_invisible(
    algorithm, draft_model_config, make_draft_batch, random_samples
):
    draft, head = _draft(algorithm, draft_model_config)
    batch = make_draft_batch(random_samples(LENGTHS, seed=2), 32)
    spec = DraftTrainSpec(num_anchors=4, loss_decay_gamma=4.0)
    targets = draft.place_blocks(batch, spec)
    with torch.no_grad():
        before = draft(batch, head, spec)
        noisy = batch["hidden_states"].clone()
        for row in range(noisy.shape[0]):
            last_anchor = int(targets.anchors[row][targets.keep[row]].max())
            noisy[row, last_anchor:] += 50.0 * torch.randn_like(noisy[row, last_anchor:])
        after = draft({**batch, "hidden_states": noisy}, head, spec)
    assert torch.equal(before.numerator, after.numerator)


@pytest.mark.parametrize("algorithm", ["dflash", "dflash2", "dspark"])
def test_a_sample_without_valid_anchor_contributes_zero_weight(
    algorithm, draft_model_config, make_draft_batch, random_samples
):
    draft, head = _draft(algorithm, draft_model_config)
    samples = random_samples([20, 20], seed=4)
    lonely = torch.tensor([0, 1] * 10)  # no two consecutive supervised tokens
    samples[1] = (samples[1][0], lonely, samples[1][2])
    spec = DraftTrainSpec(num_anchors=4, loss_decay_gamma=4.0)
    both, _ = _run(draft, head, make_draft_batch(samples, 24), spec)
    alone, _ = _run(draft, head, make_draft_batch(samples[:1], 24), spec)
    torch.testing.assert_close(both.numerator, alone.numerator)
    assert both.denominator == alone.denominator
    # A batch with nothing to learn: zero sums, finite (zero) gradients, no error.
    empty, grads = _run(draft, head, make_draft_batch(samples[1:], 24), spec)
    assert empty.numerator.item() == 0.0 and empty.denominator.item() == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in grads.values())
