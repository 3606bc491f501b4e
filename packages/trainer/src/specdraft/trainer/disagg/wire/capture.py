"""The capture contract: request, reply, their JSON form and the reply checks (no torch).

A capture request carries a prompt's token ids and loss mask; the capture server (embedded, or
the SGLang client on its behalf) writes `input_ids`, `loss_mask`, `hidden_states` and, for
DSpark, `target_last_hidden_states` into the feature store as raw row-major bytes and replies
with their keys, shapes and dtypes. Nothing but JSON crosses the wire: no pickles, no tensors.
Every reply is checked against the request and the expected widths before anyone trusts it.
Writing and reading the tensors themselves is `store.tensors`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .keys import sample_key

# dtype names a reply may carry; only what features and token rows use (`store.tensors` maps
# them to torch dtypes).
WIRE_DTYPES = ("int64", "bfloat16", "float16", "float32")


class ProtocolError(ValueError):
    """A request or reply that does not follow the capture contract (names the field)."""


class CaptureError(RuntimeError):
    """A capture that did not produce a usable sample; the producer retries it."""


class CaptureUnavailable(CaptureError):
    """The capture server could not be reached (refused, reset, DNS)."""


class CaptureTimeout(CaptureError):
    """The capture server did not answer within the timeout."""


class CaptureRejected(CaptureError):
    """The capture server refused the request (bad prompt, too long, server error)."""


class CaptureMismatch(CaptureError):
    """The reply is for another sample, or its length, layers or widths are wrong."""


@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor lies in the store and how to read its bytes back."""

    name: str
    key: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class CaptureRequest:
    """One prompt to capture, under one attempt of one sample."""

    run: str
    sample_id: int
    attempt: int
    input_ids: list[int]
    loss_mask: list[int]


@dataclass(frozen=True)
class CaptureReply:
    """What was written for a request; sent only after every store write succeeded."""

    run: str
    sample_id: int
    attempt: int
    seq_len: int
    layer_ids: tuple[int, ...]
    hidden_size: int
    tensors: tuple[TensorMeta, ...]

    def keys(self) -> list[str]:
        """Store keys of the reply's tensors."""
        return [t.key for t in self.tensors]


@dataclass(frozen=True)
class CaptureSpec:
    """What every reply of a run must hold: the tapped layers, the width, DSpark's final state."""

    layer_ids: tuple[int, ...]
    hidden_size: int
    with_last_hidden: bool

    def tensor_names(self) -> tuple[str, ...]:
        """Names of the tensors one sample has."""
        names = ("input_ids", "loss_mask", "hidden_states")
        return (*names, "target_last_hidden_states") if self.with_last_hidden else names

    def shape_of(self, name: str, seq_len: int) -> tuple[int, ...]:
        """The shape tensor `name` must have for a prompt of `seq_len` tokens."""
        if name in ("input_ids", "loss_mask"):
            return (seq_len,)
        if name == "hidden_states":
            return (seq_len, len(self.layer_ids) * self.hidden_size)
        return (seq_len, self.hidden_size)


class CaptureClient(Protocol):
    """A capture server seen from the producer: embedded HTTP server or SGLang."""

    url: str

    def capture(self, request: CaptureRequest, *, timeout: float) -> CaptureReply:
        """Capture one prompt; raises CaptureError (a subclass says why)."""
        ...

    def health(self, *, timeout: float) -> bool:
        """Whether the server answers its health check in time."""
        ...


# ------------------------------------------------------------------------------- spec from cfg


def capture_spec(layer_ids: Sequence[int], hidden_size: int, *, algorithm: str) -> CaptureSpec:
    """The spec for `algorithm` (a draft family's name): DSpark also needs the final state."""
    # Deferred: the draft family registry imports the models (torch); the wire format does not.
    from ...models.family import family_for

    return CaptureSpec(
        layer_ids=tuple(int(x) for x in layer_ids),
        hidden_size=int(hidden_size),
        with_last_hidden=family_for(algorithm).needs_last_hidden,
    )


def target_hidden_size(target_path: str | Path) -> int:
    """`hidden_size` from the target's config.json (read as JSON: no model is loaded)."""
    path = Path(target_path) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ProtocolError(
            f"cannot read the target's {path} (config field model.target): {exc}"
        ) from exc
    # Multimodal checkpoints keep the language model's sizes under text_config.
    size = config.get("hidden_size") or config.get("text_config", {}).get("hidden_size")
    if not isinstance(size, int) or size <= 0:
        raise ProtocolError(f"{path} has no positive integer hidden_size")
    return size


# ------------------------------------------------------------------------------ JSON (de)coding


