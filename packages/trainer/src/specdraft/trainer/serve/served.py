"""Served acceptance: the draft exported for vLLM, its held-out prompts run by vLLM itself.

The same held-out prompts as specdraft's own estimate (eval_run.make_eval_records: the target's
greedy continuations, cut to data.max_length) go to vLLM twice, greedy, with the draft as its
speculative model and without; vLLM's spec-decode counters give the served acceptance length.
Both figures are then on the same prompts, and the two vLLM outputs must be identical (greedy
verification cannot change what the target generates).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from specdraft.config import Config

from .vllm_engine import check_vllm_python, run_vllm_child


def served_request(
    config: Config,
    draft: Path,
    family: str,
    prompts: list[list[int]],
    dtype: str,
    mode: str,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The vllm_child request that serves `prompts` with the exported draft (`max_tokens`
    new tokens each; default: the evaluation's budget)."""
    from ..export.vllm import vllm_layout
    from ..models import family_for
    from ..train.eval_run import eval_new_tokens
    from ..train.evaluation import fit_eval_budget

    # vLLM's speculative method, and the draft tokens a block of bs proposes (DSpark's anchor
    # slot is a prediction: bs; DFlash and DFlash2: bs - 1), from the family's folder.
    spec = family_for(family)
    method = vllm_layout(spec, str(draft)).method
    if max_tokens is None:
        max_tokens, _ = fit_eval_budget(config.data.max_length, eval_new_tokens(config))
    block = int(config.model.block_size)
    longest = max((len(p) for p in prompts), default=1)
    return {
        "mode": mode,
        "target": str(Path(config.model.target).resolve()),
        "draft": str(draft),
        "method": method,
        "num_speculative_tokens": spec.supervised_slots(block),
        "prompts": prompts,
        "max_tokens": max_tokens,
        # Room for the prompt, the generation and one draft block past its end.
        "max_model_len": longest + max_tokens + 2 * block,
        "dtype": dtype,
    }


def served_inputs(
    config: Config,
    checkpoint: str,
    python: Path,
    on_start: Callable[[str], None] | None = None,
) -> tuple[str, str, str, list[Any]]:
    """What every served measurement starts from: the vLLM version (checked), the checkpoint's
    family and dtype, and the run's held-out records (cached)."""
    from ..export import checkpoint_dtype
    from ..models import family_of_architecture
    from ..train.eval_run import cached_eval_records

    version = check_vllm_python(python)
    if on_start is not None:
        on_start(version)
    architecture = json.loads((Path(checkpoint) / "config.json").read_text())["architectures"][0]
    family = family_of_architecture(architecture).name
    records, _ = cached_eval_records(config)
    return version, family, checkpoint_dtype(checkpoint), records


def served_acceptance(
    config: Config,
    checkpoint: str,
    *,
    python: Path,
    log: Path | None = None,
    timeout: float = 1800,
    on_start: Callable[[str], None] | None = None,
    speed_batch: int = 0,
    speed_batch1: int = 8,
    speed_tokens: int = 128,
    speed_more_tokens: Collection[int] = (),
    eager: bool = False,
) -> dict[str, Any]:
    """vLLM's acceptance of the checkpoint's draft next to specdraft's estimate (see module);
    `on_start(vllm_version)` is called once vLLM is found, before the long part. With a
    `speed_batch`, the same engines also measure tokens/s (speed.py) on that many held-out
    prompts, `speed_batch1` of them one at a time, `speed_tokens` new tokens each: the result's
    "speed"; `speed_more_tokens`: the draft and n-gram again at these speculative tokens per
    step. `eager`: vLLM's engines without torch.compile (enforce_eager)."""
    from ..export import export_checkpoint
    from ..train.eval_run import evaluate_checkpoint
    from .speed import add_speed_request, speed_result

    version, family, dtype, records = served_inputs(config, checkpoint, python, on_start)
    prompts = [r.input_ids[: r.prompt_len].tolist() for r in records]
    with tempfile.TemporaryDirectory(prefix="specdraft-served-") as tmp:
        draft = Path(tmp) / "draft"
        export_checkpoint(checkpoint, draft, format="vllm", dtype=dtype)
        request = served_request(config, draft, family, prompts, dtype, mode="serve")
        request["enforce_eager"] = eager
        if speed_batch:
            add_speed_request(
                request, prompts[:speed_batch], batch1_prompts=speed_batch1,
                max_tokens=speed_tokens, more_tokens=speed_more_tokens,
            )  # fmt: skip
            # One more measurement per setting, the n-gram engines and any other token counts.
            timeout *= len(request["speed"]["settings"])
        child = run_vllm_child(request, python=python, log=log, timeout=timeout)
    result: dict[str, Any] = {
        "family": family,
        "vllm_version": child.get("vllm_version") or version,
        "stage": child["stage"],
        "error": child.get("error"),
        "draft": child.get("draft", {}),
        "prompts": len(prompts),
        "num_speculative_tokens": request["num_speculative_tokens"],
        "enforce_eager": eager,
    }
    if speed_batch:
        result["speed"] = speed_result({**child, "vllm_version": result["vllm_version"]},
                                       request, family)  # fmt: skip
    if child["stage"] != "done":
        return result
    estimate = evaluate_checkpoint(config, checkpoint, records=records)
    continuations = [r.input_ids[r.prompt_len :].tolist() for r in records]
    baseline, speculative = child["baseline"], child["speculative"]
    result.update(
        specdraft={
            "acceptance_length": estimate["tau"],
            "per_position_given_previous": estimate["accept_rate_per_pos"],
            "steps": estimate["steps"],
        },
        vllm=child["acceptance"],
        outputs_identical=baseline == speculative,
        identical_outputs=sum(a == b for a, b in zip(baseline, speculative, strict=True)),
        # vLLM's greedy target output against the HF target's that specdraft estimates on.
        matches_target_greedy=sum(a == b for a, b in zip(baseline, continuations, strict=True)),
    )
    return result
