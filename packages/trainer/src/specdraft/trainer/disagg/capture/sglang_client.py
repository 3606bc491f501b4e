"""A `CaptureClient` for a real SGLang server: prompt hidden states from `POST /generate`.

What SGLang returns (read in sgl-project/sglang, python/sglang/srt/...):
- `managers/tokenizer_manager.py`: `meta_info["hidden_states"] = recv_obj.output_hidden_states[i]`
  when the request sets `return_hidden_states` (the server needs `--enable-return-hidden-states`).
- 0.5.23 `managers/scheduler_components/batch_result_processor.py`
  (`_append_prefill_hidden_states`): each prefill CHUNK appends one entry, that chunk's rows
  (a `[S_chunk][D]` list of lists); decode steps extend the list with `[D]` rows.
  `output_streamer.py` then cuts the entries to `hidden_states[:finished_len]` (finished_len =
  generated tokens, 1 here). Read closer: a middle chunk of a chunked prefill is processed with
  `store=False` (its request still has `inflight_middle_chunks`), so stock SGLang keeps only
  the LAST chunk's rows. Without the plugin the launcher therefore passes
  `--chunked-prefill-size -1`; this client joins every 2-D entry and checks the row count.
  With one chunk, `meta_info.hidden_states == [[S rows of D floats]]`.
- With the specdraft plugin (packages/sglang-plugin) configured by the launcher, SGLang writes
  the features into the feature store itself, from every chunk, and `meta_info.hidden_states`
  is `[{"specdraft_features": 1, ...}]`: the reference (`wire.sglang`). The client writes
  `input_ids` and `loss_mask` (SGLang never sees the mask) and checks the whole reply like any
  capture reply. Without the plugin the JSON body is read by `sglang_json` (numpy, no lists).
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
- Request ids carry an HMAC tag under the run's secret (`wire.sglang.capture_rid`): only such
  requests make the plugin write into the store.
- Not (yet) checked against a GPU server: the shapes above are read from the 0.5.23 source.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import numpy as np
import orjson
import torch

from ...runtime.http_client import HttpFailure, call_bytes, call_json
from ..store.base import FeatureStore, StoreError
from ..store.tensors import DTYPES, tensors_to_store
from ..wire.capture import (
    CaptureMismatch,
    CaptureRejected,
    CaptureReply,
    CaptureRequest,
    CaptureSpec,
    ProtocolError,
    check_reply,
)
from ..wire.sglang import (
    PLUGIN_TENSORS,
    PROBE,
    TOKEN_TENSORS,
    capture_rid,
    features_ref_from_json,
    is_features_ref,
    probe_rid,
)
from .client import http_capture_error
from .sglang_json import NotNumbers, NumericField, decode_generate_body

log = logging.getLogger(__name__)

FINAL_STATE_FIX = (
    "stock SGLang does not send it over HTTP; install the plugin into the SGLang server's "
    "environment (pip install --no-deps specdraft-sglang-plugin, from packages/sglang-plugin) "
    "and restart it, or set deployment.disaggregated.capture = 'embedded'"
)
PLUGIN_FIX = (
    "install the specdraft SGLang plugin into the server's environment (pip install --no-deps "
    "specdraft-sglang-plugin, from packages/sglang-plugin; the managed launcher then hands it "
    "the run's store in $SPECDRAFT_SGLANG_CAPTURE)"
)
# Token ids of the start-up probe: small ids exist in every vocabulary. 64 of them, so that the
# probe's JSON cost, timed, says what the JSON path costs per token.
PROBE_IDS = tuple(range(1, 65))
_NUMERIC_FIELDS = ("hidden_states", "last_hidden_states")


def generate_payload(request: CaptureRequest, secret: str | None = None) -> dict[str, Any]:
    """The SGLang /generate body: the prompt ids, one greedy token, hidden states returned."""
    return {
        "input_ids": list(request.input_ids),
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_hidden_states": True,
        # SGLang echoes the request id as meta_info.id: the reply's identity check. Its tag
        # is what makes the plugin write this request's features into the store.
        "rid": capture_rid(request, secret),
        "stream": False,
    }


def request_rid(request: CaptureRequest) -> str:
    """The untagged SGLang request id of a capture: `{run}/{sample}/g{attempt}`."""
    return capture_rid(request, None)


def split_sglang_hidden(
    body: Any,
    request: CaptureRequest,
    spec: CaptureSpec,
    *,
    rid: str | None = None,
    numeric: dict[str, NumericField] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(`hidden_states` [S, L*H] in config layer order, final state [S, H] or None), float32.

    `numeric` holds the fields `sglang_json` already parsed out of the raw body."""
    where = f"SGLang reply for sample {request.sample_id} attempt {request.attempt}"
    meta = _meta_info(body, where)
    _check_identity(meta, request, rid or request_rid(request), where)
    seq_len = len(request.input_ids)
    numeric = numeric or {}
    if "hidden_states" in numeric:
        states = _rows_of(numeric["hidden_states"], where)
    else:
        states = _array(_prompt_rows(meta.get("hidden_states"), where), where)
    if states.shape[0] != seq_len:
        raise CaptureMismatch(
            f"{where}: {states.shape[0]} hidden-state rows for a {seq_len}-token prompt (a "
            f"cached prefix or chunked prefill? start SGLang with --disable-radix-cache "
            f"--chunked-prefill-size -1, or {PLUGIN_FIX})"
        )
    n_layers, width = len(spec.layer_ids), spec.hidden_size
    if states.shape[1] not in (n_layers * width, (n_layers + 1) * width):
        raise CaptureMismatch(
            f"{where}: rows of {states.shape[1]} values, expected {n_layers} layers x {width} "
            f"= {n_layers * width} (or one more layer with the final state): the server taps "
            f"other layers or runs another target"
        )
    full = torch.from_numpy(states)
    # SGLang concatenates the tapped layers in ascending layer order; the config's order wins.
    ascending = sorted(spec.layer_ids)
    if list(spec.layer_ids) == ascending:
        hidden = full[:, : n_layers * width]
    else:
        blocks = {layer: full[:, i * width : (i + 1) * width] for i, layer in enumerate(ascending)}
        hidden = torch.cat([blocks[k] for k in spec.layer_ids], dim=-1)
    last = None
    if "last_hidden_states" in numeric:
        last = torch.from_numpy(_rows_of(numeric["last_hidden_states"], where))
    elif meta.get("last_hidden_states") is not None:
        last = torch.from_numpy(_array(_prompt_rows(meta["last_hidden_states"], where), where))
    elif states.shape[1] == (n_layers + 1) * width:
        last = full[:, n_layers * width :]
    if last is not None and tuple(last.shape) != (seq_len, width):
        raise CaptureMismatch(
            f"{where}: last_hidden_states has shape {list(last.shape)}, expected {[seq_len, width]}"
        )
    if spec.with_last_hidden and last is None:
        raise CaptureMismatch(
            f"{where}: DSpark needs the target's final hidden state, but the server returned "
            f"only the {n_layers} tapped layers: {FINAL_STATE_FIX}"
        )
    return hidden, last


