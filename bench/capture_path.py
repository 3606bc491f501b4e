"""SGLang capture paths side by side: what one sample of hidden states costs to get from SGLang's
scheduler into the feature store, per path, at the Qwen3-8B shape (hidden 4096, 5 tapped layers,
bf16 features).

    OMP_NUM_THREADS=1 python bench/capture_path.py --tokens 512,1300,2048,8192

Paths, all in this one process on the CPU:
- stock JSON (today's client): SGLang turns the rows into a list of lists (`.cpu().clone()
  .tolist()`, its hand-off) and orjson dumps the body (its ORJSONResponse); the client as it was
  before the plugin path: `json.loads`, `torch.tensor` of the nested lists, the store write.
- fast JSON: the same stock server; the client of today (`sglang_json`: numpy parse, no lists).
- plugin: the plugin's hook (`feature_store.capture_prefill_rows`) driven with a CPU tensor
  shaped as SGLang hands it over (the batch's rows, the request's offset and length), writing
  into the store; the body carries the reference; the client checks it and writes the tokens.
- raw store write / read of the same feature bytes (`LocalFeatureStore.put` / `get`).
"SGLang side" is the work the server does per sample (its scheduler loop stalls on the
hand-off; the dump runs in its HTTP worker), "specdraft side" the client's work on the body,
"end to end" one `capture()` over HTTP against a local server doing the SGLang side per request.
samples/s per server = 1 / SGLang side. Each figure is the best of its repeats. The stock path is
skipped above --max-stock-tokens and the fast JSON path above --max-json-tokens (memory: 8,192
tokens are ~1.8 GB of JSON and ~5 GB of Python floats on the server side).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages" / "sglang-plugin" / "src"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from sglang_stub import StubReq, hand_over_chunk, stock_append_prefill_hidden_states  # noqa: E402
from specdraft_sglang_plugin import feature_store  # noqa: E402

from specdraft.trainer.disagg.capture.sglang_client import (  # noqa: E402
    SGLangCaptureClient,
    decode_reply,
    split_sglang_hidden,
)
from specdraft.trainer.disagg.store.local import LocalFeatureStore  # noqa: E402
from specdraft.trainer.disagg.store.tensors import tensor_bytes, tensors_to_store  # noqa: E402
from specdraft.trainer.disagg.wire import CaptureRequest, capture_spec  # noqa: E402
from specdraft.trainer.disagg.wire.sglang import (  # noqa: E402
    PluginSettings,
    capture_rid,
    write_plugin_settings,
)
from specdraft.trainer.runtime.http_client import call_json  # noqa: E402

HIDDEN, LAYERS = 4096, (1, 9, 17, 25, 33)
RUN, SECRET = "bench", "be" * 32


def timed(fn, repeats: int) -> tuple[float, object]:
    """Best seconds of `repeats` calls (on a shared machine the least disturbed run is the
    closest to the path's own cost), and the last result."""
    times, out = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - started)
    return min(times), out


# ------------------------------------------------------------------------------ SGLang sides


def plugin_handoff(processor, **kwargs) -> int:
    """SGLang's hand-off with the plugin's AROUND hook applied."""
    return feature_store.capture_prefill_rows(
        stock_append_prefill_hidden_states, processor, **kwargs
    )


def stock_sglang_side(rows: torch.Tensor, rid: str) -> bytes:
    """Stock SGLang: the hand-off's list of lists, then the orjson dump of the answer."""
    req = StubReq(rid, list(range(len(rows))), True)
    hand_over_chunk(
        stock_append_prefill_hidden_states, req, rows, offset=0, size=len(rows), store=True
    )
    meta = {"id": rid, "prompt_tokens": len(rows), "hidden_states": req.hidden_states[:1]}
    return orjson.dumps({"text": "", "output_ids": [7], "meta_info": meta})


def plugin_sglang_side(rows: torch.Tensor, rid: str) -> bytes:
    """SGLang with the plugin: the hook writes the rows into the store; the reference is sent."""
    req = StubReq(rid, list(range(len(rows))), True)
    hand_over_chunk(plugin_handoff, req, rows, offset=0, size=len(rows), store=True)
    if req.to_finish is not None:
        raise RuntimeError(req.to_finish.message)
    meta = {"id": rid, "prompt_tokens": len(rows), "hidden_states": req.hidden_states[:1]}
    return orjson.dumps({"text": "", "output_ids": [7], "meta_info": meta})


# ---------------------------------------------------------------------------- specdraft sides


def todays_client(body: bytes, request: CaptureRequest, spec, store) -> object:
    """The client before this change: json.loads, torch.tensor of the lists, the store write."""
    return todays_from_parsed(json.loads(body), request, spec, store)


