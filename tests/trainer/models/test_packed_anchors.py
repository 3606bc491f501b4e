"""Anchors and block targets of packed rows: the per-token hash equals the unpacked one, anchors
stay inside one document, and a block never learns past its document's end."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.trainer.models import DocumentLayout, sample_anchors, valid_anchor_positions
from specdraft.trainer.models.anchors import position_hash, token_hash
from specdraft.trainer.models.losses import block_targets


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**40),
    sample_ids=st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=3),
    length=st.integers(1, 50),
)
def test_token_hash_of_an_unpacked_row_is_the_position_hash(seed, sample_ids, length):
    sample_id = torch.tensor(sample_ids)
    per_token = sample_id[:, None].expand(-1, length)
    positions = torch.arange(length).expand(len(sample_ids), -1)
    assert torch.equal(
        token_hash(seed, per_token, positions), position_hash(seed, sample_id, length)
    )


def _pack(docs: list[tuple[list[int], int]], pad: int):
    """One packed row [1, S] from (loss mask, sample id) documents, then `pad` padding tokens."""
    masks, document_ids, positions, sample_ids = [], [], [], []
    for index, (mask, sample_id) in enumerate(docs):
        masks += mask
        document_ids += [index] * len(mask)
        positions += list(range(len(mask)))
        sample_ids += [sample_id] * len(mask)
    masks += [0] * pad
    document_ids += [-1] * pad
    positions += [0] * pad
    sample_ids += [0] * pad
    layout = DocumentLayout(
        torch.tensor([document_ids]), torch.tensor([positions]), torch.tensor([sample_ids])
    )
    return torch.tensor([masks]), layout


documents = st.lists(
    st.tuples(st.lists(st.integers(0, 1), min_size=1, max_size=14), st.integers(0, 2**40)),
    min_size=1,
    max_size=4,
)


@settings(max_examples=120, deadline=None)
@given(
    docs=documents,
    pad=st.integers(0, 5),
    num_anchors=st.integers(1, 10),
    seed=st.integers(0, 2**31),
)
def test_packed_anchors_are_valid_positions_of_one_document(docs, pad, num_anchors, seed):
    loss_mask, layout = _pack(docs, pad)
    anchors, keep = sample_anchors(loss_mask, torch.tensor([0]), num_anchors, seed, layout=layout)
    document_ids = layout.document_ids[0].tolist()
    mask = loss_mask[0].tolist()
    valid = {
        a
        for a in range(len(mask) - 1)
        if mask[a] and mask[a + 1] and document_ids[a] == document_ids[a + 1]
    }
    assert valid == set(
        valid_anchor_positions(loss_mask, layout.document_ids)[0].nonzero()[:, 0].tolist()
    )
    kept = anchors[0][keep[0]].tolist()
    # Top num_anchors of the row over all its documents, ascending, kept slots first.
    assert len(kept) == min(num_anchors, len(valid))
    assert set(kept) <= valid and kept == sorted(kept) and len(set(kept)) == len(kept)
    assert keep[0].tolist() == [True] * len(kept) + [False] * (num_anchors - len(kept))
    # Never crossing a boundary: the anchor and the next token share a real document.
    for anchor in kept:
        assert document_ids[anchor] == document_ids[anchor + 1] >= 0
    # A document's packed anchors are among those it draws alone (same scores, fewer rivals).
    start = 0
    for index, (doc_mask, sample_id) in enumerate(docs):
        alone, alone_keep = sample_anchors(
            torch.tensor([doc_mask]), torch.tensor([sample_id]), num_anchors, seed
        )
        own = {a - start for a in kept if document_ids[a] == index}
        assert own <= set(alone[0][alone_keep[0]].tolist())
        start += len(doc_mask)


@settings(max_examples=60, deadline=None)
@given(
    mask=st.lists(st.integers(0, 1), min_size=1, max_size=30),
    pad=st.integers(0, 8),
    sample_id=st.integers(0, 2**40),
    num_anchors=st.integers(1, 10),
    width=st.integers(0, 4),
    seed=st.integers(0, 2**31),
)
def test_a_single_document_row_draws_the_unpacked_anchors(
    mask, pad, sample_id, num_anchors, width, seed
):
    loss_mask, layout = _pack([(mask, sample_id)], pad)
    width = num_anchors + width
    unpacked = sample_anchors(loss_mask, torch.tensor([sample_id]), num_anchors, seed, width)
    packed = sample_anchors(loss_mask, torch.tensor([sample_id]), num_anchors, seed, width, layout)
    assert torch.equal(packed[0], unpacked[0]) and torch.equal(packed[1], unpacked[1])


@settings(max_examples=80, deadline=None)
@given(
    doc_lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    pad=st.integers(0, 4),
    block_size=st.integers(1, 5),
)
def test_a_block_never_learns_past_its_document(doc_lengths, pad, block_size):
    # Every real token supervised: only the document boundary can cut a block.
    loss_mask, layout = _pack([([1] * n, 0) for n in doc_lengths], pad)
    length = loss_mask.shape[1]
    input_ids = torch.arange(length)[None]
    anchors = torch.arange(length)[None]
    keep = layout.document_ids >= 0
    gold, supervised, positions = block_targets(
        input_ids, loss_mask, anchors, keep, block_size, layout.document_ids
    )
    document_ids = layout.document_ids[0]
    start = 0
    for n in doc_lengths:
        for a in range(start, start + n):
            # Slot j is supervised exactly while anchor + j is inside the document.
            expected = [a + j < start + n for j in range(block_size + 1)]
            assert supervised[0, a].tolist() == expected
            assert all(
                document_ids[p] == document_ids[a] for p in positions[0, a][supervised[0, a]]
            )
        # The same as the document alone, where the sequence ends at its end.
        alone = block_targets(
            torch.arange(n)[None],
            torch.ones(1, n, dtype=torch.long),
            torch.arange(n)[None],
            torch.ones(1, n, dtype=torch.bool),
            block_size,
        )
        assert torch.equal(alone[1][0], supervised[0, start : start + n])
        assert torch.equal(
            alone[0][0][alone[1][0]] + start, gold[0, start : start + n][alone[1][0]]
        )
        start += n
    # Padding anchors (not kept) supervise nothing.
    assert not supervised[0, start:].any()
