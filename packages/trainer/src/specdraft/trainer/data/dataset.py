"""Conversations -> the tokenised training (or eval) dataset: `build_dataset` and
`corpus_lengths`, the two entry points of the data pipeline.

Rows come out as `input_ids` (int32 on disk), `loss_mask` (0/1, int8 on disk) and `sample_id`
(int64): the row's position in its source plus the rows of the sources listed before it, so a
conversation keeps its id (and its anchors) whatever else is filtered or batched around it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..runtime.cache import build_once, cache_root
from .bad_rows import BadRow, BadRowCounter, check_supervised_pair
from .cache import (
    dataset_cache_key,
    load_dataset_entry,
    load_dataset_report,
    save_dataset,
    tokenizer_fingerprint,
)
from .chat_template import ChatTemplate, resolve_chat_template
from .conversations import normalise_conversation
from .report import DataReport
from .sources import check_source, read_source, source_fingerprint
from .tokenize import tokenize_conversation, trim_unsupervised_tail

_ROWS_PER_BATCH = 1024


class EmptyCorpusError(ValueError):
    """No row of a split's data paths can train: names the field, each file and its counts."""

    def __init__(self, field: str, report: DataReport) -> None:
        self.field = field
        self.report = report
        super().__init__(
            f"{field}: no usable conversation ({report.describe_sources()}). Fix: point {field} "
            f"at ShareGPT-style rows ('conversations' with from/value or 'messages' with "
            f"role/content) that hold an assistant turn of at least two tokens within "
            f"data.max_length ({report.max_length})"
        )


@dataclass
class CorpusLengths:
    """Token counts of the kept rows (after truncation) and what was left out."""

    lengths: list[int]
    skipped: dict[str, int]
    dropped_incomplete: int
    source: str


def load_tokenizer(cfg: Any) -> tuple[Any, str]:
    """The tokenizer of a config (data.tokenizer, else model.target), from local files only."""
    field, path = ("data.tokenizer", cfg.data.tokenizer)
    if not path:
        field, path = ("model.target", cfg.model.target)
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{field} = {path!r}: no such folder; point data.tokenizer (or model.target) at a "
            f"local Hugging Face folder with the tokenizer files (nothing is downloaded)"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True), str(folder)
    except Exception as exc:
        raise ValueError(f"{field} = {path!r}: cannot load a tokenizer from it ({exc})") from exc


def build_dataset(
    cfg: Any,
    *,
    split: Literal["train", "eval"] = "train",
    tokenizer: Any = None,
    progress: bool = True,
) -> tuple[Any, DataReport]:
    """Tokenise (or load from the cache) the train or eval conversations of a config."""
    data = cfg.data
    if data.format != "sharegpt":
        raise ValueError(
            f"data.format = {data.format!r}: build_dataset reads conversations; offline feature "
            f"shards are read by the features loader"
        )
    if split == "train":
        specs, limit, field = list(data.train_paths), data.max_samples, "data.train_paths"
    elif split == "eval":
        specs, limit, field = list(data.eval_paths), data.max_eval_samples, "data.eval_paths"
    else:
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    if not specs:
        raise ValueError(f"{field} is empty: list .json/.jsonl files or 'pkg:sharegpt' there")
    for spec in specs:
        check_source(spec, field)
    tokenizer_path = ""
    if tokenizer is None:
        tokenizer, tokenizer_path = load_tokenizer(cfg)
    template = resolve_chat_template(data.chat_template, tokenizer, tokenizer_path=tokenizer_path)
    key = dataset_cache_key(
        sources=[source_fingerprint(spec) for spec in specs],
        template_source=template.source,
        tokenizer_fp=tokenizer_fingerprint(tokenizer),
        max_length=data.max_length,
        limit=limit,
        bad_rows=data.bad_rows,
    )
    root = cache_root(data.cache_dir)
    entry = root / "datasets" / f"{split}-{key}"
    hit = entry.is_dir()
    if hit:
        # An entry cached before empty corpora were refused holds no rows: refuse it the same way.
        cached = load_dataset_report(entry)
        if cached.kept == 0:
            raise EmptyCorpusError(field, cached)

    def tokenise_into(folder: Path) -> None:
        dataset, report = tokenise_sources(
            specs,
            tokenizer,
            template,
            max_length=data.max_length,
            limit=limit,
            bad_rows=data.bad_rows,
            progress=progress,
            hf_cache_dir=root / "hf-json",
        )
        report.fingerprint = key
        if report.kept == 0:
            # Raised before anything is cached, so fixing the files is picked up on the next run.
            raise EmptyCorpusError(field, report)
        save_dataset(folder, dataset, report)

    build_once(entry, tokenise_into)
    dataset, report = load_dataset_entry(entry)
    report.cache_hit = hit
    return dataset, report


