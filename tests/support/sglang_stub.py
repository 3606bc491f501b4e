"""A stand-in for `python -m sglang.launch_server`, FOR TESTS ONLY: the SGLang HTTP subset the
capture client uses, backed by a transformers target on the CPU.

SGLang pulls CUDA wheels and needs a GPU, so the tests launch this module through the same
managed launcher instead (`sglang_launcher`, with the module to run as a parameter). It speaks:
`GET /health`, `GET /health_generate`, `GET /get_model_info`, `GET /get_server_info` and
`POST /generate` with `input_ids`, `sampling_params.max_new_tokens` and `return_hidden_states`,
answering `meta_info.hidden_states = [[S rows]]` as SGLang does (see `sglang_client` for the
sources): with aux capture, the tapped layers in ascending layer order, concatenated; without
aux capture, the final hidden state alone. Stock SGLang never sends the final state next to the
aux layers; with `SPECDRAFT_SGLANG_STUB_FINAL_STATE=1` the stub appends it after them, as
SGLang with the specdraft-sglang-plugin installed does. It generates exactly one greedy token.

Prefill runs in chunks of `--chunked-prefill-size` tokens (-1: one chunk; the stub's default is
4, so the tests' short prompts take several), handed over per chunk as SGLang 0.5.23's
scheduler does: `_append_prefill_hidden_states(req=, logits_output=, hidden_state_offset=,
capture_hidden_mode=, extend_input_len=, store=)` with `store=False` for middle chunks, so a
stock answer keeps the last chunk's rows only (`stock_append_prefill_hidden_states`). With
$SPECDRAFT_SGLANG_CAPTURE set, the stub answers like a plugin-equipped SGLang: the handoff goes
through the plugin's own AROUND hook (`specdraft_sglang_plugin.feature_store`), which writes
into the run's store, and a request it fails answers the HTTP status of its FINISH_ABORT.

Its command line follows the capture interface named by `SPECDRAFT_SGLANG_STUB_INTERFACE`
("0.5.23", the default, or "aux-capture") and refuses what that SGLang refuses
(`check_capture_args`, compared with the real parser in
tests/trainer/disagg/capture/test_sglang_real_parser.py); `ServerArgs` below carries the fields
the launcher's interface detection reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from specdraft.trainer.disagg.capture.target import CaptureTarget, load_capture_target
from specdraft.trainer.runtime.http_server import JsonServer, JsonService

# The plugin's source tree: the stub runs it in place of an installed copy.
sys.path.insert(
    0, os.path.join(os.path.dirname(__file__), "..", "..", "packages", "sglang-plugin", "src")
)

STUB_VERSION = "specdraft-sglang-stub"
INTERFACE_ENV = "SPECDRAFT_SGLANG_STUB_INTERFACE"
FINAL_STATE_ENV = "SPECDRAFT_SGLANG_STUB_FINAL_STATE"
STUB_INTERFACE = os.environ.get(INTERFACE_ENV, "0.5.23")
CAPTURE_METHODS = ("EAGLE3", "DFLASH", "DSPARK")

if STUB_INTERFACE == "aux-capture":

    @dataclasses.dataclass
    class ServerArgs:
        """The capture fields of SGLang's ServerArgs after 0.5.23 (read by interface detection)."""

        model_path: str = ""
        speculative_algorithm: str | None = None
        aux_hidden_state_capture: str | None = None
        aux_hidden_state_layer_ids: list[int] | None = None

else:

    @dataclasses.dataclass
    class ServerArgs:  # type: ignore[no-redef]
        """The capture fields of SGLang 0.5.23's ServerArgs (read by interface detection)."""

        model_path: str = ""
        speculative_algorithm: str | None = None
        enable_return_aux_hidden_states: bool = False
        aux_hidden_state_capture: str | None = None
        return_aux_hidden_state_layer_ids: list[int] | None = None


