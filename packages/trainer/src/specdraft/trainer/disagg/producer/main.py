"""The producer as its own process:

    python -m specdraft.trainer.disagg.producer --config CONFIG --run-dir DIR \\
        [--set key=value ...] [--capture-url URL ...] [--prompts rows.jsonl]

(`specdraft serve-producer CONFIG` is the same for users; the managed run's supervisor starts
this module). It tokenises the training data (or reads pre-tokenised rows), plans the run's
windows with the same sampler as the trainers, resumes from the run folder's ledger, serves the
window controller and writes its address to `<run_dir>/disagg/controller.json`. The run
folder is made private (0700) and the run's secret (`<run_dir>/disagg/secret`, 0600, or
$SPECDRAFT_RUN_SECRET) is created if missing: the controller answers only requests that carry
it, and the producer sends it to the embedded capture servers. It runs until SIGTERM (the
supervisor stops it after the trainers), or until done with `--exit-when-done`.
Exit status: 0 stopped or done, 1 the producer failed (the supervisor restarts it), 2 bad
config, data or arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdraft.config import Config, ConfigError, load_config

from .jsonl import JsonlLineError, read_jsonl
from .plan import EpochPlanner, PlanError, RunPlan, plan_run
from .prompts import Prompt, count_reasons, prompts_from_rows, screen_prompts

log = logging.getLogger("specdraft.producer")


class ProducerSetupError(ValueError):
    """Bad data or arguments for the producer (exit status 2)."""


def read_prompt_file(path: str | Path) -> list[Prompt]:
    """Pre-tokenised rows: JSONL with sample_id, input_ids and loss_mask per line."""
    path = Path(path)
    rows = []
    try:
        lines = read_jsonl(path)
    except OSError as exc:
        raise ProducerSetupError(f"{path}: cannot read the prompts file: {exc}") from exc
    except JsonlLineError as exc:
        raise ProducerSetupError(f"{path}:{exc.lineno}: not JSON: {exc.reason}") from exc
    for lineno, row in lines:
        for name in ("sample_id", "input_ids", "loss_mask"):
            if not isinstance(row, dict) or name not in row:
                raise ProducerSetupError(
                    f"{path}:{lineno}: missing field {name!r} (each line needs sample_id, "
                    f"input_ids and loss_mask)"
                )
        rows.append(row)
    return prompts_from_rows(rows)


def load_prompts(cfg: Config, prompts_path: str | Path | None) -> list[Prompt]:
    """The run's prompts: from a pre-tokenised file, or tokenised from data.train_paths."""
    if prompts_path is not None:
        return read_prompt_file(prompts_path)
    from specdraft.trainer.data import build_dataset

    dataset, _report = build_dataset(cfg, split="train", progress=False)
    return prompts_from_rows(dataset)


def prompt_anchor_counts(cfg: Config, prompts: Sequence[Prompt]) -> list[int] | None:
    """Valid anchors per prompt when the plan is anchor-grouped (None otherwise: not needed)."""
    from specdraft.config.sampler_mode import sampler_mode

    if sampler_mode(cfg) != "anchor_grouped":
        return None
    from specdraft.collate import valid_anchor_count

    return [valid_anchor_count(p.loss_mask) for p in prompts]


def sampler_planner(
    cfg: Config, lengths: Sequence[int], anchor_counts: Sequence[int] | None = None
) -> EpochPlanner:
    """The trainers' micro-batch plan (same sampler, seed, buckets), as an epoch planner.

    `anchor_counts` (valid anchors per prompt) is needed when the sampler mode is anchor_grouped.
    """
    from specdraft.collate import sampler_from_config
    from specdraft.config import ShapePolicy

    # Rank 0's sampler: every rank computes the same whole-epoch plan. The producer is its own
    # process, so it builds its own (identical) shape policy from the same config.
    sampler = sampler_from_config(
        cfg,
        lengths,
        num_replicas=cfg.deployment.world_size,
        rank=0,
        shapes=ShapePolicy.from_config(cfg),
        anchor_counts=anchor_counts,
    )
    return sampler.epoch_plan


def plan_prompts(cfg: Config, prompts: Sequence[Prompt]) -> RunPlan:
    """The run's windows over these (already screened) prompts."""
    return plan_run(
        sampler_planner(
            cfg,
            [len(p.input_ids) for p in prompts],
            prompt_anchor_counts(cfg, prompts),
        ),
        [p.sample_id for p in prompts],
        num_epochs=cfg.training.num_epochs,
        max_steps=cfg.training.max_steps,
        grad_accum_steps=cfg.training.grad_accum_steps,
        world_size=cfg.deployment.world_size,
    )


