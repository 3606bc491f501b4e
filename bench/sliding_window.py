"""Sliding-window draft layers at long context, side by side with full attention, in one run.

    python bench/sliding_window.py [--max-length 8192] [--window 2048] [--anchors 32]
                                   [--rounds 5] [--algorithm dflash] [--out DIR]

The tiny Qwen3 target (bench/shapebench), a 2-layer draft, one sample of `--max-length` real
tokens (its second half supervised, as the synthetic workloads do), forward + backward of the
real draft built by `build_trainer` (FSDP2 on one rank, no compile): once with full attention,
once with every layer sliding (`model.sliding_window = --window`). Step time is timed
round-robin in one process (drift spreads evenly over both); the peak memory a step adds is
measured in a child process per variant (after a first step, the peak RSS is reset and the
second step's peak less the RSS before it is read), so one variant's allocations never hide the
other's. Beside them, what the windows save in the keys a block-sparse kernel visits
(`specdraft explain-buckets`'s estimate at this length).

What it shows on CPU: SDPA scores every key of the padded row, masked or not (the window is a
rule of the mask, not of the shapes), so the window changes neither the step time nor the memory
there beyond noise; flex on GPU skips the key blocks no query sees, which is where the saving is.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The bench's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-length", type=int, default=8192)
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--anchors", type=int, default=32, help="anchor blocks per sample")
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per variant")
    parser.add_argument("--algorithm", default="dflash", choices=["dflash", "dflash2", "dspark"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write sliding-window.md and .json here")
    # Internal: measure one variant's step memory in this process and print it as JSON.
    parser.add_argument("--memory-of", choices=["full", "window"], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def preset_of(args: argparse.Namespace) -> Any:
    """The cpu-context preset at the bench's length and anchors, one sample per micro-batch."""
    from shapebench.presets import PRESETS

    return dataclasses.replace(
        PRESETS["cpu-context"],
        name="long-context",
        max_length=args.max_length,
        buckets=(),
        num_anchors=args.anchors,
        anchor_buckets=(),
        micro_batch_size=1,
    )


def build_variant(
    args: argparse.Namespace, window: int | None, target: Any, ctx: Any, work_dir: Path
) -> tuple[Any, Any]:
    """The trainer and one micro-batch of a full-length sample, with or without the window."""
    from shapebench.child import build_bench_source
    from shapebench.presets import base_config
    from step_vs_length import probe_batches

    from specdraft.config import ShapePolicy, validate_config
    from specdraft.trainer.train.assembly import build_trainer

    preset = preset_of(args)
    name = "full" if window is None else f"window-{window}"
    raw = base_config(
        preset, args.algorithm, target, seed=args.seed, output_dir=str(work_dir / name)
    )
    raw["training"]["static_shapes"] = True
    raw["data"]["train_paths"] = ["bench:variable"]
    if window is not None:
        raw["model"]["sliding_window"] = window
    config = validate_config(raw)
    spec = {
        "workload": "variable",
        "seed": args.seed,
        "num_samples": 1,
        "vocab_bound": target.vocab_size,
        "features": "synthetic",
    }
    shapes = ShapePolicy.from_config(config)
    source = build_bench_source(config, ctx, spec, shapes)
    trainer = build_trainer(config, ctx, progress=False, source=source, shapes=shapes)
    length = args.max_length
    batch = probe_batches(source, [length], length, 1, target.vocab_size, args.seed)[length]
    return trainer, batch


def step_ms(trainer: Any, batch: Any) -> float:
    """One forward + backward of the draft on `batch`, in milliseconds."""
    spec = trainer.spec.for_epoch(0)
    start = time.perf_counter()
    out = trainer.model(batch, head=trainer.head, spec=spec)
    out.numerator.backward()
    elapsed = (time.perf_counter() - start) * 1000.0
    trainer.optimizer.zero_grad(set_to_none=True)
    return elapsed


