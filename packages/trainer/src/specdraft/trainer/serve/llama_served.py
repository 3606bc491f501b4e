"""Served acceptance and speed in llama.cpp: the draft exported to GGUF, the held-out prompts
run by `llama-server` itself.

The same held-out prompts (token ids) as specdraft's own estimate (eval_run.cached_eval_records)
go to llama-server greedily, one server per setting (its speculative flags are server-wide):
the target alone and with the draft, one prompt at a time, `max_tokens` = the evaluation's
budget. The draft's acceptance comes from the responses' timings (and per verification step
and position from /metrics, see llama_counts), next to specdraft's estimate; the outputs with
and without the draft must be identical, and the target's equal to the HF target's greedy
continuations (on the f32 GGUF of the same target; a quantized one differs by design).

With `speed`, output tokens/s at batch 1 (one prompt at a time, one slot) and with `parallel`
slots (all prompts at once) for the target alone, the draft, llama.cpp's n-gram modes and the
draft at a synthetic acceptance (llama_settings), each phase on a fresh server so that no
setting reuses what an earlier phase left (prompt caches, n-gram tables).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from specdraft.config import Config

from .llama_counts import (
    acceptance_from_metrics,
    acceptance_from_timings,
    acceptance_length_within,
    count_identical,
    metrics_delta,
    parse_metrics,
    per_position_from_steps,
    steps_from_trace,
)
from .llama_cpp_build import LlamaCpp, require_llama_cpp
from .llama_server import LlamaServer, LlamaServerFailed, ServerOptions
from .llama_settings import (
    Setting,
    ceiling_settings,
    check_speed_settings,
    draft_setting,
    ngram_settings,
)

# A warm-up request before each timed phase: a short prefix of the first prompt, a few tokens
# (short enough that no n-gram table keeps anything from it: ngram-mod keys are 24 tokens).
WARMUP_PROMPT, WARMUP_TOKENS = 8, 4


def default_draft_tokens(family: str, block_size: int) -> int:
    """Draft tokens per step of a family: block_size - 1 (DSpark: block_size)."""
    from ..models import family_for

    return family_for(family).supervised_slots(block_size)


def checkpoint_family(checkpoint: str | Path) -> str:
    """The draft family of a checkpoint folder, from its config.json architecture."""
    from ..models import family_of_architecture

    architecture = json.loads((Path(checkpoint) / "config.json").read_text())["architectures"][0]
    return family_of_architecture(architecture).name


def default_target_gguf(config: Config, build: LlamaCpp) -> Path:
    """The f32 GGUF of config.model.target, written once into the run's eval/ folder (keyed by
    the target's files, so a rebuilt target gets a new one)."""
    from ..export.target_gguf import write_target_gguf
    from ..runtime.cache import build_once, recipe_hash
    from ..train.eval_run import target_identity

    target = Path(config.model.target).resolve()
    key = recipe_hash(
        {"target": str(target), "files": target_identity(str(target)), "outtype": "f32"}
    )
    folder = Path(config.output_dir) / "eval" / f"target-gguf-{key}"

    def write(tmp: Path) -> None:
        write_target_gguf(target, tmp / "target-f32.gguf", outtype="f32")

    return build_once(folder, write) / "target-f32.gguf"


def completion_request(
    prompt: Sequence[int], max_tokens: int, *, ignore_eos: bool = False
) -> dict[str, Any]:
    """A greedy /completion request for token ids, answered with token ids and timings."""
    return {
        # A synthetic acceptance takes the draft's tokens unverified, which end in an early
        # end-of-sequence: those rows generate the whole budget, so they time as many tokens.
        "ignore_eos": ignore_eos,
        "prompt": list(prompt),
        "n_predict": max_tokens,
        "temperature": 0.0,
        "top_k": 1,
        "seed": 0,
        "cache_prompt": False,
        "return_tokens": True,
        "stream": False,
    }


