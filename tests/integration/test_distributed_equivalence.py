"""One process vs FSDP1 x2 vs FSDP2 x2, and the three pad policies, on the same data and seed.

The global batch is the same everywhere: one rank accumulating 4 micro-batches, or two ranks
accumulating 2 each; the sampler deals every optimizer window from the same slice of the seeded
permutation, and the loss is the exact token-weighted mean of the window. So the loss curves
agree up to float summation order. Observed on CPU (fp32, 4 steps): identical to 1e-7 relative;
the tolerance below leaves an order of magnitude or two for other BLAS builds.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from backend_runs import run_probe, write_config, write_conversations

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

LOSS_RTOL = 1e-5
GRAD_NORM_RTOL = 1e-4
NUM_DRAFT_LAYERS = 2  # write_config's draft: FSDP units = 2 blocks + the root
DRAFT_VOCAB = 512  # model.draft_vocab_size of the draft-vocabulary runs


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The data and config shared by every run of this module."""
    folder = tmp_path_factory.mktemp("equivalence")
    data = write_conversations(folder / "data" / "conversations.jsonl")
    return folder, write_config(folder, data)


@pytest.fixture(scope="module")
def one_process(setup):
    """World 1, accumulation 4: buckets, fixed length, pad to longest, and buckets with a draft
    vocabulary (one process, 4 fits)."""
    folder, config = setup
    sets = {
        "buckets": [],
        "static": ["training.static_shape_buckets=[]"],
        "longest": ["training.static_shapes=false", "training.static_shape_buckets=[]"],
        "vocab": [f"model.draft_vocab_size={DRAFT_VOCAB}"],
    }
    runs = [[*extra, f"output_dir={folder / name}"] for name, extra in sets.items()]
    return dict(zip(sets, run_probe(1, config, runs), strict=True))


@pytest.fixture(scope="module")
def two_ranks(setup):
    """World 2, accumulation 2, buckets: FSDP1, FSDP2, FSDP1 in bf16, FSDP1 without clipping, and
    FSDP1 / FSDP2 with a draft vocabulary (one group, 6 fits)."""
    folder, config = setup
    sets = {
        "fsdp1": ["training.backend=fsdp1"],
        "fsdp2": ["training.backend=fsdp2"],
        "fsdp1-bf16": ["training.backend=fsdp1", 'training.mixed_precision="bf16"'],
        "fsdp1-noclip": ["training.backend=fsdp1", "training.max_grad_norm=0.0"],
        "fsdp1-vocab": ["training.backend=fsdp1", f"model.draft_vocab_size={DRAFT_VOCAB}"],
        "fsdp2-vocab": ["training.backend=fsdp2", f"model.draft_vocab_size={DRAFT_VOCAB}"],
    }
    runs = [
        [*extra, "training.grad_accum_steps=2", f"output_dir={folder / name}"]
        for name, extra in sets.items()
    ]
    return dict(zip(sets, run_probe(2, config, runs), strict=True))


def assert_close_curves(got: list[float], want: list[float], rtol: float, what: str) -> None:
    assert len(got) == len(want) == 4, (what, got, want)
    for step, (a, b) in enumerate(zip(got, want, strict=True), start=1):
        assert math.isclose(a, b, rel_tol=rtol), f"{what} differs at step {step}: {a} vs {b}"


@pytest.mark.parametrize("backend", ["fsdp1", "fsdp2"])
def test_two_ranks_follow_the_one_process_loss_curve(one_process, two_ranks, backend):
    reference, run = one_process["buckets"], two_ranks[backend]
    assert_close_curves(run["loss_weight"], reference["loss_weight"], 1e-6, "loss weight")
    assert_close_curves(run["loss"], reference["loss"], LOSS_RTOL, f"{backend} x2 loss")
    assert_close_curves(
        run["grad_norm"], reference["grad_norm"], GRAD_NORM_RTOL, f"{backend} x2 grad norm"
    )


