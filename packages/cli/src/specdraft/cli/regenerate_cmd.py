"""`specdraft regenerate CONFIG --out FILE.jsonl`: the corpus with the target's own answers."""

from __future__ import annotations

import shlex
from typing import Any

import click
from click.core import ParameterSource

from .common import config_argument, load_or_exit, overrides_option


@click.command("regenerate")
@config_argument
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=str),
    help="The JSONL file to write (or to finish: rows already there are kept).",
)
@click.option(
    "--first",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="First record (counted over all sources, bad rows included).",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Records to regenerate from --first [default: to the end].",
)
@click.option(
    "--source",
    "sources",
    multiple=True,
    metavar="SPEC",
    help="Conversations to regenerate (.json/.jsonl file or pkg:sharegpt) instead of "
    "data.train_paths. Repeatable.",
)
@click.option(
    "--endpoint",
    default=None,
    metavar="URL",
    help="An OpenAI-compatible server (e.g. SGLang at http://127.0.0.1:30000) serving the "
    "target; default: run model.target in-process.",
)
@click.option(
    "--model",
    default=None,
    metavar="NAME",
    help="Model name sent to --endpoint [default: the first one it lists].",
)
@click.option(
    "--api-key",
    default=None,
    envvar="OPENAI_API_KEY",
    show_envvar=True,
    metavar="KEY",
    help="Sent to --endpoint as `Authorization: Bearer KEY`; never logged or written.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True, max=86400),
    default=600.0,
    show_default=True,
    help="Seconds one --endpoint request may take (a request that times out is retried: see "
    "--retry-for).",
)
@click.option(
    "--retry-for",
    "retry_for_s",
    type=click.FloatRange(min=0, max=7 * 86400),
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for an --endpoint that stops answering mid-run (connection refused "
    "or dropped, timeout, 429/5xx) before stopping: requests are retried with backoff (1 s "
    "doubling to 30 s, with jitter), the wait counts from the first failure and starts over "
    "whenever the server answers, and the progress bar says how long it has waited. Each "
    "request is retried 3 times in any case; 0: only those, as before. Finished answers are "
    "kept; a stopped run prints the command that resumes it.",
)
@click.option(
    "--max-new-tokens",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Longest answer per assistant turn.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Conversations answered together: one padded batch in-process, concurrent requests "
    "to --endpoint. Keep it when resuming for byte-identical output.",
)
@overrides_option
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def regenerate(
    config_path: str,
    out: str,
    first: int,
    count: int | None,
    sources: tuple[str, ...],
    endpoint: str | None,
    model: str | None,
    api_key: str | None,
    timeout_s: float,
    retry_for_s: float,
    max_new_tokens: int,
    batch_size: int,
    overrides: tuple[str, ...],
    no_progress: bool,
) -> None:
    """Rewrite the assistant turns of CONFIG's conversations with the target's greedy answers.

    \b
    Turn by turn: each assistant turn is replaced by the target's answer to the conversation
    so far (earlier answers already replaced), rendered with data.chat_template and stopped at
    the end-of-turn token; a conversation stops where its prompt reaches data.max_length.
    Writes ShareGPT JSONL (id, source_row, conversations) for data.train_paths. Interrupted
    runs resume: rerun the same command and rows already in --out are skipped. A turn the
    endpoint answers without text (null or non-string content) skips its conversation, counted
    as bad_answer. Ctrl-C stops at once; rows already written stay, and so do the finished
    answers of the batch in flight (in the --out file's .pending companion, which the rerun
    reads). An --endpoint that stops answering mid-run is waited for (see --retry-for).
    """
    config = load_or_exit(config_path, overrides)
    from specdraft.trainer.regenerate import RegenerateError, regenerate_from_config

    try:
        result = regenerate_from_config(
            config,
            out,
            first=first,
            count=count,
            sources=sources,
            endpoint=endpoint,
            model=model,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            progress=not no_progress,
            api_key=api_key,
            timeout_s=timeout_s,
            retry_for_s=retry_for_s,
        )
    except RegenerateError as exc:
        message = f"{config_path}: {exc}"
        if exc.result is not None:
            message += f"\n{exc.result.describe_kept()}"
        if exc.resumable:
            message += (
                "\nResume with the same command once the server answers again (rows written "
                "are kept, kept answers are not asked again):\n  "
                + resume_command(click.get_current_context())
            )
        raise click.ClickException(message) from None
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(f"{config_path}: {exc}") from None
    click.echo(result.describe())


def resume_command(ctx: click.Context) -> str:
    """The command line that reruns this command with the same arguments, minus the API key."""
    words = ["specdraft", ctx.info_name or "regenerate"]
    for param in ctx.command.params:
        name = param.name or ""
        if ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
            continue  # a default or the environment: the rerun gets it the same way
        value: Any = ctx.params[name]
        if isinstance(param, click.Argument):
            words.append(str(value))
            continue
        flag = max(param.opts, key=len)
        if name == "api_key":
            # Never print the key: a placeholder the user fills in (or OPENAI_API_KEY).
            words += [flag, "KEY"]
        elif getattr(param, "is_flag", False):
            if value:
                words.append(flag)
        else:
            for item in value if getattr(param, "multiple", False) else [value]:
                words += [flag, f"{item:g}" if isinstance(item, float) else str(item)]
    return shlex.join(words)
