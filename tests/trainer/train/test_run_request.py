"""The run request: built once, read by every layer; its JSON file round-trips, it decides the
deployment mode, and the dispatch starts the entry point that mode needs."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from disagg_runtime import runtime_config, write_config_toml
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.config import ConfigError
from specdraft.trainer import deployment
from specdraft.trainer.disagg.consumer import main as consumer_main
from specdraft.trainer.disagg.managed import run as managed
from specdraft.trainer.launch import LaunchPlan
from specdraft.trainer.request import RunRequest
from specdraft.trainer.train import rank_entry
from specdraft.trainer.train.run_folder import RunFolderError


@pytest.fixture(scope="module")
def config_file(tiny_target_path, tmp_path_factory) -> Path:
    """A disaggregated (managed) config for two ranks, as a TOML file."""
    folder = tmp_path_factory.mktemp("request")
    cfg = runtime_config(
        tiny_target_path, folder / "run", world_size=2, disaggregated={"managed": True}
    )
    return write_config_toml(cfg, folder / "run.toml")


FIELDS = ("training.seed", "training.micro_batch_size", "training.grad_accum_steps")


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    nproc=st.integers(1, 4),
    node_rank=st.integers(0, 3),
    port=st.none() | st.integers(1024, 65535),
    resume=st.none() | st.sampled_from(["latest", "runs/x/checkpoints/step-0000005"]),
    allowed=st.lists(st.sampled_from(FIELDS), unique=True, max_size=3),
    progress=st.booleans(),
    stop_timeout=st.floats(0, 1e4, allow_nan=False),
    overwrite=st.booleans(),
)
def test_a_request_survives_its_json_file(
    config_file, seed, nproc, node_rank, port, resume, allowed, progress, stop_timeout, overwrite
):
    """What the managed run hands its trainer process is the request it was given, whole."""
    request = RunRequest.create(
        str(config_file),
        [f"training.seed={seed}"],
        launch=LaunchPlan(nproc, nnodes=4, node_rank=node_rank, master_port=port),
        resume=resume,
        allow_changed=allowed,
        progress=progress,
        stop_timeout_s=stop_timeout,
        overwrite=overwrite,
    )
    assert RunRequest.from_json(request.to_json()) == request
    # The elastic launcher pickles it to every rank.
    assert pickle.loads(pickle.dumps(request)) == request


def test_the_launch_rank_counts_become_overrides_every_process_reads(config_file):
    request = RunRequest.create(str(config_file), launch=LaunchPlan(nproc_per_node=3))
    assert request.config.deployment.world_size == 3
    assert request.overrides[-2:] == ("deployment.nproc_per_node=3", "deployment.nnodes=1")
    # The config's own counts add nothing.
    same = RunRequest.create(str(config_file), launch=LaunchPlan(nproc_per_node=2))
    assert same.overrides == () and same.config.deployment.world_size == 2
    with pytest.raises(ConfigError):
        RunRequest.create(str(config_file), launch=LaunchPlan(nproc_per_node=10_000))


def test_the_request_names_its_deployment_mode(config_file):
    managed_request = RunRequest.create(str(config_file))
    assert managed_request.deployment == "managed"
    ranks = managed_request.with_overrides("deployment.disaggregated.managed=false")
    assert ranks.deployment == "disaggregated"
    assert ranks.config.deployment.disaggregated.managed is False
    local = managed_request.with_overrides("deployment.mode=local")
    assert local.deployment == "local"
    assert not local.resuming and RunRequest.create(str(config_file), resume="latest").resuming


def test_the_managed_trainers_get_the_request_with_managed_off(config_file):
    request = RunRequest.create(
        str(config_file),
        ["training.learning_rate=0.001"],
        resume="latest",
        allow_changed=("training.seed",),
        progress=False,
        stop_timeout_s=7.5,
    )
    argv = managed.trainer_command(request)
    # The library starts its own entry point, never the CLI package that depends on it.
    assert argv[1:3] == ["-m", "specdraft.trainer.disagg.consumer"]
    (request_file,) = argv[3:]
    ranks = RunRequest.from_json(Path(request_file).read_text())
    assert ranks == request.with_overrides("deployment.disaggregated.managed=false")
    assert ranks.deployment == "disaggregated"


def test_the_consumer_entry_launches_its_rank_main_with_the_request(
    config_file, tmp_path, monkeypatch
):
    seen = {}
    monkeypatch.setattr(
        "specdraft.trainer.launch.launch",
        lambda plan, entry, request: seen.update(plan=plan, entry=entry, request=request),
    )
    request = RunRequest.create(str(config_file), ["deployment.disaggregated.managed=false"])
    request_file = tmp_path / "request.json"
    request_file.write_text(request.to_json())
    assert consumer_main.main([str(request_file)]) == 0
    assert seen == {"plan": request.launch, "entry": consumer_main.rank_main, "request": request}
    # A request whose config does not load, and a file that is not a request: usage errors.
    fields = json.loads(request.to_json())
    fields["overrides"] = ["training.micro_batch_size=0"]
    request_file.write_text(json.dumps(fields))
    assert consumer_main.main([str(request_file)]) == 2
    request_file.write_text(json.dumps({"config": str(config_file)}))
    assert consumer_main.main([str(request_file)]) == 2
    assert consumer_main.main([str(tmp_path / "missing.json")]) == 2


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        ((), "managed"),
        (("deployment.disaggregated.managed=false",), "disaggregated"),
        (("deployment.mode=local",), "local"),
    ],
)
def test_the_dispatch_runs_the_entry_of_the_deployment_mode(
    config_file, tmp_path, monkeypatch, sets, expected
):
    """Managed runs start the services; disaggregated ranks read windows; local ranks train."""
    seen = {}
    monkeypatch.setattr(
        "specdraft.trainer.launch.launch",
        lambda plan, entry, request: seen.update(entry=entry, request=request),
    )
    monkeypatch.setattr(managed, "run_managed", lambda request: seen.update(managed=request))
    request = RunRequest.create(str(config_file), [*sets, f"output_dir={tmp_path / 'run'}"])
    deployment.run_request(request)
    if expected == "managed":
        assert seen == {"managed": request}
    else:
        entry = consumer_main.rank_main if expected == "disaggregated" else rank_entry.rank_main
        assert seen == {"entry": entry, "request": request}


def test_the_dispatch_refuses_a_fresh_run_into_a_used_folder_unless_told(
    config_file, tmp_path, monkeypatch
):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-0000002").mkdir(parents=True)
    (run / "disagg").mkdir()
    monkeypatch.setattr(managed, "run_managed", lambda request: {"ran": True})
    request = RunRequest.create(str(config_file), [f"output_dir={run}"])
    with pytest.raises(RunFolderError, match="--overwrite"):
        deployment.run_request(request)
    assert RunRequest.create(str(config_file), [f"output_dir={run}"], resume="latest").resuming
    overwrite = RunRequest.create(str(config_file), [f"output_dir={run}"], overwrite=True)
    assert deployment.run_request(overwrite) == {"ran": True}
    (moved,) = run.glob("replaced-*")
    # A managed run's own folders go aside with the training run's files.
    assert (moved / "checkpoints").is_dir() and (moved / "disagg").is_dir()


def test_the_offline_rank_entry_refuses_a_disaggregated_request(config_file):
    request = RunRequest.create(str(config_file), ["deployment.disaggregated.managed=false"])
    with pytest.raises(ValueError, match=r"disagg\.consumer\.rank_main"):
        rank_entry.rank_main(request)
