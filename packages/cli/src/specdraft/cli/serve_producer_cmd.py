"""`specdraft serve-producer`: run the producer of a disaggregated run (torch imported late)."""

from __future__ import annotations

import click

from .common import config_argument, load_or_exit, overrides_option


@click.command("serve-producer")
@config_argument
@overrides_option
@click.option(
    "--run-dir",
    default=None,
    metavar="DIR",
    help="Run folder: ledger, feature store, controller address (default: the config's "
    "output_dir, where the trainers look).",
)
@click.option(
    "--capture-url",
    "capture_urls",
    multiple=True,
    metavar="URL",
    help="A capture server's base URL (repeatable; default: "
    "deployment.disaggregated.capture_urls).",
)
@click.option(
    "--prompts",
    default=None,
    type=click.Path(dir_okay=False),
    help="Pre-tokenised JSONL rows (sample_id, input_ids, loss_mask) instead of data.train_paths.",
)
@click.option("--host", default=None, help="Controller bind address (default: controller_host).")
@click.option(
    "--port", type=click.IntRange(min=0, max=65535), default=None, help="Controller port."
)
@click.option("--exit-when-done", is_flag=True, help="Exit once every step is acknowledged.")
def serve_producer(
    config_path: str,
    overrides: tuple[str, ...],
    run_dir: str | None,
    capture_urls: tuple[str, ...],
    prompts: str | None,
    host: str | None,
    port: int | None,
    exit_when_done: bool,
) -> None:
    """Lease prompts to capture servers and serve optimizer windows to the trainer ranks.

    \b
    The producer of a disaggregated run that is not managed (deployment.disaggregated.managed =
    false): it tokenises data.train_paths, plans every window with the trainers' sampler,
    resumes from the run folder's ledger, and serves the window controller, whose address it
    writes to RUN_DIR/disagg/controller.json. Start the capture servers first (`specdraft
    serve-capture`), then this, then `specdraft train` with the same config. Runs until
    SIGTERM or Ctrl-C. Exit status: 0 stopped or done, 1 the producer failed, 2 bad config,
    data or arguments.
    """
    config = load_or_exit(config_path, overrides)
    argv = ["--config", config_path, "--run-dir", run_dir or str(config.output_dir)]
    for item in overrides:
        argv += ["--set", item]
    for url in capture_urls:
        argv += ["--capture-url", url]
    if prompts is not None:
        argv += ["--prompts", prompts]
    if host is not None:
        argv += ["--host", host]
    if port is not None:
        argv += ["--port", str(port)]
    if exit_when_done:
        argv.append("--exit-when-done")
    # The trainer package's own entry point, the one the managed run's supervisor starts.
    from specdraft.trainer.disagg.producer.main import main

    status = main(argv)
    if status:
        raise SystemExit(status)
