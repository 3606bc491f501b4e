"""Served speed: output tokens/s of the target in vLLM without speculation, with the draft, and
with vLLM's n-gram speculation (the free alternative a user tries first), side by side.

One vLLM child runs the three settings in turn, one engine at a time, on the same held-out
prompts: first one prompt at a time (batch 1, the latency case speculation is for), then all of
them at once (a batch). Every setting's greedy tokens are compared with the plain target's, so
a speedup is never bought with a different answer.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdraft.config import Config

from .vllm_engine import run_vllm_child

# vLLM's n-gram proposer: look the last 2..4 tokens up in the prompt and output so far.
NGRAM_LOOKUP = (2, 4)


def speed_settings(draft: Path, method: str, draft_tokens: int, ngram_tokens: int) -> list[dict]:
    """The three settings the child measures: no speculation, the draft, n-gram."""
    return [
        {"name": "none"},
        {
            "name": "draft",
            "speculative_config": {
                "method": method,
                "model": str(draft),
                "num_speculative_tokens": draft_tokens,
            },
        },
        {
            "name": "ngram",
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": ngram_tokens,
                "prompt_lookup_min": NGRAM_LOOKUP[0],
                "prompt_lookup_max": NGRAM_LOOKUP[1],
            },
        },
    ]


def served_speed(
    config: Config,
    checkpoint: str,
    *,
    python: Path,
    batch: int = 16,
    batch1_prompts: int = 8,
    max_tokens: int = 128,
    log: Path | None = None,
    timeout: float = 3600,
    on_start: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Tokens/s at batch 1 and at `batch` for no speculation, the draft and n-gram."""
    from ..export import export_checkpoint
    from .served import served_inputs, served_request

    version, family, dtype, records = served_inputs(config, checkpoint, python, on_start)
    prompts = [r.input_ids[: r.prompt_len].tolist() for r in records][:batch]
    with tempfile.TemporaryDirectory(prefix="specdraft-speed-") as tmp:
        draft = Path(tmp) / "draft"
        export_checkpoint(checkpoint, draft, format="vllm", dtype=dtype)
        request = served_request(config, draft, family, prompts, dtype, "speed", max_tokens)
        draft_tokens = request["num_speculative_tokens"]
        request["batch1_prompts"] = min(batch1_prompts, len(prompts))
        request["settings"] = speed_settings(draft, request["method"], draft_tokens, draft_tokens)
        child = run_vllm_child(request, python=python, log=log, timeout=timeout)
    result: dict[str, Any] = {
        "family": family,
        "vllm_version": child.get("vllm_version") or version,
        "stage": child["stage"],
        "error": child.get("error"),
        "prompts": len(prompts),
        "batch1_prompts": request["batch1_prompts"],
        "max_tokens": max_tokens,
        "draft_tokens": draft_tokens,
        "settings": [],
    }
    if child["stage"] != "done":
        return result
    plain = child["settings"][0]["tokens"]
    for setting in child["settings"]:
        entry = {key: value for key, value in setting.items() if key != "tokens"}
        entry["identical"] = sum(a == b for a, b in zip(plain, setting["tokens"], strict=True))
        for phase in ("batch1", "batch"):
            measured = entry[phase]
            measured["tokens_per_s"] = measured["tokens"] / measured["seconds"]
        result["settings"].append(entry)
    return result


def speed_lines(result: dict[str, Any]) -> list[str]:
    """The side-by-side table of a speed measurement."""
    if result["stage"] != "done":
        return [f"vLLM {result.get('vllm_version')} could not measure speed: {result['error']}"]
    rows = {s["name"]: s for s in result["settings"]}
    plain = rows["none"]
    labels = {
        "none": "target alone",
        "draft": f"{result['family']} draft",
        "ngram": f"n-gram (lookup {NGRAM_LOOKUP[0]}-{NGRAM_LOOKUP[1]})",
    }
    lines = [
        f"output tokens/s, vLLM {result['vllm_version']}, greedy, {result['max_tokens']} new "
        f"tokens, {result['draft_tokens']} speculative tokens; batch 1 = "
        f"{result['batch1_prompts']} prompts one at a time, batch {result['prompts']} = all "
        "at once",
        f"{'setting':<24} {'accept len':>10} {'batch 1':>9} {'x':>6} "
        f"{'batch ' + str(result['prompts']):>9} {'x':>6}  identical",
    ]
    for name in ("none", "draft", "ngram"):
        row = rows[name]
        accept = row.get("acceptance_length")
        one, many = row["batch1"]["tokens_per_s"], row["batch"]["tokens_per_s"]
        lines.append(
            f"{labels[name]:<24} {'-' if accept is None else f'{accept:.3f}':>10} {one:>9.1f} "
            f"{one / plain['batch1']['tokens_per_s']:>5.2f}x {many:>9.1f} "
            f"{many / plain['batch']['tokens_per_s']:>5.2f}x  "
            f"{row['identical']}/{result['prompts']}"
        )
    return lines
