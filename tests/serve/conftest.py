"""Fixtures of the serve tests: the tiny target and one-step checkpoints of every family."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_target_path():
    """The cached tiny target (built on first use, about a minute and a half)."""
    from specdraft.trainer.assets import build_tiny_target

    return build_tiny_target()


@pytest.fixture(scope="module")
def family_checkpoints(tiny_target_path, tmp_path_factory):
    """A one-step checkpoint of each family (vanilla Markov head for DSpark), by family name."""
    from train_support import one_rank, single_thread, tiny_run

    from specdraft.config import validate_config
    from specdraft.trainer.models.family import FAMILIES
    from specdraft.trainer.train.assembly import build_trainer

    root = tmp_path_factory.mktemp("serve-checkpoints")
    checkpoints = {}
    with single_thread():
        for name in FAMILIES:
            config = validate_config(
                tiny_run(
                    tiny_target_path,
                    root / name,
                    model={"algorithm": name},
                    data={"max_samples": 4},
                    training={"max_steps": 1},
                )
            )
            with one_rank() as ctx:
                trainer = build_trainer(config, ctx, progress=False)
                checkpoints[name] = trainer.fit().last_checkpoint
                trainer.writer.close()
    return checkpoints
