"""`specdraft export`: a training checkpoint becomes a HF folder that `from_pretrained` reloads to
the same outputs (loss and greedy proposals), with config.json naming the weights' dtype."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from train_support import one_rank, single_thread, tiny_run, write_config

from specdraft.cli.main import cli
from specdraft.config import validate_config


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


def outputs(model, batch, head, spec):
    """The draft's loss numerator on a batch and its greedy proposals for some anchors."""
    from specdraft.trainer.train.trainer import prediction_batch

    with torch.no_grad():
        loss = model(batch, head=head, spec=spec).numerator
        predict = prediction_batch(batch, spec.num_anchors)
        length = int(batch["loss_mask"][0].nonzero().max())
        anchors = torch.arange(spec.num_anchors) * 3 % max(1, length)
        predict["predict_anchors"] = anchors[None]
        predict["predict_keep"] = torch.ones_like(predict["predict_keep"])
        proposals = model(predict, head=head, spec=spec)
    return loss, proposals


@pytest.fixture(scope="module", params=["dflash", "dflash2", "dspark"])
def trained(request, tiny_target_path, tmp_path_factory):
    """A one-step checkpoint of each algorithm, a batch, the head and the spec."""
    from specdraft.trainer.train.assembly import build_trainer

    root = tmp_path_factory.mktemp(f"export-{request.param}")
    config = validate_config(
        tiny_run(
            tiny_target_path,
            root / "run",
            model={"algorithm": request.param, "dtype": "bfloat16"},
            data={"max_samples": 4},
            training={"max_steps": 1},
        )
    )
    with one_rank() as ctx:
        trainer = build_trainer(config, ctx, progress=False)
        result = trainer.fit()
        trainer.writer.close()
        batch = next(trainer.source.windows(0, 0))[0]
    return root, result.last_checkpoint, batch, trainer.head, trainer.spec


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_reloads_with_from_pretrained_to_the_same_outputs(trained, dtype):
    from specdraft.trainer.train.export import draft_class_for, load_checkpoint_draft

    root, checkpoint, batch, head, spec = trained
    out = root / f"export-{dtype}"
    done = CliRunner().invoke(cli, ["export", str(checkpoint), "--out", str(out), "--dtype", dtype])
    assert done.exit_code == 0, done.output

    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == dtype
    assert config["block_size"] == 8 and config["target_layer_ids"] == [0, 2]
    assert config["mask_token_id"] == 4095
    with safe_open(str(out / "model.safetensors"), framework="pt") as weights:
        dtypes = {weights.get_tensor(name).dtype for name in weights.keys()}  # noqa: SIM118
    assert dtypes == {getattr(torch, dtype)}

    reloaded = draft_class_for(config["architectures"][0]).from_pretrained(str(out)).eval()
    assert next(reloaded.parameters()).dtype == getattr(torch, dtype)
    original = load_checkpoint_draft(checkpoint).to(getattr(torch, dtype)).eval()
    head = head.to(getattr(torch, dtype))
    loss_a, proposals_a = outputs(original, batch, head, spec)
    loss_b, proposals_b = outputs(reloaded, batch, head, spec)
    assert torch.equal(proposals_a, proposals_b)
    assert torch.equal(loss_a, loss_b)
    assert proposals_a.shape == (1, spec.num_anchors, 7)


def test_the_run_dtype_is_the_default_and_a_bad_checkpoint_is_named(trained, tmp_path):
    _, checkpoint, _, _, _ = trained
    done = CliRunner().invoke(cli, ["export", str(checkpoint), "--out", str(tmp_path / "x")])
    assert done.exit_code == 0, done.output
    assert json.loads((tmp_path / "x" / "config.json").read_text())["dtype"] == "bfloat16"

    (tmp_path / "empty").mkdir()
    done = CliRunner().invoke(
        cli, ["export", str(tmp_path / "empty"), "--out", str(tmp_path / "y")]
    )
    assert done.exit_code == 1
    assert "config.json is missing" in done.output


def _tampered_copy(checkpoint, root, name: str):
    """A copy of the checkpoint with one byte of `name` flipped (what a bad copy or disk does)."""
    import shutil

    copy = root / "tampered"
    shutil.copytree(checkpoint, copy)
    target = copy / name
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    return copy


def test_export_refuses_a_checkpoint_that_differs_from_its_manifest(trained, tmp_path):
    _, checkpoint, _, _, _ = trained
    tampered = _tampered_copy(checkpoint, tmp_path, "model.safetensors")
    done = CliRunner().invoke(cli, ["export", str(tampered), "--out", str(tmp_path / "out")])
    assert done.exit_code == 1, done.output
    assert f"cannot export {tampered}" in done.output
    assert f"{tampered / 'model.safetensors'}: content differs from its checksum" in done.output
    assert not (tmp_path / "out").exists()

    (tampered / "manifest.json").unlink()
    done = CliRunner().invoke(cli, ["export", str(tampered), "--out", str(tmp_path / "out")])
    assert done.exit_code == 1
    assert "manifest.json is missing" in done.output


def test_eval_refuses_a_checkpoint_that_differs_from_its_manifest(
    trained, tiny_target_path, tmp_path
):
    _, checkpoint, _, _, _ = trained
    tampered = _tampered_copy(checkpoint, tmp_path, "config.json")
    config = write_config(
        tmp_path / "eval.toml",
        tiny_run(
            tiny_target_path,
            tmp_path / "eval-run",
            data={"eval_paths": ["pkg:sharegpt"], "max_eval_samples": 2},
        ),
    )
    done = CliRunner().invoke(cli, ["eval", str(config), "--checkpoint", str(tampered)])
    assert done.exit_code == 1, done.output
    assert f"cannot evaluate {tampered}" in done.output
    assert f"{tampered / 'config.json'}: content differs from its checksum" in done.output
    assert "Traceback" not in done.output
