"""A `CaptureClient` for a real SGLang server: prompt hidden states from `POST /generate`.

What SGLang returns (read in sgl-project/sglang, python/sglang/srt/...):
- `managers/tokenizer_manager.py`: `meta_info["hidden_states"] = recv_obj.output_hidden_states[i]`
  when the request sets `return_hidden_states` (the server needs `--enable-return-hidden-states`).
- 0.5.23 `managers/scheduler_components/batch_result_processor.py`
  (`_append_prefill_hidden_states`): each prefill CHUNK appends one entry, that chunk's rows
  (a `[S_chunk][D]` list of lists); decode steps extend the list with `[D]` rows.
  `output_streamer.py` then cuts the entries to `hidden_states[:finished_len]` (finished_len =
  generated tokens, 1 here), which would drop every prefill chunk after the first: the
  launcher passes `--chunked-prefill-size -1`, and this client joins every 2-D entry and
  checks the row count. With one chunk, `meta_info.hidden_states == [[S rows of D floats]]`.
- `layers/logits_processor.py`: with CaptureHiddenMode.FULL and aux capture on,
  `hidden_states_to_store = torch.cat(aux_hidden_states, dim=-1)`: D = L*H, the tapped layers
  only, WITHOUT the final hidden state.
- `models/qwen3.py` `set_dflash_layers_to_capture(layer_ids)`: `layers_to_capture = [k + 1 for
  k in layer_ids]` ("SGLang captures before layer i"), so layer k is HF `hidden_states[k+1]`,
  our convention; aux states are appended while the layers run, i.e. in ascending layer order.
- `layers/logits_processor.py` (0.5.23) keeps the post-norm final state in
  `LogitsProcessorOutput.last_hidden_states` under aux capture, "not copied into the response
  path": stock SGLang never sends it, and the last layer cannot be tapped as an aux layer. The
  specdraft-sglang-plugin (packages/sglang-plugin) appends it after the tapped layers, so its
  rows hold D = (L+1)*H. This client takes DSpark's final state from there (or from a separate
  `meta_info["last_hidden_states"]`), and `verify_server` proves it with one probe request
  before the run trains: a DSpark run on stock SGLang stops at start-up, naming the plugin.
- Prefix caching would skip the cached rows: the launcher starts SGLang with
  `--disable-radix-cache`, and the row count is checked against the prompt length anyway.
- Not (yet) checked against a GPU server: the shapes above are read from the 0.5.23 source.
"""

from __future__ import annotations

from typing import Any

import torch

from ...runtime.http_json import HttpFailure, call_json
from ..store.base import FeatureStore, StoreError
from ..store.tensors import DTYPES, tensors_to_store
from ..wire.capture import (
    CaptureMismatch,
    CaptureRejected,
    CaptureReply,
    CaptureRequest,
    CaptureSpec,
    check_reply,
)
from .client import http_capture_error

FINAL_STATE_FIX = (
    "stock SGLang does not send it over HTTP; install the plugin into the SGLang server's "
    "environment (pip install --no-deps specdraft-sglang-plugin, from packages/sglang-plugin) "
    "and restart it, or set deployment.disaggregated.capture = 'embedded'"
)
# Token ids of the start-up probe: small ids exist in every vocabulary.
PROBE_IDS = (1, 2, 3, 4)


def generate_payload(request: CaptureRequest) -> dict[str, Any]:
    """The SGLang /generate body: the prompt ids, one greedy token, hidden states returned."""
    return {
        "input_ids": list(request.input_ids),
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_hidden_states": True,
        # SGLang echoes the request id as meta_info.id: the reply's identity check.
        "rid": request_rid(request),
        "stream": False,
    }


def request_rid(request: CaptureRequest) -> str:
    """The SGLang request id of a capture: `{run}/{sample}/g{attempt}`."""
    return f"{request.run}/{request.sample_id}/g{request.attempt}"


