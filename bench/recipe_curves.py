"""Recipe ablations on the real target as learning curves: every variant trained by
`specdraft train` from the same weights on the same batches, at equal training time.

    python bench/recipe_curves.py --variants base,anchors64,layers2 --budget-min 30
    python bench/recipe_curves.py --variants base,lr1e-3 --plot-only      # redraw, no training

Starts from what `make real-check` builds (scripts/real_check.py --stop-after features: the
SmolLM2 target, its regenerated corpus and the recipe's offline features); a variant whose
taps or family need other features gets its own feature folder, prepared once. Each variant
is the recipe (examples/smollm2-135m-dflash.toml) plus `--set` overrides, run into
build/real/curves/<variant>/ with held-out evaluation every `--eval-every` steps, and
`specdraft curves` draws them all into one PNG and prints the table.

Equal time: a variant's cost per step differs (anchors, vocabulary, depth), so its step count
is its share of the budget: a short probe run measures its CPU seconds per step first, then
max_steps = budget / step time, with the recipe's cosine schedule over those steps. Runs go
`--jobs` at a time with `--threads` each (two one-thread runs on the two cores); their clocks
count training only (evaluation and checkpoints excluded), and the curves are drawn against the
CPU seconds each one-thread run spent in its steps (`specdraft curves --clock cpu`), which other
work on the machine does not stretch. A finished variant
is kept and reused; an interrupted one resumes from its last checkpoint.

Variants combine with '+': `lr1e-3+anchors128` is both. The recipe's blocks are 4 tokens since
2026-12-07; the card's earlier rows ran at block 8: `block8+anchors64` reruns one of them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECDRAFT = str(ROOT / ".venv" / "bin" / "specdraft")
CONFIG = "examples/smollm2-135m-dflash.toml"
WORK = ROOT / "build" / "real"
FEATURES = WORK / "run-dflash-features"

# One lever each; values are TOML literals for --set, None drops the key from the recipe (TOML
# has no null, so such a variant trains from a copy of the recipe without it: `config_for`).
VARIANTS: dict[str, dict[str, str | None]] = {
    # The recipe as it is (since 2026-12-07: blocks of 4 with gamma 2.0; since 2026-12-06:
    # 16,384-token draft vocabulary, lr 1e-3, 3% warmup, cosine, 32 anchors, 1 layer).
    "base": {},
    # The recipe before 2026-12-07: blocks of 8 at the published gamma 4 (the card's block-8
    # curves, which ran as `base`).
    "block8": {"model.block_size": "8", "training.loss_decay_gamma": None},
    # The 2026-12-02 recipe exactly as it ran (full vocabulary, lr 3e-3, 4 epochs = 860 steps,
    # cosine over them): the reference curve for "reaches the old recipe's final tau in half
    # the time".
    "recipe1202": {
        "training.max_steps": "860",
        "training.learning_rate": "3e-3",
        "model.draft_vocab_size": None,
        "model.block_size": "8",
        "training.loss_decay_gamma": None,
    },
    # vocab16k and lr1e-3 are the recipe's own values since 2026-12-06 (kept so that the card's
    # commands still name them: each is `base` now).
    "lr1e-3": {"training.learning_rate": "1e-3"},
    "lr6e-4": {"training.learning_rate": "6e-4"},
    "lr6e-3": {"training.learning_rate": "6e-3"},
    "warmup10": {"training.warmup_ratio": "0.1"},
    "constant": {"training.lr_scheduler": '"constant"'},
    "anchors16": {"training.num_anchors": "16"},
    "anchors64": {"training.num_anchors": "64"},
    "anchors128": {"training.num_anchors": "128"},
    "anchors256": {"training.num_anchors": "256"},
    "batch8": {"training.micro_batch_size": "8"},
    "layers2": {"model.num_draft_layers": "2"},
    "layers3": {"model.num_draft_layers": "3"},
    "vocab8k": {"model.draft_vocab_size": "8192"},
    "vocab16k": {"model.draft_vocab_size": "16384"},
    "vocab4k": {"model.draft_vocab_size": "4096"},
    "gamma7": {"training.loss_decay_gamma": "7.0"},
    # The recipe's own values since 2026-12-07 (kept so that the card's commands still name it:
    # `base` now). No published gamma for block 4 (lint SD304): half of block 8's 4.
    "block4": {"model.block_size": "4", "training.loss_decay_gamma": "2.0"},
    "dflash2": {"model.algorithm": '"dflash2"'},
    "dspark": {
        "model.algorithm": '"dspark"',
        "model.dspark.confidence_uses_markov": "true",
    },
}
# Set with `--taps NAME=[ids]` on the command line (e.g. the ids explain-layers suggests).
FEATURE_KEYS = ("model.target_layer_ids", "model.algorithm")


def overrides_of(name: str, taps: dict[str, str]) -> dict[str, str | None]:
    """The --set overrides of a variant name (parts joined by '+'); None drops a key."""
    merged: dict[str, str | None] = {}
    for part in name.split("+"):
        if part in taps:
            merged["model.target_layer_ids"] = taps[part]
        elif part in VARIANTS:
            merged.update(VARIANTS[part])
        else:
            known = ", ".join([*VARIANTS, *taps])
            sys.exit(f"recipe_curves: unknown variant part {part!r} (known: {known})")
    return merged


def sets(overrides: dict[str, str | None]) -> list[str]:
    """`--set key=value` arguments (a dropped key, None, is `config_for`'s, not a --set)."""
    return [
        item
        for key, value in overrides.items()
        if value is not None
        for item in ("--set", f"{key}={value}")
    ]


def config_for(name: str, overrides: dict[str, str | None]) -> str:
    """The config a variant trains from: the recipe, or a copy without the keys it drops."""
    dropped = [key for key, value in overrides.items() if value is None]
    if not dropped:
        return CONFIG
    import tomli

    from specdraft.config.toml_writer import dump_toml

    data = tomli.loads((ROOT / CONFIG).read_text())
    for key in dropped:
        *tables, last = key.split(".")
        node = data
        for table in tables:
            node = node.get(table, {})
        node.pop(last, None)
    path = WORK / "curves" / f"{name.replace('+', '_')}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"{CONFIG} without {', '.join(dropped)} (bench/recipe_curves.py, variant {name})"
    path.write_text(dump_toml(data, header=header))
    return str(path)


def data_sets(features: Path) -> list[str]:
    """The recipe's data, read from offline features."""
    return sets(
        {
            "model.target": json.dumps(str(WORK / "smollm2")),
            "data.format": '"features"',
            "data.train_paths": json.dumps([str(features)]),
            "data.eval_paths": json.dumps([str(WORK / "data" / "eval.jsonl")]),
        }
    )


def features_for(overrides: dict[str, str], env: dict[str, str]) -> Path:
    """The feature folder a variant trains from (the recipe's unless its taps or family differ)."""
    own = {k: v for k, v in overrides.items() if k in FEATURE_KEYS}
    needs_last = '"dspark"' in own.values()
    if "model.target_layer_ids" not in own and not needs_last:
        return FEATURES
    taps = own.get("model.target_layer_ids", "recipe").replace(" ", "")
    name = "features-" + ("".join(c for c in taps if c.isalnum() or c == ",") or "recipe")
    name += "-last" if needs_last else ""
    folder = WORK / "curves" / name
    prepare = [SPECDRAFT, "prepare-features", CONFIG, *sets(own)]
    prepare += sets(
        {
            "model.target": json.dumps(str(WORK / "smollm2")),
            "data.train_paths": json.dumps([str(WORK / "data" / "train.jsonl")]),
        }
    )
    print("+", " ".join(prepare[:4]), "...", flush=True)
    subprocess.run([*prepare, "--out", str(folder)], cwd=ROOT, env=env, check=True)
    return folder


def seconds_per_step(name: str, overrides: dict[str, str | None], features: Path, env) -> float:
    """A variant's training CPU seconds per step, from a short probe run (steps 5-12)."""
    with tempfile.TemporaryDirectory(prefix=f"probe-{name}-", dir=WORK) as tmp:
        probe = {
            **overrides,
            "output_dir": json.dumps(tmp),
            "training.max_steps": "12",
            "training.eval_interval": "0",
            "training.log_interval": "1",
            "training.save_interval": "1000",
            "tracking.progress_bar": "false",
        }
        config = config_for(name, overrides)
        command = [SPECDRAFT, "train", config, *data_sets(features), *sets(probe), "--overwrite"]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"recipe_curves: the probe run of {name} failed:\n{done.stderr[-2000:]}")
        lines = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        # CPU seconds (one thread), which other jobs on the machine do not stretch.
        cpu = {line["step"]: line["time/train_cpu_s"] for line in lines if "loss" in line}
    return (cpu[12] - cpu[4]) / 8


