"""`specdraft eval CONFIG --checkpoint DIR [--engine vllm|llama.cpp]`: acceptance on held-out
prompts."""

from __future__ import annotations

import json
from typing import Any

import click

from .common import config_argument, format_option, load_or_exit, overrides_option


class EvalUsageError(click.ClickException):
    """An evaluation the user must fix something for (no vLLM or llama.cpp build): exit 2."""

    exit_code = 2


@click.command("eval")
@config_argument
@click.option(
    "--checkpoint",
    required=True,
    metavar="DIR|init",
    help="A checkpoint folder (checkpoints/step-*), or 'init' for a fresh draft.",
)
@click.option(
    "--engine",
    type=click.Choice(["specdraft", "vllm", "llama.cpp"]),
    default="specdraft",
    show_default=True,
    help="specdraft: its own exact simulation of greedy verification. vllm: export the draft "
    "for vLLM, serve the same prompts with vLLM (with and without the draft) and print vLLM's "
    "measured acceptance next to specdraft's estimate. llama.cpp: the same with the draft "
    "exported to GGUF and served by llama-server (all three families).",
)
@click.option(
    "--vllm-python",
    metavar="PATH",
    default=None,
    help="Interpreter with vLLM for --engine vllm (default: build/vllm-venv/bin/python, made "
    "by scripts/vllm_cpu_venv.sh).",
)
@click.option(
    "--speed",
    is_flag=True,
    help="With --engine vllm: also measure output tokens/s of the target alone, with the draft "
    "and with vLLM's n-gram speculation, at batch 1 and at --speed-batch (the engines that "
    "served the prompts, and one more for n-gram: several minutes on CPU). With --engine "
    "llama.cpp: the same at batch 1 and with --parallel "
    "slots, for the target alone, the draft, llama.cpp's four n-gram modes and the draft at a "
    "synthetic acceptance (its measured one and every token accepted: the speed ceiling).",
)
@click.option(
    "--speed-batch",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Prompts of the batched --speed measurement (the first held-out prompts).",
)
@click.option(
    "--speed-tokens",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    help="With --engine vllm --speed: new tokens per prompt of the tokens/s measurement.",
)
@click.option(
    "--speed-draft-tokens",
    metavar="N,...",
    default=None,
    help="With --engine vllm --speed: also serve the draft and n-gram speculation at these "
    "speculative tokens per step (e.g. 3,5), beside the draft's own block_size - 1; two more "
    "engines each. On CPU a shorter step can pay where a long one does not; the table names "
    "the fastest setting at batch 1.",
)
@click.option(
    "--vllm-eager",
    is_flag=True,
    help="With --engine vllm: run vLLM's engines without torch.compile (enforce_eager). Each "
    "engine then starts without compiling (SmolLM2-135M on 2 cores: 4 s instead of 70) but "
    "decodes slower (there: 26 instead of 38 tokens/s at batch 1), so its --speed "
    "figures are not the served ones (the table says eager); for quick checks of acceptance "
    "and outputs. Default: compiled, as vLLM serves.",
)
@click.option(
    "--target-gguf",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="With --engine llama.cpp: the target's GGUF file (e.g. a quantized one). Default: "
    "the f32 GGUF of model.target, written once into the run folder's eval/.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --engine llama.cpp: llama-server's threads (-t). Its threads spin: more than "
    "the idle cores slows it down.",
)
@click.option(
    "--parallel",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="With --engine llama.cpp --speed: server slots (-np) of the batched measurement "
    "(1: batch 1 only).",
)
@click.option(
    "--speed-settings",
    metavar="NAME,...",
    default=None,
    help="With --engine llama.cpp --speed: only these settings (none, draft, ngram-simple, "
    "ngram-map-k, ngram-mod, ngram-cache, synth-measured, synth-full); the target alone and "
    "the draft are always in. Default: all.",
)
@click.option(
    "--draft-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="With --engine llama.cpp: speculative tokens per step (--spec-draft-n-max; default "
    "block_size - 1, DSpark block_size).",
)
@overrides_option
@format_option("text", "json")
def eval_(
    config_path: str,
    checkpoint: str,
    engine: str,
    vllm_python: str | None,
    speed: bool,
    speed_batch: int,
    speed_tokens: int,
    speed_draft_tokens: str | None,
    vllm_eager: bool,
    target_gguf: str | None,
    threads: int,
    parallel: int,
    speed_settings: str | None,
    draft_tokens: int | None,
    overrides: tuple[str, ...],
    fmt: str,
) -> None:
    """Measure tau: mean tokens per verification step (bonus token included) against the
    target's greedy decoding of data.eval_paths, and the acceptance rate per block position.

    \b
    With --engine vllm the acceptance is measured by vLLM serving the draft (method dflash,
    num_speculative_tokens = block_size - 1; dspark drafts block_size), greedy, from its
    spec-decode counters: acceptance length = 1 + accepted / drafts. A family the installed
    vLLM cannot run (its CPU build's V1 runner refuses DFlash2 and DSpark) is reported with
    vLLM's own reason, after vLLM has accepted the draft config, and exits 1.

    \b
    With --engine llama.cpp the draft is exported to GGUF and served by llama-server (the
    build of scripts/llama_cpp_build.sh) with the target's GGUF, greedy, one prompt at a time,
    with and without the draft; acceptance length = (generated - prompts) / (generated -
    accepted - prompts) from the responses' timings, per position from its /metrics. A draft
    llama-server refuses is reported with its own reason from its log, and exits 1.
    """
    config = load_or_exit(config_path, overrides)
    if not config.data.eval_paths:
        raise click.ClickException(
            f"{config_path}: data.eval_paths is empty; set it (or --set data.eval_paths=[...])"
        )
    from specdraft.trainer.export import ExportError

    if speed and engine == "specdraft":
        raise EvalUsageError("--speed measures serving: add --engine vllm or --engine llama.cpp")
    if vllm_eager and engine != "vllm":
        raise EvalUsageError("--vllm-eager runs vLLM's engines: add --engine vllm")
    more_tokens = _token_counts(speed_draft_tokens)
    if more_tokens and not (speed and engine == "vllm"):
        raise EvalUsageError(
            "--speed-draft-tokens adds vLLM speed settings: add --engine vllm --speed "
            "(llama.cpp: --draft-tokens)"
        )
    if engine != "llama.cpp" and (target_gguf or draft_tokens is not None or speed_settings):
        raise EvalUsageError(
            "--target-gguf, --draft-tokens and --speed-settings serve with llama.cpp: add "
            "--engine llama.cpp"
        )
    try:
        if engine == "llama.cpp":
            served_llama(
                config,
                checkpoint,
                fmt,
                speed=speed,
                target_gguf=target_gguf,
                threads=threads,
                parallel=parallel,
                draft_tokens=draft_tokens,
                speed_settings=_names(speed_settings),
            )
            return
        if engine == "vllm":
            served(
                config, checkpoint, vllm_python, fmt, speed_batch if speed else 0, speed_tokens,
                eager=vllm_eager, more_tokens=more_tokens,
            )  # fmt: skip
            return
        from specdraft.trainer.train.eval_run import evaluate_checkpoint

        result = evaluate_checkpoint(config, checkpoint)
    except ExportError as exc:
        # A missing or corrupted checkpoint file: name it, no traceback.
        raise click.ClickException(str(exc)) from None
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"tau = {result['tau']:.3f} over {int(result['steps'])} verification steps")
    rates = " ".join(f"{r:.2f}" for r in result["accept_rate_per_pos"])
    click.echo(f"acceptance per block position: {rates}")
    if result.get("capped_prompts"):
        click.echo(
            f"{int(result['capped_prompts'])} held-out prompt(s) cut from the left so prompt + "
            f"generated tokens fit data.max_length ({config.data.max_length})"
        )


