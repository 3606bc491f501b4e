"""Label sources for the SmolLM2 DFlash recipe (issue 35): which labels make a draft accept more
per CPU-hour, as learning curves from the same weights and seed at equal steps.

    python bench/label_sources.py --dry-run                  # every command, nothing run
    python bench/label_sources.py --prepare-only             # data and feature folders only
    python bench/label_sources.py --variants regen-tokens,orig1000-argmax --steps 860

Data sets (`<data>` in a variant's name):
  regen     build/real/data/train.jsonl, the target's own greedy answers to pkg:sharegpt records
            0-999 (`scripts/real_check.py --stop-after corpus`: ~22 min per 1,000 records
            through vLLM on the 2-core machine)
  orig1000  the ORIGINAL conversations of pkg:sharegpt records 0-999, as the package has them
            (written here in seconds; the data pipeline cuts them at data.max_length = 512 and
            skips rows without an answer inside it, as regenerate skipped their records)
  orig2000  the same for records 0-1999
Labels (`<labels>`): `tokens` (the written tokens: the recipe) or `argmax` (data.labels =
"target_argmax": the target's greedy prediction at each position, given the written prefix).
A `-soft` suffix adds soft labels (training.soft_label_topk = 16, soft_label_weight = 0.5).

The issue's four: regen-tokens (a, the recipe), orig1000-argmax (b), orig2000-argmax (c) and
regen-tokens-soft (d); controls: orig1000-tokens (the same text on its own tokens: what the
argmax labels change) and regen-argmax (nearly regen-tokens: the labels differ only where the
answer's second tokenisation split a word otherwise).

Each data set gets one feature folder, build/real/labels/features-<data>[-top16], prepared once
by `specdraft prepare-features` with the recipe's taps and the target's argmax per position
(one head matmul more per token), the top 16 too when a selected variant asks for soft labels;
its wall and CPU time are recorded in build/real/labels/prepare.json, with the share of
supervised positions whose written token is the target's argmax (how far the text is from the
target's own). Every variant is the recipe (examples/smollm2-135m-dflash.toml) plus its
overrides, for exactly `--steps` optimizer steps (cosine over them; num_epochs raised so that
the steps bind) with held-out tau every `--eval-every` steps, into build/real/labels/<variant>/;
`specdraft curves --clock cpu` draws and tabulates them against training CPU time
(time/train_cpu_s: a busy machine stretches wall time, not CPU time), and the table below it
adds the data cost (regeneration, estimated from the recipe card; features, measured) to the
training CPU time. Runs go `--jobs` at a time with `--threads` threads each; a finished variant
is kept, an interrupted one resumes from its last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECDRAFT = str(ROOT / ".venv" / "bin" / "specdraft")
CONFIG = "examples/smollm2-135m-dflash.toml"
WORK = ROOT / "build" / "real"
OUT = WORK / "labels"
TARGET = WORK / "smollm2"
EVAL = WORK / "data" / "eval.jsonl"
REGENERATED = WORK / "data" / "train.jsonl"
RECIPE_FEATURES = WORK / "run-dflash-features"
# The recipe card's regeneration cost, for the table: 22.5 wall minutes per 1,000 records
# through vLLM's CPU server on both cores, about 45 CPU minutes.
REGEN_MIN_PER_1000 = 45.0
SOFT = {"training.soft_label_topk": "16", "training.soft_label_weight": "0.5"}
TOPK = 16
DATA_SETS = ("regen", "orig1000", "orig2000")


def parse_variant(name: str) -> tuple[str, str, bool]:
    """(data set, labels, soft) of a variant name such as `orig1000-argmax-soft`."""
    parts = name.split("-")
    soft = parts[-1] == "soft"
    parts = parts[:-1] if soft else parts
    if len(parts) != 2 or parts[0] not in DATA_SETS or parts[1] not in ("tokens", "argmax"):
        sys.exit(
            f"label_sources: {name!r} is not <data>-<labels>[-soft] with data in "
            f"{', '.join(DATA_SETS)} and labels tokens or argmax"
        )
    return parts[0], parts[1], soft


def sets(overrides: dict[str, str]) -> list[str]:
    """`--set key=value` arguments."""
    return [item for key, value in overrides.items() for item in ("--set", f"{key}={value}")]


def run(command: list[str], args, env, **kwargs) -> None:
    """Print a command; run it unless --dry-run."""
    print("+", " ".join(command), flush=True)
    if not args.dry_run:
        subprocess.run(command, cwd=ROOT, env=env, check=True, **kwargs)


def conversations(data: str, args) -> Path:
    """The JSONL of a data set (the original ones are written here from the package)."""
    if data == "regen":
        if not REGENERATED.is_file() and not args.dry_run:
            sys.exit(
                "label_sources: no regenerated corpus at build/real/data/train.jsonl; run "
                "`python scripts/real_check.py --stop-after corpus` first"
            )
        return REGENERATED
    count = int(data.removeprefix("orig"))
    path = OUT / f"{data}.jsonl"
    if path.is_file():
        return path
    print(f"+ write pkg:sharegpt records 0-{count - 1} as they are -> {path}", flush=True)
    if args.dry_run:
        return path
    from specdraft.trainer.regenerate.replay import select_records

    # Normalised like regenerate's input (leading answers to nothing dropped), answers kept.
    rows = [
        {"id": r.record_id, "source_row": r.row, "messages": r.messages}
        for r in select_records(["pkg:sharegpt"], first=0, count=count)
        if r.messages is not None
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(path)
    return path


def agreement(folder: Path) -> float:
    """Share of supervised positions whose written token is the target's argmax there."""
    from safetensors import safe_open

    index = json.loads((folder / "index.json").read_text())
    same = total = 0
    for shard in index["shards"]:
        with safe_open(str(folder / shard["file"]), framework="pt") as handle:
            for k in range(shard["num_samples"]):
                ids = handle.get_tensor(f"{k}.input_ids")
                mask = handle.get_tensor(f"{k}.loss_mask").bool()
                argmax = handle.get_tensor(f"{k}.target_argmax").long()
                # The label of position q is the argmax at q - 1 (models/target_labels.py).
                supervised = mask[1:]
                same += int(((argmax[:-1] == ids[1:]) & supervised).sum())
                total += int(supervised.sum())
    return same / max(1, total)


