"""Tracking backends: a tiny run mirrored to TensorBoard, W&B (offline) and MLflow, each read
back with the backend's own reader and compared with the metrics JSONL, number for number.

The run trains once per module with every backend whose package is installed (`make setup`
installs them all); a backend whose package is missing skips its test with the extra to install.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from train_support import one_rank, single_thread, tiny_run

from specdraft.config import validate_config
from specdraft.config.tracking import BACKEND_NAMES, installed
from specdraft.trainer.runtime import DistContext
from specdraft.trainer.train.metrics import MetricsWriter, metrics_writer, read_metrics
from specdraft.trainer.train.tracking.base import TrackingUnavailable, scalar_metrics
from specdraft.trainer.train.tracking.registry import MODULES, backend

STEPS = 3


def _skip_unless_installed(name: str) -> None:
    if not installed(name):
        pytest.skip(f"{name} is not installed: pip install 'specdraft-trainer[{name}]'")


@pytest.fixture(scope="module")
def mirrored_run(tiny_target_path, tmp_path_factory):
    """(run folder, JSONL rows, summary) of a tiny run with every installed backend selected."""
    out = tmp_path_factory.mktemp("tracking") / "run"
    backends = [name for name in BACKEND_NAMES if installed(name)]
    config = validate_config(
        tiny_run(
            tiny_target_path,
            out,
            training={"max_steps": STEPS},
            tracking={"backends": backends, "project": "specdraft-test", "run_name": "mirror"},
        )
    )
    from specdraft.trainer.train.assembly import build_trainer

    with pytest.MonkeyPatch.context() as mp, single_thread(), one_rank() as ctx:
        mp.setenv("WANDB_MODE", "offline")
        for var in ("WANDB_DIR", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"):
            mp.delenv(var, raising=False)
        trainer = build_trainer(config, ctx, progress=False)
        summary = trainer.fit().summary()
        # What `specdraft train`'s ranks do at the end (train/rank_entry.py).
        trainer.writer.log_summary(summary)
        trainer.writer.close()
    return out, read_metrics(out / "metrics.jsonl"), summary


def _expected(rows: list[dict]) -> dict[int, dict[str, float]]:
    """Step -> the numbers every backend must hold: the JSONL lines' scalars, merged per step."""
    by_step: dict[int, dict[str, float]] = {}
    for row in rows:
        by_step.setdefault(row["step"], {}).update(scalar_metrics(row))
    return by_step


def test_the_registry_and_the_schema_name_the_same_backends():
    assert tuple(MODULES) == BACKEND_NAMES
    for name in BACKEND_NAMES:
        assert backend(name).name == name


def test_jsonl_lists_and_strings_stay_out_of_the_mirrors():
    row = {"step": 3, "time": 1.5, "loss": 0.5, "n": 2, "acc": [0.1, 0.2], "g": "nan"}
    assert scalar_metrics(row) == {"loss": 0.5, "n": 2}


