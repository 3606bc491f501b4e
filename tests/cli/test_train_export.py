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
    from specdraft.trainer.export import draft_class_for, load_checkpoint_draft

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


def eval_config(target, tmp_path):
    """A config file whose eval set is two ShareGPT prompts, for `specdraft eval`."""
    return write_config(
        tmp_path / "eval.toml",
        tiny_run(
            target,
            tmp_path / "eval-run",
            data={"eval_paths": ["pkg:sharegpt"], "max_eval_samples": 2},
        ),
    )


def test_eval_refuses_a_checkpoint_that_differs_from_its_manifest(
    trained, tiny_target_path, tmp_path
):
    _, checkpoint, _, _, _ = trained
    tampered = _tampered_copy(checkpoint, tmp_path, "config.json")
    config = eval_config(tiny_target_path, tmp_path)
    done = CliRunner().invoke(cli, ["eval", str(config), "--checkpoint", str(tampered)])
    assert done.exit_code == 1, done.output
    assert f"cannot evaluate {tampered}" in done.output
    assert f"{tampered / 'config.json'}: content differs from its checksum" in done.output
    assert "Traceback" not in done.output


# ----------------------------------------------------------------------------- formats


def export_cli(checkpoint, out, *args):
    """`specdraft export CHECKPOINT --out OUT ARGS` in-process."""
    return CliRunner().invoke(cli, ["export", str(checkpoint), "--out", str(out), *args])


def tensors_of(folder):
    """The tensors of a folder's model.safetensors."""
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


VLLM_ARCHITECTURES = {
    "dflash": "DFlashDraftModel",
    "dflash2": "DFlash2DraftModel",
    "dspark": "Qwen3DSparkModel",
}


def test_the_vllm_format_is_what_vllm_s_loaders_read(trained, tmp_path):
    _, checkpoint, _, _, _ = trained
    family = json.loads((checkpoint / "config.json").read_text())["architectures"][0]
    done = export_cli(checkpoint, tmp_path / "vllm", "--format", "vllm", "--dtype", "float32")
    assert done.exit_code == 0, done.output
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    name = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}.get(family, "dspark")
    assert config["architectures"] == [VLLM_ARCHITECTURES[name]]
    nested = config["dflash_config"]
    # vLLM's convention for dflash_config.target_layer_ids is specdraft's own (it adds 1).
    assert nested["target_layer_ids"] == [0, 2] and nested["mask_token_id"] == 4095
    assert config["is_causal"] is False
    assert config["sample_from_anchor"] is (name == "dspark")
    if name == "dspark":
        # Top level for Qwen3DSparkModel; DFlash's speculator refuses it nested when true.
        assert "sample_from_anchor" not in nested
        assert config["markov_rank"] == 256 and config["markov_head_type"] == "vanilla"
        assert config["enable_confidence_head"] is True
        assert config["confidence_head_with_markov"] is False
    else:
        assert nested["sample_from_anchor"] is False
    if name == "dflash2":
        assert {k: nested[k] for k in ("conv_kernel_size", "conv_group_size")} == {
            "conv_kernel_size": 2,
            "conv_group_size": 16,
        }
        assert (nested["selector_rank"], nested["selector_top_k"]) == (16, 4)
    assert not {"selector_loss_weight", "ce_weight", "l1_weight"} & set(config)
    # Every tensor of these drafts is one vLLM's loader reads, unchanged.
    ours = tensors_of(checkpoint)
    exported = tensors_of(tmp_path / "vllm")
    assert sorted(exported) == sorted(ours)
    for key, value in ours.items():
        assert torch.equal(exported[key], value), key


def test_the_speculators_format_describes_itself_around_the_same_weight_bytes(
    trained, tiny_target_path, tmp_path
):
    _, checkpoint, _, _, _ = trained
    done = export_cli(
        checkpoint, tmp_path / "spec", "--format", "speculators", "--verifier", tiny_target_path
    )
    assert done.exit_code == 0, done.output
    assert export_cli(checkpoint, tmp_path / "sglang").exit_code == 0
    spec = tmp_path / "spec"
    assert (spec / "model.safetensors").read_bytes() == (
        tmp_path / "sglang" / "model.safetensors"
    ).read_bytes()
    config = json.loads((spec / "config.json").read_text())
    kind = config["speculators_model_type"]
    assert kind in ("dflash", "dflash2", "dspark")
    # speculators counts hidden states as HF does: specdraft's layer k is its k + 1.
    assert config["aux_hidden_state_layer_ids"] == [1, 3]
    assert config["block_size"] == 8 and config["mask_token_id"] == 4095
    assert config["draft_vocab_size"] == 4096
    assert config["sliding_window_non_causal"] is True
    assert config["sample_from_anchor"] is (kind == "dspark")
    layers = config["transformer_layer_config"]
    assert layers["model_type"] == "qwen3" and layers["num_hidden_layers"] == 1
    assert layers["hidden_size"] == 128 and layers["rope_parameters"]["rope_type"] == "default"
    proposal = config["speculators_config"]["proposal_methods"][0]
    assert proposal["speculative_tokens"] == (8 if kind == "dspark" else 7)
    verifier = config["speculators_config"]["verifier"]
    assert verifier == {
        "name_or_path": str(tiny_target_path),
        "architectures": ["Qwen3ForCausalLM"],
    }


