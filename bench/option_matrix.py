"""Run the examples' option combinations at tiny scale on 2 CPU ranks and print a results table.

    python bench/option_matrix.py                                  # dflash2-2048 example, all 12
    python bench/option_matrix.py --example examples/qwen3-8b-dspark-8192.toml --compile off
    python bench/option_matrix.py --backends fsdp2 --padding buckets --out /tmp/matrix

Every combination of backend (fsdp1, fsdp2) x padding (pad to longest, static max_length, shape
buckets) x compile_blocks (off, on) is one `specdraft train` run, started through the CLI exactly
as a user starts it, on the example config shrunk by `--set` overrides: the tiny target, 2 draft
layers, max_length 256 with a 128 bucket, a few steps on generated conversations whose lengths
straddle the bucket. All runs share data and seed, so the final losses should agree to float
noise (padding is inert and the backends are equivalent); compiled runs also report the graphs
they built and any recompile after the warm-up. This checks that every combination runs; it is
not a speed benchmark (see bench/static_shapes.py for that).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EXAMPLE = ROOT / "examples" / "qwen3-8b-dflash2-2048.toml"

PADDING = {
    "longest": ["training.static_shapes=false", "training.static_shape_buckets=[]"],
    "static": ["training.static_shapes=true", "training.static_shape_buckets=[]"],
    "buckets": ["training.static_shapes=true", "training.static_shape_buckets=[128]"],
}


def write_conversations(path: Path, count: int, seed: int = 0) -> Path:
    """ShareGPT rows with short and long replies, so batches pad to both 128 and 256."""
    rng = random.Random(seed)
    text = "the target verifies a block of draft tokens and keeps the prefix it agrees with"
    words = text.split(" ")
    rows = []
    for index in range(count):
        question = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
        length = rng.randint(10, 40) if index % 2 == 0 else rng.randint(110, 180)
        answer = " ".join(rng.choice(words) for _ in range(length))
        turns = [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
        rows.append({"id": f"m{index}", "conversations": turns})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def tiny_overrides(example: Path, data: Path, steps: int) -> list[str]:
    """Shrink an example to the tiny target and a few steps (its options are kept)."""
    from specdraft.config import load_config
    from specdraft.trainer.assets import build_tiny_target, tiny_assets_info

    algorithm = load_config(example).model.algorithm
    overrides = [
        f"model.target={build_tiny_target()}",
        "model.target_layer_ids=[0, 2]",
        f"model.mask_token_id={tiny_assets_info().mask_token_id}",
        "model.block_size=8",
        "model.num_draft_layers=2",
        "model.dtype=float32",
        f'data.train_paths=["{data}"]',
        f"data.cache_dir={data.parent / 'cache'}",
        "data.max_length=256",
        "training.num_anchors=16",
        "training.grad_accum_steps=2",
        f"training.max_steps={steps}",
        "training.save_interval=1000",
        "training.log_interval=1",
        "training.warmup_ratio=0.0",
        "training.lr_scheduler=constant",
        "training.learning_rate=0.003",
        "deployment.nproc_per_node=2",
        "tracking.tensorboard=false",
        "tracking.progress_bar=false",
    ]
    # Each family's options shrunk to the tiny target (plain DFlash has none).
    family_options = {
        "dflash2": ["model.dflash2.selector_rank=32", "model.dflash2.selector_top_k=8"],
        "dspark": ["model.dspark.markov_rank=32"],
    }
    return overrides + family_options.get(algorithm, [])


def run_one(
    example: Path, base: list[str], out: Path, backend: str, padding: str, compiled: bool
) -> dict[str, Any]:
    """One `specdraft train` run; its summary plus what the table shows."""
    name = f"{backend}-{padding}-{'compile' if compiled else 'eager'}"
    run_dir = out / name
    sets = [
        *base,
        f"output_dir={run_dir}",
        f"training.backend={backend}",
        *PADDING[padding],
        f"training.compile_blocks={str(compiled).lower()}",
    ]
    argv = [sys.executable, "-m", "specdraft.cli", "train", str(example), "--no-progress"]
    for item in sets:
        argv += ["--set", item]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ))
    row: dict[str, Any] = {
        "run": name,
        "backend": backend,
        "padding": padding,
        "compile": compiled,
        "wall_s": round(time.perf_counter() - start, 1),
        "exit": done.returncode,
    }
    (out / f"{name}.log").write_text(done.stderr)
    summary = run_dir / "summary.json"
    if done.returncode == 0 and summary.is_file():
        data = json.loads(summary.read_text())
        row.update(
            final_loss=data["last_loss"],
            steps=data["final_step"],
            graphs=data["compile_graphs"],
            recompiles=data["recompiles_after_warmup"],
        )
    else:
        row["error"] = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "?"
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of the finished runs."""
    lines = [
        "| backend | padding | compile_blocks | steps | final loss | graphs | recompiles "
        "after warm-up | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['backend']} | {r['padding']} | {r['compile']} | failed (exit {r['exit']}):"
                f" {r['error']} | | | | {r['wall_s']} |"
            )
            continue
        lines.append(
            f"| {r['backend']} | {r['padding']} | {'on' if r['compile'] else 'off'} | "
            f"{r['steps']} | {r['final_loss']:.6f} | {r['graphs']} | {r['recompiles']} | "
            f"{r['wall_s']} |"
        )
    return "\n".join(lines)


def parse_choice(text: str, allowed: tuple[str, ...]) -> list[str]:
    """A comma list of choices, or 'all'."""
    if text == "all":
        return list(allowed)
    picked = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in picked if t not in allowed]
    if bad:
        raise SystemExit(f"unknown choice(s) {bad}; pick from {', '.join(allowed)} or 'all'")
    return picked


def main() -> int:
    """Run the selected combinations one after the other; exit 1 if any failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", type=Path, default=DEFAULT_EXAMPLE)
    parser.add_argument("--backends", default="all", help="fsdp1,fsdp2 or all")
    parser.add_argument("--padding", default="all", help="longest,static,buckets or all")
    parser.add_argument("--compile", default="all", help="off,on or all")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "option-matrix")
    args = parser.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / "build" / "inductor-cache"))
    os.environ.setdefault("SPECDRAFT_CACHE", str(ROOT / "build" / "cache"))

    backends = parse_choice(args.backends, ("fsdp1", "fsdp2"))
    paddings = parse_choice(args.padding, tuple(PADDING))
    compiles = [c == "on" for c in parse_choice(args.compile, ("off", "on"))]
    data = write_conversations(args.out / "data" / "conversations.jsonl", count=32)
    base = tiny_overrides(args.example, data, args.steps)
    rows = []
    for backend, padding, compiled in itertools.product(backends, paddings, compiles):
        rows.append(run_one(args.example, base, args.out, backend, padding, compiled))
        print(f"{rows[-1]['run']}: {rows[-1].get('final_loss', 'failed')}", flush=True)
        (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    report = f"example: {args.example.name}\n\n{table(rows)}\n"
    (args.out / "table.md").write_text(report)
    print(report)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