def capture_clients(
    cfg: Config, urls: Sequence[str], store: Any, *, secret: str | None = None
) -> list[Any]:
    """One capture client per URL, of the kind deployment.disaggregated.capture names; the
    embedded ones send the run's `secret`; SGLang's API is unauthenticated, so the SGLang
    clients tag their request ids with it instead (`wire.sglang`)."""
    from ..capture.client import HttpCaptureClient
    from ..wire.capture import capture_spec, target_hidden_size

    if not urls:
        raise ProducerSetupError(
            "no capture server: pass --capture-url or set deployment.disaggregated.capture_urls"
        )
    model = cfg.model
    spec = capture_spec(
        model.target_layer_ids, target_hidden_size(model.target), algorithm=model.algorithm
    )
    if cfg.deployment.disaggregated.capture == "sglang":
        from ..capture.sglang_client import SGLangCaptureClient
        from ..wire.capture import CaptureError

        # The secret tags each request id: the plugin writes only tagged requests of this run.
        clients = [SGLangCaptureClient(url, spec, store, secret=secret) for url in urls]
        # Before any window is planned: a server that cannot give what the draft needs (for
        # DSpark, the final hidden state) stops the run here, with the fix named.
        for client in clients:
            try:
                client.verify_server(
                    timeout=cfg.deployment.disaggregated.capture_timeout_s, run=cfg.run_id
                )
            except CaptureError as exc:
                raise ProducerSetupError(str(exc)) from None
        return clients
    return [HttpCaptureClient(url, spec, secret=secret) for url in urls]


def advertised_url(host: str, port: int) -> str:
    """The URL trainer ranks use: a wildcard bind address is replaced by this host's name."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.getfqdn()
    return f"http://{host}:{port}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m specdraft.trainer.disagg.producer",
        description="Lease prompts to capture servers and serve optimizer windows to trainers.",
    )
    parser.add_argument("--config", required=True, help="specdraft TOML config")
    parser.add_argument("--run-dir", required=True, help="run folder (ledger, store, logs)")
    parser.add_argument("--set", action="append", default=[], help="config override key=value")
    parser.add_argument(
        "--capture-url", action="append", default=[], help="capture server base URL (repeat)"
    )
    parser.add_argument("--prompts", default=None, help="pre-tokenised JSONL rows to use")
    parser.add_argument("--host", default=None, help="controller bind address")
    parser.add_argument("--port", type=int, default=None, help="controller port (0 = any)")
    parser.add_argument("--exit-when-done", action="store_true", help="exit after the last ack")
    parser.add_argument(
        "--stats-interval", type=float, default=30.0, help="seconds between stats log lines"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the producer until SIGTERM, done (--exit-when-done) or failure; the exit status."""
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        cfg = load_config(args.config, args.set)
        prompts = load_prompts(cfg, args.prompts)
        good, bad = screen_prompts(prompts, max_length=cfg.data.max_length)
        plan = plan_prompts(cfg, good)
    except (ConfigError, ProducerSetupError, PlanError, ValueError) as exc:
        print(f"producer: {exc}", file=sys.stderr)
        return 2
    if bad:
        log.warning("skipping %d bad prompts: %s", len(bad), count_reasons(bad))
    log.info(
        "plan: %d prompts, %d steps (%d per epoch)",
        len(good),
        plan.total_steps,
        plan.windows_per_epoch,
    )
    from ...runtime.private import private_files

    # The ledger and events this process appends to are plain open() files: private by umask.
    with private_files():
        return serve(cfg, args, good, bad, plan)


def serve(
    cfg: Config,
    args: argparse.Namespace,
    prompts: Sequence[Prompt],
    bad: dict[int, str],
    plan: RunPlan,
) -> int:
    """Open the store, start producer and controller, and run until told to stop."""
    from ...runtime.private import run_folder
    from ...runtime.run_secret import SecretError, ensure_run_secret
    from ..store.factory import open_store
    from ..wire.windows import write_controller_address
    from .controller import WindowController
    from .ledger import LedgerError
    from .producer import Producer, ProducerSettings

    dis = cfg.deployment.disaggregated
    run_dir = Path(args.run_dir)
    try:
        # output_dir keeps its mode; disagg/ and the store inside it are private.
        run_folder(run_dir)
        secret = ensure_run_secret(run_dir)
    except (OSError, SecretError) as exc:
        print(f"producer: run folder {run_dir}: {exc}", file=sys.stderr)
        return 2
    store = open_store(dis, run_dir, role="producer")
    try:
        clients = capture_clients(cfg, args.capture_url or dis.capture_urls, store, secret=secret)
        producer = Producer(
            ProducerSettings.from_config(cfg, plan),
            plan,
            prompts,
            store,
            clients,
            run_dir,
            bad_prompts=bad,
        )
    except (ProducerSetupError, ValueError, LedgerError) as exc:
        # A ledger of another plan or a damaged one: restarting cannot help, say why.
        store.close()
        print(f"producer: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    host = args.host if args.host is not None else dis.controller_host
    port = args.port if args.port is not None else dis.controller_port
    controller = WindowController(producer, host=host, port=port, secret=secret).start()
    try:
        producer.start()
        url = advertised_url(host, int(controller.url.rsplit(":", 1)[1]))
        write_controller_address(run_dir, url)
        log.info("window controller at %s (pid file %s)", url, run_dir / "disagg")
        last_stats = time.monotonic()
        while not stop.wait(0.2):
            if producer.failure is not None:
                log.error("producer failed: %s", producer.failure)
                return 1
            if args.exit_when_done and producer.done():
                log.info("every step is acknowledged: done")
                break
            if time.monotonic() - last_stats >= args.stats_interval:
                last_stats = time.monotonic()
                log.info("stats %s", json.dumps(producer.stats(), sort_keys=True))
        return 0
    finally:
        controller.stop()
        producer.stop()
        store.close()
