"""MLflow: each metrics line's numbers logged to an MLflow run (`tracking.backends`).

The store: tracking.mlflow_tracking_uri, else MLFLOW_TRACKING_URI, else a SQLite file in the
run folder (<output_dir>/mlflow.db, artifacts in <output_dir>/mlflow-artifacts; `mlflow ui
--backend-store-uri sqlite:///<output_dir>/mlflow.db` shows it). MLFLOW_RUN_ID continues a
run. The client is MLflow's own `MlflowClient`, so no process-global active run is touched.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Mapping
from typing import Any

from .base import Backend, SinkContext

DB_NAME = "mlflow.db"
ARTIFACTS_NAME = "mlflow-artifacts"
# MLflow refuses longer parameter values; the config's lists (paths, layer ids) rarely get close.
MAX_PARAM_CHARS = 6000


class MlflowSink:
    """An MLflow run: the config as params, metrics at the trainer's step, summary.json."""

    def __init__(self, client: Any, run_id: str) -> None:
        self._client = client
        self.run_id = run_id
        # A run that ends by an exception never reaches close(): it shows FAILED, not RUNNING.
        atexit.register(self._end, "FAILED")

    @classmethod
    def open(cls, context: SinkContext) -> MlflowSink:
        """Create (or with MLFLOW_RUN_ID continue) the run in the experiment tracking.project."""
        from mlflow import MlflowClient
        from mlflow.entities import Param

        tracking = context.config.tracking
        uri = tracking.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        artifacts = None
        if not uri:  # the run folder's own store
            folder = context.output_dir.resolve()
            folder.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{folder / DB_NAME}"
            artifacts = (folder / ARTIFACTS_NAME).as_uri()
        client = MlflowClient(tracking_uri=uri)
        name = tracking.project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "specdraft"
        experiment = client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else client.create_experiment(name, artifact_location=artifacts)
        )
        run_id = os.environ.get("MLFLOW_RUN_ID")
        if run_id:
            client.update_run(run_id, status="RUNNING")
            return cls(client, run_id)
        run = client.create_run(experiment_id, run_name=context.run_name)
        params = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in context.params().items()]
        client.log_batch(run.info.run_id, params=params)
        return cls(client, run.info.run_id)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """One batch of metrics at `step`."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, float(value), now, step) for key, value in metrics.items()]
        self._client.log_batch(self.run_id, metrics=batch)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """The summary as the run's artifact summary.json."""
        self._client.log_dict(self.run_id, dict(summary), "summary.json")

    def close(self) -> None:
        """Mark the run finished."""
        atexit.unregister(self._end)
        self._end("FINISHED")

    def _end(self, status: str) -> None:
        self._client.set_terminated(self.run_id, status=status)


BACKEND = Backend("mlflow", MlflowSink.open, run_files=(DB_NAME, ARTIFACTS_NAME))
