"""The producer: leases prompts to capture servers and publishes whole optimizer windows.

`plan` cuts the run's prompts into windows with the trainers' own sampler; `pool` spreads
captures over the capture servers; `backpressure` bounds what the store holds; `ledger` records
every lease, publish and acknowledgement so a restarted producer resumes exactly once;
`machine` holds the exactly-once rules as a state machine without threads or I/O, which
`producer` drives with its threads, pool and store; `controller` serves the windows to the
trainer ranks over HTTP (`wire.windows`). `main` is the process (`python -m
specdraft.trainer.disagg.producer`, or `specdraft serve-producer`).
"""

from .controller import WindowController
from .machine import ProducerError
from .producer import Producer, ProducerSettings, ledger_path

__all__ = ["Producer", "ProducerError", "ProducerSettings", "WindowController", "ledger_path"]
