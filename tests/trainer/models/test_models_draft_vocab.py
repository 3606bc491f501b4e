"""A draft vocabulary (model.draft_vocab_size): exact when it keeps every token, and a pruned one
trains over its own ids, never proposes a token outside them and counts such labels as misses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdraft.trainer.models import (
    DraftTrainSpec,
    build_draft,
    load_target_config,
    load_target_head,
)
from specdraft.trainer.models.draft_vocab import d2t_offsets, t2d_mask

FAMILIES = [
    ("dflash", {}),
    ("dflash2", {"dflash2": {"selector_gold_policy": "insert"}}),
    ("dflash2", {"dflash2": {"selector_gold_policy": "exclude"}}),
    ("dspark", {"dspark": {"markov_type": "vanilla"}}),
    ("dspark", {"dspark": {"markov_type": "rnn", "confidence_uses_markov": True}}),
]
SPEC = DraftTrainSpec(num_anchors=6, loss_decay_gamma=4.0, logits_chunk_blocks=4)


def _pair(draft_model_config, algorithm, overrides, ids):
    """A full-vocabulary draft and a draft-vocabulary one with the same backbone weights."""
    full_cfg = draft_model_config(algorithm, **overrides)
    target_config = load_target_config(full_cfg.target)
    head = load_target_head(full_cfg.target, torch.float32)
    torch.manual_seed(0)
    full = build_draft(full_cfg, target_config, dtype=torch.float32)
    cfg = draft_model_config(algorithm, draft_vocab_size=len(ids), **overrides)
    pruned = build_draft(cfg, target_config, dtype=torch.float32, draft_vocab=ids)
    pruned.init_draft_head(head)
    state = {k: v for k, v in full.state_dict().items() if "markov_w2" not in k}
    missing, unexpected = pruned.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight", "markov_head.markov_w2.weight"}
    if hasattr(full, "markov_head"):
        with torch.no_grad():
            pruned.markov_head.markov_w2.weight.copy_(full.markov_head.markov_w2.weight[list(ids)])
    return full, pruned, head


def _anchors(batch):
    anchors = torch.tensor([[2, 5, 9, 14, 20, 25]] * batch["input_ids"].shape[0])
    return anchors, torch.ones_like(anchors, dtype=torch.bool)


@pytest.mark.parametrize(("algorithm", "overrides"), FAMILIES)
def test_a_vocabulary_of_every_token_is_the_full_vocabulary(
    algorithm, overrides, draft_model_config, make_draft_batch, random_samples, tiny_qwen3_target
):
    ids = tuple(range(tiny_qwen3_target.vocab_size))
    full, pruned, head = _pair(draft_model_config, algorithm, overrides, ids)
    batch = make_draft_batch(random_samples([30, 24], seed=3), 32)
    anchors, keep = _anchors(batch)
    a = full.forward_with_anchors(batch, anchors, keep, head, SPEC)
    b = pruned.forward_with_anchors(batch, anchors, keep, head, SPEC)
    torch.testing.assert_close(b.numerator, a.numerator)
    torch.testing.assert_close(b.denominator, a.denominator)
    assert a.metrics.keys() == b.metrics.keys()
    for name in a.metrics:
        torch.testing.assert_close(b.metrics[name], a.metrics[name], msg=name)
    predicted = (full.predict_blocks, pruned.predict_blocks)
    args = (batch["input_ids"], batch["hidden_states"], anchors, keep, head)
    assert torch.equal(predicted[0](*args), predicted[1](*args))


@pytest.mark.parametrize(("algorithm", "overrides"), FAMILIES)
def test_a_pruned_vocabulary_never_proposes_or_credits_a_token_outside_it(
    algorithm, overrides, draft_model_config, make_draft_batch, random_samples, tiny_qwen3_target
):
    batch = make_draft_batch(random_samples([30, 24], seed=5), 32)
    # Every other token: about half of the labels fall outside.
    ids = tuple(range(0, tiny_qwen3_target.vocab_size, 2))
    full, pruned, head = _pair(draft_model_config, algorithm, overrides, ids)
    anchors, keep = _anchors(batch)
    a = full.forward_with_anchors(batch, anchors, keep, head, SPEC)
    b = pruned.forward_with_anchors(batch, anchors, keep, head, SPEC)
    # The same supervised positions are counted; none outside the vocabulary is correct.
    torch.testing.assert_close(b.metrics["count_per_pos"], a.metrics["count_per_pos"])
    assert torch.isfinite(b.numerator) and b.denominator > 0
    labels = batch["input_ids"]
    odd = labels % 2 == 1
    assert odd.any() and (~odd).any()
    proposals = pruned.predict_blocks(
        batch["input_ids"], batch["hidden_states"], anchors, keep, head
    )
    assert bool((proposals[proposals >= 0] % 2 == 0).all())
    # The loss trains: a backward reaches the draft's weights but not its frozen head.
    b.numerator.backward()
    assert pruned.fc.weight.grad is not None and pruned.lm_head.weight.grad is None


def test_the_dflash_loss_is_the_cross_entropy_over_the_draft_ids(
    draft_model_config, make_draft_batch, random_samples, tiny_qwen3_target
):
    batch = make_draft_batch(random_samples([30, 24], seed=9), 32)
    ids = tuple(range(0, tiny_qwen3_target.vocab_size, 3))
    _, pruned, head = _pair(draft_model_config, "dflash", {}, ids)
    anchors, keep = _anchors(batch)
    out = pruned.forward_with_anchors(batch, anchors, keep, head, SPEC)
    # By hand: logits of the kept head rows, labels mapped to draft ids, outside labels dropped.
    targets = pruned.blocks_at(batch, anchors, keep)
    hidden = pruned.run_backbone(
        batch["input_ids"], batch["hidden_states"], anchors, keep, head, "sdpa"
    )
    logits = hidden[:, :, 1:] @ head.lm_head.weight[list(ids)].t()
    gold = targets.gold[:, :, 1 : pruned.block_size]
    supervised = targets.supervised[:, :, 1 : pruned.block_size]
    inside = gold % 3 == 0
    decay = torch.exp(-torch.arange(pruned.block_size - 1) / SPEC.loss_decay_gamma)
    weights = (supervised & inside).float() * decay
    ce = F.cross_entropy(logits.flatten(0, 2), (gold // 3).flatten(), reduction="none")
    torch.testing.assert_close(out.numerator, (ce * weights.flatten()).sum())
    torch.testing.assert_close(out.denominator, weights.sum())
    assert out.metrics["count"] == supervised.sum()
    correct = (logits.argmax(-1) == gold // 3) & supervised & inside
    assert out.metrics["correct"] == correct.sum()


def test_the_dspark_markov_head_shrinks_with_the_vocabulary(draft_model_config, tiny_qwen3_target):
    ids = tuple(range(0, tiny_qwen3_target.vocab_size, 4))
    _, pruned, _ = _pair(draft_model_config, "dspark", {"dspark": {"markov_type": "vanilla"}}, ids)
    assert pruned.markov_head.markov_w2.weight.shape[0] == len(ids)
    # The previous token is any target token: its embedding keeps the target's rows.
    assert pruned.markov_head.markov_w1.weight.shape[0] == tiny_qwen3_target.vocab_size


def test_the_engines_maps_agree_with_the_draft_ids():
    ids = (0, 3, 4, 10)
    offsets = d2t_offsets(ids)
    assert (torch.arange(len(ids)) + offsets).tolist() == list(ids)  # vLLM: target = i + d2t[i]
    mask = t2d_mask(ids, 12)
    assert mask.sum() == len(ids) and torch.nonzero(mask).flatten().tolist() == list(ids)


def test_a_config_that_lists_other_ids_than_its_size_is_refused(draft_model_config):
    cfg = draft_model_config("dflash", draft_vocab_size=4)
    with pytest.raises(ValueError, match="draft_vocab_ids holds 3 tokens"):
        build_draft(cfg, load_target_config(cfg.target), draft_vocab=(1, 2, 3))