def _names(value: str | None) -> list[str] | None:
    """A comma-separated option's names (None when the option is not given)."""
    if value is None:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def _token_counts(value: str | None) -> list[int]:
    """--speed-draft-tokens as positive integers, or a usage error naming the bad one."""
    counts = []
    for name in _names(value) or []:
        if not name.isdigit() or int(name) < 1:
            raise EvalUsageError(
                f"--speed-draft-tokens {value}: {name!r} is not a positive number of tokens "
                "(e.g. --speed-draft-tokens 3,5)"
            )
        counts.append(int(name))
    return counts


def served(
    config: Any,
    checkpoint: str,
    vllm_python: str | None,
    fmt: str,
    speed_batch: int = 0,
    speed_tokens: int = 128,
    eager: bool = False,
    more_tokens: list[int] | None = None,
) -> None:
    """`--engine vllm`: vLLM's measured acceptance next to specdraft's estimate (and, with a
    `speed_batch`, tokens/s with and without the draft and with n-gram speculation); `eager`:
    without torch.compile."""
    from pathlib import Path

    from specdraft.trainer.serve.served import served_acceptance
    from specdraft.trainer.serve.vllm_engine import (
        VllmChildFailed,
        VllmUnavailable,
        default_vllm_python,
    )

    if checkpoint == "init":
        raise EvalUsageError("--engine vllm serves a trained checkpoint; give a step-* folder")
    log = Path(config.output_dir) / "eval" / "vllm-serve.log"
    try:
        python = Path(vllm_python) if vllm_python else default_vllm_python()
        log.parent.mkdir(parents=True, exist_ok=True)

        also = f" (and at {', '.join(map(str, more_tokens))} tokens)" if more_tokens else ""
        speed_words = (
            ", then tokens/s: the target alone, with the draft, with n-gram speculation" + also
            if speed_batch
            else ""
        )

        def starting(version: str) -> None:
            click.echo(
                f"serving the held-out prompts with vLLM {version} ({python}), with the draft "
                f"and without{speed_words} (a few minutes on CPU; vLLM's log: {log})",
                err=True,
            )

        result = served_acceptance(
            config, checkpoint, python=python, log=log, on_start=starting,
            speed_batch=speed_batch, speed_tokens=speed_tokens, eager=eager,
            speed_more_tokens=more_tokens or (),
        )  # fmt: skip
    except VllmUnavailable as exc:
        raise EvalUsageError(str(exc)) from None
    except VllmChildFailed as exc:
        raise click.ClickException(str(exc)) from None
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo("\n".join(served_lines(result)))
        if "speed" in result:
            from specdraft.trainer.serve.speed import speed_lines

            click.echo("\n".join(speed_lines(result["speed"])))
    if result["stage"] != "done":
        raise SystemExit(1)


