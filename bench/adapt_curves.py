"""Adapting a trained draft to new traffic (`model.init_from`) against training one from scratch,
as learning curves of held-out tau on the new traffic at equal CPU time (issue 36, item 4).

    python bench/adapt_curves.py                       # general draft, then both runs
    python bench/adapt_curves.py --source build/real/curves/vocab16k --steps 800
    python bench/adapt_curves.py --plot-only           # redraw, no training

The new traffic is a slice the recipe never saw: ShareGPT conversations with a fenced code
block (```), from record 11000 on (the recipe trains on 0..999 and holds out 10000..10023).
The draft learns the target's own greedy choices on them without regenerating them
(`data.labels = "target_argmax"`: one forward pass of the target, in `prepare-features`), and
is judged on held-out code conversations by the target's own greedy answers (tau as
`training.eval_interval` records it).

Two runs of the recipe (examples/smollm2-135m-dflash.toml plus the source run's overrides,
e.g. its draft vocabulary and learning rate), same batches, same steps:
  from-draft   model.init_from = the source run's last checkpoint, exported `--format vllm`
               (its weights, and its draft vocabulary when it has one)
  scratch      the same config from fresh weights (a draft vocabulary is chosen from the code
               slice's own labels)
Both cost the same per step (same shapes), so equal steps are equal CPU time; `specdraft
curves --clock cpu` draws them against the CPU seconds each one-thread run spent training.
`--reach` defaults to the scratch run's best tau: the table then says how soon each run gets
there (the issue's goal: the adapted draft in at most a quarter of scratch's CPU time).

The source draft is a trained run (`--source`: a bench/recipe_curves.py variant, whose
overrides are reused) or, by default, one trained here on general traffic: the first
`--general` ShareGPT conversations without a code block, target_argmax labels, the recipe with
the levers bench/recipe_curves.py measured (a 16,384-token draft vocabulary, lr 1e-3), for
`--source-steps` steps. Needs only the SmolLM2 target (`specdraft assets smollm2 --out
build/real/smollm2`); every step is kept and reused by a rerun.
"""

from __future__ import annotations

import argparse
import json
import math
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
ADAPT = WORK / "adapt"
FIRST_RECORD = 11000
FENCE = "```"
# The levers bench/recipe_curves.py measured (docs/recipes/smollm2-135m-dflash.md).
LEVERS = {"model.draft_vocab_size": "16384", "training.learning_rate": "1e-3"}


def sets(overrides: dict[str, str]) -> list[str]:
    """`--set key=value` arguments."""
    return [item for key, value in overrides.items() for item in ("--set", f"{key}={value}")]


def write_slice(kind: str, first: int, train: int, held_out: int) -> tuple[Path, Path]:
    """Conversations with (kind "code") or without ("general") a fenced code block in an answer,
    from record `first` on (train first, then held out), as ShareGPT JSONL, written once."""
    from specdraft.trainer.assets.corpus import sharegpt_conversations

    train_path, eval_path = ADAPT / f"{kind}-train.jsonl", ADAPT / f"{kind}-eval.jsonl"
    if train_path.is_file() and eval_path.is_file():
        return train_path, eval_path
    ADAPT.mkdir(parents=True, exist_ok=True)
    picked: list[dict] = []
    # The package holds ~17,500 usable records; read once from `first`, in file order.
    for row, messages in enumerate(sharegpt_conversations(first, 10**6), first):
        has_code = any(FENCE in m["content"] for m in messages if m["role"] == "assistant")
        if has_code != (kind == "code"):
            continue
        # From the first user turn on (some records open with an assistant greeting).
        turns = [m for m in messages if m["role"] in ("user", "assistant")]
        first_user = next((i for i, m in enumerate(turns) if m["role"] == "user"), len(turns))
        conversations = [
            {"from": "human" if m["role"] == "user" else "gpt", "value": m["content"]}
            for m in turns[first_user:]
        ]
        if len(conversations) >= 2:
            picked.append({"id": f"{kind}-{row}", "conversations": conversations})
        if len(picked) == train + held_out:
            break
    if len(picked) < train + held_out:
        sys.exit(f"adapt_curves: only {len(picked)} {kind} conversations found")
    for path, part in ((train_path, picked[:train]), (eval_path, picked[train:])):
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
    print(f"{kind} slice: {train} training, {held_out} held-out conversations -> {ADAPT}")
    return train_path, eval_path


def source_overrides(source: Path) -> dict[str, str]:
    """The --set overrides the source run was trained with (bench/recipe_curves.py's plan)."""
    plan = source / "plan.json"
    if not plan.is_file():
        return {}
    overrides = json.loads(plan.read_text())["overrides"]
    return {k: v for k, v in overrides.items() if k != "training.max_steps"}


def export_source(source: Path, env: dict[str, str]) -> Path:
    """The source run's last checkpoint as a vLLM-format draft folder (what init_from reads)."""
    out = ADAPT / f"source-{source.name}"
    if (out / "config.json").is_file():
        return out
    steps = sorted((source / "checkpoints").glob("step-*"), key=lambda p: int(p.name[5:]))
    if not steps:
        sys.exit(f"adapt_curves: {source} has no checkpoint")
    command = [SPECDRAFT, "export", str(steps[-1]), "--format", "vllm", "--out", str(out)]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    return out


