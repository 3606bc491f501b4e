"""The embedded capture server as its own process:

    python -m specdraft.trainer.disagg.capture CONFIG [--port P] [--device D] [--set key=value ...]

`specdraft serve-capture CONFIG` is the same for users; the managed run starts this module. It
serves until SIGTERM or Ctrl-C and prints `capture server listening on URL` once it is ready.
Exit status: 0 stopped, 2 a config, run folder or store that cannot be used (the message names
the file and the field).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from specdraft.config import ConfigError, load_config

# Exit status of a config or option that cannot be used (the lint convention).
EXIT_FATAL = 2


def serve(
    config_path: str,
    *,
    port: int = 0,
    device: str = "cpu",
    overrides: Sequence[str] = (),
    announce: Callable[[str], None] = print,
) -> int:
    """Serve the config's capture server until SIGTERM or SIGINT; the exit status.

    `announce` prints the ready line (the CLI passes click.echo); errors go to stderr.
    """
    try:
        config = load_config(config_path, list(overrides))
    except ConfigError as err:
        return _fail(str(err))
    # torch and transformers only once the config is known to be good.
    from ...runtime.private import run_folder
    from ...runtime.run_secret import SecretError, ensure_run_secret
    from ...runtime.service_process import ServiceError
    from ..store import StoreError, open_store
    from .server import build_capture_server

    run_dir = Path(config.output_dir)
    try:
        # output_dir keeps its mode; disagg/ and the store inside it are private.
        run_folder(run_dir)
        secret = ensure_run_secret(run_dir)
    except (OSError, SecretError) as err:
        return _fail(f"serve-capture: {config_path}: run folder {run_dir} (output_dir): {err}")
    try:
        store = open_store(config.deployment.disaggregated, run_dir, role="capture")
    except (StoreError, ServiceError, ValueError) as err:
        return _fail(f"serve-capture: {config_path}: feature store: {err}")
    try:
        server = build_capture_server(config, store, port=port, device=device, secret=secret)
    except (OSError, ValueError) as err:
        store.close()
        return _fail(f"serve-capture: {config_path}: {err}")

    def _stop(signum: int, _frame: object) -> None:
        # shutdown() waits for the serving loop: call it from another thread.
        threading.Thread(target=server.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    announce(f"capture server listening on {server.url}")
    try:
        server.serve_forever()
    finally:
        store.close()
    return 0


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return EXIT_FATAL


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and serve; the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m specdraft.trainer.disagg.capture",
        description="Serve target features for disaggregated training (embedded capture server).",
    )
    parser.add_argument("config", help="specdraft TOML config")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 = any)")
    parser.add_argument("--device", default="cpu", help="where the target runs: cpu, cuda, ...")
    parser.add_argument("--set", action="append", default=[], help="config override key=value")
    args = parser.parse_args(argv)
    # The ready line is read by whoever started this process: do not leave it in a buffer.
    return serve(
        args.config,
        port=args.port,
        device=args.device,
        overrides=args.set,
        announce=lambda line: print(line, flush=True),
    )
