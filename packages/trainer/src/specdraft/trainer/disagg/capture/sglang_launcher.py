"""Managed SGLang capture servers: ask the installed SGLang which capture flags it has, build the
`launch_server` command, start it, health-check it, stream its log to a file, stop it.

SGLang is an optional extra (it pulls CUDA wheels) and is imported nowhere: it runs as a child
`python -m <module>`, and its interface is read by a child Python too. The module is a parameter
so the tests start `sglang_stub` through this very code path.

Two capture interfaces exist (read in SGLang's `server_args` / `arg_groups`):
- "0.5.23": `--enable-return-aux-hidden-states --speculative-algorithm DFLASH|DSPARK
  --return-aux-hidden-state-layer-ids K...`; the algorithm only names the capture convention (no
  draft is loaded, `--speculative-draft-model-path` is refused), DFLASH/DSPARK require the layer
  ids (non-empty, non-negative, no repeats), pp_size must be 1.
- "aux-capture" (SGLang's main after 0.5.23): `--aux-hidden-state-capture dflash|dspark
  --aux-hidden-state-layer-ids K...`, refused together with `--speculative-algorithm`.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...runtime.http_client import HttpFailure, call_json
from ...runtime.service_process import ServiceError, ServiceProcess, run_to_end
from ..wire.sglang import (
    PLUGIN_CONFIG_ENV,
    PLUGIN_CONFIG_NAME,
    PluginSettings,
    write_plugin_settings,
)

if TYPE_CHECKING:
    from specdraft.config import Config

log = logging.getLogger(__name__)

SGLANG_MODULE = "sglang.launch_server"
SERVER_ARGS_MODULE = "sglang.srt.server_args"
INTERFACES = ("0.5.23", "aux-capture")

# --enable-return-hidden-states lets /generate return hidden states at all;
# --disable-radix-cache makes every prompt prefill in full, so no cached prefix is missing from
# the returned rows.
CAPTURE_FLAGS = ("--enable-return-hidden-states", "--disable-radix-cache")
# Only without the specdraft plugin: stock SGLang 0.5.23 keeps the hidden states of a chunked
# prefill's LAST chunk only (middle chunks are processed with store=False), so each prompt must
# prefill in one chunk. The plugin collects every chunk itself and needs no such flag.
ONE_CHUNK_FLAGS = ("--chunked-prefill-size", "-1")
PLUGIN_DIST = "specdraft-sglang-plugin"

# The child that says which specdraft plugin is installed next to SGLang and which SGLang it
# was built for: entry points and versions only, nothing of SGLang is imported.
_PLUGIN_PROBE = (
    "import json\n"
    "from importlib.metadata import entry_points, version\n"
    "out = None\n"
    "for ep in entry_points(group='sglang.srt.plugins'):\n"
    f"    if ep.dist is not None and ep.dist.name == {PLUGIN_DIST!r}:\n"
    "        import specdraft_sglang_plugin as plugin\n"
    "        out = [ep.dist.version, plugin.BUILT_FOR_SGLANG, version('sglang')]\n"
    "print(json.dumps(out))\n"
)

# The child that reads the installed SGLang's ServerArgs field names: a msgspec Struct in
# 0.5.23 (`__struct_fields__`), a dataclass in older and test builds, annotations otherwise.
# Importing server_args needs no GPU. The last stdout line is the JSON list.
_FIELDS_PROBE = (
    "import dataclasses, importlib, json, sys\n"
    "cls = importlib.import_module(sys.argv[1]).ServerArgs\n"
    "if dataclasses.is_dataclass(cls):\n"
    "    names = [f.name for f in dataclasses.fields(cls)]\n"
    "else:\n"
    "    names = getattr(cls, '__struct_fields__', None) or getattr(cls, '__annotations__', {})\n"
    "print(json.dumps(sorted(list(names))))\n"
)


class SGLangInterfaceError(RuntimeError):
    """The installed SGLang cannot be asked, or has no aux hidden-state capture we know."""


def speculative_algorithm(algorithm: str) -> str:
    """SGLang's --speculative-algorithm for a draft family: DFLASH (dflash, dflash2) or DSPARK."""
    from ...models.family import family_for

    return family_for(algorithm).sglang_algorithm