def split_sglang_hidden(
    body: Any, request: CaptureRequest, spec: CaptureSpec
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(`hidden_states` [S, L*H] in config layer order, final state [S, H] or None), float32."""
    where = f"SGLang reply for sample {request.sample_id} attempt {request.attempt}"
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    meta = body.get("meta_info") if isinstance(body, dict) else None
    if not isinstance(meta, dict):
        raise CaptureMismatch(f"{where}: no meta_info object in the answer")
    rid = meta.get("id")
    if rid is not None and rid != request_rid(request):
        raise CaptureMismatch(f"{where}: answers request {rid!r}, not {request_rid(request)!r}")
    seq_len = len(request.input_ids)
    prompt_tokens = meta.get("prompt_tokens")
    if prompt_tokens is not None and prompt_tokens != seq_len:
        raise CaptureMismatch(
            f"{where}: the server saw {prompt_tokens} prompt tokens, the request has {seq_len}"
        )
    rows = _prompt_rows(meta.get("hidden_states"), where)
    if len(rows) != seq_len:
        raise CaptureMismatch(
            f"{where}: {len(rows)} hidden-state rows for a {seq_len}-token prompt (a cached "
            f"prefix or chunked prefill? start SGLang with --disable-radix-cache "
            f"--chunked-prefill-size -1)"
        )
    try:
        states = torch.tensor(rows, dtype=torch.float32)
    except (TypeError, ValueError) as exc:
        raise CaptureMismatch(f"{where}: hidden_states rows are ragged or not numbers") from exc
    n_layers, width = len(spec.layer_ids), spec.hidden_size
    if states.shape[1] not in (n_layers * width, (n_layers + 1) * width):
        raise CaptureMismatch(
            f"{where}: rows of {states.shape[1]} values, expected {n_layers} layers x {width} "
            f"= {n_layers * width} (or one more layer with the final state): the server taps "
            f"other layers or runs another target"
        )
    # SGLang concatenates the tapped layers in ascending layer order; the config's order wins.
    blocks = {
        layer: states[:, i * width : (i + 1) * width]
        for i, layer in enumerate(sorted(spec.layer_ids))
    }
    hidden = torch.cat([blocks[k] for k in spec.layer_ids], dim=-1)
    last = None
    if "last_hidden_states" in meta and meta["last_hidden_states"] is not None:
        last = torch.tensor(_prompt_rows(meta["last_hidden_states"], where), dtype=torch.float32)
        if tuple(last.shape) != (seq_len, width):
            raise CaptureMismatch(
                f"{where}: last_hidden_states has shape {list(last.shape)}, "
                f"expected {[seq_len, width]}"
            )
    elif states.shape[1] == (n_layers + 1) * width:
        last = states[:, n_layers * width :]
    if spec.with_last_hidden and last is None:
        raise CaptureMismatch(
            f"{where}: DSpark needs the target's final hidden state, but the server returned "
            f"only the {n_layers} tapped layers: {FINAL_STATE_FIX}"
        )
    return hidden, last


def _prompt_rows(hidden_states: Any, where: str) -> list[list[float]]:
    """The prompt's rows from meta_info.hidden_states: the 2-D prefill entries, in order."""
    if not isinstance(hidden_states, list) or not hidden_states:
        raise CaptureMismatch(
            f"{where}: no hidden states in meta_info; start SGLang with "
            f"--enable-return-hidden-states and aux capture for the target layers"
        )
    if all(isinstance(row, list) and row and not isinstance(row[0], list) for row in hidden_states):
        return hidden_states  # already the bare [S][D] rows
    rows: list[list[float]] = []
    for entry in hidden_states:
        # 2-D entries are prefill chunks; 1-D entries are decode rows of generated tokens.
        if isinstance(entry, list) and entry and isinstance(entry[0], list):
            rows.extend(entry)
    return rows


class SGLangCaptureClient:
    """Captures through SGLang's /generate and writes the tensors into the store itself."""

    def __init__(
        self, url: str, spec: CaptureSpec, store: FeatureStore, *, dtype: str = "bfloat16"
    ) -> None:
        if dtype not in DTYPES or dtype == "int64":
            raise ValueError(f"feature dtype {dtype!r} is not one of bfloat16, float16, float32")
        self.url = url.rstrip("/")
        self.spec = spec
        self.store = store
        self.dtype = DTYPES[dtype]

    def __repr__(self) -> str:
        return f"SGLangCaptureClient({self.url!r})"

    def capture(self, request: CaptureRequest, *, timeout: float) -> CaptureReply:
        """One prefill on SGLang, its hidden states checked, split and stored; the reply."""
        try:
            body = call_json(
                "POST", f"{self.url}/generate", generate_payload(request), timeout=timeout
            )
        except HttpFailure as exc:
            raise http_capture_error(exc) from None
        hidden, last = split_sglang_hidden(body, request, self.spec)
        tensors = {
            "input_ids": torch.tensor(request.input_ids, dtype=torch.int64),
            "loss_mask": torch.tensor(request.loss_mask, dtype=torch.int64),
            "hidden_states": hidden.to(self.dtype),
        }
        if last is not None:
            tensors["target_last_hidden_states"] = last.to(self.dtype)
        try:
            reply = tensors_to_store(self.store, request, self.spec, tensors)
        except StoreError as exc:
            raise CaptureRejected(
                f"{self.url}: sample {request.sample_id}: feature store write failed: {exc}"
            ) from exc
        check_reply(reply, request, self.spec)
        return reply

    def health(self, *, timeout: float) -> bool:
        """True when SGLang's GET /health answers 200 in time."""
        try:
            call_json("GET", f"{self.url}/health", timeout=timeout)
        except HttpFailure:
            return False
        return True

    def server_info(self, *, timeout: float) -> dict[str, Any]:
        """SGLang's GET /get_server_info (its server arguments)."""
        try:
            info = call_json("GET", f"{self.url}/get_server_info", timeout=timeout)
        except HttpFailure as exc:
            raise http_capture_error(exc) from None
        return info if isinstance(info, dict) else {}

    def verify_server(self, *, timeout: float) -> None:
        """Fail early, naming the fix, when the server cannot return what the draft needs:
        hidden states at all, and for DSpark the final state (proved by one probe request)."""
        info = self.server_info(timeout=timeout)
        if info.get("enable_return_hidden_states") is False:
            raise CaptureRejected(
                f"{self.url} was started without --enable-return-hidden-states; restart it with "
                f"that flag (and --enable-return-aux-hidden-states for the target layers)"
            )
        if self.spec.with_last_hidden:
            self.probe_final_state(timeout=timeout)

    def probe_final_state(self, *, timeout: float) -> None:
        """One tiny /generate; CaptureRejected naming the plugin unless it has the final state."""
        probe = CaptureRequest("probe", 0, 0, list(PROBE_IDS), [1] * len(PROBE_IDS))
        try:
            body = call_json(
                "POST", f"{self.url}/generate", generate_payload(probe), timeout=timeout
            )
        except HttpFailure as exc:
            raise http_capture_error(exc) from None
        try:
            split_sglang_hidden(body, probe, self.spec)
        except CaptureMismatch as exc:
            raise CaptureRejected(
                f"{self.url}: the start-up probe failed, so this DSpark run stops before "
                f"training: {exc}"
            ) from None
