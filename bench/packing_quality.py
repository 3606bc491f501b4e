"""Is packing better, not just denser? Draft quality per compute, packed vs unpacked, in one run.

    python bench/packing_quality.py                  # the CPU quickstart, three runs, one table
    python bench/packing_quality.py --seeds 42,7     # each seed's runs; targets on the means
    python bench/packing_quality.py --max-length 1024   # rows four times the quickstart's
    python bench/packing_quality.py --quick          # a few steps on a small set (smoke test)

On the CPU quickstart setup (the tiny target, its own answers to ShareGPT prompts: train records
0-299, held-out 10000-10023; built with the Makefile's commands when build/quickstart/ lacks
them) it trains, per seed: `unpacked` (static shapes, the quickstart's 3 epochs), `packed, equal
anchor blocks` (packing, the same optimizer steps: under one static shape every step computes
micro_batch_size x num_anchors anchor blocks, so the same steps are the same computed blocks)
and `packed, equal time` (as many packed steps as fit in the unpacked run's training time at the
packed run's mean step time). Each run evaluates tau on the same held-out records before and
after training. Prints a markdown table (and writes tables.md / results.json to --out): steps,
computed anchor blocks, conversations, training time, samples (conversations) per second,
computed positions per real token, anchors per conversation, tau. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shapebench.quality import (
    PACKED_EQUAL_BLOCKS,
    PACKED_EQUAL_TIME,
    UNPACKED,
    QualityRow,
    QualityRun,
    equal_time_steps,
    execute_quality_run,
    quality_table,
    quickstart_config,
    quickstart_max_length,
    read_quality_row,
    target_lines,
    write_quality_run,
)
from shapebench.runner import REPO_ROOT, child_env

# The Makefile's quickstart data: (file, first record, count); --quick makes a small set instead.
FULL_DATA = (("train.jsonl", 0, 300), ("eval.jsonl", 10000, 24))
QUICK_DATA = (("train.jsonl", 0, 24), ("eval.jsonl", 10000, 4))
FULL_NEW_TOKENS, QUICK_NEW_TOKENS = 128, 32
# --quick: the unpacked run's steps (instead of the quickstart's epochs) and eval records.
QUICK_STEPS = 3
QUICK_EVAL_SAMPLES = 2
RUN_DIRS = {
    UNPACKED: "unpacked",
    PACKED_EQUAL_BLOCKS: "packed-blocks",
    PACKED_EQUAL_TIME: "packed-time",
}


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a few steps on a small data set")
    parser.add_argument(
        "--seeds", default="42", help="comma list of training.seed values (42: the quickstart's)"
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps of the unpacked run (default: the quickstart's 3 epochs; "
        f"{QUICK_STEPS} with --quick)",
    )
    parser.add_argument("--algorithm", choices=("dflash", "dflash2", "dspark"), default="dflash2")
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="data.max_length (row capacity) instead of the quickstart's 256",
    )
    parser.add_argument(
        "--run-timeout", type=float, default=900.0, metavar="S", help="stop a run after S seconds"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="run folders (default: build/bench/runs/packing-quality-<max length>[-quick])",
    )
    parser.add_argument("--out", type=Path, default=None, help="write tables.md and results.json")
    parser.add_argument(
        "--from-results",
        type=Path,
        default=None,
        metavar="JSON",
        help="print the report of an earlier run's results.json again (no training)",
    )
    return parser


def specdraft(args: list[str], log: Callable[[str], None]) -> None:
    """Run a `specdraft` subcommand from the repository root (one thread, as the Makefile)."""
    env = child_env()
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    log("specdraft " + shlex.join(args))
    # Its output goes to stderr with the log: stdout is the report alone.
    subprocess.run(
        [sys.executable, "-m", "specdraft.cli", *args],
        cwd=str(REPO_ROOT),
        env=env,
        check=True,
        stdout=sys.stderr,
    )


def ensure_data(quick: bool, work_dir: Path, log: Callable[[str], None]) -> tuple[Path, ...]:
    """(tiny target, train file, eval file): the quickstart's, built when missing."""
    target = REPO_ROOT / "build" / "tiny-target"
    specdraft(["assets", "tiny-target", "--out", str(target)], log)
    folder = REPO_ROOT / "build" / "quickstart"
    plan, new_tokens = FULL_DATA, FULL_NEW_TOKENS
    if quick and not all((folder / name).is_file() for name, _, _ in FULL_DATA):
        folder, plan, new_tokens = work_dir / "data", QUICK_DATA, QUICK_NEW_TOKENS
    paths = []
    for name, first, count in plan:
        path = folder / name
        # regenerate resumes a partial file and leaves a complete one alone.
        specdraft(
            [
                *("regenerate", str(REPO_ROOT / "examples" / "quickstart.toml")),
                *("--source", "pkg:sharegpt", "--out", str(path)),
                *("--first", str(first), "--count", str(count)),
                *("--max-new-tokens", str(new_tokens), "--batch-size", "32"),
            ],
            log,
        )
        paths.append(path)
    return (target, *paths)


