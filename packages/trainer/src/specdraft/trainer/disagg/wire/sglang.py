"""The SGLang leg of the capture contract: tagged request ids, the feature reference the
specdraft SGLang plugin puts in `meta_info`, and the plugin's settings file (no torch).

- A capture's SGLang request id is `{run}/{sample}/g{attempt}/{tag}`, the tag an HMAC of the
  rest under the run's secret. SGLang's HTTP API is not authenticated, so the tag is what tells
  the plugin that a request is specdraft's and of this run: a request whose id does not carry a
  valid tag is left exactly as stock SGLang treats it, and can never write into the store.
- The plugin writes the request's features into the feature store and answers, in
  `meta_info.hidden_states`, one object `{"specdraft_features": 1, ...}`: the capture reply
  (`reply_to_json`) of the tensors it wrote. The client adds `input_ids` and `loss_mask`,
  which SGLang never sees.
- The launcher hands the plugin its settings (run, secret, layers, store) in a 0600 JSON file
  named by $SPECDRAFT_SGLANG_CAPTURE, never through a request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...runtime.private import write_private
from .capture import CaptureReply, CaptureRequest, reply_from_json, reply_to_json

# Marker key (and format version) of a feature reference in meta_info.hidden_states.
FEATURES_REF_KEY = "specdraft_features"
FEATURES_REF_VERSION = 1
# The sample name of the start-up probe, which writes nothing.
PROBE = "probe"
PLUGIN_CONFIG_ENV = "SPECDRAFT_SGLANG_CAPTURE"
PLUGIN_CONFIG_NAME = "sglang-capture.json"
# The tensors the plugin writes; the client writes the token rows itself.
PLUGIN_TENSORS = ("hidden_states", "target_last_hidden_states")
TOKEN_TENSORS = ("input_ids", "loss_mask")
_TAG_HEX = 32


@dataclass(frozen=True)
class CaptureRid:
    """What a tagged request id names: a capture attempt, or (`sample_id` None) the probe."""

    run: str
    sample_id: int | None
    attempt: int


def _tag(base: str, secret: str) -> str:
    return hmac.new(secret.encode(), base.encode(), hashlib.sha256).hexdigest()[:_TAG_HEX]


def capture_rid(request: CaptureRequest, secret: str | None) -> str:
    """The SGLang request id of a capture: `{run}/{sample}/g{attempt}`, tagged with the secret."""
    base = f"{request.run}/{request.sample_id}/g{request.attempt}"
    return f"{base}/{_tag(base, secret)}" if secret else base


def probe_rid(run: str, secret: str | None) -> str:
    """The request id of the start-up probe: `{run}/probe`, tagged."""
    base = f"{run}/{PROBE}"
    return f"{base}/{_tag(base, secret)}" if secret else base


def parse_capture_rid(rid: Any, secret: str) -> CaptureRid | None:
    """The capture a request id names, or None unless its tag is valid under `secret`."""
    if not isinstance(rid, str) or rid.count("/") not in (2, 3):
        return None
    base, _, tag = rid.rpartition("/")
    if len(tag) != _TAG_HEX or not hmac.compare_digest(tag, _tag(base, secret)):
        return None
    parts = base.split("/")
    if len(parts) == 2 and parts[1] == PROBE:
        return CaptureRid(parts[0], None, 0)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].startswith("g"):
        return None
    if not parts[2][1:].isdigit():
        return None
    return CaptureRid(parts[0], int(parts[1]), int(parts[2][1:]))


def features_ref_to_json(reply: CaptureReply) -> dict[str, Any]:
    """The reference the plugin answers: the reply of what it wrote, marked."""
    return {FEATURES_REF_KEY: FEATURES_REF_VERSION, **reply_to_json(reply)}


def probe_ref_to_json(settings: PluginSettings, width: int) -> dict[str, Any]:
    """The plugin's answer to the probe: its settings and the row width it saw (no write)."""
    return {
        FEATURES_REF_KEY: FEATURES_REF_VERSION,
        PROBE: True,
        "run": settings.run_id,
        "layer_ids": list(settings.layer_ids),
        "hidden_size": settings.hidden_size,
        "with_last_hidden": settings.with_last_hidden,
        "row_width": width,
    }


def is_features_ref(value: Any) -> bool:
    """Whether a meta_info.hidden_states entry is the plugin's reference."""
    return isinstance(value, dict) and value.get(FEATURES_REF_KEY) == FEATURES_REF_VERSION


def features_ref_from_json(value: Any) -> CaptureReply:
    """Parse a reference (types only; the caller checks it with `check_reply`)."""
    return reply_from_json({k: v for k, v in value.items() if k != FEATURES_REF_KEY})


# ------------------------------------------------------------------------- plugin settings


@dataclass(frozen=True)
class PluginSettings:
    """What the plugin inside SGLang needs to write a run's features: written by the launcher."""

    run_id: str
    secret: str
    layer_ids: tuple[int, ...]
    hidden_size: int
    with_last_hidden: bool
    dtype: str
    store: str
    run_dir: str
    # The chosen store's `[deployment.disaggregated.<store>]` table ({} for a store without).
    store_settings: dict[str, Any] = field(default_factory=dict)
    store_timeout_s: float = 30.0

    def disaggregated(self) -> Any:
        """The store's part of the run's `[deployment.disaggregated]` table, to open it with."""
        from specdraft.config import DisaggregatedConfig

        tables = {self.store: self.store_settings} if self.store_settings else {}
        return DisaggregatedConfig(store=self.store, store_timeout_s=self.store_timeout_s, **tables)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**self.__dict__, "layer_ids": list(self.layer_ids)}


def write_plugin_settings(path: Path, settings: PluginSettings) -> Path:
    """Write the settings file, 0600 (it holds the run's secret)."""
    return write_private(path, json.dumps(settings.to_json()).encode())


def read_plugin_settings(path: str | Path) -> PluginSettings:
    """Read the settings file; ValueError naming the file and the field (or the mode to fix)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read ${PLUGIN_CONFIG_ENV} = {path}: {exc}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path} holds the run's secret but others can read it: chmod 600 {path}")
    fields = {
        "run_id": str,
        "secret": str,
        "layer_ids": list,
        "hidden_size": int,
        "with_last_hidden": bool,
        "dtype": str,
        "store": str,
        "run_dir": str,
    }
    for name, kind in fields.items():
        if not isinstance(data, dict) or not isinstance(data.get(name), kind):
            raise ValueError(f"{path}: field {name!r} is missing or not a {kind.__name__}")
    from specdraft.config.stores import STORE_NAMES

    if data["store"] not in STORE_NAMES:
        raise ValueError(
            f"{path}: field 'store' is {data['store']!r}, not one of {', '.join(STORE_NAMES)}"
        )
    return PluginSettings(
        run_id=data["run_id"],
        secret=data["secret"],
        layer_ids=tuple(int(k) for k in data["layer_ids"]),
        hidden_size=data["hidden_size"],
        with_last_hidden=data["with_last_hidden"],
        dtype=data["dtype"],
        store=data["store"],
        run_dir=data["run_dir"],
        store_settings=dict(data.get("store_settings") or {}),
        store_timeout_s=float(data.get("store_timeout_s", 30.0)),
    )
