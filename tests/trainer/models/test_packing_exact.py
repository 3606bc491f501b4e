"""Packing is exact: with the same anchors, a document's per-anchor losses and gradients are the
same packed between other documents as alone (fp32, 1e-6), for every family, and with a draft
vocabulary."""

from __future__ import annotations

import pytest
import torch

from specdraft.trainer.models import (
    DraftTrainSpec,
    build_draft,
    load_target_config,
    load_target_head,
)

ALGORITHMS = [
    ("dflash2", {"dflash2": {"selector_gold_policy": "insert"}}),
    ("dflash2", {"dflash2": {"selector_gold_policy": "exclude"}}),
    ("dspark", {}),
    ("dspark", {"dspark": {"markov_type": "rnn", "confidence_uses_markov": True}}),
    ("dspark", {"dspark": {"markov_type": "gated"}}),
    ("dflash", {}),
    # A draft vocabulary of the first 80 of the 96 tokens: its draft head, id maps and the
    # out-of-vocabulary labels (one in six) go through the packed path too.
    ("dflash", {"draft_vocab_size": 80}),
    ("dspark", {"draft_vocab_size": 80}),
]

# Row 0 packs documents 0, 1, 2 (the one under test is 1, between the others) and pads to 36;
# row 1 holds document 3 alone. Document 2 is supervised from its first token, so a block of
# document 1 that reaches past its end would find supervised labels there if nothing cut it.
MASKS = [
    [0, 0, 1, 1, 1, 1, 1, 1, 1],
    [0, 0, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1],
    [1] * 10,
    [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
]
ROWS = [[0, 1, 2], [3]]
PAD_TO = 36
OFFSETS = [0, 9, 22]  # where documents 0, 1, 2 start in row 0
# In-document anchors per document. Document 1's last two reach past its end (length 13).
DOC_ANCHORS = {0: [2, 5], 1: [3, 6, 9, 11], 2: [0, 4, 8], 3: [4, 9, 13]}
UNDER_TEST = 1
TOL = {"rtol": 1e-6, "atol": 1e-6}


def _draft(algorithm, overrides, draft_model_config):
    torch.manual_seed(0)
    cfg = draft_model_config(algorithm, **overrides)
    ids = None if cfg.draft_vocab_size is None else list(range(cfg.draft_vocab_size))
    draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32, draft_vocab=ids)
    # Non-trivial conv kernels: the identity init would hide a leak across blocks.
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if "conv" in name:
                param.add_(0.05 * torch.randn_like(param))
    head = load_target_head(cfg.target, torch.float32)
    draft.init_draft_head(head)
    return draft, head