def test_export_refuses_a_non_empty_out_unless_forced(trained, tmp_path):
    _, checkpoint, _, _, _ = trained
    out = tmp_path / "out"
    assert export_cli(checkpoint, out).exit_code == 0
    before = (out / "model.safetensors").read_bytes()
    done = export_cli(checkpoint, out, "--format", "vllm")
    assert done.exit_code == 2, done.output
    assert done.output.strip() == (
        f"Error: --out {out} is not empty; pass --force to replace the draft files in it, or "
        "choose an empty folder"
    )
    assert (out / "model.safetensors").read_bytes() == before
    done = export_cli(checkpoint, out, "--format", "vllm", "--force")
    assert done.exit_code == 0, done.output
    assert json.loads((out / "config.json").read_text())["is_causal"] is False
    # A folder holding anything else is not empty either.
    other = tmp_path / "notes"
    other.mkdir()
    (other / "README").write_text("mine")
    assert export_cli(checkpoint, other).exit_code == 2
    assert (other / "README").read_text() == "mine" and len(list(other.iterdir())) == 1


def test_export_never_writes_into_a_target_s_folder(trained, tiny_target_path, tmp_path):
    import shutil

    _, checkpoint, _, _, _ = trained
    copy = tmp_path / "target-copy"
    shutil.copytree(tiny_target_path, copy)
    before = {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()}
    for args in ((), ("--force",), ("--format", "vllm", "--force")):
        done = export_cli(checkpoint, copy, *args)
        assert done.exit_code == 2, done.output
        assert len(done.output.strip().splitlines()) == 1
        assert f"--out {copy} holds a model with architectures ['Qwen3ForCausalLM']" in done.output
        assert "not even with --force: choose an empty folder" in done.output
    assert {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()} == before
    # The verifier's own folder, named as such.
    done = export_cli(
        checkpoint, tiny_target_path, "--format", "speculators", "--verifier", tiny_target_path
    )
    assert done.exit_code == 2
    assert f"--out {tiny_target_path} is the target's own folder" in done.output
    # Nor over the checkpoint it exports (a draft's folder, so not caught as a model's).
    done = export_cli(checkpoint, checkpoint, "--force")
    assert done.exit_code == 2
    assert f"--out {checkpoint} is the checkpoint's own folder" in done.output


def test_speculators_export_needs_the_verifier(trained, tmp_path):
    _, checkpoint, _, _, _ = trained
    done = export_cli(checkpoint, tmp_path / "spec", "--format", "speculators")
    assert done.exit_code == 2
    assert "--format speculators needs --verifier NAME_OR_PATH" in done.output
    assert not (tmp_path / "spec").exists()


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_vllm_export_refuses_a_markov_head_vllm_cannot_build(head, tiny_target_path, tmp_path):
    from specdraft.trainer.train.assembly import build_trainer

    config = validate_config(
        tiny_run(
            tiny_target_path,
            tmp_path / "run",
            model={"algorithm": "dspark", "dspark": {"markov_type": head, "markov_rank": 16}},
            data={"max_samples": 2},
            training={"max_steps": 1},
        )
    )
    with one_rank() as ctx:
        trainer = build_trainer(config, ctx, progress=False)
        checkpoint = trainer.fit().last_checkpoint
        trainer.writer.close()
    done = export_cli(checkpoint, tmp_path / "vllm", "--format", "vllm")
    assert done.exit_code == 2, done.output
    assert len(done.output.strip().splitlines()) == 1
    assert (
        f"its DSpark Markov head is {head!r} (model.dspark.markov_type = {head!r})" in done.output
    )
    assert 'train with model.dspark.markov_type = "vanilla"' in done.output
    assert not (tmp_path / "vllm").exists()
    # SGLang's and speculators' loaders build every head.
    done = export_cli(
        checkpoint, tmp_path / "spec", "--format", "speculators", "--verifier", tiny_target_path
    )
    assert done.exit_code == 0, done.output
    assert json.loads((tmp_path / "spec" / "config.json").read_text())["markov_head_type"] == head


