"""The draft step's FLOP formula equals torch's FLOP counter on the tiny config, every family.

With SDPA's math kernel every product of the step is an aten mm/bmm/addmm the counter sees, so
the formula's model FLOPs plus its recomputed (checkpointed objective) FLOPs must equal the
counter's total exactly (tolerance 0: both are integer counts of the same products).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from specdraft.collate import ANCHOR_WIDTH
from specdraft.trainer.models import (
    DraftTrainSpec,
    build_draft,
    load_target_config,
    load_target_head,
)
from specdraft.trainer.train.flops import FlopMeter, micro_batch_flops, window_flops
from specdraft.trainer.train.peak import Peak, resolve_peak, table_peak

CASES = [
    ("dflash", {}),
    ("dflash2", {}),
    ("dflash2", {"dflash2": {"selector_loss_weight": 0.0}}),
    ("dspark", {}),
    ("dspark", {"dspark": {"markov_type": "gated", "l1_weight": 0.0, "confidence_head": False}}),
    ("dspark", {"dspark": {"markov_type": "rnn", "confidence_uses_markov": True}}),
]


def counted_step(draft, head, batch, spec) -> int:
    """FLOPs torch counts for one training forward + backward."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        draft(batch, head, spec).numerator.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize(("algorithm", "overrides"), CASES)
def test_the_formula_counts_what_torch_counts(
    algorithm, overrides, draft_model_config, make_draft_batch, random_samples
):
    torch.manual_seed(0)
    cfg = draft_model_config(algorithm, **overrides)
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
    head = load_target_head(cfg.target, torch.float32)
    batch = make_draft_batch(random_samples([30, 24, 18], seed=3), 32)
    # 6 anchors in chunks of 4 blocks: the first chunk checkpointed, the last (partial) not.
    spec = DraftTrainSpec(num_anchors=6, loss_decay_gamma=4.0, logits_chunk_blocks=4)
    flops = micro_batch_flops(draft.config, 3, 32, 6, chunk_blocks=4)
    assert flops.model + flops.recomputed == counted_step(draft, head, batch, spec)


def test_a_window_adds_its_micro_batches_at_their_own_shapes(draft_model_config):
    cfg = draft_model_config("dflash2")
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32, device="meta")
    config = draft.config
    short = {"input_ids": torch.zeros(2, 16, dtype=torch.long), ANCHOR_WIDTH: 3}
    long = {"input_ids": torch.zeros(4, 64, dtype=torch.long)}  # no width: num_anchors
    total = window_flops(config, [short, long], num_anchors=8)
    expected = micro_batch_flops(config, 2, 16, 3).model + micro_batch_flops(config, 4, 64, 8).model
    assert total.model == expected
    # The count grows with every dimension of the shapes.
    assert micro_batch_flops(config, 2, 17, 3).model > micro_batch_flops(config, 2, 16, 3).model


def test_the_meter_logs_rate_and_mfu_against_the_peak(draft_model_config):
    cfg = draft_model_config("dspark")
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
    meter = FlopMeter.for_model(draft, 2.0, "cpu")
    assert meter.peak == Peak(2.0, "tracking.peak_tflops")
    meter.count([{"input_ids": torch.zeros(2, 32, dtype=torch.long)}], num_anchors=4)
    metrics = meter.metrics(0.5)
    model = micro_batch_flops(draft.config, 2, 32, 4).model
    assert metrics["perf/model_tflops_per_s"] == pytest.approx(model / 0.5 / 1e12)
    assert metrics["perf/mfu"] == pytest.approx(metrics["perf/model_tflops_per_s"] / 2.0)
    # A model without a draft config (a test double) logs no FLOP metrics at all.
    assert FlopMeter.for_model(torch.nn.Linear(2, 2), None, "cpu").metrics(1.0) == {}


def test_known_gpus_have_their_dense_bf16_peak_and_the_cpu_is_probed():
    assert table_peak("NVIDIA H100 80GB HBM3") == 989.0
    assert table_peak("NVIDIA H100 PCIe") == 756.0
    assert table_peak("NVIDIA H200") == 989.0
    assert table_peak("NVIDIA B200") == 2250.0
    assert table_peak("NVIDIA A100-SXM4-80GB") == 312.0
    assert table_peak("Some Future GPU") is None
    probed = resolve_peak(None, "cpu")
    assert probed.source.endswith("GEMM probe") and probed.tflops > 0
    assert resolve_peak(None, "cpu") == probed  # measured once per process