def prepare_command(train_path: Path, shared: dict[str, str], out: Path) -> list[str]:
    """`specdraft prepare-features` with the target's argmax labels (resumes when rerun)."""
    settings = {**shared, "data.train_paths": json.dumps([str(train_path)])}
    return [SPECDRAFT, "prepare-features", CONFIG, "--out", str(out), "--no-progress",
            *sets(settings)]  # fmt: skip


def train_command(name: str, out: Path, settings: dict[str, str]) -> list[str]:
    """`specdraft train` of one run into `out` (resuming when it has a checkpoint)."""
    settings = {
        **settings,
        "run_id": json.dumps(f"adapt-{name}"),
        "output_dir": json.dumps(str(out)),
        "data.format": '"features"',
        "training.num_epochs": "100",
        "training.keep_last_checkpoints": "1",
        "tracking.progress_bar": "false",
    }
    command = [SPECDRAFT, "train", CONFIG, *sets(settings)]
    if any((out / "checkpoints").glob("step-*")):
        return [*command, "--resume", "latest"]
    if out.exists():
        shutil.rmtree(out)
    return command


def run_all(jobs: dict[str, tuple[list[str], Path]], env: dict[str, str]) -> None:
    """Run the commands at once (one thread each), each logged to <out>.log; DONE marks each."""
    procs = []
    for name, (command, out) in jobs.items():
        if (out / "DONE").is_file():
            print(f"{name}: done, kept ({out})", flush=True)
            continue
        out.mkdir(parents=True, exist_ok=True)
        log = open(out.with_suffix(".log"), "a")  # noqa: SIM115
        print(f"start {name}", flush=True)
        procs.append((name, out, time.monotonic(), subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=log)))  # fmt: skip
    for name, out, started, process in procs:
        if process.wait() != 0:
            sys.exit(f"adapt_curves: {name} failed (exit {process.returncode}): {out}.log")
        (out / "DONE").write_text("done\n")
        print(f"done {name} in {(time.monotonic() - started) / 60:.1f} min", flush=True)


def best_tau(run: Path) -> float:
    """The best held-out tau a run recorded."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return max(t for t in (json.loads(x).get("eval/tau") for x in lines) if t is not None)


def main() -> None:
    """Slices, labels, the source draft, both runs side by side, then the curves."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", help="a trained run to adapt from [default: train one]")
    parser.add_argument("--general", type=int, default=500, help="general conversations")
    parser.add_argument("--source-steps", type=int, default=900)
    parser.add_argument("--train", type=int, default=400, help="code conversations to train on")
    parser.add_argument("--held-out", type=int, default=24)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--reach", type=float, help="tau to reach [default: scratch's best]")
    parser.add_argument("--out", default=str(ADAPT / "adapt.png"))
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code_train, code_eval = write_slice("code", FIRST_RECORD, args.train, args.held_out)
    levers = LEVERS if args.source is None else source_overrides(Path(args.source))
    shared = {
        **levers,
        "model.target": json.dumps(str(WORK / "smollm2")),
        "data.labels": '"target_argmax"',
        "data.eval_paths": json.dumps([str(code_eval)]),
        "data.max_eval_samples": str(args.held_out),
    }
    runs = {"from-draft": ADAPT / "from-draft", "scratch": ADAPT / "scratch"}
    if not args.plot_only:
        code_features = ADAPT / "features-code"
        features = {"code features": (prepare_command(code_train, shared, code_features),
                                      code_features)}  # fmt: skip
        if args.source is None:
            general_train, _ = write_slice("general", 0, args.general, 0)
            general_features = ADAPT / "features-general"
            features["general features"] = (
                prepare_command(general_train, shared, general_features),
                general_features,
            )
        run_all(features, env)
        source = Path(args.source).resolve() if args.source else ADAPT / "general"
        if args.source is None:
            # Trained on general traffic, judged once at its end on the code slice: the tau
            # the adapted run starts from.
            settings = {
                **shared,
                "data.train_paths": json.dumps([str(general_features)]),
                "training.max_steps": str(args.source_steps),
                "training.eval_interval": str(args.source_steps),
                "training.save_interval": str(args.source_steps),
            }
            run_all({"general source": (train_command("general", source, settings), source)},
                    {**os.environ, "OMP_NUM_THREADS": "2"})  # fmt: skip
        init = export_source(source, env)
        each = {
            **shared,
            "data.train_paths": json.dumps([str(code_features)]),
            "training.max_steps": str(args.steps),
            "training.eval_interval": str(args.eval_every),
            "training.save_interval": str(max(args.eval_every, 250)),
        }
        adapted = {**each, "model.init_from": json.dumps(str(init))}
        run_all(
            {
                "from-draft": (train_command("from-draft", runs["from-draft"], adapted),
                               runs["from-draft"]),
                "scratch": (train_command("scratch", runs["scratch"], each), runs["scratch"]),
            },
            env,
        )  # fmt: skip
    reach = args.reach if args.reach is not None else best_tau(runs["scratch"])
    command = [SPECDRAFT, "curves", *map(str, runs.values()), "--out", args.out]
    # Rounded down: the table's "reached" is >=, and scratch's own best must count as reached.
    command += ["--reach", f"{math.floor(reach * 1e4) / 1e4:.4f}", "--clock", "cpu"]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=False)


if __name__ == "__main__":
    main()