def test_served_acceptance_is_read_from_vllm_s_spec_decode_counters():
    from specdraft.trainer.serve.vllm_child import acceptance_from_metrics

    # LLM.get_metrics() as the child flattens it: one entry per metric (and label set).
    metrics = [
        {"name": "vllm:spec_decode_num_drafts", "value": 40},
        {"name": "vllm:spec_decode_num_draft_tokens", "value": 280},
        {"name": "vllm:spec_decode_num_accepted_tokens", "value": 50},
        {"name": "vllm:spec_decode_num_accepted_tokens_per_pos", "values": [30, 15, 5, 0]},
        {"name": "vllm:num_requests_running", "value": 0},
    ]
    result = acceptance_from_metrics(metrics)
    assert result["acceptance_length"] == pytest.approx(1 + 50 / 40)
    assert result["per_position"] == pytest.approx([0.75, 0.375, 0.125, 0.0])
    assert result["per_position_given_previous"] == pytest.approx([0.75, 0.5, 1 / 3, 0.0])
    # No draft ran: no acceptance length, rather than a division by zero.
    assert acceptance_from_metrics([])["acceptance_length"] is None


def test_eval_on_vllm_without_vllm_says_how_to_get_it(trained, tiny_target_path, tmp_path):
    _, checkpoint, _, _, _ = trained
    config = eval_config(tiny_target_path, tmp_path)
    missing = tmp_path / "no-venv" / "bin" / "python"
    done = CliRunner().invoke(
        cli,
        [
            *("eval", str(config), "--checkpoint", str(checkpoint)),
            *("--engine", "vllm", "--vllm-python", str(missing)),
        ],
    )
    assert done.exit_code == 2, done.output
    assert len(done.output.strip().splitlines()) == 1
    assert f"--vllm-python {missing} does not exist" in done.output
    assert "scripts/vllm_cpu_venv.sh" in done.output


def test_llama_cpp_speed_settings_need_its_engine_and_known_names(
    trained, tiny_target_path, tmp_path
):
    _, checkpoint, _, _, _ = trained
    config = eval_config(tiny_target_path, tmp_path)
    base = ["eval", str(config), "--checkpoint", str(checkpoint), "--speed"]
    done = CliRunner().invoke(cli, [*base, "--engine", "vllm", "--speed-settings", "ngram-mod"])
    assert done.exit_code == 2, done.output
    assert "add --engine llama.cpp" in done.output
    # Checked before llama.cpp is looked for: no build or server needed.
    done = CliRunner().invoke(
        cli, [*base, "--engine", "llama.cpp", "--speed-settings", "ngram-mod,ngram-fast"]
    )
    assert done.exit_code == 2, done.output
    assert "unknown llama.cpp speed setting(s) ngram-fast" in done.output
    done = CliRunner().invoke(cli, [*base, "--engine", "llama.cpp", "--vllm-eager"])
    assert done.exit_code == 2, done.output
    assert "--vllm-eager runs vLLM's engines: add --engine vllm" in done.output


def test_more_vllm_draft_token_counts_need_vllm_speed_and_positive_numbers(
    trained, tiny_target_path, tmp_path
):
    _, checkpoint, _, _, _ = trained
    config = eval_config(tiny_target_path, tmp_path)
    base = ["eval", str(config), "--checkpoint", str(checkpoint)]
    # Without --speed, or on llama.cpp (which has --draft-tokens), the counts would be ignored.
    for extra in (["--engine", "vllm"], ["--engine", "llama.cpp", "--speed"]):
        done = CliRunner().invoke(cli, [*base, *extra, "--speed-draft-tokens", "3"])
        assert done.exit_code == 2, done.output
        assert "add --engine vllm --speed" in done.output
    # Checked before vLLM is looked for.
    for bad in ("3,x", "0", "-2"):
        done = CliRunner().invoke(
            cli, [*base, "--engine", "vllm", "--speed", "--speed-draft-tokens", bad]
        )
        assert done.exit_code == 2, done.output
        assert "is not a positive number of tokens" in done.output


def test_a_new_family_s_export_folder_is_a_draft_not_a_foreign_model(tmp_path, monkeypatch):
    """The drafts export recognises come from the registered families: a family added by its
    folder alone (no hand-kept list) can be re-exported over with --force, while a target's
    folder is still refused."""
    import dataclasses

    from specdraft.trainer.export.destination import foreign_model
    from specdraft.trainer.models import family as families

    dflash = families.FAMILIES["dflash"]
    scratch = dataclasses.replace(
        dflash,
        name="scratch",
        model_class=type("ScratchDraft", (dflash.model_class,), {}),
        vllm=dataclasses.replace(dflash.vllm, architecture="ScratchVllmDraft"),
        speculators=None,
    )
    monkeypatch.setitem(families.FAMILIES, "scratch", scratch)
    for architecture in ("ScratchDraft", "ScratchVllmDraft", "DFlashDraftModel"):
        (tmp_path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
        assert foreign_model(tmp_path) is None, architecture
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert "LlamaForCausalLM" in foreign_model(tmp_path)
