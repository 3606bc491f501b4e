"""A run started from an exported draft (model.init_from): the draft begins with the exported
weights, `specdraft lint` names a field that disagrees with the folder, and a resume with other
weights in the folder is refused, saying why."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file
from train_support import fit_run, merge, one_rank, single_thread, tiny_run, write_config

from specdraft.cli.main import cli
from specdraft.config import validate_config
from specdraft.trainer.train.checkpoint import CheckpointMismatch


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


@pytest.fixture(scope="module")
def exported(tiny_target_path, tmp_path_factory):
    """A one-step DFlash2 run's checkpoint exported as --format vllm in fp32."""
    root = tmp_path_factory.mktemp("init-from")
    settings = tiny_run(tiny_target_path, root / "first", training={"max_steps": 1})
    with single_thread():
        checkpoint = fit_run(settings).last_checkpoint
    out = root / "draft"
    args = ["export", str(checkpoint), "--out", str(out), "--format", "vllm", "--dtype", "float32"]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, done.output
    return settings, checkpoint, out


def test_the_run_starts_from_the_exported_weights(exported, tmp_path):
    from specdraft.trainer.train.assembly import build_trainer

    settings, checkpoint, out = exported
    started = merge(
        settings, {"output_dir": str(tmp_path / "run"), "model": {"init_from": str(out)}}
    )
    with one_rank() as ctx:
        trainer = build_trainer(validate_config(started), ctx, progress=False)
        state = trainer.backend.model.state_dict()
        saved = load_file(str(checkpoint / "model.safetensors"))
        for name, tensor in saved.items():
            assert torch.equal(state[name].full_tensor().cpu(), tensor), name
        assert trainer.fingerprint["model.init_from"].startswith("sha256:")
        trainer.writer.close()


def test_lint_names_the_field_that_disagrees_with_the_folder(exported, tmp_path):
    settings, _, out = exported
    config = merge(settings, {"model": {"init_from": str(out), "block_size": 16}})
    path = write_config(tmp_path / "c.toml", config)
    done = CliRunner().invoke(cli, ["lint", str(path)])
    assert done.exit_code == 1, done.output
    line = next(
        i for i, text in enumerate(path.read_text().splitlines(), 1) if "block_size" in text
    )
    assert f"c.toml:{line}:" in done.output and "SD332" in done.output
    assert "set block_size = 8" in done.output


def test_a_resume_with_other_weights_in_the_folder_is_refused(exported, tmp_path):
    settings, _, out = exported
    folder = tmp_path / "draft"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((out / name).read_bytes())
    started = merge(
        settings,
        {
            "output_dir": str(tmp_path / "run"),
            "model": {"init_from": str(folder)},
            "training": {"max_steps": 1, "save_interval": 1},
        },
    )
    fit_run(started)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["fc.weight"] = tensors["fc.weight"] * 2
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointMismatch) as caught:
        fit_run(merge(started, {"training": {"max_steps": 2}}), resume="latest")
    message = str(caught.value)
    assert "model.init_from (the weights the draft started from" in message
    assert "checkpoint has 'sha256:" in message and "config has 'sha256:" in message


def test_eval_init_measures_the_draft_the_run_starts_from(exported, tmp_path, monkeypatch):
    from specdraft.trainer.models import init_from
    from specdraft.trainer.train.eval_run import evaluate_checkpoint

    settings, checkpoint, out = exported
    loaded = []
    real = init_from.load_init_weights
    monkeypatch.setattr(
        init_from, "load_init_weights", lambda draft, w: loaded.append(w.sha256) or real(draft, w)
    )
    eval_data = {"eval_paths": ["pkg:sharegpt"], "max_eval_samples": 2}
    run = {"output_dir": str(tmp_path / "run"), "data": eval_data}
    started = validate_config(merge(settings, {**run, "model": {"init_from": str(out)}}))
    # A one-step draft accepts no more than a fresh one (tau 1): the folder's weights are
    # checked by being loaded, and the result by equalling the checkpoint's.
    from_folder = evaluate_checkpoint(started, "init")
    assert len(loaded) == 1
    trained = evaluate_checkpoint(validate_config(merge(settings, run)), str(checkpoint))
    assert from_folder == trained
