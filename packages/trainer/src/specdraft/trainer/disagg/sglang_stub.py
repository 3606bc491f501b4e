"""A stand-in for `python -m sglang.launch_server`, FOR TESTS ONLY: the SGLang HTTP subset the
capture client uses, backed by a transformers target on the CPU.

SGLang pulls CUDA wheels and needs a GPU, so the tests launch this module through the same
managed launcher instead (`sglang_launcher`, with the module to run as a parameter). It speaks:
`GET /health`, `GET /health_generate`, `GET /get_model_info`, `GET /get_server_info` and
`POST /generate` with `input_ids`, `sampling_params.max_new_tokens` and `return_hidden_states`,
answering `meta_info.hidden_states = [[S rows]]` as SGLang does (see `sglang_client` for the
sources): with aux capture, the tapped layers in ascending layer order, concatenated; with
`--speculative-algorithm DSPARK`, the final hidden state appended after them; without aux
capture, the final hidden state alone. It generates exactly one greedy token.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

import torch

from .capture_target import CaptureTarget, load_capture_target
from .http_json import JsonServer, JsonService

STUB_VERSION = "specdraft-sglang-stub"


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
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.target = target
        self.model_path = model_path
        self.return_hidden_states = return_hidden_states
        self.aux_capture = aux_capture
        self.speculative_algorithm = speculative_algorithm
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
            elif self.speculative_algorithm == "DSPARK":
                rows = torch.cat([hidden, last], dim=-1)
            else:
                rows = hidden
            meta["hidden_states"] = [rows.float().tolist()]
        return 200, {"text": "", "output_ids": [next_id], "meta_info": meta}


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The launch_server flags the stub knows; the rest are returned (and ignored)."""
    parser = argparse.ArgumentParser(prog="sglang_stub", description=__doc__)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--dtype", default="float32", choices=["auto", "bfloat16", "float16", "float32"]
    )
    parser.add_argument("--enable-return-hidden-states", action="store_true")
    parser.add_argument("--enable-return-aux-hidden-states", action="store_true")
    parser.add_argument("--speculative-algorithm", choices=["DFLASH", "DSPARK"], default=None)
    parser.add_argument("--aux-hidden-state-layer-ids", type=int, nargs="+", default=None)
    parser.add_argument("--disable-radix-cache", action="store_true")
    return parser.parse_known_args(list(argv))


def main(argv: Sequence[str] | None = None) -> None:
    """Run the stub until SIGTERM/SIGINT, like `python -m sglang.launch_server`."""
    args, ignored = parse_args(sys.argv[1:] if argv is None else argv)
    if args.aux_hidden_state_layer_ids is None:
        sys.exit(
            "sglang_stub: --aux-hidden-state-layer-ids is required (the stub has no draft "
            "config to read the target layers from)"
        )
    if ignored:
        print(f"sglang_stub: ignoring {' '.join(ignored)}", flush=True)
    dtype = "float32" if args.dtype == "auto" else args.dtype
    target = load_capture_target(
        args.model_path, sorted(args.aux_hidden_state_layer_ids), dtype=dtype
    )
    stub = SGLangStub(
        target,
        model_path=args.model_path,
        return_hidden_states=args.enable_return_hidden_states,
        aux_capture=args.enable_return_aux_hidden_states,
        speculative_algorithm=args.speculative_algorithm,
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