def tokenise_sources(
    specs: list[str],
    tokenizer: Any,
    template: ChatTemplate,
    *,
    max_length: int,
    limit: int | None = None,
    bad_rows: str = "skip",
    progress: bool = True,
    hf_cache_dir: Path | None = None,
) -> tuple[Any, DataReport]:
    """Read, normalise, tokenise and mask every row of the sources; return (Dataset, report)."""
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    counter = BadRowCounter(bad_rows)
    report = DataReport(source=", ".join(specs), max_length=max_length)
    batches: list[pa.RecordBatch] = []
    rows: list[tuple[list[int], list[int], int]] = []
    offset = 0
    for spec in specs:
        read = read_source(spec, hf_cache_dir=hf_cache_dir)
        report.notes.extend(read.notes)
        before = (report.rows_read, report.kept, dict(counter.counts))
        rows_of = _tokenise_rows(
            read, spec, tokenizer, template, max_length, counter, report, offset, progress
        )
        for sample_id, tokenized in rows_of:
            rows.append((tokenized.input_ids, tokenized.loss_mask, sample_id))
            if len(rows) >= _ROWS_PER_BATCH:
                batches.append(_record_batch(rows))
                rows = []
            if limit is not None and report.kept >= limit:
                report.stopped_at_limit = True
                break
        report.dropped_incomplete += read.dropped_incomplete
        report.per_source[read.label] = {
            "rows_read": report.rows_read - before[0],
            "kept": report.kept - before[1],
            "skipped": {k: v - before[2][k] for k, v in counter.counts.items()},
            "dropped_incomplete": read.dropped_incomplete,
        }
        offset += read.total
        if report.stopped_at_limit:
            break
    if rows:
        batches.append(_record_batch(rows))
    report.skipped = dict(counter.counts)
    schema = _pa_schema()
    table = pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
    return datasets.Dataset(InMemoryTable(table)), report


def _tokenise_rows(
    read: Any,
    spec: str,
    tokenizer: Any,
    template: ChatTemplate,
    max_length: int,
    counter: BadRowCounter,
    report: DataReport,
    offset: int,
    progress: bool,
) -> Iterator[tuple[int, Any]]:
    from tqdm.auto import tqdm

    with tqdm(
        total=read.total, desc=f"tokenising {spec}", unit="conv", disable=not progress
    ) as bar:
        for row, record in read.rows():
            bar.update(1)
            report.rows_read += 1
            try:
                messages = normalise_conversation(record)
                tokenized = trim_unsupervised_tail(
                    tokenize_conversation(messages, tokenizer, template, max_length)
                )
                check_supervised_pair(tokenized.loss_mask)
            except BadRow as bad:
                counter.record(read.label, row, bad)
                continue
            report.kept += 1
            report.truncated += int(tokenized.truncated)
            report.tokens += len(tokenized.input_ids)
            report.supervised_tokens += sum(tokenized.loss_mask)
            yield offset + row, tokenized


def _pa_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("sample_id", pa.int64()),
        ]
    )


def _record_batch(rows: list[tuple[list[int], list[int], int]]) -> Any:
    import pyarrow as pa

    ids, masks, sample_ids = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ids, type=pa.list_(pa.int32())),
            pa.array(masks, type=pa.list_(pa.int8())),
            pa.array(sample_ids, type=pa.int64()),
        ],
        schema=_pa_schema(),
    )


def sample_lengths(dataset: Any) -> list[int]:
    """Token count of every row of a tokenised dataset (read from Arrow, no Python rows)."""
    import pyarrow.compute as pc

    column = dataset.with_format("arrow")[:]["input_ids"]
    return pc.list_value_length(column).to_pylist()


def sample_anchor_counts(dataset: Any) -> list[int]:
    """Valid anchors of every row (a and a+1 both supervised), read from Arrow in one pass."""
    import numpy as np

    column = dataset.with_format("arrow")[:]["loss_mask"].combine_chunks()
    # A sliced column's offsets start past 0 while flatten() starts at its first value.
    offsets = np.asarray(column.offsets)
    offsets = offsets - offsets[0]
    supervised = np.asarray(column.flatten(), dtype=bool)
    # bits[j]: positions j and j+1 both supervised; a row [s, e) owns bits s .. e-2.
    bits = np.zeros(len(supervised), dtype=np.int64)
    bits[:-1] = supervised[:-1] & supervised[1:]
    pairs = np.concatenate([[0], np.cumsum(bits)])  # pairs[k] = sum(bits[:k]), k = 0 .. N
    starts, ends = offsets[:-1], offsets[1:]
    last_pair = np.maximum(ends - 1, starts)
    return (pairs[last_pair] - pairs[starts]).astype(int).tolist()


def corpus_lengths(cfg: Any, *, progress: bool = True) -> CorpusLengths:
    """The training corpus as training would load it, reduced to its sample lengths."""
    dataset, report = build_dataset(cfg, split="train", progress=progress)
    return CorpusLengths(
        lengths=sample_lengths(dataset),
        skipped=dict(report.skipped),
        dropped_incomplete=report.dropped_incomplete,
        source=report.source,
    )
