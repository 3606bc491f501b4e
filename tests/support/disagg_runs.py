"""Whole `specdraft train` runs of the disaggregated quickstart, shared by the integration tests.

Every run is the example config `examples/quickstart-disaggregated.toml` made small by `--set`
overrides (tiny target from the asset cache, 4 optimizer steps of 8 samples on 2 trainer ranks,
a constant learning rate so a resumed run can end on the same weights), started through the
CLI exactly as a user starts it. The data is a small generated ShareGPT file whose replies are
either short or long, so micro-batches pad to both buckets (real ShareGPT conversations nearly
all fill max_length). A run that several tests compare against (the uninterrupted online run,
the offline run) is made once per pytest session and reused from the session's temporary
folder, which every xdist worker of the session shares: a lock next to each shared item makes
a worker that needs it while another builds it wait for that build.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quickstart-disaggregated.toml"
SPECDRAFT = [sys.executable, "-m", "specdraft.cli"]

STEPS = 4
WORLD_SIZE = 2
SAMPLES_PER_STEP = 8  # micro_batch_size 2 x grad_accum_steps 2 x 2 ranks
BUCKETS = (128, 256)  # the example's static_shape_buckets, max_length last
MAX_INFLIGHT = 4  # the example's max_inflight_captures

# The example, made small and exactly resumable.
SMALL = (
    f"training.max_steps={STEPS}",
    "training.save_interval=2",
    "training.lr_scheduler=constant",
    "training.warmup_ratio=0.0",
    "deployment.disaggregated.window_timeout_s=240",
    "deployment.disaggregated.health_timeout_s=120",
    "deployment.disaggregated.shutdown_timeout_s=20",
)

# Counters every optimizer step of a disaggregated run logs (rank 0, metrics.jsonl).
COUNTERS = (
    "perf/train_compute_ms",
    "perf/data_wait_ms",
    "perf/window_wait_ms",
    "perf/store_read_ms",
    "perf/samples_per_s",
    "producer/inflight",
    "producer/backpressure_ms",
    "producer/capture_latency_ms",
    "store/bytes_resident",
)

# One run of 4 small steps takes ~30 s here; far more means something hangs.
RUN_TIMEOUT_S = 420


@dataclass(frozen=True)
class Run:
    """A finished `specdraft train` run: its folder, summary and per-step metrics."""

    run_dir: Path
    summary: dict[str, Any]
    steps: list[dict[str, Any]]
    stderr: str

    def by_step(self) -> dict[int, dict[str, Any]]:
        """The last metrics row of each step (a resumed run logs some steps twice)."""
        return {row["step"]: row for row in self.steps}


def session_root(factory: pytest.TempPathFactory) -> Path:
    """The session's temporary folder shared by all its xdist workers (each worker's own
    basetemp is a subfolder of it); without xdist, the session's basetemp."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path`.lock (across processes) for the `with` body."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def session_data(factory: pytest.TempPathFactory) -> Path:
    """The session's conversations: 40 ShareGPT rows, short and long replies alternating."""
    path = session_root(factory) / "shared-data" / "conversations.jsonl"
    with locked(path):
        if not path.is_file():
            _write_conversations(path)
    return path