def _meta_info(body: Any, where: str) -> dict[str, Any]:
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    meta = body.get("meta_info") if isinstance(body, dict) else None
    if not isinstance(meta, dict):
        raise CaptureMismatch(f"{where}: no meta_info object in the answer")
    return meta


def _check_identity(meta: dict[str, Any], request: CaptureRequest, rid: str, where: str) -> None:
    got = meta.get("id")
    if got is not None and got != rid:
        raise CaptureMismatch(f"{where}: answers request {got!r}, not {rid!r}")
    prompt_tokens = meta.get("prompt_tokens")
    if prompt_tokens is not None and prompt_tokens != len(request.input_ids):
        raise CaptureMismatch(
            f"{where}: the server saw {prompt_tokens} prompt tokens, the request has "
            f"{len(request.input_ids)}"
        )


def _rows_of(field: NumericField, where: str) -> np.ndarray:
    try:
        return field.prefill_rows()
    except NotNumbers as exc:
        raise CaptureMismatch(
            f"{where}: hidden_states rows are ragged or not numbers: {exc}"
        ) from None


def _array(rows: list[list[float]], where: str) -> np.ndarray:
    try:
        states = np.asarray(rows, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise CaptureMismatch(f"{where}: hidden_states rows are ragged or not numbers") from exc
    if states.ndim != 2:
        raise CaptureMismatch(f"{where}: hidden_states rows are ragged or not numbers")
    return states


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


def decode_reply(raw: bytes, where: str) -> tuple[Any, dict[str, NumericField]]:
    """The /generate body with its numeric fields parsed apart (`sglang_json`)."""
    try:
        return decode_generate_body(raw, _NUMERIC_FIELDS)
    except NotNumbers as exc:
        raise CaptureMismatch(
            f"{where}: hidden_states rows are ragged or not numbers: {exc}"
        ) from None
    except orjson.JSONDecodeError as exc:
        raise CaptureMismatch(f"{where}: the answer is not JSON: {exc}") from None


def features_ref_of(body: Any) -> dict[str, Any] | None:
    """The plugin's reference in a decoded body, or None (a stock JSON answer)."""
    try:
        entries = _meta_info(body, "").get("hidden_states")
    except CaptureMismatch:
        return None
    if isinstance(entries, list) and entries and is_features_ref(entries[0]):
        return entries[0]
    return None


class SGLangCaptureClient:
    """Captures through SGLang's /generate. With the specdraft plugin SGLang writes the features
    into the store and answers their reference; without it the client parses the JSON rows and
    writes them itself."""

    def __init__(
        self,
        url: str,
        spec: CaptureSpec,
        store: FeatureStore,
        *,
        dtype: str = "bfloat16",
        secret: str | None = None,
    ) -> None:
        if dtype not in DTYPES or dtype == "int64":
            raise ValueError(f"feature dtype {dtype!r} is not one of bfloat16, float16, float32")
        self.url = url.rstrip("/")
        self.spec = spec
        self.store = store
        self.dtype = DTYPES[dtype]
        self._secret = secret

    def __repr__(self) -> str:
        return f"SGLangCaptureClient({self.url!r})"

    def _generate(self, request: CaptureRequest, rid: str, *, timeout: float) -> bytes:
        payload = {**generate_payload(request), "rid": rid}
        try:
            return call_bytes("POST", f"{self.url}/generate", payload, timeout=timeout)
        except HttpFailure as exc:
            raise http_capture_error(exc) from None

    def capture(self, request: CaptureRequest, *, timeout: float) -> CaptureReply:
        """One prefill on SGLang; its features stored (by the plugin, or here) and checked."""
        rid = capture_rid(request, self._secret)
        where = f"SGLang reply for sample {request.sample_id} attempt {request.attempt}"
        body, numeric = decode_reply(self._generate(request, rid, timeout=timeout), where)
        ref = None if numeric else features_ref_of(body)
        if ref is not None:
            _check_identity(_meta_info(body, where), request, rid, where)
            return self._take_reference(ref, request, where)
        hidden, last = split_sglang_hidden(body, request, self.spec, rid=rid, numeric=numeric)
        tensors = {
            "input_ids": torch.tensor(request.input_ids, dtype=torch.int64),
            "loss_mask": torch.tensor(request.loss_mask, dtype=torch.int64),
            "hidden_states": hidden.to(self.dtype),
        }
        if last is not None:
            tensors["target_last_hidden_states"] = last.to(self.dtype)
        reply = self._store(request, tensors, None)
        check_reply(reply, request, self.spec)
        return reply

    def _store(
        self, request: CaptureRequest, tensors: dict[str, torch.Tensor], names: Any
    ) -> CaptureReply:
        try:
            return tensors_to_store(self.store, request, self.spec, tensors, names=names)
        except StoreError as exc:
            raise CaptureRejected(
                f"{self.url}: sample {request.sample_id}: feature store write failed: {exc}"
            ) from exc

    def _take_reference(
        self, ref: dict[str, Any], request: CaptureRequest, where: str
    ) -> CaptureReply:
        """The plugin wrote the features: check its reference, add the token rows, and check
        the whole reply like any capture reply. On failure nothing of the attempt stays."""
        try:
            features = features_ref_from_json(ref)
        except ProtocolError as exc:
            raise CaptureMismatch(f"{where}: bad feature reference: {exc}") from None
        written = [t.key for t in features.tensors]
        try:
            if any(t.name not in PLUGIN_TENSORS for t in features.tensors):
                raise CaptureMismatch(
                    f"{where}: the plugin wrote {[t.name for t in features.tensors]}; it writes "
                    f"only {list(PLUGIN_TENSORS)}"
                )
            tokens = self._store(
                request,
                {
                    "input_ids": torch.tensor(request.input_ids, dtype=torch.int64),
                    "loss_mask": torch.tensor(request.loss_mask, dtype=torch.int64),
                },
                TOKEN_TENSORS,
            )
            written += tokens.keys()
            reply = CaptureReply(
                run=features.run,
                sample_id=features.sample_id,
                attempt=features.attempt,
                seq_len=features.seq_len,
                layer_ids=features.layer_ids,
                hidden_size=features.hidden_size,
                tensors=tokens.tensors + features.tensors,
            )
            check_reply(reply, request, self.spec)
            for meta in features.tensors:
                if not self.store.exists(meta.key):
                    raise CaptureMismatch(
                        f"{where}: the SGLang plugin says it wrote {meta.key!r}, but the feature "
                        f"store this producer opened ({self.store!r}) has no such object: the "
                        f"server writes into another store (check its $SPECDRAFT_SGLANG_CAPTURE "
                        f"file against this run's deployment.disaggregated.store)"
                    )
        except BaseException:
            # A failed attempt leaves nothing resident (the producer also removes its keys).
            for key in written:
                with contextlib.suppress(StoreError):
                    self.store.remove(key, force=True)
            raise
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

    def verify_server(self, *, timeout: float, run: str = PROBE) -> bool:
        """Fail early, naming the fix, when the server cannot return what the draft needs:
        hidden states at all, and for DSpark the final state. One probe request says whether
        the plugin writes this run's features; without it the JSON path's measured cost is
        logged once. Returns whether the plugin is active."""
        info = self.server_info(timeout=timeout)
        if info.get("enable_return_hidden_states") is False:
            raise CaptureRejected(
                f"{self.url} was started without --enable-return-hidden-states; restart it with "
                f"that flag (and --enable-return-aux-hidden-states for the target layers)"
            )
        return self.probe(run=run, timeout=timeout)

    def probe(self, *, run: str, timeout: float) -> bool:
        """One /generate of PROBE_IDS under the run's probe id; True when the plugin answered."""
        probe = CaptureRequest(run, 0, 0, list(PROBE_IDS), [1] * len(PROBE_IDS))
        rid = probe_rid(run, self._secret)
        where = f"{self.url}: the start-up probe"
        started = time.perf_counter()
        body, numeric = decode_reply(self._generate(probe, rid, timeout=timeout), where)
        seconds = time.perf_counter() - started
        ref = None if numeric else features_ref_of(body)
        if ref is not None:
            self._check_probe_ref(ref, run, where)
            log.info("%s: the specdraft plugin writes this run's features into the store", self.url)
            return True
        try:
            split_sglang_hidden(body, probe, self.spec, rid=rid, numeric=numeric)
        except CaptureMismatch as exc:
            if self.spec.with_last_hidden:
                raise CaptureRejected(
                    f"{self.url}: the start-up probe failed, so this DSpark run stops before "
                    f"training: {exc}"
                ) from None
            raise CaptureRejected(f"{where} failed: {exc}") from None
        values = len(PROBE_IDS) * self.spec.hidden_size * len(self.spec.layer_ids)
        log.warning(
            "%s sends hidden states as JSON (no specdraft plugin writing this run's store): "
            "the probe took %.3f s for %d tokens, i.e. about %.2f s per 1,000-token sample of "
            "%d values per token, on the server and here; the plugin removes that cost: %s",
            self.url,
            seconds,
            len(PROBE_IDS),
            seconds / len(PROBE_IDS) * 1000,
            values // len(PROBE_IDS),
            PLUGIN_FIX,
        )
        return False

    def _check_probe_ref(self, ref: dict[str, Any], run: str, where: str) -> None:
        spec = self.spec
        want = {
            "run": run,
            "layer_ids": list(spec.layer_ids),
            "hidden_size": spec.hidden_size,
            "with_last_hidden": spec.with_last_hidden,
        }
        got = {name: ref.get(name) for name in want}
        if got != want:
            raise CaptureRejected(
                f"{where}: the SGLang plugin is set up for {got}, this run needs {want}: restart "
                f"the server with this run's $SPECDRAFT_SGLANG_CAPTURE file"
            )
        width = ref.get("row_width")
        if spec.with_last_hidden and width != (len(spec.layer_ids) + 1) * spec.hidden_size:
            raise CaptureRejected(
                f"{where}: the server's rows hold {width} values, without the final hidden state "
                f"DSpark needs, so this DSpark run stops before training: {FINAL_STATE_FIX}"
            )
