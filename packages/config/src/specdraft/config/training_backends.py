"""The data-parallel training backends, config side (torch-free): the names `training.backend`
admits, and each one's clause in that field's help.

Each name is also the trainer's module `specdraft/trainer/backends/<name>.py`, whose `BACKEND`
prepares a draft (`backends.prepare` finds it by the name), so a new backend is that module +
its line below.
"""

from __future__ import annotations

# The registered backends, in the order docs and messages list them: name -> what it wraps.
BACKENDS: dict[str, str] = {
    "fsdp1": "FullyShardedDataParallel",
    "fsdp2": "fully_shard",
}

BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)
