"""Checkpoints are safe to receive and checked before they are trusted.

A checkpoint of a real two-step run on the tiny target is tampered with the way a careless copy or
a hostile sender would: zeros written into a DCP shard, a pickle payload planted as DCP metadata or
as an RNG file (with the checksum manifest rewritten to match, as an attacker would), a missing RNG
file. Resuming refuses each, naming the file, and no payload ever runs.
"""

from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from train_support import one_rank, single_thread, tiny_run

from specdraft.config import validate_config
from specdraft.trainer.integrity import CorruptFile, sha256_file, write_manifest
from specdraft.trainer.train.checkpoint import load_rng_state, save_rng_state
from specdraft.trainer.train.safe_dcp import UnsafeCheckpoint


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


class Payload:
    """Unpickling this creates `marker`: the proof that a checkpoint ran code on load."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


@pytest.fixture(scope="module")
def saved_run(tiny_target_path, tmp_path_factory):
    """A two-step run with a checkpoint at step 2: (config mapping, checkpoint folder)."""
    from specdraft.trainer.train.assembly import build_trainer

    root = tmp_path_factory.mktemp("safety")
    settings = tiny_run(tiny_target_path, root / "run")
    with single_thread(), one_rank() as ctx:
        trainer = build_trainer(validate_config(settings), ctx, progress=False)
        result = trainer.fit()
        trainer.writer.close()
    return settings, result.last_checkpoint


@pytest.fixture
def run_copy(saved_run, tmp_path):
    """A fresh copy of the saved run (its own output_dir) and its checkpoint folder."""
    settings, checkpoint = saved_run
    out = tmp_path / "run"
    shutil.copytree(checkpoint.parent.parent, out)
    settings = dict(settings, output_dir=str(out))
    return validate_config(settings), out / "checkpoints" / checkpoint.name


def resume(config, checkpoint: Path):
    from specdraft.trainer.train.assembly import build_trainer

    with one_rank() as ctx:
        trainer = build_trainer(config, ctx, progress=False, resume=str(checkpoint))
        trainer.writer.close()
        return trainer


def dcp_shard(checkpoint: Path) -> Path:
    (shard,) = sorted((checkpoint / "dcp").glob("*.distcp"))
    return shard


def test_zeros_written_into_a_dcp_shard_are_refused_naming_the_file(run_copy):
    config, checkpoint = run_copy
    shard = dcp_shard(checkpoint)
    with shard.open("r+b") as handle:
        handle.seek(shard.stat().st_size // 2)
        handle.write(bytes(4096))
    with pytest.raises(CorruptFile) as caught:
        resume(config, checkpoint)
    message = str(caught.value)
    assert f"{shard}: content differs from its checksum" in message
    assert "resume from an earlier checkpoint" in message


def test_a_file_planted_next_to_the_checkpoint_is_named(run_copy):
    config, checkpoint = run_copy
    (checkpoint / "dcp" / "extra.distcp").write_bytes(b"x")
    with pytest.raises(CorruptFile, match=r"extra\.distcp: not listed in manifest\.json"):
        resume(config, checkpoint)


def test_a_checkpoint_without_manifest_is_refused(run_copy):
    config, checkpoint = run_copy
    (checkpoint / "manifest.json").unlink()
    with pytest.raises(CorruptFile, match=r"manifest\.json is missing"):
        resume(config, checkpoint)


def test_a_pickle_planted_as_dcp_metadata_does_not_run(run_copy, tmp_path):
    config, checkpoint = run_copy
    marker = tmp_path / "ran"
    metadata = checkpoint / "dcp" / ".metadata"
    metadata.write_bytes(pickle.dumps(Payload(marker)))
    write_manifest(checkpoint)  # an attacker rewrites the checksums too
    with pytest.raises(UnsafeCheckpoint) as caught:
        resume(config, checkpoint)
    assert not marker.exists()
    assert str(metadata) in str(caught.value)
    assert "builtins.exec" in str(caught.value)


def test_a_pickle_planted_as_an_rng_file_does_not_run(run_copy, tmp_path):
    config, checkpoint = run_copy
    marker = tmp_path / "ran"
    safe = checkpoint / "rng" / "rank0.safetensors"
    safe.unlink()
    # The format specdraft wrote before: a pickle that torch.load(weights_only=False) would run.
    torch.save({"torch": Payload(marker)}, checkpoint / "rng" / "rank0.pt")
    write_manifest(checkpoint)
    with pytest.raises(CorruptFile) as caught:
        resume(config, checkpoint)
    assert not marker.exists()
    assert f"{safe} is missing" in str(caught.value)
    assert "rank0.pt is an older pickle format" in str(caught.value)


def test_a_missing_rng_file_is_an_error_naming_it(run_copy):
    config, checkpoint = run_copy
    rng = checkpoint / "rng" / "rank0.safetensors"
    rng.unlink()
    with pytest.raises(CorruptFile, match=rf"{rng}: missing \(listed in manifest\.json\)"):
        resume(config, checkpoint)
    write_manifest(checkpoint)  # consistent checksums: the RNG check itself must catch it
    with pytest.raises(CorruptFile, match=rf"{rng} is missing; every rank's RNG state"):
        resume(config, checkpoint)


def test_an_intact_checkpoint_resumes_with_its_rng_state(run_copy):
    config, checkpoint = run_copy
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    trainer = resume(config, checkpoint)
    assert (trainer.step, trainer.epoch) == (state["step"], state["epoch"])
    manifest = json.loads((checkpoint / "manifest.json").read_text())["sha256"]
    assert manifest["model.safetensors"] == sha256_file(checkpoint / "model.safetensors")
    assert not list(checkpoint.rglob("*.pt"))


def test_rng_states_round_trip_through_safetensors(tmp_path):
    path = tmp_path / "rng.safetensors"
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    np.random.standard_normal()  # leaves a cached Gaussian in numpy's legacy state
    random.gauss(0, 1)  # and one in Python's
    save_rng_state(path)
    expected = (torch.rand(3), random.random(), random.gauss(0, 1), np.random.standard_normal(2))
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    load_rng_state(path)
    again = (torch.rand(3), random.random(), random.gauss(0, 1), np.random.standard_normal(2))
    assert torch.equal(expected[0], again[0])
    assert expected[1:3] == again[1:3]
    assert np.array_equal(expected[3], again[3])
