"""How the train compute of one micro-batch grows with its padded length, in one process.

The static-shape tables compare runs in separate processes, so on a shared two-core machine
their step times carry run-to-run drift. This probe isolates the one thing buckets change:
the same real samples (fixed real length, fixed anchors) are padded to every length in turn,
and forward + backward of the real draft (built by `build_trainer`, FSDP2 on one rank) is
timed round-robin, so drift spreads evenly over the lengths. A least-squares line
t(L) = fixed + per_position * L then says which share of a step at length L is context work —
the only part padding adds to — and so the most buckets can save there:

    saving(static -> buckets) = context share at max_length * share of positions removed

With `--anchor-widths A1,A2,...` it also times the anchor dimension in the same process: every
(length, anchor width) cell, round-robin, and fits the plane t(L, A) = fixed + per_position * L +
per_block * A, whose anchor part at (max_length, num_anchors) is what anchor buckets can save:

    saving(anchor buckets) = anchor share at num_anchors * share of anchor blocks removed

Usage: python bench/step_vs_length.py [--preset cpu|cpu-context|gpu] [--rounds 9] [--out DIR]
       [--anchor-widths 8,16,32,64]
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
    parser.add_argument(
        "--anchor-widths",
        default=None,
        help="comma list of anchor widths: also time every (length, width) cell and fit t(L, A)",
    )
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


def fit_plane(points: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """Least-squares (fixed, per_position, per_block) of t = fixed + a L + b A."""
    n = float(len(points))
    sx = sum(float(x) for x, _, _ in points)
    sy = sum(float(y) for _, y, _ in points)
    st = sum(t for _, _, t in points)
    sxx = sum(float(x) * x for x, _, _ in points)
    syy = sum(float(y) * y for _, y, _ in points)
    sxy = sum(float(x) * y for x, y, _ in points)
    sxt = sum(x * t for x, _, t in points)
    syt = sum(y * t for _, y, t in points)
    # Normal equations [[n, sx, sy], [sx, sxx, sxy], [sy, sxy, syy]] (c, a, b) = (st, sxt, syt),
    # solved by Cramer's rule (3 unknowns: no numpy needed).
    m = [[n, sx, sy], [sx, sxx, sxy], [sy, sxy, syy]]
    rhs = [st, sxt, syt]

    def det(a: list[list[float]]) -> float:
        return (
            a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
            - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0])
        )

    base = det(m)
    out = []
    for col in range(3):
        swapped = [[rhs[r] if c == col else m[r][c] for c in range(3)] for r in range(3)]
        out.append(det(swapped) / base)
    return out[0], out[1], out[2]


def build_probe(
    preset: Any, algorithm: str, target: Any, ctx: Any, seed: int, work_dir: Path
) -> tuple[Any, Any]:
    """The draft exactly as a benchmark run builds it (static shapes at max_length, no compile)."""
    from shapebench.child import build_bench_source
    from shapebench.presets import base_config

    from specdraft.config import ShapePolicy, validate_config
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
    shapes = ShapePolicy.from_config(config)
    source = build_bench_source(config, ctx, spec, shapes)
    return build_trainer(config, ctx, progress=False, source=source, shapes=shapes), source


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


def time_lengths(trainer: Any, batches: dict, rounds: int) -> dict[Any, list[float]]:
    """Milliseconds of forward + backward per batch key (a length or a (length, width) cell),
    round-robin over the keys."""
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


def time_anchor_cells(
    trainer: Any, batches: dict[int, Any], widths: list[int], preset: Any, rounds: int
) -> dict[str, Any]:
    """t(L, A) for every (length, anchor width) cell in one process, and the fitted plane.

    The width only sets how many anchor blocks the draft computes (the probe's samples have more
    valid anchors than the widest cell, so every cell computes full blocks): the timing is the
    cost of A blocks at L positions, the quantity anchor buckets change.
    """
    from specdraft.collate import ANCHOR_WIDTH

    cells = {
        (length, width): {**batch, ANCHOR_WIDTH: width}
        for length, batch in batches.items()
        for width in widths
    }
    times = time_lengths(trainer, cells, rounds)
    medians = {cell: statistics.median(ts) for cell, ts in times.items()}
    fixed, per_position, per_block = fit_plane([(L, A, t) for (L, A), t in medians.items()])
    top = (max(batches), preset.num_anchors)
    at_top = medians.get(top, fixed + per_position * top[0] + per_block * top[1])
    print(
        "[probe] anchors: " + ", ".join(f"{L}x{A}: {t:.1f} ms" for (L, A), t in medians.items()),
        flush=True,
    )
    return {
        "widths": widths,
        "median_ms": {f"{L}x{A}": t for (L, A), t in medians.items()},
        "fixed_ms": fixed,
        "per_position_ms": per_position,
        "per_block_ms": per_block,
        # The share of a step at (max_length, num_anchors) that scales with the anchor count.
        "anchor_share": per_block * preset.num_anchors / at_top,
    }


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
        anchors = row.get("anchors")
        if anchors:
            widths = anchors["widths"]
            lines += [
                "| padded length | " + " | ".join(f"{w} anchors" for w in widths) + " |",
                "|---|" + "---|" * len(widths),
            ]
            for length in lengths:
                cells = [anchors["median_ms"][f"{length}x{w}"] for w in widths]
                lines.append(f"| {length} | " + " | ".join(f"{t:.1f} ms" for t in cells) + " |")
            lines += [
                "",
                f"Fit: t(L, A) = {anchors['fixed_ms']:.1f} ms + {anchors['per_position_ms']:.4f} "
                f"ms × L + {anchors['per_block_ms']:.3f} ms × A; anchor share of a step at "
                f"(L = {lengths[-1]}, A = {preset.num_anchors}): "
                f"**{anchors['anchor_share']:.1%}**.",
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
            if args.anchor_widths:
                widths = sorted({int(x) for x in args.anchor_widths.split(",")})
                results["algorithms"][algorithm]["anchors"] = time_anchor_cells(
                    trainer, batches, widths, preset, args.rounds
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
