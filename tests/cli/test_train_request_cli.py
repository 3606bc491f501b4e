"""`specdraft train` builds one run request from its options and hands it to the trainer's
dispatch, which decides the deployment mode (the CLI names none)."""

from __future__ import annotations

from click.testing import CliRunner
from disagg_runtime import runtime_config, write_config_toml

from specdraft.cli.main import cli
from specdraft.trainer import deployment


def test_train_hands_the_dispatch_one_request_with_every_option(
    tiny_target_path, tmp_path, monkeypatch
):
    run = tmp_path / "run"
    cfg = runtime_config(tiny_target_path, run, world_size=1, disaggregated={"managed": True})
    config = write_config_toml(cfg, tmp_path / "run.toml")
    checkpoint = run / "checkpoints" / "step-0000005"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    seen = []
    monkeypatch.setattr(deployment, "run_request", lambda request: seen.append(request) or {})
    argv = ["train", str(config), "--resume", str(checkpoint), "--allow-changed", "training.seed"]
    argv += ["--nproc-per-node", "2", "--stop-timeout", "9", "--no-progress", "--overwrite"]
    argv += ["--set", "training.learning_rate=0.001"]
    done = CliRunner().invoke(cli, argv)
    assert done.exit_code == 0, done.output
    (request,) = seen
    assert request.config_path == str(config) and request.deployment == "managed"
    assert request.resume == str(checkpoint) and request.allow_changed == ("training.seed",)
    assert request.launch.world_size == 2 and request.config.deployment.world_size == 2
    assert request.config.training.learning_rate == 0.001
    assert (request.progress, request.stop_timeout_s, request.overwrite) == (False, 9.0, True)


def test_a_used_output_folder_is_a_usage_error(tiny_target_path, tmp_path):
    run = tmp_path / "run"
    cfg = runtime_config(tiny_target_path, run, world_size=1, disaggregated={"managed": True})
    config = write_config_toml(cfg, tmp_path / "run.toml")
    (run / "checkpoints" / "step-0000002").mkdir(parents=True)
    done = CliRunner().invoke(cli, ["train", str(config)])
    assert done.exit_code == 2
    assert "already holds a run" in done.output and "--overwrite" in done.output
