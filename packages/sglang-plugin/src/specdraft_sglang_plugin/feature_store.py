"""The AROUND hook on SGLang 0.5.23's prefill hidden-state hand-off: a specdraft request's rows
go into the run's feature store as raw bytes, and `meta_info` carries only their reference.

Read in 0.5.23 (`managers/scheduler_components/batch_result_processor.py`):
`process_batch_result_prefill` calls `_append_prefill_hidden_states(req=, logits_output=,
hidden_state_offset=, capture_hidden_mode=, extend_input_len=, store=)` once per request of
the batch and per prefill chunk; the request's rows are `logits_output.hidden_states[offset :
offset + extend_input_len]` under full capture, and the method returns the next offset. A
middle chunk comes with `store=False` (the request still has `inflight_middle_chunks`), so
stock SGLang keeps the last chunk's rows only, turned into a Python list of lists of floats
(`.cpu().clone().tolist()`) inside the scheduler loop. Here every chunk's rows are copied into
one buffer of the whole prompt, so several chunks give the same tensor as one, and the last
chunk writes it (`store.tensors.tensors_to_store`, the embedded capture server's writer: the
same keys, bytes and TensorMeta) and appends the reference to `req.hidden_states`, which the
output streamer cuts to `finished_len` (1) entries: exactly the reference.

A request is specdraft's when it asks for `return_hidden_states = True` and its id is
`{run}/{sample}/g{attempt}/{tag}` with a valid tag under the run's secret (`wire.sglang`);
anything else goes to SGLang's own method untouched. A failed write aborts that request only
(`req.to_finish = FINISH_ABORT(..., 503)`: the client sees an HTTP error and the producer
retries), after removing whatever it wrote; the scheduler keeps serving. The buffer lives on
the request object, so a request that is aborted, retracted or dropped takes it along.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

FEATURES_TARGET = (
    "sglang.srt.managers.scheduler_components.batch_result_processor."
    "SchedulerBatchResultProcessor._append_prefill_hidden_states"
)
# The request attribute holding a prefill's rows between its chunks.
ROWS_ATTR = "specdraft_rows"
# HTTP status of a request whose features could not be stored (the producer retries it).
WRITE_FAILED = 503

log = logging.getLogger("specdraft_sglang_plugin")
_WRITER: FeatureWriter | None = None


def enable(path: str) -> FeatureWriter:
    """Read the run's settings file and arm the hook (called by `register`)."""
    global _WRITER
    try:
        from specdraft.trainer.disagg.wire.sglang import read_plugin_settings
    except ImportError as exc:
        raise RuntimeError(
            f"the specdraft SGLang plugin writes into the feature store through specdraft's own "
            f"store code, which is not importable here ({exc}): install specdraft-trainer into "
            f"the SGLang server's environment (pip install 'specdraft-trainer[sglang]')"
        ) from exc
    _WRITER = FeatureWriter(read_plugin_settings(path))
    log.info(
        "specdraft: writing features of run %r into its %s store",
        _WRITER.run_id,
        _WRITER.settings.store,
    )
    return _WRITER


def disable() -> None:
    """Disarm the hook (every request then goes to SGLang's own method)."""
    global _WRITER
    _WRITER = None


def capture_prefill_rows(original: Any, processor: Any, *args: Any, **kwargs: Any) -> int:
    """AROUND hook of `_append_prefill_hidden_states`: specdraft's requests into the store,
    every other request to SGLang's own method."""
    writer = _WRITER
    target = writer.target_of(kwargs.get("req")) if writer is not None and not args else None
    mode = kwargs.get("capture_hidden_mode")
    # Only the last token's state captured: stock SGLang sends that one row, and the client's
    # row-count check names the fix.
    if target is None or mode is None or not mode.is_full():
        return original(processor, *args, **kwargs)
    return writer.take_chunk(target, **kwargs)


