"""Compiled draft blocks with shape buckets: exactly the planned graphs, no compile in training,
and clear errors when a limit or a shape goes outside the plan.

Each probe runs in a fresh process (Dynamo's caches and counters are per process). The Inductor
cache under build/ makes a repeat run take seconds; a cold one compiles 6-9 small graphs.
"""

from __future__ import annotations

import pytest
from _backend_runs import run_probe, write_config, write_conversations

from specdraft.config import compile_plan, load_config

pytestmark = [pytest.mark.slow, pytest.mark.compile]

COMPILED = {
    "max_length": 384,  # buckets 128, 256 and max_length 384: three static shapes
    "static_shape_buckets": [128, 256],
    "compile_blocks": True,
    "fail_on_recompile": True,
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Short and long conversations, shared by every probe of this module."""
    return write_conversations(tmp_path_factory.mktemp("compile-data") / "conversations.jsonl")


@pytest.mark.distributed
@pytest.mark.parametrize("backend", ["fsdp1", "fsdp2"])
def test_three_buckets_compile_the_planned_graphs_before_step_one(tmp_path, data, backend):
    config = write_config(tmp_path, data, eval_samples=2, **COMPILED)
    plan = compile_plan(load_config(config))
    # Per shape: the first block's input without grad, the second's with grad, and the no-grad
    # evaluation forward; all blocks share one code object.
    assert (plan.num_shapes, plan.graphs_per_shape) == (3, 3)

    # FSDP1 once failed here: tracing the next shape after a warm-up backward left sharded
    # gradients on the flat parameter its blocks' parameters are views of.
    (run,) = run_probe(2, config, [[f"training.backend={backend}"]])

    assert "error" not in run, run
    assert run["compile_graphs"] == plan.graphs_per_block
    assert run["recompiles_after_warmup"] == 0
    assert run["compile_metrics"] == [[plan.graphs_per_block, 0]] * run["steps"]


def test_a_limit_below_the_plan_fails_with_the_numbers(tmp_path, data):
    config = write_config(tmp_path, data, **COMPILED)
    plan = compile_plan(load_config(config))  # no evaluation: 3 shapes x 2 graphs

    (run,) = run_probe(1, config, [[]], tweaks={"recompile_limit": 2})

    kind, message = run["error"]
    assert kind == "RecompileError"
    assert "torch._dynamo.config.recompile_limit = 2" in message
    assert f"needs {plan.graphs_per_block} graphs" in message
    assert f"recompile_limit = {plan.recompile_limit}" in message
    assert "training.static_shape_buckets" in message


def test_fail_on_recompile_stops_a_shape_the_warm_up_did_not_build(tmp_path, data):
    config = write_config(tmp_path, data, **COMPILED)

    # The train loader pads to the longest sample instead of the run's buckets.
    (run,) = run_probe(1, config, [[]], tweaks={"pad_to_longest": True})

    kind, message = run["error"]
    assert kind == "RecompileError"
    assert "training.fail_on_recompile = true" in message
    assert "pad policy" in message
