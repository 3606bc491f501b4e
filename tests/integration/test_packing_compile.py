"""Compiled draft blocks with sequence packing: the warm-up builds one graph set (the packed
training graph and the unpacked evaluation graph of the one static length) and training, which
meets real packed rows, the empty dummies of the last window and evaluation, never recompiles,
and trains the same losses as the same packed run uncompiled.

Every batch the trainer runs under packing carries the packed keys (document and position ids),
so the dummies the warm-up compiles take the same path as real rows. One small probe (one draft
block, one length: 2 graphs) because compiles are slow on CPU.
"""

from __future__ import annotations

import pytest
from backend_runs import run_probe, write_config, write_conversations

from specdraft.config import ShapePolicy, load_config

pytestmark = [pytest.mark.slow, pytest.mark.compile]

PACKED_COMPILED = {
    "packing": True,
    "num_draft_layers": 1,
    "static_shape_buckets": [],
    "compile_blocks": True,
    "fail_on_recompile": True,
}


def test_packed_rows_compile_one_graph_set_and_never_recompile(tmp_path):
    data = write_conversations(tmp_path / "data" / "conversations.jsonl")
    config = write_config(tmp_path, data, eval_samples=2, **PACKED_COMPILED)
    loaded = load_config(config)
    shapes = ShapePolicy.from_config(loaded)
    assert shapes.packing
    plan = shapes.compile_plan(
        compile_blocks=True, with_eval=True, num_blocks=loaded.model.num_draft_layers
    )
    # One length x one anchor width: the training graph and the no-grad evaluation forward.
    assert (plan.num_shapes, plan.num_widths, plan.graphs_per_block) == (1, 1, 2)

    # The same packed run uncompiled first (no graph in the process yet), then compiled.
    eager_overrides = ["training.compile_blocks=false", "training.fail_on_recompile=false"]
    eager, run = run_probe(1, config, [eager_overrides, []])

    assert "error" not in eager, eager
    assert "error" not in run, run
    # Compiled packed blocks compute what the eager ones do (Inductor fuses, so not bitwise).
    assert run["loss"] == pytest.approx(eager["loss"], rel=1e-4)
    assert run["grad_norm"] == pytest.approx(eager["grad_norm"], rel=1e-3)
    assert run["compile_graphs"] == plan.graphs_per_block
    assert run["recompiles_after_warmup"] == 0
    assert run["compile_metrics"] == [[plan.graphs_per_block, 0]] * run["steps"]
    # Real packed rows were trained (more conversations than rows), at the one static length.
    assert run["samples"][0] > 8
    assert {n for step in run["pad_lengths"] for n in step} == {256}


def test_a_warm_up_without_the_packed_keys_would_recompile(tmp_path):
    """The claim above is not vacuous: warm-up dummies without the packed keys build the unpacked
    graph, and the first real packed row then needs another one."""
    data = write_conversations(tmp_path / "data" / "conversations.jsonl")
    config = write_config(tmp_path, data, **PACKED_COMPILED)

    (run,) = run_probe(1, config, [[]], tweaks={"unpacked_warmup": True})

    kind, message = run["error"]
    assert kind == "RecompileError"
    assert "training.fail_on_recompile = true" in message
