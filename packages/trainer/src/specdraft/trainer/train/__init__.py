"""The training loop and what surrounds it, for every mode (local, offline features, disaggregated).

`assembly.build_trainer(config, ctx)` turns a validated config into a `trainer.Trainer` built
whole (backend, head, spec, optimizer and schedule, batch source, settings, run output,
evaluator); `Trainer.fit` runs the loop. Around it: `sources.py` (the local `BatchSource` and
the batch builder every source shares), `checkpoint.py` and `resume.py` (atomic, verified
checkpoints and exact resume), `metrics.py`, `schedule.py`, `eval_run.py` / `evaluation.py`
(tau on held-out prompts); around a run, `rank_entry.py` (what every rank runs), `dry_run.py`
(`--dry-run`'s plan), `preflight.py` (the checks before any rank starts) and `environment.py`
(what the ranks inherit). Exporting a checkpoint is `specdraft.trainer.export`. Import from the
modules: this package's `__init__` stays empty so that importing one of them does not load the
others.
"""