def features(data: str, topk: int, argmax: bool, args, env) -> Path:
    """The feature folder of a data set, prepared once (argmax, top-K when asked)."""
    if data == "regen" and not (argmax or topk) and (RECIPE_FEATURES / "index.json").is_file():
        return RECIPE_FEATURES  # the recipe's own: tokens need nothing more
    folder = OUT / (f"features-{data}" + (f"-top{topk}" if topk else ""))
    record = OUT / "prepare.json"
    done = json.loads(record.read_text()) if record.is_file() else {}
    if folder.name in done and (folder / "index.json").is_file():
        return folder
    overrides = {
        "model.target": json.dumps(str(TARGET)),
        "data.train_paths": json.dumps([str(conversations(data, args))]),
        "data.labels": '"target_argmax"' if argmax else '"tokens"',
        "training.soft_label_topk": str(topk),
    }
    started = time.monotonic()
    cpu_started = os.times()
    command = [SPECDRAFT, "prepare-features", CONFIG, *sets(overrides), "--out", str(folder)]
    run(command, args, env)
    if not args.dry_run:
        ended = os.times()
        cpu = (ended.children_user + ended.children_system) - (
            cpu_started.children_user + cpu_started.children_system
        )
        done[folder.name] = {
            "minutes": round((time.monotonic() - started) / 60, 1),
            "cpu_minutes": round(cpu / 60, 1),
            "threads": args.threads,
            "argmax_agrees": round(agreement(folder), 4) if argmax or topk else None,
        }
        record.write_text(json.dumps(done, indent=1) + "\n")
        print(f"{folder.name}: {done[folder.name]}", flush=True)
    return folder


def train_command(name: str, folder: Path, labels: str, soft: bool, args) -> list[str]:
    """The `specdraft train` command of a variant (resuming when it has a checkpoint)."""
    out = OUT / name
    overrides = {
        "run_id": json.dumps(f"labels-{name}"),
        "output_dir": json.dumps(str(out)),
        "model.target": json.dumps(str(TARGET)),
        "data.format": '"features"',
        "data.train_paths": json.dumps([str(folder)]),
        "data.eval_paths": json.dumps([str(EVAL)]),
        "data.max_eval_samples": str(args.eval_samples),
        "data.labels": '"target_argmax"' if labels == "argmax" else '"tokens"',
        **(SOFT if soft else {}),
        "training.num_epochs": "1000",  # max_steps binds: every variant takes --steps steps
        "training.max_steps": str(args.steps),
        "training.eval_interval": str(args.eval_every),
        "training.save_interval": str(max(args.eval_every, 250)),
        "training.keep_last_checkpoints": "1",
        "tracking.progress_bar": "false",
    }
    command = [SPECDRAFT, "train", CONFIG, *sets(overrides)]
    if any((out / "checkpoints").glob("step-*")):
        command += ["--resume", "latest"]
    elif out.exists() and not args.dry_run:
        shutil.rmtree(out)
    return command