def todays_from_parsed(parsed: dict, request: CaptureRequest, spec, store) -> object:
    """The client before this change, after json.loads."""
    rows = [r for e in parsed["meta_info"]["hidden_states"] if isinstance(e[0], list) for r in e]
    states = torch.tensor(rows, dtype=torch.float32)
    tensors = {
        "input_ids": torch.tensor(request.input_ids, dtype=torch.int64),
        "loss_mask": torch.tensor(request.loss_mask, dtype=torch.int64),
        "hidden_states": states.to(torch.bfloat16),
    }
    return tensors_to_store(store, request, spec, tensors)


def fast_json_client(body: bytes, request: CaptureRequest, spec, store) -> object:
    """Today's JSON fallback: numpy parse of the raw body, the store write."""
    decoded, numeric = decode_reply(body, "bench")
    hidden, _ = split_sglang_hidden(decoded, request, spec, numeric=numeric)
    tensors = {
        "input_ids": torch.tensor(request.input_ids, dtype=torch.int64),
        "loss_mask": torch.tensor(request.loss_mask, dtype=torch.int64),
        "hidden_states": hidden.to(torch.bfloat16),
    }
    return tensors_to_store(store, request, spec, tensors)


def plugin_client(client: SGLangCaptureClient, body: bytes, request: CaptureRequest) -> object:
    """The client on the plugin path: the reference checked, the token rows written."""
    from specdraft.trainer.disagg.capture.sglang_client import features_ref_of

    decoded, _ = decode_reply(body, "bench")
    return client._take_reference(features_ref_of(decoded), request, "bench")


# --------------------------------------------------------------------------- the HTTP server


class Server:
    """A local /generate that does one path's SGLang side per request."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows
        self.answer = stock_sglang_side
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body = server.answer(server.rows, payload["rid"])
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def todays_capture(url: str, request: CaptureRequest, spec, store) -> object:
    """Today's `capture()` end to end: urllib, json.loads, torch.tensor, the store write."""
    payload = {
        "input_ids": request.input_ids,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_hidden_states": True,
        "rid": capture_rid(request, None),
    }
    body = call_json("POST", f"{url}/generate", payload, timeout=600)  # urllib + json.loads
    return todays_from_parsed(body, request, spec, store)


# ------------------------------------------------------------------------------------ one size


def measure(tokens: int, args: argparse.Namespace, folder: Path) -> list[dict]:
    """Every path at one prompt length; one row per path."""
    torch.manual_seed(tokens)
    rows = torch.randn(tokens, len(LAYERS) * HIDDEN).to(torch.bfloat16)
    spec = capture_spec(LAYERS, HIDDEN, algorithm="dflash2")
    store = LocalFeatureStore(folder / "feature-store")
    ids = list(range(tokens))
    feature_mb = rows.numel() * 2 / 1e6
    out = []
    attempt = iter(range(10**6))

    def request() -> CaptureRequest:
        return CaptureRequest(RUN, tokens, next(attempt), ids, [1] * tokens)

    def clear() -> None:
        shutil.rmtree(store.root / RUN, ignore_errors=True)

    data = tensor_bytes(rows)
    keys = (f"{RUN}/{tokens}/g{900000 + i}/hidden_states" for i in range(10**6))
    store.put(key := f"{RUN}/{tokens}/g900000/hidden_states", data)
    read_s, _ = timed(lambda: store.get(key), args.repeats)
    clear()
    server = Server(rows)
    try:
        json_paths = []
        if tokens <= args.max_stock_tokens:
            json_paths.append(("stock JSON (today)", todays_client, "today"))
        if tokens <= args.max_json_tokens:
            json_paths.append(("fast JSON fallback", fast_json_client, "fast"))
        body, stock_s = None, None
        for name, client_side, kind in json_paths:
            repeats = args.stock_repeats if kind == "today" else args.json_repeats
            req = request()
            rid = capture_rid(req, None)
            # Both JSON paths answer from the same stock server: its side is measured once.
            if stock_s is None:
                stock_s, body = timed(lambda r=rid: stock_sglang_side(rows, r), args.json_repeats)
            else:
                body = stock_sglang_side(rows, rid)
            sglang_s, json_mb = stock_s, len(body) / 1e6
            client_s, _ = timed(lambda b=body, f=client_side, q=req: f(b, q, spec, store), repeats)
            clear()
            del body
            server.answer = stock_sglang_side
            if kind == "today":
                e2e_s, _ = timed(
                    lambda: todays_capture(server.url, request(), spec, store), repeats
                )
            else:
                client = SGLangCaptureClient(server.url, spec, store)
                e2e_s, _ = timed(lambda c=client: c.capture(request(), timeout=600), repeats)
            clear()
            out.append(row(tokens, name, feature_mb, json_mb, sglang_s, client_s, e2e_s))
        # The plugin path.
        client = SGLangCaptureClient(server.url, spec, store, secret=SECRET)

        def plugin_sample() -> tuple[bytes, CaptureRequest]:
            req = request()
            return plugin_sglang_side(rows, capture_rid(req, SECRET)), req

        # Interleaved with the raw writes, so both see the same page cache and disk.
        plugin_times, write_times = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            body, req = plugin_sample()
            plugin_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            store.put(next(keys), data)
            write_times.append(time.perf_counter() - started)
        sglang_s, write_s = min(plugin_times), min(write_times)
        client_s, _ = timed(lambda: plugin_client(client, body, req), args.repeats)
        clear()
        server.answer = plugin_sglang_side
        e2e_s, _ = timed(lambda: client.capture(request(), timeout=600), args.repeats)
        clear()
        out.append(row(tokens, "plugin", feature_mb, len(body) / 1e6, sglang_s, client_s, e2e_s))
    finally:
        server.stop()
    out.append(row(tokens, "raw store write / read", feature_mb, 0.0, write_s, read_s, None))
    return out


