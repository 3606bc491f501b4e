"""The fast objectives against the old formulas kept in bench/objective_speed.py.

The package computes the logits as one contiguous mm with a fused cross-entropy, and skips the
work a zero weight discards (the DFlash2 selector, DSpark's target distribution). Here the same
fp32 draft, head and batch go through both implementations: sums, metrics and gradients must
agree to 1e-6, and a skipped path must really skip (its inputs are poisoned or its helper
raises) while the loss stays that of the old code doing the work.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from specdraft.trainer.models import (
    DraftTrainSpec,
    build_draft,
    load_target_config,
    load_target_head,
)

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import objective_speed  # noqa: E402  (the bench script holds the old implementations)

TOL = {"rtol": 1e-6, "atol": 1e-6}
SELECTOR_METRICS = (
    "selector_weighted_ce",
    "selector_recall_hits",
    "selector_count",
    "selector_correct",
)
TARGET_METRICS = ("l1_sum", "accept_sum")


@pytest.fixture
def case(tiny_qwen3_target, draft_model_config, make_draft_batch, random_samples):
    """Factory: (draft, head, batch, spec, targets, hidden leaf) in fp32; 2 samples, 3 chunks."""

    def make(algorithm: str, **overrides):
        torch.manual_seed(11)
        cfg = draft_model_config(algorithm, **overrides)
        draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
        # Random (not identity) weights everywhere, so every gradient is non-trivial.
        with torch.no_grad():
            for param in draft.parameters():
                param.normal_(0.0, 0.3)
        head = load_target_head(cfg.target, torch.float32)
        batch = make_draft_batch(random_samples([29, 21], seed=4), 32)
        # Two samples and chunks of 2 of the 6 blocks: every chunk is a strided slice.
        spec = DraftTrainSpec(num_anchors=6, loss_decay_gamma=4.0, logits_chunk_blocks=2)
        targets = draft.place_blocks(batch, spec)
        hidden = draft.run_backbone(
            batch["input_ids"], batch["hidden_states"], targets.anchors, targets.keep, head, "sdpa"
        )
        return draft, head, batch, spec, targets, hidden.detach().requires_grad_(True)

    return make


def _loss_and_grads(draft, hidden, loss):
    """(numerator, metrics, {name: grad or None}, grad of the hidden states)."""
    params = dict(draft.named_parameters())
    grads = torch.autograd.grad(
        loss.numerator, [hidden, *params.values()], allow_unused=True, retain_graph=False
    )
    return grads[0], dict(zip(params, grads[1:], strict=True))


def _compare(draft, head, batch, spec, targets, hidden, *, skipped_params=()):
    """New objective vs the old one: sums, shared metrics and gradients to 1e-6."""
    new = draft.objective(hidden, targets, batch, head, spec)
    old = objective_speed.old_objective(draft, hidden, targets, batch, head, spec)
    torch.testing.assert_close(new.numerator, old.numerator, **TOL)
    torch.testing.assert_close(new.denominator, old.denominator, rtol=0, atol=0)
    for key, value in new.metrics.items():
        torch.testing.assert_close(value, old.metrics[key], **TOL, msg=key)
    new_hidden_grad, new_grads = _loss_and_grads(draft, hidden, new)
    old_hidden_grad, old_grads = _loss_and_grads(draft, hidden, old)
    torch.testing.assert_close(new_hidden_grad, old_hidden_grad, **TOL)
    assert new_hidden_grad.abs().sum() > 0
    for name, want in old_grads.items():
        got = new_grads[name]
        if name.startswith(skipped_params):
            # Skipped work: no gradient at all, where the old code produced exact zeros.
            assert got is None, name
            assert want is None or torch.count_nonzero(want) == 0, name
        elif want is None:
            assert got is None, name
        else:
            torch.testing.assert_close(got, want, **TOL, msg=name)
    return new, old


@pytest.mark.parametrize("policy", ["exclude", "insert"])
def test_dflash2_fast_objective_equals_the_old_formula(case, policy):
    draft, *rest = case("dflash2", dflash2={"selector_gold_policy": policy})
    new, old = _compare(draft, *rest)
    assert set(new.metrics) == set(old.metrics)
    assert new.metrics["selector_count"] > 0


@pytest.mark.parametrize(
    ("markov_type", "confidence", "with_markov", "l1_weight"),
    [
        ("vanilla", True, False, 0.9),
        ("gated", True, True, 0.9),
        ("rnn", False, False, 0.9),
        # l1_weight 0 but the confidence head on: its acceptance target still needs the target.
        ("vanilla", True, False, 0.0),
    ],
)
def test_dspark_fast_objective_equals_the_old_formula(
    case, markov_type, confidence, with_markov, l1_weight
):
    draft, *rest = case(
        "dspark",
        dspark={
            "markov_type": markov_type,
            "confidence_head": confidence,
            "confidence_uses_markov": with_markov,
            "l1_weight": l1_weight,
        },
    )
    new, old = _compare(draft, *rest)
    assert set(new.metrics) == set(old.metrics)
    assert new.metrics["l1_sum"] > 0


def test_zero_selector_weight_skips_the_selector_without_changing_the_loss(case, monkeypatch):
    draft, head, batch, spec, targets, hidden = case(
        "dflash2", dflash2={"selector_gold_policy": "insert", "selector_loss_weight": 0.0}
    )
    # The old code (bench reference) does the selector work, times 0.
    old = objective_speed.old_objective(draft, hidden, targets, batch, head, spec)
    assert old.metrics["selector_count"] > 0

    def no_top_k(*args, **kwargs):
        raise AssertionError("the selector's top-k ran although its loss weight is 0")

    monkeypatch.setattr("specdraft.trainer.models.dflash2.model.candidate_set", no_top_k)
    new, _ = _compare(
        draft, head, batch, spec, targets, hidden, skipped_params=("candidate_selector.",)
    )
    # Metrics that need the selector are left out (not zeros); the rest are unchanged.
    assert not set(SELECTOR_METRICS) & set(new.metrics)
    assert set(new.metrics) == set(old.metrics) - set(SELECTOR_METRICS)


def test_zero_l1_weight_without_confidence_head_skips_the_target_distribution(case):
    draft, head, batch, spec, targets, hidden = case(
        "dspark", dspark={"l1_weight": 0.0, "confidence_head": False}
    )
    old = objective_speed.old_objective(draft, hidden, targets, batch, head, spec)
    # Poisoned target states: any use of them would turn the sums or gradients into NaN.
    poisoned = {
        **batch,
        "target_last_hidden_states": torch.full_like(
            batch["target_last_hidden_states"], float("nan")
        ),
    }
    new = draft.objective(hidden, targets, poisoned, head, spec)
    assert torch.isfinite(new.numerator)
    torch.testing.assert_close(new.numerator, old.numerator, **TOL)
    assert not set(TARGET_METRICS) & set(new.metrics)
    assert set(new.metrics) == set(old.metrics) - set(TARGET_METRICS)
    assert new.metrics["confidence_bce_sum"] == 0
    # And with the real target states, the fast path matches the old one in gradients too.
    _compare(draft, head, batch, spec, targets, hidden)


def test_fast_logits_path_equals_the_strided_head_and_logsumexp(tiny_qwen3_target):
    head = load_target_head(tiny_qwen3_target.path, torch.float32)
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 5, 4, 32, generator=generator, requires_grad=True)
    labels = torch.randint(0, tiny_qwen3_target.vocab_size, (3, 5, 3), generator=generator)
    old = objective_speed.old_logits_ce(hidden, labels, head)
    (old_grad,) = torch.autograd.grad(old, hidden)
    new = objective_speed.new_logits_ce(hidden, labels, head)
    (new_grad,) = torch.autograd.grad(new, hidden)
    torch.testing.assert_close(new, old, **TOL)
    torch.testing.assert_close(new_grad, old_grad, **TOL)
    assert old_grad[:, :, 0].abs().sum() == 0  # the anchor slot is not predicted


def test_bench_prints_a_before_after_row_for_every_case(tmp_path, capsys):
    out = tmp_path / "speed.md"
    assert (
        objective_speed.main(
            ["--sizes", "toy", "--rounds", "1", "--warmup", "0", "--out", str(out)]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert out.read_text().strip() == printed.strip()
    rows = [line for line in printed.splitlines() if line.startswith("| toy |")]
    expected = [f"objective: {name}" for name, _, _ in objective_speed.CASES]
    assert [row.split(" | ")[1] for row in rows] == [*expected, "logits path (head + CE)"]
    for row in rows:
        cells = row.split(" | ")[2:5]
        before, after, ratio = (float(cell) for cell in cells)
        assert before > 0 and after > 0
        # Cells are rounded: the ratio must lie within what the rounded times allow (at toy
        # size a time may be a few thousandths of a millisecond, so a fixed relative tolerance
        # would fail on rounding alone).
        half_before, half_after, half_ratio = (_half_unit(cell) for cell in cells)
        low = (after - half_after) / (before + half_before)
        high = (after + half_after) / max(before - half_before, 1e-12)
        assert low - half_ratio <= ratio <= high + half_ratio, (row, low, high)


def _half_unit(cell: str) -> float:
    """Half a unit in the last printed decimal of a table cell."""
    decimals = len(cell.strip().partition(".")[2])
    return 0.5 * 10.0**-decimals


def test_bench_rejects_an_unknown_size(capsys):
    assert objective_speed.main(["--sizes", "huge"]) == 2
    assert "--sizes: unknown ['huge']" in capsys.readouterr().err
