"""Collecting every layer's states for the probes: the positions a draft block can start after,
drawn by seed, and the rows' states, anchors, labels and final states aligned with the target's
own forward (layer l = HF hidden_states[l + 1])."""

from __future__ import annotations

import pytest
import torch

from specdraft.trainer.layer_probe import collect_layer_states, probe_positions

OFFSETS = (2, 3, 4)


def test_positions_start_a_valid_block_and_reach_the_furthest_offset():
    mask = [0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0]
    gen = torch.Generator().manual_seed(0)
    positions = probe_positions(mask, OFFSETS, 100, gen)
    # j + 1 and j + 2 supervised (the anchor is valid), j + 3 inside the sample.
    assert positions == [2, 3, 6, 7, 8]
    assert probe_positions([0, 1], OFFSETS, 10, gen) == []


def test_positions_are_drawn_by_the_seed():
    mask = [1] * 200

    def draw(seed: int) -> list[int]:
        return probe_positions(mask, OFFSETS, 16, torch.Generator().manual_seed(seed))

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)
    assert len(draw(3)) == 16 and draw(3) == sorted(draw(3))


@pytest.fixture(scope="module")
def model(tiny_qwen3_target):
    torch.manual_seed(0)
    return tiny_qwen3_target.model.eval()


def test_rows_hold_each_layer_s_state_the_anchor_labels_and_final_states(model):
    gen = torch.Generator().manual_seed(1)
    rows = []
    for length in (40, 23, 31):
        ids = torch.randint(1, 95, (length,), generator=gen).tolist()
        mask = [0] * 5 + [1] * (length - 8) + [0] * 3
        rows.append((ids, mask))
    states = collect_layer_states(model, rows, OFFSETS, per_sample=6, seed=9)
    again = collect_layer_states(model, rows, OFFSETS, per_sample=6, seed=9)
    assert torch.equal(states.features, again.features)
    num_layers = model.config.num_hidden_layers
    assert states.features.shape == (num_layers, 18, model.config.hidden_size)
    assert states.samples == 3 and states.num_rows == 18
    # The same rows as each sample alone: positions drawn in row order from one generator.
    gen = torch.Generator().manual_seed(9)
    picked = [probe_positions(mask, OFFSETS, 6, gen) for _, mask in rows]
    row = 0
    for (ids, mask), positions in zip(rows, picked, strict=True):
        with torch.no_grad():
            out = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        for j in positions:
            for layer in range(num_layers):
                expected = out.hidden_states[layer + 1][0, j]
                torch.testing.assert_close(states.features[layer, row], expected)
            assert int(states.anchor_ids[row]) == ids[j + 1]
            for k, d in enumerate(OFFSETS):
                label = ids[j + d] if j + d < len(ids) and mask[j + d] else -1
                assert int(states.labels[row, k]) == label
                torch.testing.assert_close(
                    states.teacher[row, k], out.last_hidden_state[0, j + d - 1]
                )
            row += 1


def test_no_usable_position_is_refused(model):
    with pytest.raises(ValueError, match="no sample has a position"):
        collect_layer_states(model, [([1, 2, 3], [0, 1, 1])], OFFSETS, per_sample=4, seed=0)