def finish_abort(message: str, status_code: int) -> Any:
    """SGLang's finish reason that fails one request with an HTTP status."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return FINISH_ABORT(message, status_code=status_code)


def is_writer_rank() -> bool:
    """Whether this scheduler writes (rank 0 of its attention-TP group: one writer per request,
    the rank whose output streamer answers it; every rank holds the same rows)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        return get_parallel().attn_tp_rank == 0
    except (ImportError, RuntimeError, AttributeError):
        return True  # no parallel context: a single process


class FeatureWriter:
    """One run's settings and its store, opened on first use in the scheduler process (the
    plugin is loaded in every SGLang process; only schedulers write)."""

    def __init__(self, settings: Any) -> None:
        from specdraft.trainer.disagg.store.tensors import DTYPES
        from specdraft.trainer.disagg.wire.capture import CaptureSpec

        self.settings = settings
        self.run_id = settings.run_id
        self.spec = CaptureSpec(settings.layer_ids, settings.hidden_size, settings.with_last_hidden)
        self.dtype = DTYPES[settings.dtype]
        ascending = sorted(settings.layer_ids)
        # SGLang concatenates the tapped layers in ascending order; the config's order wins.
        self.order = [ascending.index(k) for k in settings.layer_ids]
        self._store: Any = None
        self._lock = threading.Lock()

    def store(self) -> Any:
        """The run's feature store (local files or Mooncake), opened once."""
        with self._lock:
            if self._store is None:
                self._store = open_feature_store(self.settings)
            return self._store

    def target_of(self, req: Any) -> Any:
        """The capture a request names (a `CaptureRid`), or None when it is not this run's."""
        from specdraft.trainer.disagg.wire.sglang import parse_capture_rid

        if req is None or getattr(req, "return_hidden_states", False) is not True:
            return None
        target = parse_capture_rid(getattr(req, "rid", None), self.settings.secret)
        return target if target is not None and target.run == self.run_id else None

    def take_chunk(
        self,
        target: Any,
        *,
        req: Any,
        logits_output: Any,
        hidden_state_offset: int,
        capture_hidden_mode: Any,
        extend_input_len: int,
        store: bool = True,
    ) -> int:
        """One prefill chunk (full capture) of a specdraft request; returns the next offset, as
        SGLang's own method does."""
        del capture_hidden_mode  # full: the caller checked
        start, end = hidden_state_offset, hidden_state_offset + extend_input_len
        middle = (
            not store
            and getattr(req, "inflight_middle_chunks", 0) > 0
            and not req.finished()
            and not req.is_retracted
        )
        if (not store and not middle) or not is_writer_rank():
            # Aborted, retracted or discarded (its rows are never sent): drop what was kept.
            setattr(req, ROWS_ATTR, None)
            return end
        rows = logits_output.hidden_states[start:end]
        if target.sample_id is None:  # the start-up probe: say who we are, write nothing
            if store:
                from specdraft.trainer.disagg.wire.sglang import probe_ref_to_json

                req.hidden_states.append(probe_ref_to_json(self.settings, int(rows.shape[-1])))
            return end
        buffer = getattr(req, ROWS_ATTR, None)
        if buffer is None:
            buffer = PromptRows(self, len(req.origin_input_ids))
            setattr(req, ROWS_ATTR, buffer)
        buffer.add(rows)
        if middle:
            return end
        setattr(req, ROWS_ATTR, None)
        try:
            reply = buffer.write(target, req.origin_input_ids)
        except Exception as exc:  # the store, or rows that do not fit: fail this request only
            message = f"specdraft plugin: sample {target.sample_id} attempt {target.attempt}: {exc}"
            log.warning("%s", message)
            req.to_finish = finish_abort(message, WRITE_FAILED)
            return end
        from specdraft.trainer.disagg.wire.sglang import features_ref_to_json

        req.hidden_states.append(features_ref_to_json(reply))
        return end