def status_mib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak_rss() -> None:
    """Start the peak (VmHWM) over from the current RSS: building the trainer peaks higher than
    a step, and that peak would hide the step's (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def measure_memory(args: argparse.Namespace) -> int:
    """Child mode: the peak RSS two steps of one variant add, printed as JSON."""
    import torch
    from shapebench.target import tiny_target

    from specdraft.trainer.runtime import init_distributed, shutdown_distributed

    torch.manual_seed(args.seed)
    target = tiny_target()
    ctx = init_distributed()
    window = None if args.memory_of == "full" else args.window
    with tempfile.TemporaryDirectory(prefix="specdraft-sliding-") as tmp:
        trainer, batch = build_variant(args, window, target, ctx, Path(tmp))
        step_ms(trainer, batch)  # the first step allocates the gradients and AdamW-free caches
        reset_peak_rss()
        before = status_mib("VmRSS")
        step_ms(trainer, batch)
        added = status_mib("VmHWM") - before
        trainer.writer.close()
    shutdown_distributed()
    print(json.dumps({"variant": args.memory_of, "peak_added_mib": added, "before_mib": before}))
    return 0


def memory_of(variant: str, argv: list[str]) -> dict[str, Any]:
    """Run the memory child for one variant."""
    done = subprocess.run(
        [sys.executable, __file__, *argv, "--memory-of", variant],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(args: argparse.Namespace, results: dict[str, Any]) -> str:
    """The side-by-side table."""
    full, slid = results["full"], results["window"]
    lines = [
        f"sliding-window draft layers at max_length {args.max_length} ({args.algorithm}, tiny "
        f"Qwen3 target, 2 draft layers, {args.anchors} anchors x 16, one full-length sample, "
        f"CPU SDPA, {args.rounds} round-robin steps)",
        "",
        "| attention | step ms (median) | range | x full | peak RSS a step adds | "
        "keys flex visits |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in (("full", full), (f"sliding, window {args.window}", slid)):
        lines.append(
            f"| {name} | {row['median_ms']:.0f} | {row['min_ms']:.0f}-{row['max_ms']:.0f} | "
            f"{row['median_ms'] / full['median_ms']:.2f}x | {row['peak_added_mib']:.0f} MiB | "
            f"{row['keys_share']:.0%} |"
        )
    lines += [
        "",
        "keys flex visits: the visible keys per draft query against full attention, anchors "
        "uniform over the sample (explain-buckets' estimate); flex skips the rest on GPU, to its "
        "128-key blocks. CPU SDPA scores every key of the padded row, masked or not.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Time both variants round-robin, measure their memory in children, print the table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.memory_of:
        return measure_memory(args)
    import torch
    from shapebench.target import tiny_target

    from specdraft.collate.window_savings import mean_visible_context
    from specdraft.trainer.runtime import init_distributed, shutdown_distributed

    torch.manual_seed(args.seed)
    target = tiny_target()
    ctx = init_distributed()
    times: dict[str, list[float]] = {"full": [], "window": []}
    with tempfile.TemporaryDirectory(prefix="specdraft-sliding-") as tmp:
        variants = {
            "full": build_variant(args, None, target, ctx, Path(tmp)),
            "window": build_variant(args, args.window, target, ctx, Path(tmp)),
        }
        for trainer, batch in variants.values():  # warm-up: allocator, first use of kernels
            step_ms(trainer, batch)
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                times[name].append(step_ms(*variants[name]))
            last = ", ".join(f"{k} {v[-1]:.0f} ms" for k, v in times.items())
            print(f"[sliding] round {r + 1}/{args.rounds}: {last}", flush=True)
        for trainer, _ in variants.values():
            trainer.writer.close()
        del variants
    shutdown_distributed()
    block = 16
    full_keys = mean_visible_context(args.max_length, block, None) + block
    results: dict[str, Any] = {}
    for name, window in (("full", None), ("window", args.window)):
        keys = mean_visible_context(args.max_length, block, window) + block
        results[name] = {
            "median_ms": statistics.median(times[name]),
            "min_ms": min(times[name]),
            "max_ms": max(times[name]),
            "times_ms": times[name],
            "keys_share": keys / full_keys,
            **memory_of(name, argv),
        }
    text = report(args, results)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sliding-window.md").write_text(text + "\n")
        (args.out / "sliding-window.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