class StubReq:
    """The fields of SGLang 0.5.23's `Req` that the prefill hand-off reads and writes."""

    def __init__(self, rid: str, input_ids: list[int], return_hidden_states: bool) -> None:
        self.rid = rid
        self.origin_input_ids = list(input_ids)
        self.return_hidden_states = return_hidden_states
        self.hidden_states: list[Any] = []
        self.inflight_middle_chunks = 0
        self.is_retracted = False
        self.to_finish: Any = None

    def finished(self) -> bool:
        """Whether the request has a finish reason (never, before its one token)."""
        return False


class StubAbort:
    """SGLang's FINISH_ABORT(message, status_code): the answer of a failed request."""

    def __init__(self, message: str, status_code: int) -> None:
        self.message = message
        self.status_code = status_code


FULL_CAPTURE = SimpleNamespace(is_full=lambda: True, is_last=lambda: False)


def stock_append_prefill_hidden_states(
    _processor: Any,
    *,
    req: Any,
    logits_output: Any,
    hidden_state_offset: int,
    capture_hidden_mode: Any,
    extend_input_len: int,
    store: bool = True,
) -> int:
    """What stock SGLang 0.5.23 does with one chunk's rows under full capture: a committed
    chunk of a request that asked for them is appended as a list of lists; the next offset."""
    end = hidden_state_offset + extend_input_len
    if store and req.return_hidden_states:
        rows = logits_output.hidden_states[hidden_state_offset:end]
        req.hidden_states.append(rows.cpu().clone().tolist())
    return end


def hand_over_chunk(
    handoff: Any, req: Any, batch_rows: torch.Tensor, *, offset: int, size: int, store: bool
) -> int:
    """One call of the scheduler's prefill hand-off: this request's `size` rows start at
    `offset` in the batch's rows; returns the next request's offset."""
    return handoff(
        None,
        req=req,
        logits_output=SimpleNamespace(hidden_states=batch_rows),
        hidden_state_offset=offset,
        capture_hidden_mode=FULL_CAPTURE,
        extend_input_len=size,
        store=store,
    )


def prefill_handoff() -> Any:
    """The hand-off as this process has it: stock, or through the plugin's hook when it is
    configured ($SPECDRAFT_SGLANG_CAPTURE)."""
    path = os.environ.get("SPECDRAFT_SGLANG_CAPTURE")
    if not path:
        return stock_append_prefill_hidden_states
    from specdraft_sglang_plugin import feature_store

    feature_store.enable(path)
    feature_store.finish_abort = StubAbort  # SGLang's own needs its scheduler modules

    def hooked(processor: Any, **kwargs: Any) -> int:
        return feature_store.capture_prefill_rows(
            stock_append_prefill_hidden_states, processor, **kwargs
        )

    return hooked


