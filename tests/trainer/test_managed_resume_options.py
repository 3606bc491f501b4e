"""`specdraft train --resume ... --allow-changed FIELD` on a managed disaggregated run reaches the
trainer ranks the managed launcher starts (it used to stop with "not passed on yet")."""

from __future__ import annotations

from pathlib import Path

from _disagg_runtime import runtime_config, write_config_toml
from click.testing import CliRunner

from specdraft.cli.main import cli
from specdraft.cli.train_cmd import train
from specdraft.trainer.disagg import managed
from specdraft.trainer.launch import LaunchPlan

PLAN = LaunchPlan(
    nproc_per_node=2, nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=None
)


def _parsed(argv: list[str]) -> dict:
    """What `specdraft train` makes of the trainer argv (after `python -m specdraft.cli train`)."""
    assert argv[1:4] == ["-m", "specdraft.cli", "train"]
    return train.make_context("train", argv[4:]).params


def test_the_trainer_command_carries_allow_changed_to_the_ranks():
    argv = managed.trainer_command(
        "run.toml",
        ["training.learning_rate=1e-3"],
        "latest",
        PLAN,
        False,
        ("training.seed", "training.micro_batch_size"),
    )
    params = _parsed(argv)
    assert params["resume"] == "latest"
    assert params["allow_changed"] == ("training.seed,training.micro_batch_size",)
    assert "deployment.disaggregated.managed=false" in params["overrides"]

    plain = _parsed(managed.trainer_command("run.toml", [], "latest", PLAN, False))
    assert plain["allow_changed"] == ()


def test_train_passes_allow_changed_to_the_managed_launcher(
    tiny_target_path, tmp_path, monkeypatch
):
    run = tmp_path / "run"
    cfg = runtime_config(tiny_target_path, run, world_size=1, disaggregated={"managed": True})
    assert cfg.deployment.disaggregated.managed
    config = write_config_toml(cfg, tmp_path / "run.toml")
    checkpoint = run / "checkpoints" / "step-0000005"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    seen: dict = {}

    def fake_run_managed(config_path, overrides, resume, plan, progress=True, allow_changed=()):
        # Stands in for the services and ranks: records what the CLI hands the launcher.
        seen.update(resume=resume, allow_changed=tuple(allow_changed))
        argv = managed.trainer_command(
            config_path, overrides, resume, plan, progress, allow_changed
        )
        seen["trainer_params"] = _parsed(argv)
        return {}

    monkeypatch.setattr(managed, "run_managed", fake_run_managed)
    done = CliRunner().invoke(
        cli,
        [
            "train",
            str(config),
            "--resume",
            str(checkpoint),
            "--allow-changed",
            "training.seed",
            "--no-progress",
        ],
    )
    assert done.exit_code == 0, done.output
    assert "not passed on" not in done.output
    assert seen["resume"] == str(checkpoint)
    assert seen["allow_changed"] == ("training.seed",)
    assert seen["trainer_params"]["allow_changed"] == ("training.seed",)
    assert Path(seen["trainer_params"]["config_path"]) == config
