"""Anchor-block counts: what each anchor policy computes on a workload, exactly, without training.

    python bench/anchor_counts.py --workloads low-supervision,variable,long,sharegpt --suggest 4

For every workload, the micro-batches of the harness's own config and sampler (one epoch of
--samples samples), and per length stack (static, buckets): computed positions per real token and
computed anchor blocks per valid anchor at num_anchors, at the preset's anchor buckets, at the
exact-DP suggestion of --suggest widths from these micro-batches, and at the exact width
(pad-to-longest's floor), in random and in anchor-grouped order (data.anchor_grouped); then the
">= 90% of the empty anchor blocks removed" target, judged on the *removable* empty blocks and
on *all* empty blocks. Counts do
not depend on the algorithm (the masks and sampler are the same for both) nor on the machine's
load. Prints markdown and writes counts.md / counts.json to --out.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shapebench.presets import PRESETS, with_anchor_buckets
from shapebench.workloads import parse_workloads

# The workloads whose rows the counts describe (online trains on ShareGPT prompts: see sharegpt).
COUNTED = ("low-supervision", "variable", "long", "sharegpt")


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--workloads", default=",".join(COUNTED), help=", ".join(COUNTED))
    parser.add_argument(
        "--samples", type=int, default=1024, help="samples per workload (one epoch is counted)"
    )
    parser.add_argument(
        "--suggest",
        default="4",
        help="comma list of K: a row of suggested anchor buckets (exact DP) per K",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--anchor-buckets",
        default=None,
        metavar="A,B,...",
        help="count these widths as the preset's anchor buckets (num_anchors is appended), e.g. "
        "widths suggested on another seed, to check them on unseen samples",
    )
    parser.add_argument("--ranks", type=int, default=1, help="trainer ranks the sampler deals to")
    parser.add_argument("--tokenizer", default=None, help="data.tokenizer for sharegpt (gpu)")
    parser.add_argument("--out", type=Path, default=None, help="write counts.md / counts.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Count every workload and print the tables and target lines."""
    parser = build_parser()
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.anchor_buckets is not None:
        try:
            preset = with_anchor_buckets(preset, args.anchor_buckets)
        except ValueError as exc:
            parser.error(str(exc))
    try:
        workloads = parse_workloads(args.workloads)
    except ValueError as exc:
        parser.error(str(exc))
    if "online" in workloads:
        parser.error("--workloads: online is not counted here (its samples are sharegpt's)")
    try:
        suggest = [int(k) for k in args.suggest.split(",") if k.strip()]
    except ValueError:
        parser.error(f"--suggest {args.suggest!r}: expected a comma list of integers, e.g. 4,8")
    if args.samples < 1 or not suggest or min(suggest) < 1:
        parser.error("--samples and every --suggest K must be at least 1")

    import os

    from shapebench.anchorcount import (
        check_lines,
        count_table,
        count_workload,
        default_work_dir,
        to_json,
        workload_samples,
    )
    from shapebench.runner import BenchSettings, child_env
    from shapebench.target import qwen3_8b_shaped_target, tiny_target
    from shapebench.variants import BY_KEY

    work_dir = default_work_dir(preset)
    settings = BenchSettings(
        preset=preset,
        algorithms=("dspark",),
        variants=(BY_KEY["static"],),
        workloads=tuple(workloads),
        # One epoch of --samples: the harness plans steps x window samples per run.
        steps=max(
            1, args.samples // (preset.micro_batch_size * preset.grad_accum_steps * args.ranks)
        ),
        steady=1,
        ranks=args.ranks,
        seed=args.seed,
        work_dir=work_dir,
        tokenizer=args.tokenizer,
    )
    from shapebench.presets import TargetFacts
    from shapebench.workloads import is_synthetic

    if not all(is_synthetic(w) for w in workloads):
        # The harness's cache locations (tiny target, tokenised datasets), offline.
        for key in ("SPECDRAFT_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            os.environ.setdefault(key, child_env()[key])
    if all(is_synthetic(w) for w in workloads):
        # Synthetic rows need no target (random ids, masks by construction): a stand-in keeps
        # the gpu preset's counts from building its 8B-shaped target on a laptop.
        target = TargetFacts("(not read: synthetic rows)", (0, 1), 4096, 4096)
    elif preset.target == "tiny":
        target = tiny_target()
    else:
        target = qwen3_8b_shaped_target(work_dir.parent / "targets" / "qwen3-8b-shaped")
    command = "python bench/anchor_counts.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    widths = "/".join(str(w) for w in (*preset.anchor_buckets, preset.num_anchors))
    lines = [
        "# Anchor-block counts",
        "",
        f"- command: `{command}`",
        f"- preset `{preset.name}`: max_length {preset.max_length}, num_anchors "
        f"{preset.num_anchors}, preset anchor buckets {widths}, micro-batch "
        f"{preset.micro_batch_size} x accum {preset.grad_accum_steps} x {args.ranks} rank(s), "
        f"seed {args.seed}",
        f"- one epoch of the harness's sampler over {args.samples} samples per workload; "
        "exact counts, the same for DFlash2 and DSpark",
        "",
    ]
    payload: dict[str, object] = {"command": command, "workloads": {}}
    targets: list[str] = []
    for workload in workloads:
        lengths, counts = workload_samples(settings, workload, target, args.samples)
        rows = count_workload(
            settings, workload, target, lengths=lengths, counts=counts, suggest_k=suggest
        )
        lines += [f"## {workload} ({len(lengths)} samples)", "", count_table(rows), ""]
        targets += check_lines(workload, rows)
        payload["workloads"][workload] = to_json(rows)  # type: ignore[index]
    lines += [
        "## Target: >= 90% of the empty anchor blocks removed",
        "",
        "Against the same length stack at num_anchors in random order, judged on the removable "
        "empty blocks (down to the exact width of the row's own micro-batches: a width must hold "
        "the fullest row) and, as the target is worded, on all empty blocks.",
        "",
    ]
    lines += [f"- {line}" for line in targets]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "counts.md").write_text(text)
        (args.out / "counts.json").write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