def run_command(
    name: str, overrides: dict[str, str | None], features: Path, steps: int, args
) -> list:
    """The `specdraft train` command of a variant (resuming when it has a checkpoint)."""
    out = WORK / "curves" / name
    settings = {
        **overrides,
        # run_id allows letters, digits and ._- only: a combined variant's '+' becomes '_'.
        "run_id": json.dumps(f"curves-{name.replace('+', '_')}"),
        "output_dir": json.dumps(str(out)),
        "training.max_steps": str(steps),
        # The recipe's 4 epochs end a run at 860 steps whatever max_steps says: a cheaper
        # variant's share of the budget needs more passes over the data (seen 2026-12-05:
        # vocab16k stopped at 860 of its 1,721 steps).
        "training.num_epochs": "100",
        "training.eval_interval": str(args.eval_every),
        "data.max_eval_samples": str(args.eval_samples),
        "training.save_interval": str(max(args.eval_every, 250)),
        "training.keep_last_checkpoints": "1",
        "tracking.progress_bar": "false",
    }
    command = [SPECDRAFT, "train", config_for(name, overrides), *data_sets(features)]
    command += sets(settings)
    if any((out / "checkpoints").glob("step-*")):
        command += ["--resume", "latest"]
    elif out.exists():
        shutil.rmtree(out)
    return command


