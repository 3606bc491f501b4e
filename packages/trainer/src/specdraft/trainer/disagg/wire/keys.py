"""Feature-store object keys: `{run}/{sample}/g{attempt}/{name}`, one per tensor per attempt.

Keys travel in capture replies and sample references, so their form is part of the wire
contract; the stores treat them as opaque strings.
"""

from __future__ import annotations

import re

# The tensors one sample has in the store; DSpark adds the final hidden state.
TENSOR_NAMES = ("input_ids", "loss_mask", "hidden_states", "target_last_hidden_states")

# Same alphabet as `Config.run_id`, so every run id makes a valid key prefix.
_RUN_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_KEY_RE = re.compile(r"^(?P<run>[A-Za-z0-9._-]+)/(?P<sample>\d+)/g(?P<attempt>\d+)/(?P<name>\w+)$")


def sample_key(run: str, sample_id: int, attempt: int, name: str) -> str:
    """The store key `{run}/{sample}/g{attempt}/{name}` of one tensor of one capture attempt."""
    if not _RUN_RE.match(run):
        raise ValueError(
            f"run id {run!r} cannot key store objects: use letters, digits, '.', '_' and '-' "
            f"(config field run_id)"
        )
    if isinstance(sample_id, bool) or not isinstance(sample_id, int) or sample_id < 0:
        raise ValueError(f"sample_id must be a non-negative int, got {sample_id!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise ValueError(f"attempt must be a non-negative int, got {attempt!r}")
    if name not in TENSOR_NAMES:
        raise ValueError(f"tensor name {name!r} is not one of {', '.join(TENSOR_NAMES)}")
    return f"{run}/{sample_id}/g{attempt}/{name}"


def parse_sample_key(key: str) -> tuple[str, int, int, str]:
    """Inverse of `sample_key`: (run, sample_id, attempt, name); ValueError if malformed."""
    match = _KEY_RE.match(key)
    if match is None or match["name"] not in TENSOR_NAMES:
        raise ValueError(f"{key!r} is not a feature-store key of the form run/sample/gN/name")
    return match["run"], int(match["sample"]), int(match["attempt"]), match["name"]