def _field(data: Mapping[str, Any], name: str, kind: type, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ProtocolError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if name not in data:
        raise ProtocolError(f"{where}: missing field {name!r}")
    value = data[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ProtocolError(f"{where}: field {name!r} must be an integer, got {value!r}")
    if kind is not int and not isinstance(value, kind):
        raise ProtocolError(f"{where}: field {name!r} must be a {kind.__name__}, got {value!r}")
    return value


def _int_list(data: Mapping[str, Any], name: str, where: str) -> list[int]:
    values = _field(data, name, list, where)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ProtocolError(f"{where}: field {name!r} must be a list of integers")
    return list(values)


def request_to_json(request: CaptureRequest) -> dict[str, Any]:
    """JSON-ready form of a request."""
    return {
        "run": request.run,
        "sample_id": request.sample_id,
        "attempt": request.attempt,
        "input_ids": list(request.input_ids),
        "loss_mask": list(request.loss_mask),
    }


def request_from_json(data: Any) -> CaptureRequest:
    """Parse and validate a request; ProtocolError names the bad field."""
    where = "capture request"
    request = CaptureRequest(
        run=_field(data, "run", str, where),
        sample_id=_field(data, "sample_id", int, where),
        attempt=_field(data, "attempt", int, where),
        input_ids=_int_list(data, "input_ids", where),
        loss_mask=_int_list(data, "loss_mask", where),
    )
    validate_request(request)
    return request


def validate_request(request: CaptureRequest) -> None:
    """Reject a request no server can capture: empty, mismatched lengths, bad ids or mask."""
    where = f"capture request for sample {request.sample_id}"
    try:
        sample_key(request.run, request.sample_id, request.attempt, "input_ids")
    except ValueError as exc:
        raise ProtocolError(f"{where}: {exc}") from exc
    if not request.input_ids:
        raise ProtocolError(f"{where}: input_ids is empty")
    if len(request.loss_mask) != len(request.input_ids):
        raise ProtocolError(
            f"{where}: loss_mask has {len(request.loss_mask)} entries for "
            f"{len(request.input_ids)} input_ids"
        )
    if any(t < 0 for t in request.input_ids):
        raise ProtocolError(f"{where}: input_ids holds a negative token id")
    if any(m not in (0, 1) for m in request.loss_mask):
        raise ProtocolError(f"{where}: loss_mask must hold only 0 and 1")


def reply_to_json(reply: CaptureReply) -> dict[str, Any]:
    """JSON-ready form of a reply."""
    return {
        "run": reply.run,
        "sample_id": reply.sample_id,
        "attempt": reply.attempt,
        "seq_len": reply.seq_len,
        "layer_ids": list(reply.layer_ids),
        "hidden_size": reply.hidden_size,
        "tensors": [
            {"name": t.name, "key": t.key, "shape": list(t.shape), "dtype": t.dtype}
            for t in reply.tensors
        ],
    }


def reply_from_json(data: Any) -> CaptureReply:
    """Parse a reply (types only; `check_reply` judges its content)."""
    where = "capture reply"
    tensors = []
    for i, item in enumerate(_field(data, "tensors", list, where)):
        at = f"{where} tensors[{i}]"
        tensors.append(
            TensorMeta(
                name=_field(item, "name", str, at),
                key=_field(item, "key", str, at),
                shape=tuple(_int_list(item, "shape", at)),
                dtype=_field(item, "dtype", str, at),
            )
        )
    return CaptureReply(
        run=_field(data, "run", str, where),
        sample_id=_field(data, "sample_id", int, where),
        attempt=_field(data, "attempt", int, where),
        seq_len=_field(data, "seq_len", int, where),
        layer_ids=tuple(_int_list(data, "layer_ids", where)),
        hidden_size=_field(data, "hidden_size", int, where),
        tensors=tuple(tensors),
    )


# ---------------------------------------------------------------------------------- the checks


def check_reply(reply: CaptureReply, request: CaptureRequest, spec: CaptureSpec) -> None:
    """Raise CaptureMismatch unless the reply is this sample's, at the right length and widths."""
    where = f"capture reply for sample {request.sample_id} attempt {request.attempt}"
    got = (reply.run, reply.sample_id, reply.attempt)
    want = (request.run, request.sample_id, request.attempt)
    if got != want:
        raise CaptureMismatch(
            f"{where}: answers run/sample/attempt {got}, not {want} (a stale or crossed reply)"
        )
    if reply.seq_len != len(request.input_ids):
        raise CaptureMismatch(
            f"{where}: seq_len {reply.seq_len} but the prompt has {len(request.input_ids)} "
            f"tokens (did the server truncate it, or reuse a cached prefix?)"
        )
    if tuple(reply.layer_ids) != spec.layer_ids:
        raise CaptureMismatch(
            f"{where}: layers {list(reply.layer_ids)} but model.target_layer_ids is "
            f"{list(spec.layer_ids)}: the server taps other layers; restart it with this config"
        )
    if reply.hidden_size != spec.hidden_size:
        raise CaptureMismatch(
            f"{where}: hidden size {reply.hidden_size} but the target's is {spec.hidden_size}: "
            f"the server runs another target model"
        )
    names = [t.name for t in reply.tensors]
    if sorted(names) != sorted(spec.tensor_names()):
        raise CaptureMismatch(f"{where}: tensors {names}, expected {list(spec.tensor_names())}")
    for meta in reply.tensors:
        shape = spec.shape_of(meta.name, len(request.input_ids))
        if tuple(meta.shape) != shape:
            raise CaptureMismatch(
                f"{where}: {meta.name} has shape {list(meta.shape)}, expected {list(shape)}"
            )
        if meta.dtype not in WIRE_DTYPES:
            raise CaptureMismatch(f"{where}: {meta.name} has unknown dtype {meta.dtype!r}")
        integer = meta.name in ("input_ids", "loss_mask")
        if integer != (meta.dtype == "int64"):
            raise CaptureMismatch(f"{where}: {meta.name} has dtype {meta.dtype}")
        key = sample_key(request.run, request.sample_id, request.attempt, meta.name)
        if meta.key != key:
            raise CaptureMismatch(f"{where}: {meta.name} is stored under {meta.key!r}, not {key!r}")
