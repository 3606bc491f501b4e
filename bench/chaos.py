"""Chaos run of a managed disaggregated training: seeded faults, resumed as a cluster would.

    python bench/chaos.py --faults 20 --steps 200 --seed 0 [--store local|mooncake] [--out DIR]

Two runs of the CPU quickstart (examples/quickstart-disaggregated.toml, the tiny target, two
trainer ranks): one uninterrupted, and one during which a seeded schedule injects faults into
random components of the live run: SIGKILL, SIGSTOP (then SIGCONT a few seconds later) or
SIGTERM of the capture server, the producer, a trainer rank, the Mooncake master (with
`--store mooncake`, run inside `unshare -n`; see docs/disaggregated.md), or a SIGTERM of the
whole run (a preemption). Whenever the run ends before its last step, it is started again with
`--resume latest`, as a requeued job would be. At the end it prints every fault, the resumes,
the producer ledger's exactly-once audit (samples trained more than once, samples never
trained, per epoch) and whether the final weights equal the uninterrupted run's.

The first fault waits for the first checkpoint; each later one for two steps trained since the
launch (or the last fault), then a seeded 0-2 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "quickstart-disaggregated.toml"
SAMPLES = 64  # 8 windows of 8 samples per epoch
SAVE_INTERVAL = 10


@dataclass
class Fault:
    """One injected fault and what the run did next."""

    launch: int
    step: int
    target: str
    kind: str
    outcome: str = ""


def settings(run_dir: Path, target: str, steps: int, store: str) -> list[str]:
    """The quickstart as a long, exactly resumable run in `run_dir`."""
    epochs = -(-steps * 8 // SAMPLES)
    return [
        f"model.target={target}",
        f"output_dir={run_dir}",
        f"data.max_samples={SAMPLES}",
        f"training.max_steps={steps}",
        f"training.num_epochs={epochs}",
        f"training.save_interval={SAVE_INTERVAL}",
        "training.lr_scheduler=constant",
        "training.warmup_ratio=0.0",
        f"deployment.disaggregated.store={store}",
        "deployment.disaggregated.window_timeout_s=300",
        "deployment.disaggregated.health_timeout_s=120",
        "deployment.disaggregated.shutdown_timeout_s=20",
        "deployment.disaggregated.max_producer_restarts=100",
    ]


def command(run_dir: Path, target: str, steps: int, store: str, resume: bool) -> list[str]:
    argv = [sys.executable, "-m", "specdraft.cli", "train", str(EXAMPLE), "--no-progress"]
    for item in settings(run_dir, target, steps, store):
        argv += ["--set", item]
    return argv + (["--resume", "latest"] if resume else [])


def trained_steps(run_dir: Path, since: float = 0.0) -> int:
    """Steps in metrics.jsonl logged after the wall time `since` (all of them: since = 0)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    count = 0
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            count += "loss" in row and float(row["time"]) >= since
        except (ValueError, KeyError, TypeError):
            continue
    return count


def last_step(run_dir: Path) -> int:
    """The newest step metrics.jsonl holds (0 before the first)."""
    path = run_dir / "metrics.jsonl"
    steps = [0]
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            continue
    return max(steps)


def children(pid: int) -> list[int]:
    """Every descendant of `pid` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
                parents[int(entry)] = int(stat.rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [child for child, parent in parents.items() if parent == current]
        out += kids
        frontier += kids
    return out


def components(launcher: int) -> dict[str, list[int]]:
    """The live run's processes by role."""
    roles: dict[str, list[int]] = {"run": [launcher]}
    for pid in children(launcher):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"disagg.capture" in line:
            roles.setdefault("capture server", []).append(pid)
        elif b"disagg.producer" in line:
            roles.setdefault("producer", []).append(pid)
        elif b"mooncake_master" in line:
            roles.setdefault("store (mooncake_master)", []).append(pid)
        elif b"spawn_main" in line:
            roles.setdefault("trainer rank", []).append(pid)
    return roles


def inject(rng: random.Random, launcher: int) -> tuple[str, str, int, int] | None:
    """Pick a live component and a fault; (target, kind, pid, signal) or None."""
    roles = components(launcher)
    targets = [*sorted(r for r in roles if r != "run"), "run"]
    target = rng.choice(targets)
    kinds = ["SIGTERM"] if target == "run" else ["SIGKILL", "SIGSTOP", "SIGTERM"]
    kind = rng.choice(kinds)
    pid = rng.choice(roles[target])
    return target, kind, pid, getattr(signal, kind)


def wait_for(predicate, process: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.2)
    return False


