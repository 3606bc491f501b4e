"""`specdraft serve-capture`: run the embedded capture server of a config (torch imported late)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

# Exit status of a config or option that cannot be used (the lint convention).
EXIT_FATAL = 2


def _fail(message: str) -> None:
    click.echo(message, err=True)
    raise SystemExit(EXIT_FATAL)


@click.command("serve-capture")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=0,
    show_default=True,
    help="Port on 127.0.0.1 (0 picks a free one; the URL is printed).",
)
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="Where the target runs: cpu, cuda, cuda:1, ...",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config value, e.g. --set deployment.disaggregated.store=mooncake "
    "(repeatable).",
)
def serve_capture(config_path: str, port: int, device: str, overrides: tuple[str, ...]) -> None:
    """Serve target features for disaggregated training: the embedded capture server.

    Loads model.target, answers POST /capture (a prompt's token ids in; its hidden states at
    model.target_layer_ids, plus the final state for DSpark, written into the feature store of
    deployment.disaggregated.store) and GET /health, on 127.0.0.1 until Ctrl-C or SIGTERM.
    Only requests carrying the run's secret are served: $SPECDRAFT_RUN_SECRET, else
    OUTPUT_DIR/disagg/secret (created, mode 0600, if missing), and only for the config's run_id.
    Prints `capture server listening on URL` once it is ready.
    """
    from specdraft.config import ConfigError, load_config

    try:
        config = load_config(config_path, overrides)
    except ConfigError as err:
        _fail(str(err))

    # torch and transformers only once the config is known to be good.
    from specdraft.trainer.disagg import (
        ServiceError,
        StoreError,
        build_capture_server,
        open_store,
    )
    from specdraft.trainer.disagg.http_json import SecretError, ensure_run_secret, run_folder

    run_dir = Path(config.output_dir)
    try:
        # output_dir keeps its mode; disagg/ and the store inside it are private.
        run_folder(run_dir)
        secret = ensure_run_secret(run_dir)
    except (OSError, SecretError) as err:
        _fail(f"serve-capture: {config_path}: run folder {run_dir} (output_dir): {err}")
    try:
        store = open_store(config.deployment.disaggregated, run_dir, role="capture")
    except (StoreError, ServiceError, ValueError) as err:
        _fail(f"serve-capture: {config_path}: feature store: {err}")
    try:
        server = build_capture_server(config, store, port=port, device=device, secret=secret)
    except (OSError, ValueError) as err:
        store.close()
        _fail(f"serve-capture: {config_path}: {err}")

    def _stop(signum: int, _frame: object) -> None:
        # shutdown() waits for the serving loop: call it from another thread.
        threading.Thread(target=server.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    click.echo(f"capture server listening on {server.url}")
    try:
        server.serve_forever()
    finally:
        store.close()
