"""Shared bits of the producer / window-delivery tests: prompts, configs, capture clients that
fail on cue, a producer with its controller, and trainer ranks that consume windows.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from disagg_support import make_config

from specdraft.config import Config
from specdraft.trainer.disagg.capture.client import HttpCaptureClient
from specdraft.trainer.disagg.capture.server import CaptureServer, build_capture_server
from specdraft.trainer.disagg.consumer.client import WindowClient
from specdraft.trainer.disagg.consumer.fetch import fetch_micro_batches
from specdraft.trainer.disagg.producer.controller import WindowController
from specdraft.trainer.disagg.producer.ledger import read_ledger, replay, trained_sample_counts
from specdraft.trainer.disagg.producer.main import plan_prompts
from specdraft.trainer.disagg.producer.producer import Producer, ProducerSettings, ledger_path
from specdraft.trainer.disagg.producer.prompts import Prompt, screen_prompts
from specdraft.trainer.disagg.store import local_store_root, tensors_to_store
from specdraft.trainer.disagg.store.local import LocalFeatureStore
from specdraft.trainer.disagg.wire import CaptureError, capture_spec
from specdraft.trainer.disagg.wire.windows import write_controller_address


def make_prompts(
    n: int, *, vocab: int = 90, first_id: int = 1000, seed: int = 0, longest: int = 24
) -> list[Prompt]:
    """n prompts of 3..longest tokens with a supervised tail, sample ids first_id.. (not
    indices)."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(n):
        length = int(torch.randint(3, longest + 1, (1,), generator=g))
        ids = torch.randint(1, vocab, (length,), generator=g).tolist()
        prompt_len = max(1, length // 3)
        mask = [0] * prompt_len + [1] * (length - prompt_len)
        prompts.append(Prompt(first_id + 7 * i, tuple(ids), tuple(mask)))
    return prompts


def runtime_config(
    target: str | Path,
    run_dir: Path,
    *,
    world_size: int = 2,
    micro_batch_size: int = 2,
    grad_accum_steps: int = 2,
    num_epochs: int = 2,
    algorithm: str = "dflash2",
    disaggregated: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> Config:
    """A disaggregated config for the tiny target with small batches and short timeouts."""
    dis = {
        "capture_timeout_s": 10.0,
        "window_timeout_s": 20.0,
        "health_timeout_s": 2.0,
        "shutdown_timeout_s": 5.0,
        "max_inflight_captures": 3,
        **(disaggregated or {}),
    }
    high_watermark = dis.pop("high_watermark", None)
    doc = make_config(Path(target), run_dir, algorithm=algorithm, disaggregated=dis).model_dump()
    doc["training"].update(
        micro_batch_size=micro_batch_size,
        grad_accum_steps=grad_accum_steps,
        num_epochs=num_epochs,
        **(training or {}),
    )
    doc["data"].update(data or {})
    doc["deployment"]["nproc_per_node"] = world_size
    doc["deployment"]["disaggregated"]["high_watermark"] = high_watermark
    # Validated as a whole: the cross-field rules (watermark >= one window) see the final sizes.
    return Config.model_validate(doc)


class FakeCapture:
    """An in-process capture client writing deterministic features into the store.

    `fail(sample_id, attempt)` says whether that attempt fails (after writing some objects,
    as a server that dies mid-write would); `down` makes it unreachable, health included.
    """

    def __init__(
        self,
        store: Any,
        spec: Any,
        *,
        url: str = "fake://capture",
        fail: Callable[[int, int], bool] = lambda sid, attempt: False,
        delay_s: float = 0.0,
    ) -> None:
        self.store, self.spec, self.url = store, spec, url
        self.fail = fail
        self.delay_s = delay_s
        self.down = False
        self.requests: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def capture(self, request: Any, *, timeout: float) -> Any:
        with self._lock:
            self.requests.append((request.sample_id, request.attempt))
        if self.down:
            raise CaptureError(f"{self.url}: connection refused")
        if self.delay_s:
            threading.Event().wait(self.delay_s)
        tensors = fake_features(request, self.spec)
        if self.fail(request.sample_id, request.attempt):
            # Half-written attempt: the producer must remove it.
            self.store.put(f"{request.run}/{request.sample_id}/g{request.attempt}/input_ids", b"x")
            raise CaptureError(f"{self.url}: injected failure of sample {request.sample_id}")
        return tensors_to_store(self.store, request, self.spec, tensors)

    def health(self, *, timeout: float) -> bool:
        return not self.down


def fake_features(request: Any, spec: Any) -> dict[str, torch.Tensor]:
    """Features that encode the sample id and token position, so a mix-up is visible."""
    seq = len(request.input_ids)
    width = len(spec.layer_ids) * spec.hidden_size
    pos = torch.arange(seq, dtype=torch.float32)[:, None]
    return {
        "input_ids": torch.tensor(request.input_ids, dtype=torch.int64),
        "loss_mask": torch.tensor(request.loss_mask, dtype=torch.int64),
        "hidden_states": pos + request.sample_id + torch.zeros(seq, width),
        "target_last_hidden_states": pos - request.sample_id + torch.zeros(seq, spec.hidden_size),
    }


def spec_for(cfg: Config, hidden_size: int) -> Any:
    """The capture spec of a config's model for a target of this hidden size."""
    return capture_spec(cfg.model.target_layer_ids, hidden_size, algorithm=cfg.model.algorithm)


@dataclass
class Runtime:
    """A producer with its controller, its store and the plan, for one test."""

    cfg: Config
    run_dir: Path
    producer: Producer
    controller: WindowController
    store: LocalFeatureStore
    prompts: list[Prompt]

    @property
    def total_steps(self) -> int:
        return self.producer.plan.total_steps

    def client(self, rank: int, *, timeout_s: float | None = None) -> WindowClient:
        timeout = timeout_s or self.cfg.deployment.disaggregated.window_timeout_s
        return WindowClient(rank=rank, timeout_s=timeout, run_dir=self.run_dir)


@contextmanager
def running_producer(
    cfg: Config,
    run_dir: Path,
    prompts: list[Prompt],
    clients: list[Any],
    *,
    store: LocalFeatureStore | None = None,
) -> Iterator[Runtime]:
    """Start a producer and its controller over the run folder's local store; stop them after."""
    store = store or LocalFeatureStore(local_store_root(run_dir))
    good, bad = screen_prompts(prompts, max_length=cfg.data.max_length)
    plan = plan_prompts(cfg, good)
    producer = Producer(
        ProducerSettings.from_config(cfg, plan),
        plan,
        good,
        store,
        clients,
        run_dir,
        bad_prompts=bad,
    )
    controller = WindowController(producer).start()
    write_controller_address(run_dir, controller.url)
    producer.start()
    try:
        yield Runtime(cfg, run_dir, producer, controller, store, good)
    finally:
        controller.stop()
        producer.stop()


@dataclass
class Delivered:
    """What the simulated trainer ranks received: (step, rank) -> sample ids, and rows."""

    samples: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    rows: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)

    def per_epoch(self, windows_per_epoch: int) -> dict[int, Counter[int]]:
        counts: dict[int, Counter[int]] = {}
        for (step, _rank), ids in self.samples.items():
            counts.setdefault(step // windows_per_epoch, Counter()).update(ids)
        return counts


def train_ranks(
    make_client: Callable[[int], WindowClient],
    store: Any,
    *,
    world_size: int,
    steps: range,
    delivered: Delivered | None = None,
    on_step: Callable[[int, int], None] = lambda step, rank: None,
) -> Delivered:
    """Run `world_size` rank threads over `steps`: next_window, read tensors, ack."""
    delivered = delivered or Delivered()
    lock = threading.Lock()

    def rank_loop(rank: int) -> None:
        client = make_client(rank)
        try:
            for step in steps:
                refs = client.next_window(step)
                rows = [row for micro in fetch_micro_batches(store, refs) for row in micro]
                with lock:
                    delivered.samples[(step, rank)] = [int(r["sample_id"]) for r in rows]
                    for row in rows:
                        delivered.rows[int(row["sample_id"])] = row
                on_step(step, rank)
                client.ack(step)
        except BaseException as exc:
            with lock:
                delivered.errors.append(exc)

    threads = [threading.Thread(target=rank_loop, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a trainer rank hung"
    return delivered


def ledger_trained_counts(run_dir: Path) -> dict[int, Counter[int]]:
    """Per epoch, how often each sample is in an acknowledged window, from the ledger alone."""
    return trained_sample_counts(replay(read_ledger(ledger_path(run_dir))))


def expected_once(prompts: list[Prompt], epochs: int) -> dict[int, Counter[int]]:
    """Every prompt once in every epoch."""
    return {e: Counter(p.sample_id for p in prompts) for e in range(epochs)}


def start_capture_server(cfg: Config, store: Any) -> tuple[CaptureServer, HttpCaptureClient]:
    """A real embedded capture server over HTTP on the config's target, and its client."""
    server = build_capture_server(cfg, store).start()
    return server, HttpCaptureClient(server.url, server.spec)


def wait_idle(producer: Producer, timeout: float = 20.0) -> None:
    """Wait until no capture is in flight (stale ones finish after a rollback)."""
    deadline = time.monotonic() + timeout
    while producer.stats()["producer/inflight"] > 0:
        assert time.monotonic() < deadline, "captures still in flight"
        time.sleep(0.02)


def write_config_toml(cfg: Config, path: Path) -> Path:
    """Write a config as TOML (for a producer subprocess); None values are left out."""
    lines: list[str] = []

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"cannot write {v!r} as TOML")

    def table(prefix: str, data: dict[str, Any]) -> None:
        scalars = {k: v for k, v in data.items() if not isinstance(v, dict) and v is not None}
        if prefix:
            lines.append(f"[{prefix}]")
        lines.extend(f"{k} = {value(v)}" for k, v in scalars.items())
        for k, v in data.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", cfg.model_dump())
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_prompts_jsonl(prompts: list[Prompt], path: Path) -> Path:
    """Pre-tokenised rows for `producer_main --prompts`."""
    rows = [
        {"sample_id": p.sample_id, "input_ids": list(p.input_ids), "loss_mask": list(p.loss_mask)}
        for p in prompts
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
