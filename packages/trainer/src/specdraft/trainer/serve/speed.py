"""Served speed: output tokens/s of the target in vLLM without speculation, with the draft, and
with vLLM's n-gram speculation (the free alternative a user tries first), side by side.

The serving child (served.served_acceptance) runs the settings in turn, one engine at a
time, on the same held-out prompts (the draft and n-gram at the draft's own token count, and
again at any other counts asked for: on CPU a shorter speculation step can pay where a long one
does not); the draft's and the plain target's engines are the ones that
served the acceptance prompts, so only the n-gram engine (and, per other count, a draft and an
n-gram engine) is built for speed alone. Each setting
is timed first one prompt at a time (batch 1, the latency case speculation is for), then all of
them at once (a batch). Every setting's greedy tokens are compared with the plain target's, so
a speedup is never bought with a different answer.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

# vLLM's n-gram proposer: look the last 2..4 tokens up in the prompt and output so far.
NGRAM_LOOKUP = (2, 4)


def speed_settings(
    draft: Path,
    method: str,
    draft_tokens: int,
    ngram_tokens: int,
    more_tokens: Collection[int] = (),
) -> list[dict]:
    """The settings the child measures: no speculation, the draft and n-gram at the draft's own
    token count, then the draft and n-gram again at each of `more_tokens` speculative tokens
    per step (fewer tokens: a cheaper step on CPU, where verification is compute-bound)."""
    settings: list[dict] = [{"name": "none"}]
    settings += [draft_setting("draft", draft, method, draft_tokens)]
    settings += [ngram_setting("ngram", ngram_tokens)]
    for tokens in sorted(set(more_tokens) - {draft_tokens}):
        settings += [draft_setting(f"draft-{tokens}", draft, method, tokens)]
        settings += [ngram_setting(f"ngram-{tokens}", tokens)]
    return settings


def draft_setting(name: str, draft: Path, method: str, tokens: int) -> dict:
    """The draft as vLLM's speculative model, proposing `tokens` per step."""
    return {
        "name": name,
        "speculative_config": {
            "method": method,
            "model": str(draft),
            "num_speculative_tokens": tokens,
        },
    }


def ngram_setting(name: str, tokens: int) -> dict:
    """vLLM's n-gram proposer, proposing up to `tokens` per step."""
    return {
        "name": name,
        "speculative_config": {
            "method": "ngram",
            "num_speculative_tokens": tokens,
            "prompt_lookup_min": NGRAM_LOOKUP[0],
            "prompt_lookup_max": NGRAM_LOOKUP[1],
        },
    }


def add_speed_request(
    request: dict[str, Any],
    prompts: list[list[int]],
    *,
    batch1_prompts: int,
    max_tokens: int,
    more_tokens: Collection[int] = (),
) -> None:
    """Ask the serving child (`request`, mode "serve") to also measure tokens/s on `prompts`:
    the first `batch1_prompts` one at a time, then all of them at once, `max_tokens` each;
    `more_tokens`: the draft and n-gram again at these speculative tokens per step."""
    draft_tokens = int(request["num_speculative_tokens"])
    # The engines serve both: room for the longer of the two, with the same slack past the end
    # of the generation (draft blocks) that served_request left.
    slack = request["max_model_len"] - max((len(p) for p in request["prompts"]), default=1)
    slack -= int(request["max_tokens"])
    longest = max((len(p) for p in prompts), default=1)
    request["max_model_len"] = max(request["max_model_len"], longest + max_tokens + slack)
    request["speed"] = {
        "prompts": prompts,
        "max_tokens": max_tokens,
        "batch1_prompts": min(batch1_prompts, len(prompts)),
        "settings": speed_settings(
            Path(request["draft"]), request["method"], draft_tokens, draft_tokens, more_tokens
        ),
    }


