"""The child process that runs vLLM for specdraft: `python vllm_child.py REQUEST.json RESULT.json`.

Run by the interpreter of the vLLM venv (scripts/vllm_cpu_venv.sh), so it imports only the
standard library and vLLM; specdraft is not installed there. The request says what to do:

- "check": build vLLM's engine config for the target with the draft as its speculative model
  (`EngineArgs.create_engine_config`, where vLLM parses the draft config, resolves the method
  and architecture, and validates the model runner), recording what vLLM read from the draft;
- "serve": the check, then greedy generation of the prompts with speculation (acceptance from
  `LLM.get_metrics()`) and without, in that order (vLLM's metrics are process-wide counters);
  with `request["speed"]`, also the output tokens/s of each of its settings (none, the draft,
  vLLM's n-gram speculation) at batch 1 (prompts one at a time) and at a batch (all prompts at
  once), after a warm-up, with each setting's acceptance and tokens; the draft's and the plain
  target's engines are the ones that served the prompts.

The result is JSON: {"stage": "config" | "runner" | "serve" | "done", "error": ..., ...}. The
engines run in this process (no engine-core or worker process: `engine_kwargs`); the guard below
still matters should a vLLM setting spawn one, which re-imports this file.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

RUNNER_REFUSAL = "Model Runner V1 does not support: "
DRAFTS = "vllm:spec_decode_num_drafts"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"


def acceptance_from_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Acceptance length and per-position acceptance from vLLM's spec-decode counters.

    `metrics` are vLLM's `Metric`s as dicts (name, and value or values). Acceptance length is
    1 + accepted / drafts (the bonus token included); `per_position` is each draft position's
    accepted count over the drafts, `per_position_given_previous` the same conditioned on the
    position before it being accepted (specdraft's own estimate reports that one).
    """
    counters: dict[str, float] = {}
    vectors: dict[str, list[float]] = {}
    for metric in metrics:
        if "values" in metric:
            old = vectors.get(metric["name"], [])
            new = list(metric["values"])
            width = max(len(old), len(new))
            old, new = old + [0] * (width - len(old)), new + [0] * (width - len(new))
            vectors[metric["name"]] = [a + b for a, b in zip(old, new, strict=True)]
        elif "value" in metric:
            counters[metric["name"]] = counters.get(metric["name"], 0) + metric["value"]
    drafts = counters.get(DRAFTS, 0)
    accepted = counters.get(ACCEPTED, 0)
    per_pos = vectors.get(ACCEPTED_PER_POS, [])
    conditional = []
    for k, count in enumerate(per_pos):
        reached = drafts if k == 0 else per_pos[k - 1]
        conditional.append(count / reached if reached else 0.0)
    return {
        "drafts": drafts,
        "draft_tokens": counters.get(DRAFT_TOKENS, 0),
        "accepted": accepted,
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "accepted_per_position": per_pos,
        "per_position": [count / drafts if drafts else 0.0 for count in per_pos],
        "per_position_given_previous": conditional,
    }


def metric_dicts(metrics: list[Any]) -> list[dict[str, Any]]:
    """vLLM `Metric` objects as plain dicts (the names and numbers only)."""
    out = []
    for metric in metrics:
        entry: dict[str, Any] = {"name": metric.name}
        if hasattr(metric, "values") and isinstance(metric.values, list):
            entry["values"] = list(metric.values)
        elif hasattr(metric, "value"):
            entry["value"] = metric.value
        else:
            continue
        out.append(entry)
    return out