def row(tokens, path, feature_mb, body_mb, sglang_s, client_s, e2e_s) -> dict:
    """One table row."""
    return {
        "tokens": tokens,
        "path": path,
        "feature_mb": round(feature_mb, 1),
        "body_mb": round(body_mb, 3),
        "sglang_s": sglang_s,
        "specdraft_s": client_s,
        "e2e_s": e2e_s,
        "samples_per_s": 1.0 / sglang_s if sglang_s else None,
    }


def table(rows: list[dict]) -> str:
    """Markdown."""
    lines = [
        "| tokens | path | feature MB | body MB | SGLang side s/sample | specdraft side s/sample "
        "| end to end s/sample | samples/s per server | end to end vs stock |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    stock = {r["tokens"]: r["e2e_s"] for r in rows if r["path"].startswith("stock")}
    for r in rows:
        e2e = "" if r["e2e_s"] is None else f"{r['e2e_s']:.3f}"
        base = stock.get(r["tokens"])
        ratio = base / r["e2e_s"] if base and r["e2e_s"] else None
        vs = "" if ratio is None else f"{ratio:.1f}x" if ratio < 10 else f"{ratio:.0f}x"
        per_server = f"{r['samples_per_s']:.1f}" if r["e2e_s"] is not None else ""
        lines.append(
            f"| {r['tokens']:,} | {r['path']} | {r['feature_mb']} | {r['body_mb']} "
            f"| {r['sglang_s']:.3f} | {r['specdraft_s']:.3f} | {e2e} | {per_server} | {vs} |"
        )
    return "\n".join(lines)


def targets(rows: list[dict], tokens: int = 1300) -> str:
    """The targets at 1,300 tokens."""
    at = {r["path"]: r for r in rows if r["tokens"] == tokens}
    if not {"plugin", "raw store write / read"} <= set(at):
        return ""
    plugin, raw = at["plugin"], at["raw store write / read"]
    lines = [
        f"plugin SGLang side / raw store write: {plugin['sglang_s'] / raw['sglang_s']:.2f}x "
        f"(target <= 2x)",
        f"plugin specdraft side / raw store read: "
        f"{plugin['specdraft_s'] / raw['specdraft_s']:.2f}x (target <= 2x)",
    ]
    if "stock JSON (today)" in at:
        stock = at["stock JSON (today)"]["e2e_s"]
        lines.append(f"plugin end to end: {stock / plugin['e2e_s']:.0f}x faster (target >= 50x)")
        if "fast JSON fallback" in at:
            fast = at["fast JSON fallback"]["e2e_s"]
            lines.append(
                f"fast JSON end to end: {fast:.2f} s, {stock / fast:.1f}x faster (target >= 4x, "
                f"<= 5 s)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the sizes, print the table and the targets."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tokens", default="512,1300,2048,8192")
    parser.add_argument("--repeats", type=int, default=7, help="runs of the plugin and raw rows")
    parser.add_argument("--json-repeats", type=int, default=3, help="runs of the fast JSON path")
    parser.add_argument("--stock-repeats", type=int, default=2, help="runs of the stock path")
    parser.add_argument("--max-stock-tokens", type=int, default=2048)
    parser.add_argument("--max-json-tokens", type=int, default=2048)
    parser.add_argument("--store-dir", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="capture-bench-", dir=args.store_dir))
    settings = PluginSettings(RUN, SECRET, LAYERS, HIDDEN, False, "bfloat16", "local", str(folder))
    feature_store.enable(str(write_plugin_settings(folder / "capture.json", settings)))
    rows: list[dict] = []
    try:
        for tokens in [int(t) for t in args.tokens.split(",")]:
            rows += measure(tokens, args, folder)
            print(table([r for r in rows if r["tokens"] == tokens]), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print()
    print(f"Qwen3-8B shape: hidden {HIDDEN}, {len(LAYERS)} tapped layers, bf16; local store")
    print(table(rows))
    print()
    print(targets(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
