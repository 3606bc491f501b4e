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

and then checks that on real micro-batches: `--anchor-batches N` micro-batches of the
`--anchor-workload` (default `low-supervision`), drawn by the trainer's own sampler and padded to
max_length (static shapes), each timed at num_anchors (static) and at the width the preset's
anchor buckets give it (static + anchor buckets), round-robin. Reported: computed anchor blocks
per valid anchor under both, the share of anchor blocks removed, the measured fall of the step
and the target (fall >= removed share x anchor share - 3 points).

Usage: python bench/step_vs_length.py [--preset cpu|cpu-context|gpu] [--rounds 9] [--out DIR]
       [--anchor-widths 16,32,64 [--anchor-batches 8] [--anchor-workload low-supervision]]
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
    parser.add_argument(
        "--anchor-batches",
        type=int,
        default=8,
        help="with --anchor-widths: workload micro-batches timed at num_anchors and bucketed",
    )
    parser.add_argument(
        "--anchor-workload",
        default="low-supervision",
        help="synthetic workload of those micro-batches (variable, long, low-supervision)",
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
    # Centred sums: the raw normal equations mix L^2 ~ 1e7 with times ~ 1e3 and lose the
    # slopes to rounding; around the means the 2x2 system is well conditioned.
    mean_x = statistics.fmean(float(x) for x, _, _ in points)
    mean_y = statistics.fmean(float(y) for _, y, _ in points)
    mean_t = statistics.fmean(t for _, _, t in points)
    dx = [float(x) - mean_x for x, _, _ in points]
    dy = [float(y) - mean_y for _, y, _ in points]
    dt = [t - mean_t for _, _, t in points]
    sxx = sum(a * a for a in dx)
    syy = sum(b * b for b in dy)
    sxy = sum(a * b for a, b in zip(dx, dy, strict=True))
    sxt = sum(a * t for a, t in zip(dx, dt, strict=True))
    syt = sum(b * t for b, t in zip(dy, dt, strict=True))
    det = sxx * syy - sxy * sxy  # Cramer's rule on [[sxx, sxy], [sxy, syy]] (a, b) = (sxt, syt)
    per_position = (sxt * syy - sxy * syt) / det
    per_block = (sxx * syt - sxy * sxt) / det
    return mean_t - per_position * mean_x - per_block * mean_y, per_position, per_block


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

    spec = trainer.spec.for_epoch(0)
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


# The allowance on the probe: the step must fall by removed share x anchor share - 3 pts.
ANCHOR_PROBE_TOLERANCE = 0.03


def workload_anchor_batches(
    source: Any, preset: Any, workload: str, count: int, vocab: int, seed: int
) -> list[dict[str, Any]]:
    """`count` micro-batches of a synthetic workload as training draws them, at max_length.

    The sampler is the trainer's (random order, the preset's micro-batch size), the collator is
    the static + anchor-buckets policy's, so each batch carries the anchor width training would
    give it; the valid anchor counts come from the same loss masks.
    """
    from shapebench.workloads import synthetic_rows, synthetic_samples

    from specdraft.collate import DataCollatorWithPadding, MicroBatchSampler, anchor_counts
    from specdraft.config import ShapePolicy

    policy = ShapePolicy.from_parts(
        static_shapes=True,
        max_length=preset.max_length,
        num_anchors=preset.num_anchors,
        anchor_buckets=preset.anchor_buckets,
    )
    rows_per_batch = preset.micro_batch_size
    samples = synthetic_samples(
        workload, max_length=preset.max_length, count=count * rows_per_batch, seed=seed
    )
    data = synthetic_rows(samples, vocab_bound=vocab, seed=seed)
    sampler = MicroBatchSampler(
        [s.length for s in samples],
        micro_batch_size=rows_per_batch,
        grad_accum_steps=1,
        seed=seed,
    )
    collate = DataCollatorWithPadding(pad_to=policy)
    out = []
    for indices in sampler.epoch_plan(0)[0][:count]:
        if not indices:
            continue
        batch = collate([data[i] for i in indices])
        valid = [min(preset.num_anchors, c) for c in anchor_counts(batch["loss_mask"])]
        batch["num_real"] = len(indices)
        ids = batch["sample_id"].tolist()
        lengths = [samples[i].length for i in indices]
        batch.update(source.synthetic(ids, lengths, len(indices), preset.max_length))
        out.append({"batch": source.builder.to_device(batch), "valid": valid})
    return out


def time_workload_anchors(
    trainer: Any, items: list[dict[str, Any]], preset: Any, anchor_share: float, rounds: int
) -> dict[str, Any]:
    """Static (num_anchors) against static + anchor buckets on the same micro-batches."""
    from shapebench.checks import removable_share_removed

    from specdraft.collate import ANCHOR_WIDTH

    cells = {}
    for index, item in enumerate(items):
        cells[("static", index)] = {**item["batch"], ANCHOR_WIDTH: preset.num_anchors}
        cells[("anchor buckets", index)] = item["batch"]  # the width its collator chose
    times = time_lengths(trainer, cells, rounds)
    medians = {cell: statistics.median(ts) for cell, ts in times.items()}
    valid = sum(sum(item["valid"]) for item in items)
    rows = sum(len(item["valid"]) for item in items)
    computed_static = rows * preset.num_anchors
    computed_buckets = sum(len(item["valid"]) * int(item["batch"][ANCHOR_WIDTH]) for item in items)
    # The floor: each micro-batch at its largest per-sample count (what pad-to-longest computes).
    computed_exact = sum(len(item["valid"]) * max(1, max(item["valid"])) for item in items)
    removable = removable_share_removed(computed_static, computed_buckets, computed_exact)
    t_static = sum(medians[("static", i)] for i in range(len(items)))
    t_buckets = sum(medians[("anchor buckets", i)] for i in range(len(items)))
    removed = 1.0 - computed_buckets / computed_static
    fall = 1.0 - t_buckets / t_static
    expected = removed * anchor_share
    return {
        "micro_batches": len(items),
        "widths": [int(item["batch"][ANCHOR_WIDTH]) for item in items],
        "valid_blocks": valid,
        "computed_blocks": {
            "static": computed_static,
            "anchor buckets": computed_buckets,
            "exact width": computed_exact,
        },
        "removable_removed": removable,
        "blocks_per_valid": {
            "static": computed_static / valid if valid else 0.0,
            "anchor buckets": computed_buckets / valid if valid else 0.0,
        },
        "empty_removed": (
            (computed_static - computed_buckets) / (computed_static - valid)
            if computed_static > valid
            else 0.0
        ),
        "mean_ms": {"static": t_static / len(items), "anchor buckets": t_buckets / len(items)},
        "anchor_blocks_removed": removed,
        "step_fall": fall,
        "expected_fall": expected,
        "met": fall >= expected - ANCHOR_PROBE_TOLERANCE,
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
        check = row.get("anchor_check")
        if check:
            lines += anchor_check_lines(preset, check, args.anchor_workload)
    return "\n".join(lines) + "\n"


def anchor_check_lines(preset: Any, check: dict[str, Any], workload: str) -> list[str]:
    """The static vs static + anchor buckets comparison on workload micro-batches."""
    buckets = "/".join(str(w) for w in (*preset.anchor_buckets, preset.num_anchors))
    per_valid = check["blocks_per_valid"]
    computed = check["computed_blocks"]
    mean = check["mean_ms"]
    shortfall = check["expected_fall"] - ANCHOR_PROBE_TOLERANCE - check["step_fall"]
    verdict = "met" if check["met"] else f"missed by {100 * shortfall:.1f} pts"
    share = check.get("removable_removed")
    removable = "none" if share is None else f"{share:.1%}"
    return [
        f"{check['micro_batches']} `{workload}` micro-batches at L = {preset.max_length}, "
        f"anchor widths chosen {check['widths']} (anchor buckets {buckets}):",
        "",
        "| policy | fwd+bwd per micro-batch (mean of medians) | computed anchor blocks | "
        "computed anchor blocks per valid anchor |",
        "|---|---|---|---|",
        f"| static ({preset.num_anchors} anchors) | {mean['static']:.1f} ms | "
        f"{computed['static']} | {per_valid['static']:.2f} |",
        f"| static + anchor buckets | {mean['anchor buckets']:.1f} ms | "
        f"{computed['anchor buckets']} | {per_valid['anchor buckets']:.2f} |",
        "",
        f"Anchor buckets remove {check['anchor_blocks_removed']:.1%} of the computed anchor "
        f"blocks ({check['empty_removed']:.1%} of the empty ones, {removable} of the "
        f"{computed['static'] - computed['exact width']} removable ones: the exact width computes "
        f"{computed['exact width']}); the step falls by "
        f"{check['step_fall']:.1%}, expected {check['expected_fall']:.1%} (removed share x "
        f"anchor share); target (fall >= expected - 3 pts): **{verdict}**.",
        "",
    ]


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
    from shapebench.workloads import SYNTHETIC_LENGTHS

    if args.anchor_workload not in SYNTHETIC_LENGTHS:
        names = ", ".join(SYNTHETIC_LENGTHS)
        print(f"--anchor-workload {args.anchor_workload}: choose from {names}", file=sys.stderr)
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
                anchors = time_anchor_cells(trainer, batches, widths, preset, args.rounds)
                results["algorithms"][algorithm]["anchors"] = anchors
                if args.anchor_batches > 0:
                    items = workload_anchor_batches(
                        source,
                        preset,
                        args.anchor_workload,
                        args.anchor_batches,
                        target.vocab_size,
                        args.seed,
                    )
                    check = time_workload_anchors(
                        trainer, items, preset, anchors["anchor_share"], args.rounds
                    )
                    results["algorithms"][algorithm]["anchor_check"] = check
                    print(f"[probe] {algorithm} anchor check: {check}", flush=True)
                    del items
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
