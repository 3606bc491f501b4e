"""The table of `specdraft` subcommands: name -> "module:attribute", imported only when used.

A lazy table keeps `specdraft --help` and `specdraft lint` fast and torch-free, and means one
command module that fails to import cannot take the other commands down with it.
"""

from __future__ import annotations

COMMANDS: dict[str, str] = {
    "lint": "specdraft.cli.lint_cmd:lint",
    "config": "specdraft.cli.config_cmd:config",
    "explain-buckets": "specdraft.cli.explain_cmd:explain_buckets",
    "explain-vocab": "specdraft.cli.explain_vocab_cmd:explain_vocab",
    "explain-layers": "specdraft.cli.explain_layers_cmd:explain_layers",
    "train": "specdraft.cli.train_cmd:train",
    "eval": "specdraft.cli.eval_cmd:eval_",
    "export": "specdraft.cli.export_cmd:export",
    "serve-capture": "specdraft.cli.serve_capture_cmd:serve_capture",
    "serve-producer": "specdraft.cli.serve_producer_cmd:serve_producer",
    "regenerate": "specdraft.cli.regenerate_cmd:regenerate",
    "prepare-features": "specdraft.cli.prepare_features_cmd:prepare_features",
    "assets": "specdraft.cli.assets_cmd:assets",
    "audit": "specdraft.cli.audit_cmd:audit",
    "curves": "specdraft.cli.curves_cmd:curves",
}

# One-line summaries for `specdraft --help`, so listing commands imports none of them.
SUMMARIES: dict[str, str] = {
    "lint": "Check config files (schema, bucket rules, target) as path:line:col: CODE lines.",
    "config": "Print the config JSON Schema, or a config with defaults and overrides resolved.",
    "explain-buckets": "Dry run: the resolved pad lengths and what each costs on the corpus.",
    "explain-vocab": "Dry run: what a draft vocabulary of each size covers on the corpus.",
    "explain-layers": "Dry run: rank the target's layers by probes, suggest target_layer_ids.",
    "train": "Train a DFlash, DFlash2 or DSpark drafter (FSDP1/FSDP2, local or disaggregated).",
    "eval": "Acceptance length tau of a draft checkpoint on held-out prompts.",
    "export": "Export a checkpoint as a HF draft folder SGLang can load.",
    "serve-capture": "Run the embedded capture server (target features into the store).",
    "serve-producer": "Run the producer: lease prompts to capture servers, serve windows.",
    "regenerate": "Rewrite a corpus's assistant turns with the target's own greedy answers.",
    "prepare-features": "Run the target once over the corpus and write offline feature shards.",
    "assets": "Build local targets (the tiny one; real ones from GGUF files) into a fixed folder.",
    "audit": "Check a run's record: every sample trained exactly once per epoch?",
    "curves": "Learning curves: held-out tau of runs against step and training time (PNG).",
}