class PromptRows:
    """A prompt's rows: those of a one-chunk prefill as they are, those of several chunks
    collected chunk by chunk into CPU tensors of the prompt's full length."""

    def __init__(self, writer: FeatureWriter, seq_len: int) -> None:
        self.writer = writer
        self.seq_len = seq_len
        self.filled = 0
        self.error: str | None = None
        self.hidden: torch.Tensor | None = None
        self.last: torch.Tensor | None = None

    def add(self, rows: torch.Tensor) -> None:
        """Copy one chunk's rows (device to host, in config layer order) after the previous."""
        if self.error is not None:
            return
        spec = self.writer.spec
        layers, width = len(spec.layer_ids), spec.hidden_size
        count, got = int(rows.shape[0]), int(rows.shape[-1])
        if got not in (layers * width, (layers + 1) * width):
            self.error = (
                f"rows of {got} values, expected {layers} layers x {width} (+ {width} for the "
                f"final state): SGLang taps other layers or runs another target than the run's"
            )
            return
        if spec.with_last_hidden and got != (layers + 1) * width:
            self.error = "no final hidden state in the rows (the LogitsProcessor hook did not run)"
            return
        if self.filled + count > self.seq_len:
            self.error = f"more hidden-state rows than the prompt's {self.seq_len} tokens"
            return
        dtype = self.writer.dtype
        if self.filled == 0 and count == self.seq_len:
            # The whole prompt in one chunk (the common case): written from SGLang's rows as
            # they are (a view when the layers are in order), with no staging copy.
            self.hidden = self._layers(rows).to(dtype)
            if spec.with_last_hidden:
                self.last = rows[:, layers * width :].to(dtype)
            self.filled = count
            return
        if self.hidden is None:
            self.hidden = torch.empty((self.seq_len, layers * width), dtype=dtype)
            if spec.with_last_hidden:
                self.last = torch.empty((self.seq_len, width), dtype=dtype)
        at = slice(self.filled, self.filled + count)
        self.hidden[at].copy_(self._layers(rows))  # device to host, chunk after chunk
        if self.last is not None:
            self.last[at].copy_(rows[:, layers * width :])
        self.filled += count

    def _layers(self, rows: torch.Tensor) -> torch.Tensor:
        """The tapped layers of the rows in the config's order (SGLang's are ascending)."""
        order, width = self.writer.order, self.writer.spec.hidden_size
        if order == sorted(order):
            return rows[:, : len(order) * width]
        return torch.cat([rows[:, i * width : (i + 1) * width] for i in order], dim=-1)

    def write(self, target: Any, input_ids: Any) -> Any:
        """Store the whole prompt's features; the reply of what was written (or raise, with
        nothing left in the store)."""
        from specdraft.trainer.disagg.store.tensors import tensors_to_store
        from specdraft.trainer.disagg.wire.capture import CaptureRequest
        from specdraft.trainer.disagg.wire.sglang import PLUGIN_TENSORS

        if self.error is not None:
            raise ValueError(self.error)
        if self.filled != self.seq_len or self.hidden is None:
            raise ValueError(
                f"hidden-state rows for {self.filled} of the prompt's {self.seq_len} tokens (a "
                f"cached prefix? start SGLang with --disable-radix-cache)"
            )
        tensors = {"hidden_states": self.hidden}
        if self.last is not None:
            tensors["target_last_hidden_states"] = self.last
        request = CaptureRequest(target.run, target.sample_id, target.attempt, list(input_ids), [])
        return tensors_to_store(
            self.writer.store(), request, self.writer.spec, tensors, names=PLUGIN_TENSORS
        )


def open_feature_store(settings: Any) -> Any:
    """The feature store the settings name, opened for a capture server."""
    from pathlib import Path

    from specdraft.trainer.disagg.store.factory import open_store

    return open_store(settings.disaggregated(), Path(settings.run_dir), role="capture")