def interface_from_fields(fields: Sequence[str]) -> str:
    """The capture interface a set of ServerArgs field names belongs to."""
    names = set(fields)
    if "return_aux_hidden_state_layer_ids" in names:
        return "0.5.23"
    if "aux_hidden_state_layer_ids" in names:
        return "aux-capture"
    raise SGLangInterfaceError(
        "the installed SGLang's ServerArgs has neither return_aux_hidden_state_layer_ids "
        "(0.5.23) nor aux_hidden_state_layer_ids (later builds): it cannot capture target "
        "layers; install sglang>=0.5.23, or set deployment.disaggregated.sglang_interface"
    )


def detect_sglang_interface(
    python: str | None = None,
    *,
    server_args_module: str = SERVER_ARGS_MODULE,
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
) -> str:
    """Ask `python` (a child process) which capture interface its SGLang has, from the
    field names of its ServerArgs."""
    python = python or sys.executable
    try:
        done = run_to_end(
            [python, "-c", _FIELDS_PROBE, server_args_module],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if env is None else {**os.environ, **env},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SGLangInterfaceError(
            f"cannot ask {python} for {server_args_module}.ServerArgs: {exc}"
        ) from exc
    lines = done.stdout.strip().splitlines()
    try:
        fields = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except json.JSONDecodeError:
        fields = None
    if not isinstance(fields, list):
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise SGLangInterfaceError(
            f"{python} could not import {server_args_module}.ServerArgs (exit {done.returncode}):"
            f"\n{tail}\ninstall SGLang there (pip install 'specdraft-trainer[sglang]'), or set "
            f"deployment.disaggregated.sglang_interface to skip this check"
        )
    return interface_from_fields(fields)


def capture_args(algorithm: str, layer_ids: Sequence[int], interface: str) -> list[str]:
    """The aux hidden-state capture flags of one interface for a draft family's layers."""
    # SGLang returns the tapped layers in ascending order whatever order it is given; sorted
    # here so the command says what the reply will hold (the client restores config order).
    ids = [str(k) for k in sorted(layer_ids)]
    method = speculative_algorithm(algorithm)
    if interface == "0.5.23":
        return [
            "--enable-return-aux-hidden-states",
            "--speculative-algorithm",
            method,
            "--return-aux-hidden-state-layer-ids",
            *ids,
        ]
    if interface == "aux-capture":
        return ["--aux-hidden-state-capture", method.lower(), "--aux-hidden-state-layer-ids", *ids]
    raise ValueError(f"unknown SGLang interface {interface!r}; expected one of {INTERFACES}")


def resolve_interface(
    cfg: Config,
    *,
    python: str | None = None,
    server_args_module: str = SERVER_ARGS_MODULE,
    env: Mapping[str, str] | None = None,
) -> str:
    """deployment.disaggregated.sglang_interface, or what the installed SGLang says ('auto')."""
    forced = cfg.deployment.disaggregated.sglang_interface
    if forced != "auto":
        return forced
    return detect_sglang_interface(python, server_args_module=server_args_module, env=env)


def plugin_version(python: str | None = None, *, timeout: float = 60.0) -> str | None:
    """The version of the specdraft SGLang plugin installed for `python` if it was built for
    the SGLang installed there (else it refuses to load and the JSON path is used), or None."""
    try:
        done = run_to_end(
            [python or sys.executable, "-c", _PLUGIN_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    if not isinstance(found, list) or len(found) != 3:
        return None
    ours, built_for, installed = found
    if built_for != installed:
        log.warning(
            "%s %s was built for SGLang %s, but SGLang %s is installed: it will refuse to load, "
            "and capture takes the slow JSON path; install the plugin built for SGLang %s",
            PLUGIN_DIST,
            ours,
            built_for,
            installed,
            installed,
        )
        return None
    return str(ours)


def plugin_settings(cfg: Config, secret: str) -> PluginSettings:
    """What the plugin inside a managed SGLang server needs to write this run's features."""
    from ..wire.capture import capture_spec, target_hidden_size

    model, dis = cfg.model, cfg.deployment.disaggregated
    spec = capture_spec(
        model.target_layer_ids, target_hidden_size(model.target), algorithm=model.algorithm
    )
    return PluginSettings(
        run_id=cfg.run_id,
        secret=secret,
        layer_ids=spec.layer_ids,
        hidden_size=spec.hidden_size,
        with_last_hidden=spec.with_last_hidden,
        dtype="bfloat16",
        store=dis.store,
        run_dir=str(Path(cfg.output_dir).resolve()),
        store_settings=store_settings_json(dis),
        store_timeout_s=dis.store_timeout_s,
    )


def store_settings_json(dis: Any) -> dict[str, Any]:
    """The chosen store's settings table as JSON ({} for a store without settings)."""
    from specdraft.config.stores import STORE_RULES

    settings = STORE_RULES[dis.store].settings_of(dis)
    return {} if settings is None else settings.model_dump()


def plugin_environment(cfg: Config, secret: str) -> dict[str, str]:
    """Write `<output_dir>/disagg/sglang-capture.json` (0600: it holds the secret) and return
    the environment that hands it to the plugin inside SGLang."""
    from ...runtime.private import private_dir

    folder = private_dir(Path(cfg.output_dir) / "disagg")
    path = write_plugin_settings(folder / PLUGIN_CONFIG_NAME, plugin_settings(cfg, secret))
    return {PLUGIN_CONFIG_ENV: str(path)}


def sglang_command(
    cfg: Config,
    *,
    port: int,
    module: str = SGLANG_MODULE,
    python: str | None = None,
    interface: str | None = None,
    extra_args: Sequence[str] = (),
    plugin: bool | None = None,
) -> list[str]:
    """`python -m sglang.launch_server --model-path … --host 127.0.0.1 --port …`, the capture
    flags of `interface` (default: resolved from the config / the installed SGLang), then
    `deployment.disaggregated.sglang_args`, then `extra_args`. `plugin` says whether the
    specdraft plugin runs in the server (default: whether it is installed for `python`);
    without it each prompt is prefilled in one chunk."""
    if interface is None:
        interface = resolve_interface(
            cfg, python=python, server_args_module=server_args_module_of(module)
        )
    if plugin is None:
        plugin = plugin_version(python) is not None
    return [
        python or sys.executable,
        "-m",
        module,
        "--model-path",
        str(cfg.model.target),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *CAPTURE_FLAGS,
        *(() if plugin else ONE_CHUNK_FLAGS),
        *capture_args(cfg.model.algorithm, cfg.model.target_layer_ids, interface),
        *cfg.deployment.disaggregated.sglang_args,
        *extra_args,
    ]


def server_args_module_of(module: str) -> str:
    """Where the ServerArgs of a launch module live: SGLang's own, or the module itself."""
    return SERVER_ARGS_MODULE if module == SGLANG_MODULE else module


class ManagedSGLang:
    """One SGLang server started by the run; `url` once `start` returned."""

    def __init__(
        self,
        cfg: Config,
        *,
        port: int,
        log_path: Path,
        module: str = SGLANG_MODULE,
        extra_args: Sequence[str] = (),
        secret: str | None = None,
        plugin: bool | None = None,
    ) -> None:
        if plugin is None:
            plugin = plugin_version() is not None
        # With the run's secret the plugin gets its settings and writes the features itself.
        self.env = plugin_environment(cfg, secret) if plugin and secret else {}
        self.command = sglang_command(
            cfg, port=port, module=module, extra_args=extra_args, plugin=bool(self.env)
        )
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = Path(log_path)
        self.health_timeout_s = cfg.deployment.disaggregated.health_timeout_s
        self.shutdown_timeout_s = cfg.deployment.disaggregated.shutdown_timeout_s
        self.process: ServiceProcess | None = None

    def start(self) -> ManagedSGLang:
        """Start the server and wait until GET /health answers; ServiceError with the log tail."""
        self.process = ServiceProcess(
            "SGLang capture server", self.command, self.log_path, env=self.env
        )
        try:
            self.process.wait_ready(
                self.healthy, timeout=self.health_timeout_s, what=f"healthy at {self.url}"
            )
        except ServiceError:
            self.stop()
            raise
        return self

    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether GET /health answers 200."""
        try:
            call_json("GET", f"{self.url}/health", timeout=timeout)
        except HttpFailure:
            return False
        return True

    def alive(self) -> bool:
        """Whether the server process still runs."""
        return self.process is not None and self.process.alive()

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after deployment.disaggregated.shutdown_timeout_s."""
        if self.process is None:
            return None
        return self.process.stop(grace=self.shutdown_timeout_s)

    def __enter__(self) -> ManagedSGLang:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