def main(argv: list[str] | None = None) -> int:
    """Train the runs of every seed and print the table."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: expected integers, e.g. 42,7")
    if not seeds:
        parser.error("--seeds: at least one seed")
    steps = args.steps if args.steps is not None else (QUICK_STEPS if args.quick else None)
    if steps is not None and steps < 1:
        parser.error("--steps must be at least 1")
    if args.max_length is not None and args.max_length < 16:
        parser.error("--max-length must be at least 16")
    if args.from_results is not None:
        payload = json.loads(args.from_results.read_text())
        rows = [QualityRow(**run) for run in payload["runs"]]
        # Files from before the setting was recorded: --algorithm / --max-length say it.
        algorithm = payload.get("algorithm", args.algorithm)
        max_length = payload.get("max_length") or args.max_length or quickstart_max_length()
        print(render(payload["command"], rows, algorithm, max_length), end="")
        return 0
    # One folder per setting, so runs at another max_length do not replace these.
    default_dir = f"packing-quality-{args.max_length or 'quickstart'}" + (
        "-quick" if args.quick else ""
    )
    work_dir = (args.work_dir or REPO_ROOT / "build" / "bench" / "runs" / default_dir).resolve()
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[quality {time.perf_counter() - started:6.0f} s] {message}", file=sys.stderr)

    target, train_path, eval_path = ensure_data(args.quick, work_dir, log)
    max_length = args.max_length or quickstart_max_length()
    command = "python bench/packing_quality.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    rows: list[QualityRow] = []

    def train(run: QualityRun) -> QualityRow:
        run_dir = work_dir / f"seed{run.seed}" / RUN_DIRS[run.name]
        config = quickstart_config(
            run=run,
            algorithm=args.algorithm,
            output_dir=run_dir,
            train_path=train_path,
            eval_path=eval_path,
            target=target,
            max_eval_samples=QUICK_EVAL_SAMPLES if args.quick else None,
            max_length=args.max_length,
        )
        write_quality_run(run_dir, config, algorithm=args.algorithm, seed=run.seed)
        log(f"run {run.name} (seed {run.seed}, steps {run.max_steps or 'epochs'}) ...")
        code = execute_quality_run(run_dir, timeout_s=args.run_timeout)
        row = read_quality_row(run, run_dir, code)
        log(f"  {row.status}: {row.steps} steps, {row.train_s:.1f} s, tau {row.tau_after:.3f}")
        rows.append(row)
        report = render(command, rows, args.algorithm, max_length)
        extra = {"algorithm": args.algorithm, "max_length": max_length}
        write_outputs(args.out, report, {"command": command, **extra}, rows)
        return row

    for seed in seeds:
        unpacked = train(QualityRun(UNPACKED, False, seed, steps))
        if not unpacked.ok:
            continue
        packed = train(QualityRun(PACKED_EQUAL_BLOCKS, True, seed, unpacked.steps))
        if not packed.ok:
            continue
        timed = equal_time_steps(unpacked, packed)
        if timed == packed.steps:
            # The equal-blocks run is the equal-time run too (the targets pair it so).
            log("equal time is the equal-blocks run's step count: no third run")
            continue
        train(QualityRun(PACKED_EQUAL_TIME, True, seed, timed))
    print(render(command, rows, args.algorithm, max_length), end="")
    return 0 if rows and all(row.ok for row in rows) else 1


def render(command: str, rows: list[QualityRow], algorithm: str, max_length: int) -> str:
    """The markdown report: setting, table, targets."""
    from shapebench.report import machine_description

    lines = [
        "# Packing: draft quality per compute (CPU quickstart)",
        "",
        f"- command: `{command}`",
        f"- machine: {machine_description()}",
        f"- date: {dt.datetime.now().strftime('%Y-%m-%d %H:%M')}",
        f"- setting: examples/quickstart.toml (tiny target, 1-layer {algorithm} draft, "
        f"micro-batch 4, 32 anchors of 8) at max_length {max_length}, with static_shapes and no "
        "buckets; packed runs add training.packing (rows of max_length)",
        "",
        quality_table(rows),
        "## Targets",
        "",
        *target_lines(rows),
    ]
    return "\n".join(lines) + "\n"


def write_outputs(
    out: Path | None, report: str, setting: dict[str, object], rows: list[QualityRow]
) -> None:
    """tables.md and results.json (the setting and every row), rewritten after every run."""
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "tables.md").write_text(report)
    payload = {**setting, "runs": [row.to_dict() for row in rows]}
    (out / "results.json").write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    sys.exit(main())
