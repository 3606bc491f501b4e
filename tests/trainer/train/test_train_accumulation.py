"""Gradient accumulation is exact: four micro-batches of one sample accumulated give the loss and
the gradients of one micro-batch of four, and the optimizer step applies the same update."""

from __future__ import annotations

import pytest
import torch
from train_support import one_rank, single_thread, tiny_run

from specdraft.config import validate_config


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a (possibly sharded) parameter or gradient."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def one_window(config, ctx):
    """Loss, gradients and the applied update of the first optimizer window of a run."""
    from specdraft.trainer.train.assembly import build_trainer
    from specdraft.trainer.train.metrics import PerfClock

    trainer = build_trainer(config, ctx, progress=False)
    # Plain SGD with lr 1: the parameter change is exactly the gradient the trainer stepped with.
    trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)
    trainer.scheduler = torch.optim.lr_scheduler.ConstantLR(trainer.optimizer, factor=1.0)
    window = next(trainer.source.windows(0, 0))
    packed, _, samples = trainer.forward_backward(window, trainer.spec, PerfClock(ctx.device))
    numerator, denominator = packed.tolist()
    names = [n for n, p in trainer.model.named_parameters() if p.grad is not None]
    params = dict(trainer.model.named_parameters())
    grads = {n: full(params[n].grad).clone() / denominator for n in names}
    before = {n: full(params[n]).detach().clone() for n in names}
    trainer.optimizer_step(packed[1])
    update = {n: before[n] - full(params[n]).detach() for n in names}
    trainer.writer.close()
    supervised = [int(batch["loss_mask"].sum()) for batch in window]
    return supervised, samples, numerator / denominator, grads, update


@pytest.mark.parametrize("backend", ["fsdp2", "fsdp1"])
def test_accumulating_four_micro_batches_equals_one_batch_of_four(
    tiny_target_path, tmp_path, backend
):
    base = tiny_run(
        tiny_target_path,
        tmp_path,
        data={"max_samples": 4},
        # No clipping, so the update is the raw token-weighted mean gradient.
        training={"backend": backend, "max_grad_norm": 0.0, "static_shapes": True},
    )
    accumulated = validate_config(
        {**base, "training": {**base["training"], "micro_batch_size": 1, "grad_accum_steps": 4}}
    )
    one_batch = validate_config(
        {**base, "training": {**base["training"], "micro_batch_size": 4, "grad_accum_steps": 1}}
    )
    with one_rank() as ctx:
        micro_a, samples_a, loss_a, grads_a, update_a = one_window(accumulated, ctx)
        micro_b, samples_b, loss_b, grads_b, update_b = one_window(one_batch, ctx)

    assert len(micro_a) == 4 and micro_b == [sum(micro_a)]
    # Samples of different lengths: a mean of per-micro-batch means would differ from the exact
    # token-weighted mean, so equal results mean exact accumulation.
    assert len(set(micro_a)) > 1
    assert samples_a == samples_b == 4
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 5
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-7, msg=name)
        torch.testing.assert_close(update_a[name], grads_a[name], rtol=1e-4, atol=1e-7, msg=name)
        torch.testing.assert_close(update_b[name], grads_b[name], rtol=1e-4, atol=1e-7, msg=name)