def _packed_anchors(keep_docs: set[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchors [2, 9] of the packed batch; blocks of documents outside `keep_docs` not kept."""
    width = sum(len(DOC_ANCHORS[doc]) for doc in ROWS[0])
    anchors = torch.zeros(2, width, dtype=torch.long)
    keep = torch.zeros(2, width, dtype=torch.bool)
    slot = 0
    for doc, offset in zip(ROWS[0], OFFSETS, strict=True):
        for anchor in DOC_ANCHORS[doc]:
            anchors[0, slot], keep[0, slot] = offset + anchor, doc in keep_docs
            slot += 1
    for slot, anchor in enumerate(DOC_ANCHORS[3]):
        anchors[1, slot], keep[1, slot] = anchor, 3 in keep_docs
    return anchors, keep


def _alone(make_draft_batch, samples, doc):
    """The document alone (unpacked, unpadded) and its anchors, all kept."""
    batch = make_draft_batch([samples[doc]], len(MASKS[doc]))
    anchors = torch.tensor([DOC_ANCHORS[doc]])
    return batch, anchors, torch.ones_like(anchors, dtype=torch.bool)


def _run(draft, head, batch, anchors, keep, spec, backward=True):
    draft.zero_grad(set_to_none=True)
    out = draft.forward_with_anchors(batch, anchors, keep, head, spec)
    grads = {}
    if backward:
        out.numerator.backward()
        grads = {n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None}
    return out, grads


@pytest.fixture
def spec():
    return DraftTrainSpec(num_anchors=9, loss_decay_gamma=4.0, logits_chunk_blocks=3, seed=5)


@pytest.mark.parametrize(("algorithm", "overrides"), ALGORITHMS)
def test_a_document_gets_the_same_losses_and_gradients_packed_as_alone(
    algorithm,
    overrides,
    spec,
    draft_model_config,
    make_draft_batch,
    make_packed_batch,
    supervised_samples,
):
    draft, head = _draft(algorithm, overrides, draft_model_config)
    samples = supervised_samples(MASKS, seed=3)
    packed = make_packed_batch(samples, ROWS, PAD_TO)
    alone, alone_anchors, alone_keep = _alone(make_draft_batch, samples, UNDER_TEST)

    # Per-anchor losses: one block kept at a time, packed and alone.
    anchors, doc_keep = _packed_anchors({UNDER_TEST})
    slots = doc_keep.nonzero().tolist()
    assert len(slots) == len(DOC_ANCHORS[UNDER_TEST])
    with torch.no_grad():
        for index, (row, slot) in enumerate(slots):
            one = torch.zeros_like(doc_keep)
            one[row, slot] = True
            got = draft.forward_with_anchors(packed, anchors, one, head, spec)
            one_alone = torch.zeros_like(alone_keep)
            one_alone[0, index] = True
            want = draft.forward_with_anchors(alone, alone_anchors, one_alone, head, spec)
            assert want.denominator > 0
            torch.testing.assert_close(got.numerator, want.numerator, **TOL)
            torch.testing.assert_close(got.denominator, want.denominator, **TOL)

    # Gradients of a loss that weights only this document's blocks.
    got, got_grads = _run(draft, head, packed, anchors, doc_keep, spec)
    want, want_grads = _run(draft, head, alone, alone_anchors, alone_keep, spec)
    torch.testing.assert_close(got.numerator, want.numerator, **TOL)
    torch.testing.assert_close(got.denominator, want.denominator, **TOL)
    assert got.metrics.keys() == want.metrics.keys()
    for key, value in want.metrics.items():
        torch.testing.assert_close(got.metrics[key], value, **TOL)
    assert got_grads.keys() == want_grads.keys() and want_grads
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, **TOL, msg=name)


@pytest.mark.parametrize(("algorithm", "overrides"), [ALGORITHMS[0], ALGORITHMS[3]])
def test_a_packed_batch_sums_what_its_documents_compute_alone(
    algorithm,
    overrides,
    spec,
    draft_model_config,
    make_draft_batch,
    make_packed_batch,
    supervised_samples,
):
    draft, head = _draft(algorithm, overrides, draft_model_config)
    samples = supervised_samples(MASKS, seed=4)
    packed = make_packed_batch(samples, ROWS, PAD_TO)
    anchors, keep = _packed_anchors({0, 1, 2, 3})
    total, total_grads = _run(draft, head, packed, anchors, keep, spec)
    numerator = denominator = 0.0
    grads: dict[str, torch.Tensor] = {}
    for doc in range(len(MASKS)):
        out, doc_grads = _run(draft, head, *_alone(make_draft_batch, samples, doc), spec)
        numerator, denominator = numerator + out.numerator, denominator + out.denominator
        for name, grad in doc_grads.items():
            grads[name] = grads[name] + grad if name in grads else grad
    torch.testing.assert_close(total.numerator, numerator, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(total.denominator, denominator)
    assert total_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(total_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize(("algorithm", "overrides"), [ALGORITHMS[0], ALGORITHMS[3]])
def test_a_row_holding_one_document_computes_exactly_the_unpacked_row(
    algorithm, overrides, draft_model_config, make_draft_batch, make_packed_batch, random_samples
):
    # Sampled anchors too: the per-token hash equals the unpacked one on such a row.
    draft, head = _draft(algorithm, overrides, draft_model_config)
    samples = random_samples([23, 17, 9], seed=1)
    spec = DraftTrainSpec(num_anchors=8, loss_decay_gamma=4.0, logits_chunk_blocks=3, seed=9)
    unpacked = make_draft_batch(samples, 32)
    packed = make_packed_batch(samples, [[0], [1], [2]], 32)
    assert torch.equal(packed["input_ids"], unpacked["input_ids"])
    want = draft.place_blocks(unpacked, spec)
    got = draft.place_blocks(packed, spec)
    for got_part, want_part in zip(got, want, strict=True):
        assert torch.equal(got_part, want_part)
    with torch.no_grad():
        out_unpacked = draft(unpacked, head, spec)
        out_packed = draft(packed, head, spec)
    assert torch.equal(out_packed.numerator, out_unpacked.numerator)
    assert torch.equal(out_packed.denominator, out_unpacked.denominator)


def test_given_anchors_reproduce_the_sampled_forward(
    spec, draft_model_config, make_packed_batch, supervised_samples
):
    draft, head = _draft(*ALGORITHMS[2], draft_model_config)
    packed = make_packed_batch(supervised_samples(MASKS, seed=5), ROWS, PAD_TO)
    targets = draft.place_blocks(packed, spec)
    with torch.no_grad():
        sampled = draft(packed, head, spec)
        given = draft.forward_with_anchors(packed, targets.anchors, targets.keep, head, spec)
    assert torch.equal(sampled.numerator, given.numerator)
    assert torch.equal(sampled.denominator, given.denominator)
