"""Tracking backends: where a run's metrics go besides metrics.jsonl, one module per backend.

`base.py` is the `MetricSink` protocol and what opening one is told; `jsonl.py` the JSONL file
every run writes; `registry.py` finds the optional backends (`<name>_sink.py`: TensorBoard,
W&B, MLflow) by the names `tracking.backends` selects. Import from the modules: no backend's
package is imported before a run selects it.
"""
