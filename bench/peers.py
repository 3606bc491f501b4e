"""specdraft's training step against its peers' (SpecForge 0.2.0, speculators 0.9.0), side by side.

    python bench/peers.py                          # small and medium, every family both sides have
    python bench/peers.py --sizes small --rounds 9 --threads 2
    python bench/peers.py --sizes tiny --check-only --no-build   # loss agreement only (the test)

Each peer runs in a venv of its own, built once under build/ by its script
(scripts/specforge_venv.sh, scripts/speculators_venv.sh; kept while current). The weights and
the batch are written once per size under build/bench/peers/ as safetensors (peer_bench/
fixtures.py) and every side loads them: the same target, the same draft tensors, the same row,
the same anchors. Each (side, family) is a worker process that imports its side as a library
and builds its step from that side's own classes (peer_bench/*_worker.py).

First every peer's loss is checked against specdraft's on the same family (rel 1e-4; each
peer's normalisation applied to specdraft's sums, and the objective terms each is configured
with printed). Then the workers step round-robin, one step each per round, the order rotated
each round; a step is forward + backward of one micro-batch, fp32, CPU, gradients dropped before
it. The table gives per (size, family, side) the median step and its spread (min-max), the
paired ratio specdraft / side (per round, median and min-max) and the model TFLOP/s and MFU of
the median step (specdraft's FLOP count of the shared model, train/flops.py, over the GEMM
probe's rate, train/peak.py). Report the load average printed next to the table: the machine
is shared.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from peer_bench.agreement import Agreement, compare
from peer_bench.fixtures import FAMILIES, SIZES, Size, write_fixture
from peer_bench.workers import PEERS, ROOT, Worker, build_venv, side_python


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="small,medium", help=f"of {','.join(SIZES)}")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--rounds", type=int, default=7, help="timed steps per worker (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per worker first")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of every side")
    parser.add_argument("--fixtures", type=Path, default=ROOT / "build/bench/peers")
    parser.add_argument("--out", type=Path, default=ROOT / "build/bench/peers.md")
    parser.add_argument(
        "--profile", action="store_true", help="one profiled step per worker after the timing"
    )
    parser.add_argument("--check-only", action="store_true", help="loss agreement, no timing")
    parser.add_argument(
        "--no-build",
        action="store_true",
        help="use the peers' venvs as they are (exit 2 if missing)",
    )
    return parser


def ensure_venvs(peers: list[str], build: bool) -> None:
    """Build each peer's venv (kept when current), or check that it is there."""
    for peer in peers:
        if build:
            build_venv(peer)
        elif not side_python(peer).is_file():
            print(
                f"peers.py: {side_python(peer)} is missing: run {PEERS[peer][1]} "
                "(or drop --no-build)",
                file=sys.stderr,
            )
            raise SystemExit(2)


def start_workers(
    fixture: Path, size: Size, families: list[str], peers: list[str], threads: int
) -> list[Worker]:
    """specdraft's worker per family, then each peer's for the families it has; all loaded."""
    sides = [("specdraft", family) for family in families]
    sides += [(peer, f) for peer in peers for f in PEERS[peer][2] if f in families]
    logs = fixture / "logs"
    workers = [Worker(s, f, fixture, threads, logs / f"{s}-{f}.log") for s, f in sides]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.wait_ready()
    return workers


def check_losses(workers: list[Worker]) -> list[Agreement]:
    """Every peer's loss against specdraft's on the same family."""
    ours = {w.family: w.command("check") for w in workers if w.side == "specdraft"}
    return [
        compare(w.side, w.family, ours[w.family], w.command("check"))
        for w in workers
        if w.side != "specdraft"
    ]


def time_round_robin(workers: list[Worker], rounds: int, warmup: int) -> dict[str, list[float]]:
    """Step times (ms) per worker: warm-up steps, then one step each per round, order rotated."""
    for worker in workers:
        for _ in range(warmup):
            worker.command("step")
    times: dict[str, list[float]] = {w.name: [] for w in workers}
    for index in range(rounds):
        shift = index % len(workers)
        for worker in workers[shift:] + workers[:shift]:
            times[worker.name].append(worker.command("step")["ms"])
    return times


def model_flops(fixture: Path, family: str, size: Size) -> float:
    """specdraft's model FLOPs of one step of the family at the size (train/flops.py)."""
    import json

    import torch

    from specdraft.config.schema import ModelConfig
    from specdraft.trainer.models import build_draft, load_target_config
    from specdraft.trainer.train.flops import micro_batch_flops

    options = json.loads((fixture / family / "model.json").read_text())
    draft = build_draft(
        ModelConfig(**options),
        load_target_config(fixture / "target"),
        dtype=torch.float32,
        device="meta",
    )
    return micro_batch_flops(draft.config, 1, size.length, size.anchors).model


