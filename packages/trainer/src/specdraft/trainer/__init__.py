"""specdraft trainer: data, draft models, backends, training loop, disaggregated runtime.

Where a change goes: `data/` turns conversations into token ids and loss masks; `models/` holds
the draft families (`models.family` is the one place that says what each needs), the objectives
and the frozen target; `features/` writes and reads offline target features; `backends/` shards
and compiles the draft behind the `Backend` protocol; `train/` builds the `Trainer` and runs the
loop, checkpoints, evaluation and export; `disagg/` is the disaggregated runtime (capture, store,
producer, consumer, managed runs); `regenerate/` rewrites a corpus with the target's answers;
`assets/` builds the tiny offline test assets; `runtime/` holds the process-level pieces they
share (distributed context, cache, JSON over HTTP). `launch.py` starts the ranks.
"""

__version__ = "0.1.0"
