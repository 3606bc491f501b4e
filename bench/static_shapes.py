"""Static-shape benchmark: the reference note's comparison tables, side by side in one run.

    python bench/static_shapes.py                       # cpu preset, every table
    python bench/static_shapes.py --workloads long --algorithms dflash2 --variants static,buckets
    python bench/static_shapes.py --preset gpu --out $OUT --time-budget 540

Runs every selected variant (fsdp1 / fsdp2 pad-to-longest, fsdp2 + static_shapes, + buckets,
+ anchor buckets, + packing, each static one with and without compile_blocks) on every selected
workload and algorithm, one after the other, each in a fresh process, on the same data and seed.
Prints markdown tables and writes them (tables.md, results.json) to --out after every run, so a
stopped run still leaves its finished rows. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shapebench.presets import PRESETS, with_anchor_buckets
from shapebench.variants import parse_variants
from shapebench.workloads import parse_workloads

ALGORITHMS = ("dflash", "dflash2", "dspark")
# The reference tables compare the two extended families; plain DFlash runs when asked for.
DEFAULT_ALGORITHMS = "dflash2,dspark"
# Without a time budget everything runs in the canonical order; under one (the GPU script), the
# rows the reference's 8192 table compares come first, so a budget cut drops the least needed.
DEFAULT_VARIANTS = {
    "cpu": "all",
    "cpu-context": "all",
    "toy": "all",
    "gpu": "fsdp2,static-compile,buckets-compile,packed-compile,static-anchors-compile,"
    "buckets-anchors-compile,static,buckets,packed,static-anchors,buckets-anchors,fsdp1",
}
DEFAULT_WORKLOADS = {
    "cpu": "all",
    "cpu-context": "long,variable",
    "toy": "variable",
    "gpu": "long,low-supervision,variable",
}


def parse_algorithms(text: str) -> tuple[str, ...]:
    """Algorithms named in a comma list."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in ALGORITHMS]
    if unknown or not names:
        raise ValueError(
            f"--algorithms: unknown {', '.join(unknown) or '(empty)'}; choose from "
            f"{', '.join(ALGORITHMS)}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument(
        "--algorithms", default=DEFAULT_ALGORITHMS, help="comma list of " + ", ".join(ALGORITHMS)
    )
    parser.add_argument(
        "--variants",
        default=None,
        help="comma list of fsdp1, fsdp2, static, buckets, static-compile, buckets-compile, "
        "static-anchors, buckets-anchors, static-anchors-compile, buckets-anchors-compile, "
        "packed, packed-compile (default: all; the gpu preset runs them in priority order)",
    )
    parser.add_argument(
        "--workloads",
        default=None,
        help="comma list of variable, long, sharegpt, online, low-supervision (default: all on "
        "cpu, long,low-supervision,variable on gpu, variable on toy)",
    )
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    parser.add_argument(
        "--steady", type=int, default=None, help="measured window: the last N steps of a run"
    )
    parser.add_argument("--ranks", type=int, default=1, help="trainer ranks per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--baseline", default="fsdp2", help="the variant the deltas are taken against"
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="overhead allowed by the buckets target, as a share (0.05 = 5 points)",
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="S",
        help="skip runs that cannot start with 45 s left, stop one that overruns",
    )
    parser.add_argument("--tokenizer", default=None, help="data.tokenizer for sharegpt (gpu)")
    parser.add_argument(
        "--anchor-buckets",
        default=None,
        metavar="A,B,...",
        help="anchor widths of the *-anchors rows instead of the preset's (num_anchors is "
        "appended), e.g. the suggestion of bench/anchor_counts.py",
    )
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="run folders (default: build/bench/<preset>)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="write tables.md and results.json here"
    )
    return parser


def steady_steps(steps: int, steady: int | None, preset_steady: int, preset_steps: int) -> int:
    """The measured window: as given, the preset's, or about two thirds of the steps."""
    if steady is not None:
        return steady
    if steps == preset_steps:
        return preset_steady
    return max(1, steps - max(1, steps // 3)) if steps > 1 else 1


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    parser = build_parser()
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.anchor_buckets is not None:
        # The lint rules check the widths again per run, as for any config.
        try:
            preset = with_anchor_buckets(preset, args.anchor_buckets)
        except ValueError as exc:
            parser.error(str(exc))
    try:
        variants = parse_variants(args.variants or DEFAULT_VARIANTS[preset.name])
        workloads = parse_workloads(args.workloads or DEFAULT_WORKLOADS[preset.name])
        algorithms = parse_algorithms(args.algorithms)
    except ValueError as exc:
        parser.error(str(exc))
    steps = args.steps or preset.steps
    steady = steady_steps(steps, args.steady, preset.steady, preset.steps)
    if steps < 1 or not 1 <= steady <= steps:
        parser.error(f"--steps {steps} / --steady {steady}: need 1 <= steady <= steps")
    if args.ranks < 1:
        parser.error("--ranks must be at least 1")

    from shapebench.report import machine_description, render_report
    from shapebench.runner import REPO_ROOT, BenchSettings, child_env, run_all
    from shapebench.target import qwen3_8b_shaped_target, tiny_target

    work_dir = (args.work_dir or REPO_ROOT / "build" / "bench" / preset.name).resolve()
    settings = BenchSettings(
        preset=preset,
        algorithms=algorithms,
        variants=tuple(variants),
        workloads=tuple(workloads),
        steps=steps,
        steady=steady,
        ranks=args.ranks,
        seed=args.seed,
        work_dir=work_dir,
        time_budget_s=args.time_budget,
        tokenizer=args.tokenizer,
    )
    # The harness shares the children's cache locations (tiny target, datasets, Inductor).
    import os

    for key in ("SPECDRAFT_CACHE", "TORCHINDUCTOR_CACHE_DIR", "HF_HUB_OFFLINE"):
        os.environ.setdefault(key, child_env()[key])
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[bench {time.perf_counter() - started:6.0f} s] {message}", file=sys.stderr)

    log("preparing the target")
    if preset.target == "tiny":
        target = tiny_target()
    else:
        target = qwen3_8b_shaped_target(work_dir / "targets" / "qwen3-8b-shaped")
    command = "python bench/static_shapes.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    machine = machine_description()
    results = []

    def render() -> str:
        return render_report(
            settings,
            results,
            command=command,
            machine=machine,
            baseline=args.baseline,
            tolerance=args.tolerance,
        )

    def on_result(result) -> None:
        results.append(result)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "tables.md").write_text(render())
            runs = [r.to_dict() for r in results]
            payload = {"command": command, "machine": machine, "runs": runs}
            (args.out / "results.json").write_text(json.dumps(payload, indent=2))

    run_all(settings, target, on_result=on_result, log=log, started=started)
    print(render(), end="")
    trained = [r for r in results if r.ok]
    failed = [r for r in results if r.status == "failed"]
    stopped = [r for r in results if r.status in ("timeout", "skipped")]
    log(
        f"done: {len(trained)} run(s) measured, {len(failed)} failed, {len(stopped)} stopped or "
        "skipped"
    )
    # A budget cut is expected under --time-budget; a failed run is not.
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