def test_tensorboard_events_hold_the_jsonl_numbers(mirrored_run):
    _skip_unless_installed("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, rows, _ = mirrored_run
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    logged: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            logged.setdefault(event.step, {})[tag] = event.value
    expected = _expected(rows)
    assert sorted(logged) == sorted(expected) == list(range(1, STEPS + 1))
    for step, numbers in expected.items():
        assert logged[step] == pytest.approx(numbers, rel=1e-6)  # TensorBoard keeps float32


def test_wandb_offline_run_holds_the_jsonl_numbers(mirrored_run):
    _skip_unless_installed("wandb")
    out, rows, summary = mirrored_run
    [run_dir] = (out / "wandb").glob("offline-run-*")
    # W&B's own reader of its transaction log (run-<id>.wandb).
    records = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    logged: dict[int, dict[str, float]] = {}
    for line in records.splitlines():
        record = json.loads(line)
        if record.get("type") == "history":
            items = record["history"]["item"]
            step = int(record["history"]["step"]["num"])
            numbers = {k: v for k, v in items.items() if not k.startswith("_")}
            logged.setdefault(step, {}).update(numbers)
    assert logged == _expected(rows)
    state = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", str(run_dir), "--json", "--summary"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    inspected = json.loads(state)
    assert (inspected["project"], inspected["name"], inspected["state"]) == (
        "specdraft-test",
        "mirror",
        "finished",
    )
    assert inspected["config"]["model.block_size"] == 8
    assert inspected["config"]["run_id"] == "tiny"
    assert inspected["summary"]["summary/final_step"] == summary["final_step"] == STEPS
    assert inspected["summary"]["summary/last_loss"] == summary["last_loss"]


def test_mlflow_run_holds_the_jsonl_numbers(mirrored_run):
    _skip_unless_installed("mlflow")
    from mlflow import MlflowClient

    out, rows, summary = mirrored_run
    client = MlflowClient(tracking_uri=f"sqlite:///{out.resolve() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("specdraft-test")
    [run] = client.search_runs([experiment.experiment_id])
    assert (run.info.run_name, run.info.status) == ("mirror", "FINISHED")
    logged: dict[int, dict[str, float]] = {}
    for key in run.data.metrics:
        for metric in client.get_metric_history(run.info.run_id, key):
            logged.setdefault(metric.step, {})[key] = metric.value
    assert logged == _expected(rows)
    assert run.data.params["model.block_size"] == "8"
    artifacts = Path(client.download_artifacts(run.info.run_id, "summary.json", str(out)))
    assert json.loads(artifacts.read_text()) == json.loads(json.dumps(summary))
    assert artifacts.is_relative_to(out)


def _tracking_config(tmp_path: Path, target: Path, **tracking: object):
    return validate_config(tiny_run(target, tmp_path / "run", tracking=tracking))


def test_a_missing_package_stops_the_run_before_anything_opens(
    tiny_target_path, tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # how Python spells "not installed"
    config = _tracking_config(tmp_path, tiny_target_path, backends=["tensorboard", "mlflow"])
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=__import__("torch").device("cpu"))
    with pytest.raises(TrackingUnavailable) as err:
        metrics_writer(config, tmp_path / "run", ctx)
    message = str(err.value)
    assert "\n" not in message
    assert "tracking.backends selects 'mlflow'" in message
    assert "pip install 'specdraft-trainer[mlflow]'" in message
    assert not (tmp_path / "run" / "tensorboard").exists()  # nothing was opened


def test_a_backend_that_fails_to_start_closes_the_ones_before_it(
    tiny_target_path, tmp_path, monkeypatch
):
    _skip_unless_installed("tensorboard")
    _skip_unless_installed("mlflow")
    # An MLflow server that is not there: the run stops at the start, in one line.
    config = _tracking_config(
        tmp_path,
        tiny_target_path,
        backends=["tensorboard", "mlflow"],
        mlflow_tracking_uri="http://127.0.0.1:9",
    )
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=__import__("torch").device("cpu"))
    with pytest.raises(TrackingUnavailable) as err:
        metrics_writer(config, tmp_path / "run", ctx)
    assert str(err.value).startswith("tracking backend 'mlflow' did not start: ")
    assert "\n" not in str(err.value)


def test_only_rank_0_opens_the_backends(tiny_target_path, tmp_path):
    config = _tracking_config(tmp_path, tiny_target_path, backends=["tensorboard"])
    ctx = DistContext(rank=1, world_size=1, local_rank=0, device=__import__("torch").device("cpu"))
    writer = metrics_writer(config, tmp_path / "run", ctx)
    writer.write(1, {"loss": 1.0})
    writer.log_summary({"final_step": 1})
    writer.close()
    assert not (tmp_path / "run").exists()


class _BrokenSink:
    """A sink whose every call fails (a full disk, a dropped connection)."""

    def __init__(self) -> None:
        self.calls = 0

    def log(self, step, metrics):
        self.calls += 1
        raise OSError(28, "No space left on device")

    def log_summary(self, summary):
        raise ConnectionError("gone")

    def close(self):
        raise ConnectionError("gone")


def test_a_failing_mirror_is_logged_once_and_never_stops_the_jsonl(tmp_path, caplog):
    sink = _BrokenSink()
    writer = MetricsWriter(tmp_path / "metrics.jsonl", sinks=[sink])
    with caplog.at_level(logging.WARNING):
        for step in (1, 2, 3):
            writer.write(step, {"loss": 1.0 / step})
        writer.log_summary({"final_step": 3})
        writer.close()
    assert sink.calls == 3
    assert [row["step"] for row in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    failures = [r for r in caplog.records if "_BrokenSink log failed" in r.getMessage()]
    assert len(failures) == 1 and "JSONL and training go on" in failures[0].getMessage()