@pytest.mark.parametrize("backend", ["fsdp1", "fsdp2"])
def test_gradients_are_reduced_once_per_optimizer_step(two_ranks, backend):
    # Two micro-batches per window: without no_sync (FSDP1) or set_requires_gradient_sync
    # (FSDP2) on the first one, every unit would reduce-scatter twice per step.
    run = two_ranks[backend]
    assert run["reduce_scatters"] == run["steps"] * (NUM_DRAFT_LAYERS + 1)


def test_the_logged_gradient_norm_is_global_with_clipping_off(one_process, two_ranks):
    # max_grad_norm = 0 clips nothing, but the logged norm must still be the norm of the whole
    # gradient, not of this rank's shard: step 1 (before any update) equals one process's.
    run, reference = two_ranks["fsdp1-noclip"], one_process["buckets"]
    assert math.isclose(run["grad_norm"][0], reference["grad_norm"][0], rel_tol=GRAD_NORM_RTOL)
    assert_close_curves(run["loss_weight"], reference["loss_weight"], 1e-6, "loss weight")


def test_pad_policies_give_the_same_loss(one_process):
    buckets, static, longest = (one_process[k] for k in ("buckets", "static", "longest"))
    # The policies really padded differently (otherwise the comparison proves nothing).
    seen = {
        name: {n for lengths in run["pad_lengths"] for n in lengths}
        for name, run in one_process.items()
    }
    assert seen["static"] == {256}
    assert seen["buckets"] == {128, 256}
    assert seen["longest"] - {128, 256}
    for name, run in (("static", static), ("pad-to-longest", longest)):
        assert_close_curves(run["loss"], buckets["loss"], LOSS_RTOL, f"{name} loss")


@pytest.mark.parametrize("name", ["fsdp1", "fsdp2", "fsdp1-bf16"])
def test_the_frozen_head_stays_out_of_sharding_and_untouched(two_ranks, name):
    run = two_ranks[name]
    assert not run["head_in_model"]
    assert not run["head_trainable"]
    assert run["head_unchanged"]


def test_fsdp1_bf16_trains_close_to_fp32(two_ranks):
    bf16, fp32 = two_ranks["fsdp1-bf16"], two_ranks["fsdp1"]
    assert all(math.isfinite(loss) for loss in bf16["loss"])
    # Step 1 is before any update: only bf16 rounding separates the two.
    assert math.isclose(bf16["loss"][0], fp32["loss"][0], rel_tol=2e-2)


@pytest.mark.parametrize("backend", ["fsdp1", "fsdp2"])
def test_a_draft_vocabulary_trains_the_same_sharded(setup, one_process, two_ranks, backend):
    from safetensors.torch import load_file

    from specdraft.config import load_config
    from specdraft.trainer.models import load_target_head

    reference, run = one_process["vocab"], two_ranks[f"{backend}-vocab"]
    # The vocabulary really changes the objective: another loss than the full vocabulary's.
    assert not math.isclose(reference["loss"][0], one_process["buckets"]["loss"][0], rel_tol=1e-3)
    assert_close_curves(run["loss_weight"], reference["loss_weight"], 1e-6, "loss weight")
    assert_close_curves(run["loss"], reference["loss"], LOSS_RTOL, f"{backend} x2 vocab loss")
    # The draft's own head (the target's rows of its tokens) stays frozen under sharding.
    folder, config = setup
    last = sorted((folder / f"{backend}-vocab" / "checkpoints").glob("step-*"))[-1]
    weights = load_file(str(last / "model.safetensors"))
    ids = json.loads((last / "config.json").read_text())["draft_vocab_ids"]
    head = load_target_head(load_config(config).model.target, torch.float32)
    assert len(ids) == DRAFT_VOCAB
    assert torch.equal(weights["lm_head.weight"], head.lm_head.weight[ids])
