"""The embedded capture server: a transformers target behind `GET /health` and `POST /capture`.

A capture runs the target on the prompt, writes the sample's tensors into the feature store and
only then answers with the reply (keys, shapes, dtypes). An error answers 4xx/5xx with a JSON
`error` and no reply, so the producer never publishes a sample whose bytes are not all stored.
Bound to 127.0.0.1 by default. It is an internal service of one run: given the run's secret,
it answers only requests that carry it (401 otherwise, before anything runs), and it captures
only for its own run id (403 otherwise), so nothing foreign lands in the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...runtime.http_server import JsonServer, JsonService
from ..store.base import FeatureStore, StoreError
from ..store.tensors import tensors_to_store
from ..wire.capture import (
    CaptureSpec,
    ProtocolError,
    capture_spec,
    reply_to_json,
    request_from_json,
)
from .target import CaptureTarget, load_capture_target

if TYPE_CHECKING:
    from specdraft.config import Config


class CaptureServer(JsonService):
    """Serves captures of `target` into `store` (which its owner closes); `start()` runs it on a
    background thread."""

    def __init__(
        self,
        target: CaptureTarget,
        store: FeatureStore,
        spec: CaptureSpec,
        *,
        max_length: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        run_id: str | None = None,
        secret: str | None = None,
    ) -> None:
        if spec.layer_ids != target.layer_ids or spec.hidden_size != target.hidden_size:
            raise ValueError(
                f"capture spec (layers {list(spec.layer_ids)}, hidden {spec.hidden_size}) does not "
                f"match the target (layers {list(target.layer_ids)}, hidden {target.hidden_size})"
            )
        self.target = target
        self.store = store
        self.spec = spec
        self.max_length = max_length
        self.run_id = run_id
        self.captures = 0
        self._http = JsonServer(
            {("GET", "/health"): self._health, ("POST", "/capture"): self._capture},
            host=host,
            port=port,
            name="capture-server",
            secret=secret,
        )

    def _health(self, _body: Any) -> tuple[int, Any]:
        return 200, {
            "status": "ok",
            "layer_ids": list(self.spec.layer_ids),
            "hidden_size": self.spec.hidden_size,
            "with_last_hidden": self.spec.with_last_hidden,
            "dtype": str(self.target.dtype).removeprefix("torch."),
            "captures": self.captures,
        }

    def _capture(self, body: Any) -> tuple[int, Any]:
        try:
            request = request_from_json(body)
        except ProtocolError as exc:
            return 400, {"error": str(exc)}
        if self.run_id is not None and request.run != self.run_id:
            # Another run's keys would be orphans no producer of this run ever removes.
            return 403, {
                "error": f"sample {request.sample_id}: this server captures for run "
                f"{self.run_id!r}, not {request.run!r} (config field run_id)"
            }
        seq_len = len(request.input_ids)
        if self.max_length is not None and seq_len > self.max_length:
            return 413, {
                "error": f"sample {request.sample_id}: {seq_len} tokens is above "
                f"data.max_length = {self.max_length}"
            }
        try:
            hidden, last = self.target.features(request.input_ids)
        except (IndexError, RuntimeError) as exc:
            # Token ids outside the embedding, or a sequence beyond the position limit.
            return 422, {"error": f"sample {request.sample_id}: the target cannot run it: {exc}"}
        tensors = {
            "input_ids": torch.tensor(request.input_ids, dtype=torch.int64),
            "loss_mask": torch.tensor(request.loss_mask, dtype=torch.int64),
            "hidden_states": hidden,
            "target_last_hidden_states": last,
        }
        try:
            reply = tensors_to_store(self.store, request, self.spec, tensors)
        except StoreError as exc:
            return 503, {"error": f"sample {request.sample_id}: feature store write failed: {exc}"}
        self.captures += 1
        return 200, reply_to_json(reply)


def build_capture_server(
    cfg: Config,
    store: FeatureStore,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    dtype: str | None = None,
    device: str = "cpu",
    secret: str | None = None,
) -> CaptureServer:
    """The embedded capture server a config describes (target, layers, DSpark, max_length,
    run_id); with `secret`, only requests carrying it are served.

    The target runs in `dtype` if given, else as the local path runs it (bf16 on CUDA, fp32 on
    the CPU: the rule of `models.target.target_dtype`, not imported to keep this process light),
    so online features equal the in-process ones; model.dtype is the draft's dtype.
    """
    model = cfg.model
    if dtype is None:
        dtype = "bfloat16" if str(device).startswith("cuda") else "float32"
    target = load_capture_target(
        Path(model.target), model.target_layer_ids, dtype=dtype, device=device
    )
    spec = capture_spec(model.target_layer_ids, target.hidden_size, algorithm=model.algorithm)
    return CaptureServer(
        target,
        store,
        spec,
        max_length=cfg.data.max_length,
        host=host,
        port=port,
        run_id=cfg.run_id,
        secret=secret,
    )
