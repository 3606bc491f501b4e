"""The text report of a llama.cpp measurement (llama_served): the acceptance table next to
specdraft's estimate, and the tokens/s table in the shape of vLLM's (speed.speed_lines)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _rates(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def llama_served_lines(result: dict[str, Any]) -> list[str]:
    """The acceptance report: llama.cpp's acceptance next to specdraft's, outputs compared."""
    build = f"llama.cpp build {result['build']}"
    family = result["family"]
    if result["stage"] == "draft":
        return [f"{build} refused the {family} draft: {result['error']}", f"(log: {result['log']})"]
    if result["stage"] != "done":
        return [
            f"{build} could not serve the target GGUF {result['target_gguf']}: {result['error']}",
            f"(log: {result.get('log')})",
        ]
    ours, theirs = result["specdraft"], result["llama_cpp"]
    per_step = theirs["per_step"]
    target = Path(result["target_gguf"]).name
    threads = result["threads"]
    same = "identical" if result["outputs_identical"] else "DIFFERENT"
    hf_note = "" if not result["target_gguf_given"] else f" (target GGUF given: {target})"
    lines = [
        f"{result['prompts']} held-out prompts x {result['max_tokens']} new tokens, {family} "
        f"draft, {build} ({result['draft_tokens']} draft tokens, target {target}, "
        f"{threads} thread{'s' if threads != 1 else ''})",
        f"{'':<34}{'llama.cpp':>10} {'specdraft':>10}",
        f"{'acceptance length':<34}{_fmt(theirs['acceptance_length']):>10} "
        f"{ours['acceptance_length']:>10.3f}",
        f"{'verification steps':<34}{theirs['steps']:>10} {int(ours['steps']):>10}",
        f"{'tokens after each first':<34}{theirs['generated'] - theirs['prompts']:>10} "
        f"{ours.get('tokens', '-'):>10}",
        f"{'per drafted step (/metrics)':<34}{_fmt(per_step['acceptance_length']):>10} "
        f"{'':>10}  ({int(per_step['drafts'])} drafts)",
        f"acceptance per position (given the one before): llama.cpp "
        f"{_rates((theirs.get('per_position') or per_step)['per_position_given_previous'])}",
        f"{'':<43}specdraft {_rates(ours['per_position_given_previous'])}",
        f"greedy outputs with and without the draft: {same} ({result['identical_outputs']} of "
        f"{result['prompts']}); llama.cpp's greedy output equals the HF target's on "
        f"{result['matches_target_greedy']} of {result['prompts']}{hf_note}",
    ]
    if "block_acceptance_length" in ours:
        lines.append(
            f"specdraft's estimate is cut to the block's first {result['draft_tokens']} "
            f"positions (the whole block: {ours['block_acceptance_length']:.3f})"
        )
    return lines


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def llama_speed_lines(result: dict[str, Any]) -> list[str]:
    """The side-by-side tokens/s table of a llama.cpp speed measurement, with what the ceiling
    rows say: how much of the gap to N + 1 tokens per step is the draft's quality, how much
    the cost of drafting and verifying. Measured at batch 1 only (`parallel` 1), one column."""
    speed = result["speed"]
    rows = {row["name"]: row for row in speed["settings"]}
    plain = rows["none"]
    slots = speed["parallel"]
    batched = slots > 1
    threads = result["threads"]
    prompts = speed["prompts"]
    header = (
        f"output tokens/s, llama.cpp build {result['build']}, greedy, {result['max_tokens']} new "
        f"tokens, {speed['draft_tokens']} speculative tokens, {threads} "
        f"thread{'s' if threads != 1 else ''}; batch 1 = {prompts} prompts one at a time"
    )
    columns = f"{'setting':<26} {'accept len':>10} {'batch 1':>9} {'x':>6}"
    if batched:
        header += f", {slots} slots = all {prompts} at once (-np {slots})"
        columns += f" {str(slots) + ' slots':>9} {'x':>6}  identical (batch 1, {slots} slots)"
    else:
        columns += "  identical"
    lines = [header, columns]
    for row in speed["settings"]:
        one = row["batch1"]["tokens_per_s"]
        accept = row["acceptance_length"] if row["name"] != "none" else None
        identical = f"{row['identical_batch1']}/{prompts}"
        line = f"{row['label']:<26} {_fmt(accept):>10} {one:>9.1f} "
        line += f"{_ratio(one, plain['batch1']['tokens_per_s']):>6}"
        if batched:
            many = row["batch"]["tokens_per_s"]
            identical += f", {row['identical_batch']}/{prompts}"
            line += f" {many:>9.1f} {_ratio(many, plain['batch']['tokens_per_s']):>6}"
        if row["synthetic"]:
            identical += " (synthetic acceptance)"
        lines.append(f"{line}  {identical}")
    lines += ceiling_lines(rows, speed["draft_tokens"])
    return lines


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "-"


def ceiling_lines(rows: dict[str, dict[str, Any]], draft_tokens: int) -> list[str]:
    """The batch-1 reading of the ceiling rows (see llama_speed_lines)."""
    plain, draft, full = rows.get("none"), rows.get("draft"), rows.get("synth-full")
    if not (plain and draft and full):
        return []
    base = plain["batch1"]["tokens_per_s"]
    if base <= 0:
        return []
    got = draft["batch1"]["tokens_per_s"] / base
    best = full["batch1"]["tokens_per_s"] / base
    lines = [
        f"batch 1: the draft gives {got:.2f}x; this draft shape with every draft token accepted "
        f"would give {best:.2f}x (the gap is the draft's quality), and {draft_tokens + 1} tokens "
        f"per target step would be {draft_tokens + 1:.2f}x if drafting and verification were "
        f"free (the rest is their cost)"
    ]
    measured = rows.get("synth-measured")
    if measured:
        same = measured["batch1"]["tokens_per_s"] / base
        lines.append(
            f"batch 1 at the draft's acceptance drawn at random: {same:.2f}x (the draft's "
            f"{got:.2f}x beside it checks that acceptance alone sets the speed)"
        )
    return lines
