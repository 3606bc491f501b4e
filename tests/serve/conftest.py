"""Fixtures of the serve tests: one-step checkpoints of every family on the tiny target
(`tiny_target_path`, tests/conftest.py)."""

from __future__ import annotations

import pytest


def one_step_checkpoints(target, root, families, **model) -> dict:
    """A one-step checkpoint of each of `families` (vanilla Markov head for DSpark)."""
    from train_support import one_rank, single_thread, tiny_run

    from specdraft.config import validate_config
    from specdraft.trainer.train.assembly import build_trainer

    checkpoints = {}
    with single_thread():
        for name in families:
            config = validate_config(
                tiny_run(
                    target,
                    root / name,
                    model={"algorithm": name, **model},
                    data={"max_samples": 4},
                    training={"max_steps": 1},
                )
            )
            with one_rank() as ctx:
                trainer = build_trainer(config, ctx, progress=False)
                checkpoints[name] = trainer.fit().last_checkpoint
                trainer.writer.close()
    return checkpoints


@pytest.fixture(scope="module")
def family_checkpoints(tiny_target_path, tmp_path_factory):
    """A one-step checkpoint of each family, by family name."""
    from specdraft.trainer.models.family import FAMILIES

    root = tmp_path_factory.mktemp("serve-checkpoints")
    return one_step_checkpoints(tiny_target_path, root, FAMILIES)


@pytest.fixture(scope="module")
def vocab_checkpoints(tiny_target_path, tmp_path_factory):
    """A one-step checkpoint with a 512-token draft vocabulary of each family an engine serves
    that way (dflash, dspark)."""
    root = tmp_path_factory.mktemp("serve-vocab-checkpoints")
    return one_step_checkpoints(tiny_target_path, root, ("dflash", "dspark"), draft_vocab_size=512)