def engine_kwargs(
    request: dict[str, Any], speculative: bool, setting: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The engine arguments of a request, with or without the draft (or another `setting`'s
    speculative config)."""
    kwargs: dict[str, Any] = {
        "model": request["target"],
        "dtype": request.get("dtype", "auto"),
        "max_model_len": int(request["max_model_len"]),
        "seed": 0,
        "disable_log_stats": False,
        # The worker runs in this process: with VLLM_ENABLE_V1_MULTIPROCESSING=0 (vllm_engine's
        # CHILD_ENV) there is no engine-core process either, so an engine starts without two
        # spawned processes that each re-import vLLM (~20 s of its ~25 s start on two cores).
        "distributed_executor_backend": "uni",
    }
    if request.get("enforce_eager"):
        # No torch.compile: the engine starts sooner (the served figures say so).
        kwargs["enforce_eager"] = True
    if setting is not None:
        if setting.get("speculative_config"):
            kwargs["speculative_config"] = dict(setting["speculative_config"])
    elif speculative:
        kwargs["speculative_config"] = {
            "method": request["method"],
            "model": request["draft"],
            "num_speculative_tokens": int(request["num_speculative_tokens"]),
        }
    return kwargs


def check_config(request: dict[str, Any]) -> dict[str, Any]:
    """vLLM's engine config for the draft: what vLLM read from it, or where it refused it."""
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import EngineArgs

    seen: dict[str, Any] = {}
    original = VllmConfig._validate_v1_model_runner

    def observe(self: Any) -> None:
        # The speculative config is complete here: vLLM parsed the draft's config.json and
        # resolved its method and architecture before validating the model runner.
        seen.update(read_draft_facts(self.speculative_config))
        original(self)

    VllmConfig._validate_v1_model_runner = observe  # type: ignore[method-assign]
    try:
        EngineArgs(**engine_kwargs(request, speculative=True)).create_engine_config()
    except Exception as exc:  # vLLM raises ValueError, NotImplementedError, pydantic errors
        message = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
        for line in str(exc).splitlines():
            if RUNNER_REFUSAL in line:
                # pydantic appends " [type=value_error, input_value=...]" to the reason.
                reason = line[line.index(RUNNER_REFUSAL) :].split(" [type=")[0].strip()
                return {"stage": "runner", "error": reason, "draft": seen}
        return {"stage": "config", "error": message, "draft": seen}
    finally:
        VllmConfig._validate_v1_model_runner = original  # type: ignore[method-assign]
    return {"stage": "checked", "draft": seen}


def read_draft_facts(spec: Any) -> dict[str, Any]:
    """What vLLM made of the draft: method, architecture, aux layers, speculative tokens."""
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        get_eagle3_aux_layers_from_config,
    )

    draft = spec.draft_model_config
    hf = draft.hf_config
    dflash_config = getattr(hf, "dflash_config", None) or {}
    aux = get_eagle3_aux_layers_from_config(spec)
    return {
        "method": spec.method,
        "architectures": list(draft.architectures or []),
        "aux_hidden_state_layers": list(aux) if aux else None,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "mask_token_id": dflash_config.get("mask_token_id"),
        "sample_from_anchor": getattr(hf, "sample_from_anchor", None),
        "dflash_config": dict(dflash_config),
    }


def open_engine(
    request: dict[str, Any], speculative: bool, setting: dict[str, Any] | None = None
) -> Any:
    """A vLLM engine for the request (with the draft, without, or with a speed setting's)."""
    from vllm import LLM

    llm = LLM(**engine_kwargs(request, speculative, setting))
    keep_kernel_overrides()
    return llm


def keep_kernel_overrides() -> None:
    """Stop vLLM's CPU platform from binding its C++ stand-ins for Triton kernels again: the
    engine just built bound them for the whole process.

    It binds them at every worker start by scanning every loaded module. With the engines in
    this one process (`engine_kwargs`), a later engine's scan meets objects it cannot read
    (numba's, once the n-gram proposer has imported it) and fails the engine.
    """
    from vllm.platforms import current_platform

    platform = type(current_platform)
    if hasattr(platform, "register_triton_kernel_overrides"):
        platform.register_triton_kernel_overrides = classmethod(lambda cls: None)  # type: ignore[method-assign]


def collect() -> None:
    """Free the engine just dropped (`del llm` first) before the next one is built: one at a
    time, two would not fit."""
    import gc

    gc.collect()