def served_lines(result: dict[str, Any]) -> list[str]:
    """The text report of a served evaluation."""
    draft = result.get("draft") or {}
    version = result.get("vllm_version")
    if result["stage"] == "runner":
        return [
            f"vLLM {version} accepted the draft config (method {draft.get('method')}, "
            f"architecture {', '.join(draft.get('architectures') or [])}, target layers "
            f"{draft.get('aux_hidden_state_layers')} in its aux numbering) but cannot run "
            f"the {result['family']} family on this build: {result['error']}"
        ]
    if result["stage"] != "done":
        return [f"vLLM {version} refused the {result['family']} draft: {result['error']}"]
    ours, theirs = result["specdraft"], result["vllm"]

    def rates(values: list[float]) -> str:
        return " ".join(f"{v:.2f}" for v in values)

    same = "identical" if result["outputs_identical"] else "DIFFERENT"
    return [
        f"{result['prompts']} held-out prompts, {result['family']} draft, vLLM {version} "
        f"(method {draft.get('method')}, {result['num_speculative_tokens']} draft tokens)",
        f"acceptance length: vLLM {theirs['acceptance_length']:.3f} "
        f"({int(theirs['drafts'])} drafts), specdraft estimate {ours['acceptance_length']:.3f} "
        f"({int(ours['steps'])} steps)",
        f"acceptance per position (given the one before): vLLM "
        f"{rates(theirs['per_position_given_previous'])}",
        f"                                          specdraft "
        f"{rates(ours['per_position_given_previous'])}",
        f"greedy outputs with and without the draft: {same} "
        f"({result['identical_outputs']} of {result['prompts']}); vLLM's greedy output equals "
        f"the HF target's on {result['matches_target_greedy']} of {result['prompts']}",
    ]


def served_llama(
    config: Any,
    checkpoint: str,
    fmt: str,
    *,
    speed: bool,
    target_gguf: str | None,
    threads: int,
    parallel: int,
    draft_tokens: int | None,
    speed_settings: list[str] | None = None,
) -> None:
    """`--engine llama.cpp`: llama-server's acceptance next to specdraft's estimate (and with
    `speed` the tokens/s table); exit 2 without a build, 1 when llama-server refuses the draft."""
    from pathlib import Path

    from specdraft.trainer.serve.llama_cpp_build import LlamaCpp, LlamaCppUnavailable
    from specdraft.trainer.serve.llama_report import llama_served_lines, llama_speed_lines
    from specdraft.trainer.serve.llama_served import served_llama_cpp
    from specdraft.trainer.serve.llama_server import LlamaServerFailed

    if checkpoint == "init":
        raise EvalUsageError("--engine llama.cpp serves a trained checkpoint; give a step-* folder")
    logs = Path(config.output_dir) / "eval" / "llama.cpp"

    def starting(build: LlamaCpp) -> None:
        click.echo(
            f"serving the held-out prompts with llama.cpp build {build.build_number} "
            f"({build.server}), with the draft and without"
            f"{', then the speed settings' if speed else ''} (llama-server's logs: {logs})",
            err=True,
        )

    try:
        result = served_llama_cpp(
            config,
            checkpoint,
            target_gguf=Path(target_gguf) if target_gguf else None,
            threads=threads,
            speed=speed,
            parallel=parallel,
            draft_tokens=draft_tokens,
            speed_settings=speed_settings,
            log_dir=logs,
            on_start=starting,
        )
    except LlamaCppUnavailable as exc:
        raise EvalUsageError(str(exc)) from None
    except ValueError as exc:  # --draft-tokens outside the family's block, an unknown setting
        raise EvalUsageError(str(exc)) from None
    except LlamaServerFailed as exc:
        raise click.ClickException(f"{exc}") from None
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo("\n".join(llama_served_lines(result)))
        if "speed" in result:
            click.echo("\n".join(llama_speed_lines(result)))
    if result["stage"] != "done":
        raise SystemExit(1)
