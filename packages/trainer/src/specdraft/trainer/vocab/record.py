"""A run's draft vocabulary: chosen from its training data and written beside its checkpoints.

Every rank chooses it from the same counts (deterministic), so no rank waits for another; once
the resume checks pass, rank 0 writes `<output_dir>/draft_vocab.json` (the ids, the coverage,
where they came from) for the user. The draft's config carries the ids into every checkpoint and
export; a resume compares them with the checkpoint's (train/resume.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .choice import DraftVocab, choose_draft_vocab, coverage
from .frequencies import arrow_token_counts, corpus_token_counts, shard_token_counts

log = logging.getLogger(__name__)

RECORD_NAME = "draft_vocab.json"


def run_token_counts(config: Any, dataset: Any, vocab_size: int, *, progress: bool) -> np.ndarray:
    """Supervised-token counts of the run's training data (its loaded dataset when it has one)."""
    if dataset is None:  # a disaggregated run: the producer reads the corpus; count it here too
        counts = corpus_token_counts(config, vocab_size, split="train", progress=progress)
        assert counts is not None
        return counts
    if hasattr(dataset, "token_columns"):
        return shard_token_counts(dataset, vocab_size)
    return arrow_token_counts(dataset, vocab_size)


def draft_vocab_for_run(
    config: Any,
    dataset: Any,
    vocab_size: int,
    *,
    progress: bool = False,
    given: Sequence[int] | None = None,
) -> DraftVocab | None:
    """The run's draft vocabulary (None without model.draft_vocab_size): `given` target ids
    (model.init_from's, whose head rows belong to them), else chosen from the data."""
    size = config.model.draft_vocab_size
    if size is None:
        return None
    counts = run_token_counts(config, dataset, vocab_size, progress=progress)
    if given is not None:
        ids = tuple(int(token) for token in given)
        vocab = DraftVocab(ids, vocab_size, coverage(counts, ids))
    else:
        vocab = choose_draft_vocab(counts, size)
    log.info(
        "draft vocabulary: %d of %d target tokens, covering %.2f%% of the %d supervised labels "
        "of the training data",
        vocab.size,
        vocab_size,
        100 * vocab.train_coverage,
        int(counts.sum()),
    )
    return vocab


def write_vocab_record(output_dir: str | Path, vocab: DraftVocab, config: Any) -> Path:
    """Write `<output_dir>/draft_vocab.json` (atomically: a reader never sees half a file)."""
    path = Path(output_dir) / RECORD_NAME
    record = {
        "draft_vocab_size": vocab.size,
        "target": str(config.model.target),
        "target_vocab_size": vocab.target_vocab_size,
        "train_coverage": vocab.train_coverage,
        "train_paths": list(config.data.train_paths),
        "ids": list(vocab.ids),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)
    return path
