"""Plan the runs of a benchmark, execute each in a fresh process, and read back its row.

Offline workloads run `python -m shapebench.child RUN_DIR`; the online workload runs
`specdraft train` itself (deployment.mode = "disaggregated": embedded capture server, local
store, producer, trainer ranks), so what is measured is exactly what a user runs. Runs happen one
after the other, same data and seed for every variant; a time budget skips the runs that would
not fit (and stops a run that overruns), so a partial table still comes back.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .child import BENCH_FILE, CONFIG_FILE, RUN_FILE
from .presets import Preset, TargetFacts, base_config
from .results import RunResult, steady_result
from .variants import Variant
from .workloads import is_synthetic

BENCH_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = BENCH_DIR.parent
# A run is not started with less time than this left in the budget: it could not finish.
MIN_RUN_S = 45.0
# A packed row holds several conversations, so a packed run reads this many times the samples of
# an unpacked one for the same steps (a row holds at most 8 synthetic `long` samples, about 1.8
# on average); should that still be short, it passes over them again (PACKED_EPOCHS) rather than
# stop before its steps.
PACKED_SAMPLES_FACTOR = 8
PACKED_EPOCHS = 100


@dataclass(frozen=True)
class BenchSettings:
    """Everything one invocation of the harness runs."""

    preset: Preset
    algorithms: tuple[str, ...]
    variants: tuple[Variant, ...]
    workloads: tuple[str, ...]
    steps: int
    steady: int
    ranks: int
    seed: int
    work_dir: Path
    time_budget_s: float | None = None
    tokenizer: str | None = None  # data.tokenizer for `sharegpt` / `online` (gpu preset)

    @property
    def window(self) -> int:
        """Samples per optimizer step over all ranks."""
        return self.preset.micro_batch_size * self.preset.grad_accum_steps * self.ranks


@dataclass(frozen=True)
class PlannedRun:
    """One variant of one table."""

    workload: str
    algorithm: str
    variant: Variant
    run_dir: Path

    def empty_result(self, ranks: int) -> RunResult:
        """A row with only its identity filled in."""
        return RunResult(self.workload, self.algorithm, self.variant.key, ranks=ranks)


def plan_runs(settings: BenchSettings) -> list[PlannedRun]:
    """Runs in execution order: workload, then variant (as listed), then algorithm."""
    return [
        PlannedRun(
            workload,
            algorithm,
            variant,
            settings.work_dir / "runs" / workload / algorithm / variant.key,
        )
        for workload in settings.workloads
        for variant in settings.variants
        for algorithm in settings.algorithms
    ]


def num_samples(settings: BenchSettings, variant: Variant) -> int:
    """Samples a run reads: one optimizer window per step, more for packed rows."""
    samples = settings.steps * settings.window
    return samples * PACKED_SAMPLES_FACTOR if variant.packing else samples


def unsupported_reason(settings: BenchSettings, workload: str) -> str | None:
    """Why a workload cannot run with these settings, or None."""
    if workload == "online" and settings.preset.target != "tiny":
        return (
            "online needs a real target for the embedded capture server; this preset's target "
            "is a shape-only stand-in (run online with --preset cpu)"
        )
    if workload == "sharegpt" and settings.preset.target != "tiny" and not settings.tokenizer:
        return (
            "sharegpt on this preset needs --tokenizer (e.g. the folder that "
            "bench/qwen_tokenizer.py builds)"
        )
    return None


def run_config(settings: BenchSettings, run: PlannedRun, target: TargetFacts) -> dict[str, Any]:
    """The config of one run: preset base + variant + workload."""
    preset = settings.preset
    config = base_config(
        preset, run.algorithm, target, seed=settings.seed, output_dir=str(run.run_dir)
    )
    config["training"].update(run.variant.training_overrides(preset.buckets, preset.anchor_buckets))
    config["training"]["max_steps"] = settings.steps
    if run.variant.packing:
        config["training"]["num_epochs"] = PACKED_EPOCHS  # max_steps ends the run first
    config["deployment"] = {"nproc_per_node": settings.ranks}
    data = config["data"]
    if run.variant.anchor_grouped:
        data["anchor_grouped"] = True
    if is_synthetic(run.workload):
        # Never read: the child generates the rows; the name only documents the run.
        data["train_paths"] = [f"bench:{run.workload}"]
    else:
        data["max_samples"] = num_samples(settings, run.variant)
        if settings.tokenizer:
            data["tokenizer"] = settings.tokenizer
    if run.workload == "online":
        config["deployment"]["mode"] = "disaggregated"
    return config


def run_spec(settings: BenchSettings, run: PlannedRun, target: TargetFacts) -> dict[str, Any]:
    """run.json: what the child needs beyond the config."""
    real_target = settings.preset.target == "tiny"
    return {
        "workload": run.workload,
        "algorithm": run.algorithm,
        "variant": run.variant.key,
        "seed": settings.seed,
        "num_samples": num_samples(settings, run.variant),
        "ranks": settings.ranks,
        "vocab_bound": target.vocab_size,
        # The tiny target runs in-process for real conversations; the shape-only stand-in cannot.
        "features": "target" if real_target and run.workload == "sharegpt" else "synthetic",
    }


def write_run(settings: BenchSettings, run: PlannedRun, target: TargetFacts) -> None:
    """A fresh run folder with its config (validated first) and run.json."""
    import json

    from specdraft.config import validate_config
    from specdraft.config.toml_writer import dump_toml

    config = run_config(settings, run, target)
    validate_config(config)  # a preset or variant that makes a bad config fails here, early
    if run.run_dir.exists():
        shutil.rmtree(run.run_dir)
    run.run_dir.mkdir(parents=True)
    header = f"specdraft bench: {run.workload} / {run.algorithm} / {run.variant.label}"
    (run.run_dir / CONFIG_FILE).write_text(dump_toml(config, header=header))
    (run.run_dir / RUN_FILE).write_text(json.dumps(run_spec(settings, run, target), indent=2))


def child_env() -> dict[str, str]:
    """The environment of a run: bench/ importable, caches under build/, no hub."""
    env = dict(os.environ)
    paths = [str(BENCH_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO_ROOT / "build" / "inductor-cache"))
    env.setdefault("SPECDRAFT_CACHE", str(REPO_ROOT / "build" / "cache"))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def command_of(run: PlannedRun) -> list[str]:
    """The process that executes a run."""
    if run.workload == "online":
        config = str(run.run_dir / CONFIG_FILE)
        return [sys.executable, "-m", "specdraft.cli", "train", config, "--no-progress"]
    return [sys.executable, "-m", "shapebench.child", str(run.run_dir)]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a run's process group (it was started in its own session)."""
    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def failure_reason(log_path: Path) -> str:
    """The most telling line of a failed run's log: the last error line, else the last line."""
    if not log_path.is_file():
        return "no log"
    lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    for line in reversed(lines):
        if "Error" in line or "error:" in line:
            return line
    return lines[-1] if lines else "no output"


