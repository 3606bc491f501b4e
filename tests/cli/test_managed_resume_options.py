"""`specdraft train --resume ... --allow-changed FIELD` on a managed disaggregated run reaches the
trainer ranks the managed launcher starts (it used to stop with "not passed on yet")."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from disagg_runtime import runtime_config, write_config_toml

from specdraft.cli.main import cli
from specdraft.trainer.disagg.consumer import main as consumer_main
from specdraft.trainer.disagg.managed import run as managed
from specdraft.trainer.launch import LaunchPlan

PLAN = LaunchPlan(
    nproc_per_node=2, nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=None
)


def _parsed(argv: list[str], monkeypatch) -> dict:
    """What the trainer ranks' entry point makes of the argv the managed run starts it with."""
    # The library starts its own entry point, never the CLI package that depends on it.
    assert argv[1:3] == ["-m", "specdraft.trainer.disagg.consumer"]
    seen: dict = {}

    def fake_launch(plan, entry, config_path, overrides, resume, progress, allow_changed):
        seen.update(
            entry=entry,
            world_size=plan.world_size,
            config_path=config_path,
            overrides=overrides,
            resume=resume,
            progress=progress,
            allow_changed=allow_changed,
        )

    monkeypatch.setattr("specdraft.trainer.launch.launch", fake_launch)
    assert consumer_main.main(argv[3:]) == 0
    assert seen["entry"] is consumer_main.rank_main
    return seen


def test_the_trainer_command_carries_allow_changed_to_the_ranks(monkeypatch):
    argv = managed.trainer_command(
        "run.toml",
        ["training.learning_rate=1e-3"],
        "latest",
        PLAN,
        False,
        ("training.seed", "training.micro_batch_size"),
    )
    params = _parsed(argv, monkeypatch)
    assert params["resume"] == "latest"
    assert params["allow_changed"] == ("training.seed", "training.micro_batch_size")
    assert "deployment.disaggregated.managed=false" in params["overrides"]
    assert params["world_size"] == 2 and params["progress"] is False

    plain = _parsed(managed.trainer_command("run.toml", [], "latest", PLAN, False), monkeypatch)
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
        seen["trainer_params"] = _parsed(argv, monkeypatch)
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