class SGLangStub(JsonService):
    """The stub server around one target; `start()` serves on a background thread."""

    def __init__(
        self,
        target: CaptureTarget,
        *,
        model_path: str,
        return_hidden_states: bool = True,
        aux_capture: bool = True,
        speculative_algorithm: str | None = "DFLASH",
        final_state: bool = False,
        chunk_size: int = -1,
        handoff: Any = stock_append_prefill_hidden_states,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.chunk_size = chunk_size
        self.handoff = handoff
        self.target = target
        self.model_path = model_path
        self.return_hidden_states = return_hidden_states
        self.aux_capture = aux_capture
        self.speculative_algorithm = speculative_algorithm
        self.final_state = final_state
        self._http = JsonServer(
            {
                ("GET", "/health"): lambda _: (200, None),
                ("GET", "/health_generate"): self._health_generate,
                ("GET", "/get_model_info"): self._model_info,
                ("GET", "/get_server_info"): self._server_info,
                ("POST", "/generate"): self._generate,
            },
            host=host,
            port=port,
            name="sglang-stub",
        )

    def _model_info(self, _body: Any) -> tuple[int, Any]:
        return 200, {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "is_generation": True,
        }

    def _server_info(self, _body: Any) -> tuple[int, Any]:
        return 200, {
            "model_path": self.model_path,
            "enable_return_hidden_states": self.return_hidden_states,
            "enable_return_aux_hidden_states": self.aux_capture,
            "aux_hidden_state_layer_ids": sorted(self.target.layer_ids),
            "speculative_algorithm": self.speculative_algorithm,
            "disable_radix_cache": True,
            "version": STUB_VERSION,
        }

    def _health_generate(self, _body: Any) -> tuple[int, Any]:
        self.target.features([0])
        return 200, None

    def _generate(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            return 400, {"error": "the request body must be a JSON object"}
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            return 400, {"error": "input_ids must be a non-empty list of token ids"}
        params = body.get("sampling_params") or {}
        if params.get("max_new_tokens", 1) != 1:
            return 400, {"error": "this stub generates exactly one token (max_new_tokens = 1)"}
        want_hidden = bool(body.get("return_hidden_states"))
        if want_hidden and not self.return_hidden_states:
            # Mirrors SGLang's refusal when the server flag is off.
            return 400, {
                "error": "The server is not configured to return the hidden states. "
                "Please set `--enable-return-hidden-states` to enable it."
            }
        try:
            hidden, last = self.target.features(ids)
        except (IndexError, RuntimeError) as exc:
            return 400, {"error": f"cannot run the prompt: {exc}"}
        head = self.target.model.get_output_embeddings()
        with torch.no_grad():
            next_id = int(head(last[-1:].to(head.weight.dtype)).argmax(-1)[0])
        meta: dict[str, Any] = {
            "id": body.get("rid") or "stub",
            "prompt_tokens": len(ids),
            "completion_tokens": 1,
            "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": 1},
        }
        if want_hidden:
            if not self.aux_capture:
                rows = last
            elif self.final_state:
                rows = torch.cat([hidden, last], dim=-1)
            else:
                rows = hidden
            req = StubReq(str(meta["id"]), ids, True)
            self._prefill(req, rows)
            if req.to_finish is not None:
                return req.to_finish.status_code, {"error": req.to_finish.message}
            # The output streamer's cut to finished_len (one generated token).
            meta["hidden_states"] = req.hidden_states[:1]
        return 200, {"text": "", "output_ids": [next_id], "meta_info": meta}

    def _prefill(self, req: StubReq, rows: torch.Tensor) -> None:
        """Hand the rows over chunk by chunk, as the scheduler does."""
        size = len(rows) if self.chunk_size <= 0 else self.chunk_size
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            middle = start + size < len(rows)
            req.inflight_middle_chunks = 1 if middle else 0
            hand_over_chunk(self.handoff, req, chunk, offset=0, size=len(chunk), store=not middle)


def parse_args(
    argv: Sequence[str], interface: str = STUB_INTERFACE
) -> tuple[argparse.Namespace, list[str]]:
    """The launch_server flags the stub knows for an interface; the rest are returned."""
    parser = argparse.ArgumentParser(prog="sglang_stub", description=__doc__)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--dtype", default="float32", choices=["auto", "bfloat16", "float16", "float32"]
    )
    parser.add_argument("--enable-return-hidden-states", action="store_true")
    parser.add_argument("--speculative-algorithm", default=None)
    parser.add_argument("--speculative-draft-model-path", default=None)
    parser.add_argument("--pp-size", type=int, default=1)
    parser.add_argument("--disable-radix-cache", action="store_true")
    parser.add_argument("--chunked-prefill-size", type=int, default=4)
    if interface == "aux-capture":
        parser.add_argument("--aux-hidden-state-capture", choices=["eagle3", "dflash", "dspark"])
        parser.add_argument("--aux-hidden-state-layer-ids", type=int, nargs="+", default=None)
    else:
        parser.add_argument("--enable-return-aux-hidden-states", action="store_true")
        parser.add_argument(
            "--return-aux-hidden-state-layer-ids", type=int, nargs="+", default=None
        )
    return parser.parse_known_args(list(argv))