def recipe_digest() -> str:
    """The recipe file's digest, kept in a variant's plan.json: a variant is the recipe plus its
    overrides, so a finished run of an older recipe is a different variant under the same name."""
    return hashlib.sha256((ROOT / CONFIG).read_bytes()).hexdigest()[:16]


def stale_note(out: Path, overrides: dict[str, str | None]) -> str:
    """A warning when a kept variant was trained from another recipe or other overrides ('' if
    not): it is kept (its curve is data), and a rerun needs its folder moved away."""
    plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").is_file() else {}
    if plan.get("overrides", overrides) != overrides:
        why = f"its overrides were {plan['overrides']}"
    elif plan.get("recipe") not in (None, recipe_digest()):
        why = f"{CONFIG} has changed since"
    elif "recipe" not in plan:
        why = f"its plan.json does not record which {CONFIG} it trained from"
    else:
        return ""
    return f"\n  warning: {why}; move {out} away to train this variant again"


def main() -> None:
    """Train the variants (equal time, `--jobs` at once), then draw and tabulate the curves."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="base")
    parser.add_argument("--budget-min", type=float, default=40.0, help="training CPU minutes each")
    parser.add_argument("--steps", type=int, help="fixed steps for every variant (no probe)")
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--eval-samples", type=int, default=24)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--taps", action="append", default=[], metavar="NAME=[ids]")
    parser.add_argument("--out", default=str(WORK / "curves" / "curves.png"))
    parser.add_argument("--reach", type=float, default=1.21)
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    if not FEATURES.is_dir():
        sys.exit(
            "recipe_curves: no recipe features at build/real/run-dflash-features; run "
            "`python scripts/real_check.py --stop-after features` first"
        )
    taps = dict(item.split("=", 1) for item in args.taps)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    names = [n for n in args.variants.split(",") if n]
    if not args.plot_only:
        pending = []
        for name in names:
            out = WORK / "curves" / name
            overrides = overrides_of(name, taps)
            if (out / "DONE").is_file():
                print(f"{name}: done, kept ({out}){stale_note(out, overrides)}")
                continue
            features = features_for(overrides, env)
            plan = out / "plan.json"
            if plan.is_file():
                steps = json.loads(plan.read_text())["steps"]
            elif "training.max_steps" in overrides:
                steps = int(overrides["training.max_steps"])
            elif args.steps:
                steps = args.steps
            else:
                per_step = seconds_per_step(name, overrides, features, env)
                steps = max(args.eval_every, round(args.budget_min * 60 / per_step))
                print(f"{name}: {per_step:.2f} s/step -> {steps} steps in {args.budget_min} min")
            # The command first: a folder without a checkpoint is cleared for a fresh start.
            command = run_command(name, overrides, features, steps, args)
            out.mkdir(parents=True, exist_ok=True)
            plan.write_text(
                json.dumps({"steps": steps, "overrides": overrides, "recipe": recipe_digest()})
            )
            pending.append((name, command))
        running: list[tuple[str, subprocess.Popen, float]] = []
        while pending or running:
            while pending and len(running) < args.jobs:
                name, command = pending.pop(0)
                log = open(WORK / "curves" / name / "train.log", "a")  # noqa: SIM115
                print(f"start {name}: {' '.join(command[-8:])}", flush=True)
                running.append(
                    (name, subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log),
                     time.monotonic())
                )  # fmt: skip
            time.sleep(10)
            for item in list(running):
                name, process, started = item
                if process.poll() is None:
                    continue
                running.remove(item)
                minutes = (time.monotonic() - started) / 60
                if process.returncode == 0:
                    (WORK / "curves" / name / "DONE").write_text("trained\n")
                    print(f"done {name} in {minutes:.1f} min", flush=True)
                else:
                    print(f"FAILED {name} (exit {process.returncode}): see its train.log")
    folders = [str(WORK / "curves" / n) for n in names if (WORK / "curves" / n).is_dir()]
    command = [SPECDRAFT, "curves", *folders, "--out", args.out, "--reach", str(args.reach)]
    command += ["--clock", "cpu"]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=False)


if __name__ == "__main__":
    main()