def log_tail(path: Path, log: Callable[[str], None], lines: int = 30) -> None:
    """Pass the end of a failed run's log on (its folder may not come back from a GPU box)."""
    if path.is_file():
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        log("  log tail:\n    " + "\n    ".join(tail))


def execute(settings: BenchSettings, run: PlannedRun, *, timeout_s: float | None) -> RunResult:
    """Run one planned run in a fresh process and read back its row."""
    result = run.empty_result(settings.ranks)
    log_path = run.run_dir / "log.txt"
    start = time.perf_counter()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command_of(run),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(),
            cwd=str(REPO_ROOT),
            start_new_session=True,  # so a timeout stops the run's ranks and services too
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            code = None
        except KeyboardInterrupt:
            # The run has its own session, so Ctrl-C does not reach it: stop it here.
            _stop(proc)
            raise
    result.wall_s = time.perf_counter() - start
    if code is None:
        result.status = "timeout"
        result.reason = f"stopped after {result.wall_s:.0f} s (time budget)"
        return result
    if code != 0:
        result.status = "failed"
        result.reason = failure_reason(log_path)
        return result
    online = run.workload == "online"
    result = steady_result(result, run.run_dir, steady=settings.steady, online=online)
    if online and not (run.run_dir / BENCH_FILE).is_file():
        result.positions_per_real_token = planned_positions(run.run_dir / CONFIG_FILE)
        result.positions_estimated = True
    return result


def planned_positions(config_path: Path) -> float:
    """Computed positions per real token the run's pad policy plans on its corpus (online)."""
    from specdraft.collate import account_padding
    from specdraft.config import ShapePolicy, load_config
    from specdraft.trainer.data import corpus_lengths

    config = load_config(config_path)
    if config.training.packing:
        return 0.0  # account_padding plans unpacked micro-batches: not counted for packed rows
    lengths = corpus_lengths(config, progress=False).lengths
    report = account_padding(
        lengths,
        micro_batch_size=config.training.micro_batch_size,
        pad_to=ShapePolicy.from_config(config).pad_to,
        seed=config.training.seed,
        num_replicas=config.deployment.world_size,
    )
    return report.positions_per_real_token


def run_all(
    settings: BenchSettings,
    target: TargetFacts,
    *,
    on_result: Callable[[RunResult], None],
    log: Callable[[str], None],
    started: float | None = None,
) -> list[RunResult]:
    """Execute every planned run in order, within the time budget; report each row as it lands.

    The budget counts from `started` (a `time.perf_counter()` value; default: now), so the
    harness's own set-up, such as writing a stand-in target, is inside it.
    """
    started = time.perf_counter() if started is None else started
    results = []
    for run in plan_runs(settings):
        reason = unsupported_reason(settings, run.workload)
        timeout_s = None
        if reason is None and settings.time_budget_s is not None:
            timeout_s = settings.time_budget_s - (time.perf_counter() - started)
            if timeout_s < MIN_RUN_S:
                reason = f"not started: {max(0.0, timeout_s):.0f} s left of the time budget"
        if reason is not None:
            result = run.empty_result(settings.ranks)
            result.status, result.reason = "skipped", reason
        else:
            log(f"run {run.workload} / {run.algorithm} / {run.variant.label} ...")
            write_run(settings, run, target)
            result = execute(settings, run, timeout_s=timeout_s)
            log(
                f"  {result.status} in {result.wall_s:.0f} s"
                + (f": {result.reason}" if result.reason else "")
            )
            if result.status == "failed":
                log_tail(run.run_dir / "log.txt", log)
        results.append(result)
        on_result(result)
    return results