def check_capture_args(argv: Sequence[str], interface: str = STUB_INTERFACE) -> argparse.Namespace:
    """SGLang's verdict on the capture flags of `argv`: the parsed args, or ValueError."""
    args, unknown = parse_args(argv, interface)
    # An aux-capture flag of the other interface is an unknown argument to SGLang's parser.
    foreign = [a for a in unknown if "aux-hidden-state" in a]
    if foreign:
        raise ValueError(f"unrecognized arguments: {' '.join(foreign)}")
    if interface == "aux-capture":
        method, layer_ids = args.aux_hidden_state_capture, args.aux_hidden_state_layer_ids
        if method is None:
            if layer_ids is not None:
                raise ValueError(
                    "--aux-hidden-state-layer-ids requires --aux-hidden-state-capture."
                )
            return args
        if args.speculative_algorithm is not None:
            raise ValueError(
                "--aux-hidden-state-capture cannot be combined with --speculative-algorithm."
            )
        method = method.upper()
        flag = "--aux-hidden-state-layer-ids"
    else:
        layer_ids = args.return_aux_hidden_state_layer_ids
        flag = "--return-aux-hidden-state-layer-ids"
        if not args.enable_return_aux_hidden_states:
            if layer_ids is not None:
                raise ValueError(f"{flag} requires --enable-return-aux-hidden-states.")
            return args
        method = (args.speculative_algorithm or "").upper()
        if method not in CAPTURE_METHODS:
            raise ValueError(
                "--enable-return-aux-hidden-states needs --speculative-algorithm EAGLE3, DFLASH "
                f"or DSPARK to name the capture convention, got {args.speculative_algorithm!r}."
            )
    if args.speculative_draft_model_path is not None:
        raise ValueError(
            "aux hidden-state capture runs without a draft; drop --speculative-draft-model-path."
        )
    if args.pp_size != 1:
        raise ValueError("aux hidden-state capture only supports pp_size == 1.")
    if method != "EAGLE3" and not layer_ids:
        raise ValueError(f"aux hidden-state capture with {method} requires {flag}.")
    if layer_ids is not None:
        if any(k < 0 for k in layer_ids):
            raise ValueError(f"{flag} must be non-negative, got {list(layer_ids)}.")
        if len(set(layer_ids)) != len(layer_ids):
            raise ValueError(f"{flag} must not repeat a layer, got {list(layer_ids)}.")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Run the stub until SIGTERM/SIGINT, like `python -m sglang.launch_server`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = check_capture_args(argv)
    except ValueError as exc:
        sys.exit(f"sglang_stub: {exc}")
    _, ignored = parse_args(argv)
    layer_ids = getattr(args, "aux_hidden_state_layer_ids", None) or getattr(
        args, "return_aux_hidden_state_layer_ids", None
    )
    aux_capture = bool(
        getattr(args, "aux_hidden_state_capture", None)
        or getattr(args, "enable_return_aux_hidden_states", False)
    )
    if not layer_ids:
        sys.exit(
            "sglang_stub: the stub needs the aux layer ids (it has no draft config to read the "
            "target layers from)"
        )
    if ignored:
        print(f"sglang_stub: ignoring {' '.join(ignored)}", flush=True)
    dtype = "float32" if args.dtype == "auto" else args.dtype
    target = load_capture_target(args.model_path, sorted(layer_ids), dtype=dtype)
    stub = SGLangStub(
        target,
        model_path=args.model_path,
        return_hidden_states=args.enable_return_hidden_states,
        aux_capture=aux_capture,
        speculative_algorithm=args.speculative_algorithm,
        # The plugin always appends the final state after the tapped layers.
        final_state=os.environ.get(FINAL_STATE_ENV) == "1"
        or bool(os.environ.get("SPECDRAFT_SGLANG_CAPTURE")),
        chunk_size=args.chunked_prefill_size,
        handoff=prefill_handoff(),
        host=args.host,
        port=args.port,
    )

    def _stop(signum: int, _frame: object) -> None:
        # shutdown() blocks until serve_forever returns: call it off the serving thread.
        threading.Thread(target=stub.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"sglang_stub: serving {args.model_path} on {stub.url}", flush=True)
    stub.serve_forever()


if __name__ == "__main__":
    main()