def greedy(llm: Any, request: dict[str, Any]) -> list[list[int]]:
    """Greedy token ids of the request's prompts on `llm`."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=int(request["max_tokens"]))
    tokens, _ = timed_generate(llm, params, request["prompts"])
    return tokens


def serve(request: dict[str, Any]) -> dict[str, Any]:
    """The check, then the prompts with and without speculation; with a `speed` sub-request,
    each engine also measures its tokens/s before it is freed (the draft's and the plain
    target's engines serve both, so a served evaluation with speed builds three engines, not
    five), and the n-gram engine follows."""
    result = check_config(request)
    if result["stage"] != "checked":
        return result
    speed_request = request.get("speed")
    measured: dict[str, dict[str, Any]] = {}
    llm = open_engine(request, speculative=True)
    result["speculative"] = greedy(llm, request)
    # vLLM's metrics are process-wide counters: read them before anything else speculates.
    result["acceptance"] = acceptance_from_metrics(metric_dicts(llm.get_metrics()))
    if speed_request:
        measured["draft"] = measure_speed(llm, speed_request, "draft")
    del llm
    collect()
    llm = open_engine(request, speculative=False)
    result["baseline"] = greedy(llm, request)
    if speed_request:
        measured["none"] = measure_speed(llm, speed_request, "none")
    del llm
    collect()
    if speed_request:
        for setting in speed_request["settings"]:
            if setting["name"] not in measured:
                llm = open_engine(request, True, setting)
                measured[setting["name"]] = measure_speed(llm, speed_request, setting["name"])
                del llm
                collect()
        result["speed"] = {
            "stage": "done",
            "settings": [measured[s["name"]] for s in speed_request["settings"]],
        }
    result["stage"] = "done"
    return result


def timed_generate(
    llm: Any, params: Any, prompts: list[list[int]]
) -> tuple[list[list[int]], float]:
    """Greedy token ids of `prompts` in one call, and the call's wall seconds."""
    import time

    started = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs], time.perf_counter() - started


def measure_speed(llm: Any, speed_request: dict[str, Any], name: str) -> dict[str, Any]:
    """Tokens/s of `llm` (the setting `name`) at batch 1 and at a batch, after a warm-up; its
    acceptance from the counters' change over the measurement."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=int(speed_request["max_tokens"]))
    prompts = speed_request["prompts"]
    timed_generate(llm, params, prompts[:2])  # warm-up: first-call compilation and caches
    before = acceptance_from_metrics(metric_dicts(llm.get_metrics()))
    single_tokens, single_seconds = [], 0.0
    for ids in prompts[: int(speed_request["batch1_prompts"])]:
        tokens, seconds = timed_generate(llm, params, [ids])
        single_tokens += tokens
        single_seconds += seconds
    batch_tokens, batch_seconds = timed_generate(llm, params, prompts)
    after = acceptance_from_metrics(metric_dicts(llm.get_metrics()))
    drafts = after["drafts"] - before["drafts"]
    accepted = after["accepted"] - before["accepted"]
    per_pos = [
        a - b
        for a, b in zip(
            after["accepted_per_position"],
            before["accepted_per_position"] + [0] * len(after["accepted_per_position"]),
            strict=False,
        )
    ]
    return {
        "name": name,
        "batch1": {
            "prompts": len(single_tokens),
            "tokens": sum(map(len, single_tokens)),
            "seconds": single_seconds,
        },
        "batch": {
            "prompts": len(batch_tokens),
            "tokens": sum(map(len, batch_tokens)),
            "seconds": batch_seconds,
        },
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "per_position": [count / drafts for count in per_pos] if drafts else [],
        "tokens": batch_tokens,
    }


def main(argv: list[str]) -> int:
    """Read the request, run it, write the result; exit 0 whenever a result was written."""
    request_file, result_file = argv[1], argv[2]
    with open(request_file) as handle:
        request = json.load(handle)
    try:
        import vllm

        version = vllm.__version__
        modes = {"check": check_config, "serve": serve}
        result = modes[request["mode"]](request)
    except Exception as exc:
        result = {"stage": "serve", "error": f"{type(exc).__name__}: {exc}"}
        traceback.print_exc()
        version = None
    result["vllm_version"] = version
    tmp = result_file + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle)
    os.replace(tmp, result_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