def cost_table(names: list[str]) -> None:
    """Minutes of data (regeneration, features) and training per variant, next to each other."""
    record = OUT / "prepare.json"
    prepared = json.loads(record.read_text()) if record.is_file() else {}
    print("\nvariant              regenerate  features  train  (CPU min; argmax = written token)")
    for name in names:
        data, _, soft = parse_variant(name)
        folder = f"features-{data}" + (f"-top{TOPK}" if soft else "")
        info = prepared.get(folder, {})
        regen = REGEN_MIN_PER_1000 if data == "regen" else 0.0
        summary = OUT / name / "metrics.jsonl"
        train = "-"
        if summary.is_file():
            lines = [json.loads(x) for x in summary.read_text().splitlines() if x.strip()]
            seconds = [x["time/train_cpu_s"] for x in lines if "time/train_cpu_s" in x]
            train = f"{seconds[-1] / 60:.1f}" if seconds else "-"
        print(
            f"{name:20s} {regen:10.1f}  {info.get('cpu_minutes', '-'):>8}  {train:>5}    "
            f"{info.get('argmax_agrees', '-')}"
        )


def main() -> None:
    """Prepare the data and features, train the variants, then draw and tabulate the curves."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--variants", default="regen-tokens,orig1000-argmax,orig2000-argmax,regen-tokens-soft"
    )
    parser.add_argument("--steps", type=int, default=860, help="optimizer steps of every variant")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-samples", type=int, default=24)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prepare-only", action="store_true", help="data and features only")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--out", default=str(OUT / "curves.png"))
    parser.add_argument("--reach", type=float, default=1.21)
    args = parser.parse_args()
    if not TARGET.is_dir() or not EVAL.is_file():
        message = (
            "label_sources: needs the SmolLM2 target and the held-out set (build/real/smollm2, "
            "build/real/data/eval.jsonl): run `python scripts/real_check.py --stop-after corpus`"
        )
        if not args.dry_run:
            sys.exit(message)
        print(f"# {message}")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    names = [n for n in args.variants.split(",") if n]
    variants = {name: parse_variant(name) for name in names}
    # One folder per data set, with top-K when any of its variants trains on soft labels; the
    # original conversations always with the argmax (its agreement with the text is reported).
    soft_data = {data for data, _, soft in variants.values() if soft}
    argmax_data = {d for d, labels, _ in variants.values() if labels == "argmax" or d != "regen"}
    folders = {
        data: features(data, TOPK if data in soft_data else 0, data in argmax_data, args, env)
        for data in dict.fromkeys(data for data, _, _ in variants.values())
    }
    if args.prepare_only:
        return
    pending = []
    for name, (data, labels, soft) in variants.items():
        if (OUT / name / "DONE").is_file():
            print(f"{name}: done, kept")
            continue
        pending.append((name, train_command(name, folders[data], labels, soft, args)))
    running: list[tuple[str, subprocess.Popen]] = []
    while pending or running:
        while pending and len(running) < args.jobs:
            name, command = pending.pop(0)
            print("+", " ".join(command), flush=True)
            if args.dry_run:
                continue
            (OUT / name).mkdir(parents=True, exist_ok=True)
            log = open(OUT / name / "train.log", "a")  # noqa: SIM115 - closed with the process
            running.append(
                (name, subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log))
            )
        if not running:
            break
        time.sleep(10)
        for item in list(running):
            name, process = item
            if process.poll() is None:
                continue
            running.remove(item)
            if process.returncode == 0:
                (OUT / name / "DONE").write_text("trained\n")
                print(f"done {name}", flush=True)
            else:
                print(f"FAILED {name} (exit {process.returncode}): see its train.log", flush=True)
    folders_done = [str(OUT / n) for n in names if (OUT / n).is_dir()]
    command = [SPECDRAFT, "curves", *folders_done, "--out", args.out, "--reach", str(args.reach)]
    command += ["--clock", "cpu"]
    print("+", " ".join(command), flush=True)
    if not args.dry_run:
        subprocess.run(command, cwd=ROOT, check=False)
        cost_table(names)


if __name__ == "__main__":
    main()