def context_size(prompts: Sequence[Sequence[int]], max_tokens: int, draft_tokens: int) -> int:
    """Per-slot context: the longest prompt, the generation and a draft block past its end."""
    longest = max((len(p) for p in prompts), default=1)
    need = longest + max_tokens + 2 * (max(draft_tokens, 8) + 1) + 16
    return -(-need // 256) * 256


def run_phase(
    build: LlamaCpp,
    setting: Setting,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    *,
    target: Path,
    threads: int,
    parallel: int,
    per_slot_ctx: int,
    log: Path,
    draft_tokens: int = 0,
) -> dict[str, Any]:
    """One fresh server with `setting`: the prompts one at a time (`parallel` 1) or all at
    once (`parallel` slots); tokens, wall seconds, and the acceptance of that phase alone
    (with `draft_tokens`, per position from its step-by-step trace too)."""
    options = ServerOptions(
        model=target,
        threads=threads,
        ctx_size=per_slot_ctx * parallel,
        parallel=parallel,
        extra=setting.args,
        trace=draft_tokens > 0,
    )

    def request(prompt: Sequence[int]) -> dict[str, Any]:
        return completion_request(prompt, max_tokens, ignore_eos=setting.synthetic)

    with LlamaServer(build.server, options, log, name=f"llama-server ({setting.name})") as server:
        warm = prompts[0][:WARMUP_PROMPT]
        server.complete(completion_request(warm, WARMUP_TOKENS))
        before = parse_metrics(server.metrics_text())
        if parallel == 1:
            responses, seconds = [], 0.0
            for prompt in prompts:
                started = time.perf_counter()
                responses.append(server.complete(request(prompt)))
                seconds += time.perf_counter() - started
        else:
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
                responses = list(pool.map(lambda p: server.complete(request(p)), prompts))
            seconds = time.perf_counter() - started
        after = parse_metrics(server.metrics_text())
    tokens = [list(r.get("tokens") or []) for r in responses]
    count = sum(len(t) for t in tokens)
    traced = None
    if draft_tokens:
        steps = steps_from_trace(log.read_text(encoding="utf-8", errors="replace"))
        traced = per_position_from_steps(steps, draft_tokens)
    return {
        "per_position_trace": traced,
        "prompts": len(prompts),
        "parallel": parallel,
        "tokens": count,
        "seconds": seconds,
        "tokens_per_s": count / seconds if seconds > 0 else 0.0,
        "timings": acceptance_from_timings(responses),
        "per_step": acceptance_from_metrics(metrics_delta(before, after)),
        "outputs": tokens,
    }


def served_llama_cpp(
    config: Config,
    checkpoint: str,
    *,
    target_gguf: Path | None = None,
    threads: int = 1,
    speed: bool = False,
    parallel: int = 4,
    draft_tokens: int | None = None,
    speed_settings: Collection[str] | None = None,
    log_dir: Path | None = None,
    on_start: Callable[[LlamaCpp], None] | None = None,
) -> dict[str, Any]:
    """llama.cpp's acceptance of the checkpoint's draft next to specdraft's estimate, outputs
    compared (and with `speed` the tokens/s table's settings, or only `speed_settings`; with
    `parallel` 1 at batch 1 only); see module. Raises LlamaCppUnavailable without a build,
    ExportError when the draft cannot be exported, ValueError for an unknown setting."""
    from ..export import export_checkpoint
    from ..train.eval_run import cached_eval_records, eval_new_tokens, evaluate_checkpoint
    from ..train.evaluation import fit_eval_budget

    if speed_settings is not None:
        check_speed_settings(speed_settings)
    build = require_llama_cpp()
    family = checkpoint_family(checkpoint)
    slots = default_draft_tokens(family, int(config.model.block_size))
    if draft_tokens is None:
        draft_tokens = slots
    if not 1 <= draft_tokens <= slots:
        raise ValueError(
            f"--draft-tokens {draft_tokens}: a {family} draft of block_size "
            f"{config.model.block_size} proposes 1..{slots} tokens per step"
        )
    if on_start is not None:
        on_start(build)
    records, _ = cached_eval_records(config)
    prompts = [r.input_ids[: r.prompt_len].tolist() for r in records]
    continuations = [r.input_ids[r.prompt_len :].tolist() for r in records]
    max_tokens, _ = fit_eval_budget(config.data.max_length, eval_new_tokens(config))
    given = target_gguf is not None
    target = Path(target_gguf) if given else default_target_gguf(config, build)
    logs = Path(log_dir) if log_dir else Path(config.output_dir) / "eval" / "llama.cpp"
    per_slot = context_size(prompts, max_tokens, draft_tokens)
    result: dict[str, Any] = {
        "engine": "llama.cpp",
        "build": build.build_number,
        "family": family,
        "stage": "start",
        "error": None,
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "draft_tokens": draft_tokens,
        "threads": threads,
        "target_gguf": str(target),
        "target_gguf_given": given,
        "logs": str(logs),
    }

    def phase(setting: Setting, batch: int, trace: bool = False) -> dict[str, Any]:
        kind = "batch1" if batch == 1 else f"np{batch}"
        return run_phase(
            build,
            setting,
            prompts,
            max_tokens,
            target=target,
            threads=threads,
            parallel=batch,
            per_slot_ctx=per_slot,
            log=logs / f"{setting.name}-{kind}.log",
            draft_tokens=draft_tokens if trace else 0,
        )

    alone_setting = Setting("none", "target alone")
    with tempfile.TemporaryDirectory(prefix="specdraft-llama-") as tmp:
        draft_file = export_checkpoint(
            checkpoint, Path(tmp) / "draft.gguf", format="gguf", verifier=str(config.model.target)
        ).path
        drafted = draft_setting(family, draft_file, draft_tokens)
        try:
            alone = phase(alone_setting, 1)
        except LlamaServerFailed as exc:
            return {**result, "stage": "target", "error": exc.reason, "log": str(exc.log)}
        try:
            with_draft = phase(drafted, 1, trace=True)
        except LlamaServerFailed as exc:
            return {**result, "stage": "draft", "error": exc.reason, "log": str(exc.log)}
        estimate = evaluate_checkpoint(config, checkpoint, records=records)
        result.update(
            stage="done",
            specdraft=estimate_summary(estimate, draft_tokens),
            llama_cpp={
                **with_draft["timings"],
                "per_step": with_draft["per_step"],
                "per_position": with_draft["per_position_trace"],
            },
            outputs_identical=alone["outputs"] == with_draft["outputs"],
            identical_outputs=count_identical(alone["outputs"], with_draft["outputs"]),
            matches_target_greedy=count_identical(continuations, alone["outputs"]),
        )
        if speed:
            result["speed"] = measure_speed(
                phase,
                alone_setting,
                alone,
                drafted,
                with_draft,
                draft_tokens,
                parallel,
                settings=speed_settings,
            )
    return result


def estimate_summary(estimate: dict[str, Any], draft_tokens: int) -> dict[str, Any]:
    """specdraft's estimate as the report compares it: for a draft served with fewer tokens
    than its block proposes, the acceptance of the block's first `draft_tokens` positions."""
    rates = list(estimate["accept_rate_per_pos"])
    summary = {
        "acceptance_length": estimate["tau"],
        "per_position_given_previous": rates,
        "steps": estimate["steps"],
        # Tokens its walk advanced over (tau = tokens / steps).
        "tokens": round(estimate["tau"] * estimate["steps"]),
    }
    if draft_tokens < len(rates):
        # The walk's steps are the whole block's; cut, each advances at most draft_tokens + 1,
        # so its token count is not the cut one and is left out.
        del summary["tokens"]
        summary.update(
            acceptance_length=acceptance_length_within(rates, draft_tokens),
            per_position_given_previous=rates[:draft_tokens],
            block_acceptance_length=estimate["tau"],
        )
    return summary


def measure_speed(
    phase: Callable[[Setting, int], dict[str, Any]],
    alone_setting: Setting,
    alone: dict[str, Any],
    drafted: Setting,
    with_draft: dict[str, Any],
    draft_tokens: int,
    parallel: int,
    *,
    settings: Collection[str] | None = None,
) -> dict[str, Any]:
    """Every setting (or those named in `settings`; the target alone and the draft always) at
    batch 1, the acceptance runs reused for those two, and with `parallel` slots unless it is 1;
    outputs compared with the target alone's at batch 1."""
    measured = with_draft["per_step"]["acceptance_length"]
    extra = [
        *ngram_settings(draft_tokens),
        *ceiling_settings(drafted, measured, draft_tokens),
    ]
    plans: list[tuple[Setting, dict[str, Any] | None]] = [
        (alone_setting, alone),
        (drafted, with_draft),
        *((s, None) for s in extra if settings is None or s.name in settings),
    ]
    reference = alone["outputs"]
    rows = []
    for setting, single in plans:
        single = single if single is not None else phase(setting, 1)
        many = phase(setting, parallel) if parallel > 1 else None
        rows.append(
            {
                "name": setting.name,
                "label": setting.label,
                "synthetic": setting.synthetic,
                "batch1": phase_summary(single),
                "batch": phase_summary(many) if many is not None else None,
                "acceptance_length": single["timings"]["acceptance_length"],
                "acceptance_per_step": single["per_step"]["acceptance_length"],
                "identical_batch1": count_identical(reference, single["outputs"]),
                "identical_batch": (
                    count_identical(reference, many["outputs"]) if many is not None else None
                ),
            }
        )
    return {
        "parallel": parallel,
        "prompts": len(reference),
        "draft_tokens": draft_tokens,
        "settings": rows,
    }


def phase_summary(measured: dict[str, Any]) -> dict[str, Any]:
    """A phase's figures without its token lists."""
    return {
        key: measured[key] for key in ("prompts", "parallel", "tokens", "seconds", "tokens_per_s")
    }