def _write_conversations(path: Path) -> None:
    rng = random.Random(0)
    text = (
        "the model reads a long conversation and answers with care while the draft learns "
        "to guess what comes next in every block of tokens"
    )
    words = text.split()
    rows = []
    for i in range(40):
        question = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
        # About 30..90 tokens, or past the 128 bucket.
        count = rng.randint(8, 40) if i % 2 == 0 else rng.randint(70, 140)
        answer = " ".join(rng.choice(words) for _ in range(count))
        turns = [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
        rows.append({"id": f"c{i}", "conversations": turns})
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(tmp, path)


def run_settings(run_dir: Path, data: Path) -> tuple[str, ...]:
    """The overrides that make the example a small test run in `run_dir` on `data`, on the tiny
    target from the asset cache (built on first use, as the `tiny_target_path` fixture is)."""
    from specdraft.trainer.assets import build_tiny_target

    return (
        f"model.target={build_tiny_target()}",
        f"output_dir={run_dir}",
        f'data.train_paths=["{data}"]',
        # Next to the data: the shared dataset cache under build/ keeps nothing of a test.
        f"data.cache_dir={data.parent / 'cache'}",
        *SMALL,
    )


def train(
    run_dir: Path,
    data: Path,
    overrides: tuple[str, ...] = (),
    *,
    resume: str | None = None,
    netns: bool = False,
) -> Run:
    """Run `specdraft train` on the small quickstart into `run_dir`; fail with its output."""
    sets = (*run_settings(run_dir, data), *overrides)
    argv = [*SPECDRAFT, "train", str(EXAMPLE), "--no-progress"]
    for item in sets:
        argv += ["--set", item]
    if resume:
        argv += ["--resume", resume]
    env = dict(os.environ)
    if netns:
        # Mooncake's transfer engine binds to MC_TCP_BIND_ADDRESS; the namespace has only lo.
        env["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"
        argv = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert done.returncode == 0, (
        f"specdraft train failed ({done.returncode}):\n{done.stderr[-6000:]}\n"
        f"{service_logs(run_dir)}"
    )
    # Rank 0 writes the summary the command prints.
    summary = json.loads((run_dir / "summary.json").read_text())
    return Run(run_dir, summary, read_steps(run_dir), done.stderr)


def shared_run(factory: pytest.TempPathFactory, name: str, overrides: tuple[str, ...] = ()) -> Run:
    """A run made once per pytest session (several test files compare against it), by the
    first worker that needs it; a run that failed is made again from scratch."""
    data = session_data(factory)
    run_dir = session_root(factory) / "shared-runs" / name
    done = run_dir / "summary.json"
    with locked(run_dir):
        if done.is_file():
            return Run(run_dir, json.loads(done.read_text()), read_steps(run_dir), "")
        shutil.rmtree(run_dir, ignore_errors=True)
        return train(run_dir, data, overrides)


def read_steps(run_dir: Path) -> list[dict[str, Any]]:
    """The per-step rows of a run's metrics.jsonl (evaluation rows left out)."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row for row in rows if "loss" in row]


def service_logs(run_dir: Path, lines: int = 30) -> str:
    """The tail of every service log of a run, for a failure message."""
    out = []
    for log in sorted((run_dir / "logs").glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"--- {log.name} ---\n" + "\n".join(tail))
    return "\n".join(out)


def ledger_state(run_dir: Path) -> Any:
    """The producer's state, replayed from the run folder's ledger alone."""
    from specdraft.trainer.disagg.producer.ledger import read_ledger, replay
    from specdraft.trainer.disagg.producer.producer import ledger_path

    return replay(read_ledger(ledger_path(run_dir)))


def planned_samples(run_dir: Path, data: Path, steps: int = STEPS) -> Counter[int]:
    """Each sample id of the run's first `steps` windows, as the producer plans them."""
    from specdraft.config import load_config
    from specdraft.trainer.disagg.producer.main import load_prompts, plan_prompts
    from specdraft.trainer.disagg.producer.prompts import screen_prompts

    cfg = load_config(EXAMPLE, run_settings(run_dir, data))
    good, _bad = screen_prompts(load_prompts(cfg, None), max_length=cfg.data.max_length)
    plan = plan_prompts(cfg, good)
    return Counter(sid for window in plan.windows[:steps] for sid in window.sample_ids())


def namespace_problem() -> str | None:
    """Why Mooncake cannot run in a private network namespace here, or None if it can."""
    # The probe of the Mooncake store tests, shared rather than copied (tests/support).
    from disagg_support import unshare_problem

    return unshare_problem()