def run_until_done(
    run_dir: Path, target: str, steps: int, store: str, faults: int, seed: int, log: Path
) -> tuple[list[Fault], int, float]:
    """The chaos run: launches, faults, resumes; (faults, launches, seconds)."""
    rng = random.Random(seed)
    done: list[Fault] = []
    launches, start = 0, time.monotonic()
    while True:
        launches += 1
        with log.open("a") as console:
            process = subprocess.Popen(
                command(run_dir, target, steps, store, resume=launches > 1),
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=console,
                start_new_session=True,
            )
        checkpoints = run_dir / "checkpoints"
        launched = time.time()
        while len(done) < faults and process.poll() is None:

            def ready(after: float = launched, folder: Path = checkpoints) -> bool:
                has_checkpoint = folder.is_dir() and any(folder.glob("step-*"))
                return has_checkpoint and trained_steps(run_dir, after) >= 2

            if not wait_for(ready, process, 600):
                break
            time.sleep(rng.uniform(0, 2))
            if process.poll() is not None:
                break
            picked = inject(rng, process.pid)
            if picked is None:
                continue
            name, kind, pid, signum = picked
            fault = Fault(launches, last_step(run_dir), name, kind)
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                continue
            done.append(fault)
            if signum == signal.SIGSTOP:
                time.sleep(rng.uniform(2, 6))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            # Did the run survive it? A run that stops takes its services down first (up to
            # shutdown_timeout_s each): give it that long, unless it trains on meanwhile.
            logged = trained_steps(run_dir)
            deadline = time.monotonic() + 30
            while process.poll() is None and time.monotonic() < deadline:
                if trained_steps(run_dir) >= logged + 3:
                    break  # training went on: it rode the fault out
                time.sleep(0.2)
            fault.outcome = "survived" if process.poll() is None else "run ended"
            print(
                f"  fault {len(done):2d}: {name} {kind} at step {fault.step}: {fault.outcome}",
                flush=True,
            )
            launched = time.time()  # the next fault waits for two more steps
        code = process.wait()
        if done and done[-1].outcome == "run ended":
            done[-1].outcome = f"run ended (status {code}), resumed"
        summary = run_dir / "summary.json"
        final = json.loads(summary.read_text()) if summary.is_file() else {}
        if code == 0 and final.get("final_step") == steps and not final.get("stopped"):
            return done, launches, time.monotonic() - start
        if launches > faults + 10:
            raise SystemExit(f"gave up after {launches} launches; see {log}")


def audit(run_dir: Path, target: str, steps: int, store: str) -> tuple[int, int, int]:
    """(samples trained more than once, planned samples never trained, epochs) by the ledger."""
    from specdraft.config import load_config
    from specdraft.trainer.disagg.producer.ledger import read_ledger, replay, trained_sample_counts
    from specdraft.trainer.disagg.producer.main import load_prompts, plan_prompts
    from specdraft.trainer.disagg.producer.producer import ledger_path
    from specdraft.trainer.disagg.producer.prompts import screen_prompts

    counts = trained_sample_counts(replay(read_ledger(ledger_path(run_dir))))
    cfg = load_config(EXAMPLE, settings(run_dir, target, steps, store))
    good, _ = screen_prompts(load_prompts(cfg, None), max_length=cfg.data.max_length)
    planned: dict[int, Counter[int]] = {}
    for window in plan_prompts(cfg, good).windows[:steps]:
        planned.setdefault(window.epoch, Counter()).update(window.sample_ids())
    twice = sum(1 for c in counts.values() for n in c.values() if n > 1)
    lost = sum(len(set(p) - set(counts.get(e, Counter()))) for e, p in planned.items())
    return twice, lost, len(planned)


def weights_diff(a: Path, b: Path, steps: int) -> tuple[bool, float]:
    """(bitwise equal, max |difference|) of two runs' final draft weights."""
    from safetensors.torch import load_file

    name = f"step-{steps:07d}"
    x = load_file(str(a / "checkpoints" / name / "model.safetensors"))
    y = load_file(str(b / "checkpoints" / name / "model.safetensors"))
    diff = max(float((x[k] - y[k]).abs().max()) for k in x)
    same = (a / "checkpoints" / name / "model.safetensors").read_bytes() == (
        b / "checkpoints" / name / "model.safetensors"
    ).read_bytes()
    return same, diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--store", choices=("local", "mooncake"), default="local")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "chaos")
    args = parser.parse_args()
    from specdraft.trainer.assets import build_tiny_target

    target = str(build_tiny_target())
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    whole, chaos = args.out / "whole", args.out / "chaos"
    for folder in (whole, chaos):
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"uninterrupted run of {args.steps} steps ...", flush=True)
    started = time.monotonic()
    with (args.out / "whole.log").open("w") as console:
        subprocess.run(
            command(whole, target, args.steps, args.store, resume=False),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=console,
            check=True,
        )
    print(f"  done in {time.monotonic() - started:.0f} s", flush=True)
    print(f"chaos run: {args.faults} faults (seed {args.seed}) ...", flush=True)
    log = args.out / "chaos.log"
    log.write_text("")
    faults, launches, seconds = run_until_done(
        chaos, target, args.steps, args.store, args.faults, args.seed, log
    )
    twice, lost, epochs = audit(chaos, target, args.steps, args.store)
    same, diff = weights_diff(whole, chaos, args.steps)
    kinds = Counter(f"{f.target} {f.kind}" for f in faults)
    listed = ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items()))
    print()
    print(f"faults injected:             {len(faults)} ({listed})")
    print(f"faults the run survived:     {sum(f.outcome == 'survived' for f in faults)}")
    print(f"resumes (--resume latest):   {launches - 1}")
    print(f"chaos run wall time:         {seconds:.0f} s")
    print(f"epochs audited (ledger):     {epochs}")
    print(f"samples trained twice:       {twice}")
    print(f"samples lost:                {lost}")
    print(
        f"final weights == uninterrupted run's: {'yes, bitwise' if same else 'no'} "
        f"(max |diff| {diff:.3g})"
    )


if __name__ == "__main__":
    main()
