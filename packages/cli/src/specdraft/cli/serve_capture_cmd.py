"""`specdraft serve-capture`: run the embedded capture server of a config (torch imported late)."""

from __future__ import annotations

import click

from .common import config_argument, overrides_option


@click.command("serve-capture")
@config_argument
@overrides_option
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
def serve_capture(config_path: str, overrides: tuple[str, ...], port: int, device: str) -> None:
    """Serve target features for disaggregated training: the embedded capture server.

    Loads model.target, answers POST /capture (a prompt's token ids in; its hidden states at
    model.target_layer_ids, plus the final state for DSpark, written into the feature store of
    deployment.disaggregated.store) and GET /health, on 127.0.0.1 until Ctrl-C or SIGTERM.
    Only requests carrying the run's secret are served: $SPECDRAFT_RUN_SECRET, else
    OUTPUT_DIR/disagg/secret (created, mode 0600, if missing), and only for the config's run_id.
    Prints `capture server listening on URL` once it is ready.
    """
    # The trainer package's own entry point (what the managed run starts, too); importing it
    # costs no torch until the config is known to be good.
    from specdraft.trainer.disagg.capture.main import serve

    status = serve(config_path, port=port, device=device, overrides=overrides, announce=click.echo)
    if status:
        raise SystemExit(status)
