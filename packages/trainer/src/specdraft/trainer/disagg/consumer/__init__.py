"""The trainer ranks' side: optimizer windows from the producer, tensors from the store.

`client` talks to the window controller (`wire.windows`), `fetch` reads a window's samples from
the feature store, `source` is the `BatchSource` the trainer consumes, and `assembly` builds the
trainer of a disaggregated run. `rank_main` is what each rank runs (`specdraft train` and the
managed run start it, the latter through `python -m specdraft.trainer.disagg.consumer`). It never
imports the producer.
"""

from .assembly import PlanMismatch, build_disaggregated_trainer
from .client import EndOfRun, WindowClient, WindowError, WindowTimeout
from .main import rank_main
from .source import WindowBatchSource

__all__ = [
    "EndOfRun",
    "PlanMismatch",
    "WindowBatchSource",
    "WindowClient",
    "WindowError",
    "WindowTimeout",
    "build_disaggregated_trainer",
    "rank_main",
]