def speed_result(child: dict[str, Any], request: dict[str, Any], family: str) -> dict[str, Any]:
    """The speed table's data from the child's result, each setting's outputs compared with
    the plain target's."""
    speed = request["speed"]
    measured = child.get("speed") or {}
    result: dict[str, Any] = {
        "family": family,
        "vllm_version": child.get("vllm_version"),
        "stage": measured.get("stage", child["stage"]),
        "error": child.get("error"),
        "prompts": len(speed["prompts"]),
        "batch1_prompts": speed["batch1_prompts"],
        "max_tokens": speed["max_tokens"],
        "draft_tokens": int(request["num_speculative_tokens"]),
        "enforce_eager": bool(request.get("enforce_eager")),
        "settings": [],
    }
    if result["stage"] != "done":
        return result
    plain = next(s for s in measured["settings"] if s["name"] == "none")["tokens"]
    asked = {s["name"]: s.get("speculative_config", {}) for s in speed["settings"]}
    for setting in measured["settings"]:
        entry = {key: value for key, value in setting.items() if key != "tokens"}
        entry["speculative_tokens"] = asked[setting["name"]].get("num_speculative_tokens")
        entry["identical"] = sum(a == b for a, b in zip(plain, setting["tokens"], strict=True))
        for phase in ("batch1", "batch"):
            counted = entry[phase]
            counted["tokens_per_s"] = counted["tokens"] / counted["seconds"]
        result["settings"].append(entry)
    return result


def setting_label(row: dict[str, Any], family: str) -> str:
    """A setting's name in the table: what speculates, and how many tokens a step."""
    tokens = row.get("speculative_tokens")
    if row["name"] == "none":
        return "target alone"
    if row["name"].startswith("draft"):
        return f"{family} draft, {tokens} tokens"
    return f"n-gram {NGRAM_LOOKUP[0]}-{NGRAM_LOOKUP[1]}, {tokens} tokens"


def fastest_at_batch1(result: dict[str, Any]) -> dict[str, Any]:
    """The setting with the most output tokens/s at batch 1 among those whose outputs all equal
    the target's (a faster setting that changes an answer is not a speedup); the target alone
    is always among them."""
    honest = [s for s in result["settings"] if s["identical"] == result["prompts"]]
    return max(honest, key=lambda s: s["batch1"]["tokens_per_s"])


def speed_lines(result: dict[str, Any]) -> list[str]:
    """The side-by-side table of a speed measurement, and the fastest setting at batch 1."""
    if result["stage"] != "done":
        return [f"vLLM {result.get('vllm_version')} could not measure speed: {result['error']}"]
    plain = next(s for s in result["settings"] if s["name"] == "none")
    lines = [
        f"output tokens/s, vLLM {result['vllm_version']}, greedy, {result['max_tokens']} new "
        f"tokens; batch 1 = {result['batch1_prompts']} prompts one at a time, batch "
        f"{result['prompts']} = all at once"
        + (" (eager: no torch.compile)" if result.get("enforce_eager") else ""),
        f"{'setting':<28} {'accept len':>10} {'batch 1':>9} {'x':>6} "
        f"{'batch ' + str(result['prompts']):>9} {'x':>6}  identical",
    ]
    for row in result["settings"]:
        accept = row.get("acceptance_length")
        one, many = row["batch1"]["tokens_per_s"], row["batch"]["tokens_per_s"]
        lines.append(
            f"{setting_label(row, result['family']):<28} "
            f"{'-' if accept is None else f'{accept:.3f}':>10} {one:>9.1f} "
            f"{one / plain['batch1']['tokens_per_s']:>5.2f}x {many:>9.1f} "
            f"{many / plain['batch']['tokens_per_s']:>5.2f}x  "
            f"{row['identical']}/{result['prompts']}"
        )
    best = fastest_at_batch1(result)
    ratio = best["batch1"]["tokens_per_s"] / plain["batch1"]["tokens_per_s"]
    lines.append(
        f"fastest at batch 1: {setting_label(best, result['family'])} ({ratio:.2f}x the target "
        "alone)"
    )
    return lines
