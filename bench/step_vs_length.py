"""How the train compute of one micro-batch grows with its padded length, in one process.

The static-shape tables compare runs in separate processes, so on a shared two-core machine
their step times carry run-to-run drift. This probe isolates the one thing buckets change:
the same real samples (fixed real length, fixed anchors) are padded to every length in turn,
and forward + backward of the real draft (built by `build_trainer`, FSDP2 on one rank) is
timed round-robin, so drift spreads evenly over the lengths. A least-squares line
t(L) = fixed + per_position * L then says which share of a step at length L is context work —
the only part padding adds to — and so the most buckets can save there:

    saving(static -> buckets) = context share at max_length * share of positions removed

Usage: python bench/step_vs_length.py [--preset cpu|cpu-context|gpu] [--rounds 9] [--out DIR]
(on the gpu preset, with the Qwen3-8B-shaped stand-in target, it needs a GPU: run_gpu.sh runs it
after the tables when time is left).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The probe's command line."""
    from shapebench.presets import PRESETS

    parser = argparse.ArgumentParser(
        description="Train compute per micro-batch against its padded length (one process).",
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--algorithms", default="dflash2,dspark", help="comma list")
    parser.add_argument(
        "--lengths",
        default=None,
        help="comma list of padded lengths (default: the preset's buckets and max_length)",
    )
    parser.add_argument(
        "--real-length",
        type=int,
        default=None,
        help="real tokens per sample (default: the smallest padded length)",
    )
    parser.add_argument("--rounds", type=int, default=9, help="timed passes over the lengths")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where the gpu preset's stand-in target is written (default: build/bench/<preset>)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write probe.md and probe.json")
    return parser.parse_args(argv)


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of time against length."""
    xs = [float(x) for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
    return mean_y - slope * mean_x, slope


def build_probe(
    preset: Any, algorithm: str, target: Any, ctx: Any, seed: int, work_dir: Path
) -> tuple[Any, Any]:
    """The draft exactly as a benchmark run builds it (static shapes at max_length, no compile)."""
    from shapebench.child import build_bench_source
    from shapebench.presets import base_config

    from specdraft.config import validate_config
    from specdraft.trainer.train.assembly import build_trainer

    raw = base_config(preset, algorithm, target, seed=seed, output_dir=str(work_dir / algorithm))
    raw["training"]["static_shapes"] = True
    raw["data"]["train_paths"] = ["bench:variable"]
    config = validate_config(raw)
    spec = {
        "workload": "variable",
        "seed": seed,
        "num_samples": preset.micro_batch_size,
        "vocab_bound": target.vocab_size,
        "features": "synthetic",
    }
    source = build_bench_source(config, ctx, spec)
    return build_trainer(config, ctx, progress=False, source=source), source


def probe_batches(
    source: Any, lengths: list[int], real_length: int, rows: int, vocab: int, seed: int
) -> dict[int, Any]:
    """One micro-batch of `rows` samples of `real_length` tokens, padded to each length."""
    from shapebench.workloads import SyntheticSample, synthetic_rows

    from specdraft.collate import DataCollatorWithPadding

    # Half the tokens unsupervised: the middle of the workloads' 20-80% prefix.
    samples = [SyntheticSample(real_length, real_length // 2) for _ in range(rows)]
    data = synthetic_rows(samples, vocab_bound=vocab, seed=seed)
    out = {}
    for length in lengths:
        batch = DataCollatorWithPadding(pad_to=length)(data)
        batch["num_real"] = rows
        ids = batch["sample_id"].tolist()
        batch.update(source.synthetic(ids, [real_length] * rows, rows, length))
        out[length] = source.builder.to_device(batch)
    return out


def time_lengths(trainer: Any, batches: dict, rounds: int) -> dict[int, list[float]]:
    """Milliseconds of forward + backward per length, round-robin over the lengths."""
    import torch

    spec = trainer.spec_for_epoch(trainer.spec, 0)
    lengths = list(batches)

    device = trainer.ctx.device

    def sync() -> None:
        # CUDA kernels run asynchronously: time what the device did, not what was queued.
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def once(length: int) -> float:
        sync()
        start = time.perf_counter()
        out = trainer.model(batches[length], head=trainer.head, spec=spec)
        out.numerator.backward()
        sync()
        elapsed = (time.perf_counter() - start) * 1000.0
        trainer.optimizer.zero_grad(set_to_none=True)
        return elapsed

    for length in lengths:  # warm-up: allocator, kernels' first use
        once(length)
        once(length)
    times: dict[int, list[float]] = {length: [] for length in lengths}
    for r in range(rounds):
        shift = r % len(lengths)  # rotate the order so no length always follows the same one
        for length in lengths[shift:] + lengths[:shift]:
            times[length].append(once(length))
    return times


def report(preset: Any, results: dict[str, Any], args: argparse.Namespace) -> str:
    """The probe's markdown: per-length medians, the fitted line, the context share."""
    lines = [
        "# Train compute per micro-batch against padded length",
        "",
        f"- command: `python bench/step_vs_length.py {' '.join(sys.argv[1:])}`".rstrip(),
        f"- preset `{preset.name}`: {preset.description}; micro-batch {preset.micro_batch_size}"
        f" x {results['real_length']} real tokens, num_anchors {preset.num_anchors},"
        f" block {preset.block_size}; {args.rounds} rounds, median",
        "",
    ]
    for algorithm, row in results["algorithms"].items():
        lengths = row["lengths"]
        lines += [
            f"## {algorithm}",
            "",
            "| padded length | fwd+bwd (median) | spread (min–max) | vs longest length |",
            "|---|---|---|---|",
        ]
        top = row["median_ms"][str(lengths[-1])]
        for length in lengths:
            med = row["median_ms"][str(length)]
            low, high = row["range_ms"][str(length)]
            lines.append(f"| {length} | {med:.1f} ms | {low:.1f}–{high:.1f} ms | {med / top:.3f} |")
        lines += [
            "",
            f"Fit: t(L) = {row['fixed_ms']:.1f} ms + {preset.micro_batch_size} rows × "
            f"{row['per_position_us']:.2f} µs × L; context share of a step at L = "
            f"{lengths[-1]}: **{row['context_share']:.1%}**.",
            "",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the probe for each algorithm and print (and optionally write) its table."""
    import torch
    from shapebench.presets import PRESETS
    from shapebench.runner import REPO_ROOT
    from shapebench.target import qwen3_8b_shaped_target, tiny_target

    from specdraft.trainer.runtime import init_distributed, shutdown_distributed

    args = parse_args(argv)
    preset = PRESETS[args.preset]
    lengths = (
        [int(x) for x in args.lengths.split(",")]
        if args.lengths
        else sorted({*preset.buckets, preset.max_length})
    )
    real_length = args.real_length or lengths[0]
    if real_length > lengths[0]:
        print(f"--real-length {real_length} exceeds the smallest length", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    if preset.target == "tiny":
        target = tiny_target()
    else:  # the same Qwen3-8B-shaped stand-in (random embedding and head) the gpu runs use
        work_dir = (args.work_dir or REPO_ROOT / "build" / "bench" / preset.name).resolve()
        target = qwen3_8b_shaped_target(work_dir / "targets" / "qwen3-8b-shaped")
    results: dict[str, Any] = {"real_length": real_length, "algorithms": {}}
    ctx = init_distributed()  # a one-rank group: FSDP2 wraps the draft as in a 1-rank run
    with tempfile.TemporaryDirectory(prefix="specdraft-probe-") as tmp:
        for algorithm in args.algorithms.split(","):
            trainer, source = build_probe(preset, algorithm, target, ctx, args.seed, Path(tmp))
            batches = probe_batches(
                source, lengths, real_length, preset.micro_batch_size, target.vocab_size, args.seed
            )
            times = time_lengths(trainer, batches, args.rounds)
            medians = {length: statistics.median(ts) for length, ts in times.items()}
            fixed, slope = fit_line(list(medians.items()))
            top = lengths[-1]
            results["algorithms"][algorithm] = {
                "lengths": lengths,
                "median_ms": {str(k): v for k, v in medians.items()},
                "range_ms": {str(k): [min(v), max(v)] for k, v in times.items()},
                "fixed_ms": fixed,
                "per_position_us": slope * 1000.0 / preset.micro_batch_size,
                "context_share": slope * top / medians[top],
            }
            print(
                f"[probe] {algorithm}: "
                + ", ".join(f"{k}: {v:.1f} ms" for k, v in medians.items()),
                flush=True,
            )
            trainer.writer.close()
            del trainer, source, batches
    shutdown_distributed()
    text = report(preset, results, args)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe.md").write_text(text)
        (args.out / "probe.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