def spread(values: list[float]) -> str:
    """min-max."""
    return f"{min(values):.3g}-{max(values):.3g}"


def size_table(
    size: Size, fixture: Path, families: list[str], times: dict[str, list[float]], peak: float
) -> tuple[list[str], list[str]]:
    """The markdown rows of one size, and one summary line per family (against the fastest peer)."""
    rows, summary = [], []
    for family in families:
        flops = model_flops(fixture, family, size)
        ours = times[f"specdraft {family}"]
        sides = [name for name in times if name.endswith(f" {family}")]
        peers = [name for name in sides if not name.startswith("specdraft")]
        for name in sides:
            mine = times[name]
            median = statistics.median(mine)
            rate = flops / (median / 1e3)
            if name.startswith("specdraft"):
                ratio = "-"
            else:
                paired = [a / b for a, b in zip(ours, mine, strict=True)]
                ratio = f"{statistics.median(paired):.3f} ({spread(paired)})"
            rows.append(
                f"| {size.name} | {family} | {name.split()[0]} | {median:.1f} | {spread(mine)} | "
                f"{ratio} | {rate / 1e12:.3f} ({100 * rate / peak:.1f}%) |"
            )
        if peers:
            fastest = min(peers, key=lambda name: statistics.median(times[name]))
            paired = [a / b for a, b in zip(ours, times[fastest], strict=True)]
            ratio = statistics.median(paired)
            verdict = "met" if ratio <= 0.90 else "NOT met"
            summary.append(
                f"- {size.name} {family}: fastest peer {fastest.split()[0]}, specdraft / it "
                f"{ratio:.3f} (target <= 0.90: {verdict})"
            )
    return rows, summary


def machine_line() -> str:
    """CPU model and count."""
    model = platform.processor() or "cpu"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} CPUs"


def main(argv: list[str] | None = None) -> int:
    """Check the losses, time the steps round-robin, print and write the table."""
    args = build_parser().parse_args(argv)
    sizes = [SIZES[name] for name in args.sizes.split(",")]
    families = [f for f in args.families.split(",") if f]
    peers = [p for p in args.peers.split(",") if p]
    ensure_venvs(peers, build=not args.no_build)
    peak = 0.0
    if not args.check_only:
        import torch

        from specdraft.trainer.train.peak import probe_tflops

        torch.set_num_threads(args.threads)
        peak = probe_tflops("cpu", torch.float32) * 1e12
    command = "python bench/peers.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        f"command: `{command.strip()}`",
        f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
        f"machine: {machine_line()}; threads per side: {args.threads}",
    ]
    if peak:
        lines.append(f"GEMM probe: {peak / 1e9:.0f} GFLOP/s (fp32, {args.threads} thread(s))")
    agreements: list[Agreement] = []
    rows: list[str] = []
    summary: list[str] = []
    for size in sizes:
        fixture = write_fixture(args.fixtures, size, tuple(families))
        workers = start_workers(fixture, size, families, peers, args.threads)
        try:
            found = check_losses(workers)
            agreements += found
            for agreement in found:
                print(f"[{size.name}] {agreement.line()}", flush=True)
            if args.check_only:
                continue
            before = os.getloadavg()[0]
            started = time.perf_counter()
            times = time_round_robin(workers, args.rounds, args.warmup)
            after = os.getloadavg()[0]
            lines.append(
                f"{size.name} (H {size.hidden}, I {size.intermediate}, V {size.vocab}, 1 x "
                f"{size.length} tokens, {size.anchors} anchors, block 16): load average (1 min) "
                f"{before:.2f} before, {after:.2f} after {time.perf_counter() - started:.0f} s"
            )
            if args.profile:
                for worker in workers:
                    path = fixture / "profiles" / f"{worker.side}-{worker.family}.txt"
                    path.parent.mkdir(exist_ok=True)
                    worker.command(f"profile {path}")
                lines.append(f"{size.name} profiles: {fixture / 'profiles'}")
            size_rows, size_summary = size_table(size, fixture, families, times, peak)
            rows += size_rows
            summary += size_summary
        finally:
            for worker in workers:
                worker.close()
    lines += ["", "Loss agreement (rel 1e-4):"] + [f"- {a.line()}" for a in agreements]
    if rows:
        lines += [
            "",
            "| size | family | side | step median (ms) | spread (ms) | specdraft / side, "
            "paired (min-max) | model TFLOP/s (MFU) |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            *summary,
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.check_only:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0 if all(a.agrees for a in agreements) else 1


if __name__ == "__main__":
    raise SystemExit(main())
