"""Fixtures of the draft-model tests: packed batches built by hand, as the packing collator does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture
def make_packed_batch(tiny_qwen3_target):
    """Factory: pack samples [(input_ids [L], loss_mask [L], sample_id)] into rows.

    `rows` lists the sample indices of each row in order; every row is zero-padded to `pad_to`.
    Each document's target features are computed alone (a document never sees another), then
    concatenated, as the trainer's batch builder does. Adds the packing keys of the contract:
    document_ids (-1 on padding), position_ids (0 on padding), document_sample_ids (0 on
    padding), sample_id (the row's first document).
    """
    from specdraft.trainer.models import TargetFeatureExtractor

    extractor = TargetFeatureExtractor(tiny_qwen3_target.model, list(tiny_qwen3_target.layer_ids))

    def make(samples, rows: list[list[int]], pad_to: int) -> dict:
        keys = ("input_ids", "loss_mask", "hidden_states", "target_last_hidden_states")
        layout = ("document_ids", "position_ids", "document_sample_ids")
        out: dict[str, list] = {key: [] for key in keys + layout}
        for row in rows:
            parts: dict[str, list] = {key: [] for key in keys + layout}
            for doc, index in enumerate(row):
                input_ids, loss_mask, sample_id = samples[index]
                length = input_ids.shape[0]
                features, last = extractor(input_ids[None], torch.ones(1, length, dtype=torch.long))
                parts["input_ids"].append(input_ids)
                parts["loss_mask"].append(loss_mask)
                parts["hidden_states"].append(features[0])
                parts["target_last_hidden_states"].append(last[0])
                parts["document_ids"].append(torch.full((length,), doc, dtype=torch.long))
                parts["position_ids"].append(torch.arange(length))
                parts["document_sample_ids"].append(torch.full((length,), sample_id))
            total = sum(part.shape[0] for part in parts["input_ids"])
            pad = pad_to - total
            assert pad >= 0, f"row {row} holds {total} tokens, more than {pad_to}"
            for key in keys + layout:
                joined = torch.cat(parts[key])
                widths = (0, 0, 0, pad) if joined.dim() == 2 else (0, pad)
                value = -1 if key == "document_ids" else 0
                out[key].append(F.pad(joined, widths, value=value))
        batch = {key: torch.stack(values) for key, values in out.items()}
        batch["sample_id"] = torch.tensor([samples[row[0]][2] for row in rows], dtype=torch.long)
        return batch

    return make


@pytest.fixture
def supervised_samples(tiny_qwen3_target):
    """Factory: random samples whose loss masks are given (1 = supervised), one per mask."""

    def make(masks: list[list[int]], seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        samples = []
        for index, mask in enumerate(masks):
            ids = torch.randint(
                0, tiny_qwen3_target.mask_token_id, (len(mask),), generator=generator
            )
            samples.append((ids, torch.tensor(mask, dtype=torch.long), 500 + 11 * index + seed))
        return samples

    return make
