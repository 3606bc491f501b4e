"""Compiled draft blocks with shape buckets (and anchor buckets): exactly the planned graphs of the
length x anchor-width grid and of the grad variants, no compile in training, and clear errors
when a limit or a shape goes outside the plan.

Each probe runs in a fresh process (Dynamo's caches and counters are per process). Every claim
here is about Dynamo's graphs, guards and limits, so the probes compile with the `aot_eager`
backend (SPECDRAFT_COMPILE_BACKEND): the same Dynamo graphs and AOT autograd joint graphs,
without Inductor's code generation and C++ builds, which cost minutes per graph on two cold
cores. Real Inductor code runs in tests/integration/test_packing_compile.py. Each test still
plans only the graphs its claim needs: the grid runs one draft block (6 graphs), the grad
variants one length (2 graphs), and the two error tests the same 2 graphs.
"""

from __future__ import annotations

import pytest
from backend_runs import run_probe, write_config, write_conversations

from specdraft.config import ShapePolicy, load_config
from specdraft.trainer.backends.compile import COMPILE_BACKEND_ENV

pytestmark = [pytest.mark.slow, pytest.mark.compile]


@pytest.fixture(autouse=True)
def graphs_without_code_generation(monkeypatch):
    """The probes (subprocesses) inherit the backend choice (see the module docstring)."""
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "aot_eager")


# 2 lengths (128, max_length 256) x 2 anchor widths (72, num_anchors 128): the short replies have
# 15-69 valid anchors and fit 128 tokens, the long ones 160-239 anchors, so training meets both
# lengths and both widths. One draft block: the grad variants are the next config's claim.
GRID = {
    "num_draft_layers": 1,
    "max_length": 256,
    "static_shape_buckets": [128],
    "num_anchors": 128,
    "static_anchor_buckets": [72],
    "compile_blocks": True,
    "fail_on_recompile": True,
}

# Two draft blocks at one length (max_length 256, static shapes, no buckets), no evaluation: the
# first block's input comes from the frozen embedding and has no grad, the second's has, and
# Dynamo guards on requires_grad, so training needs 2 graphs.
VARIANTS = {
    "num_draft_layers": 2,
    "max_length": 256,
    "static_shape_buckets": [],
    "compile_blocks": True,
    "fail_on_recompile": True,
}


def compile_plan(config):
    """The plan of the config's own shape policy, as the run assembly builds it."""
    return ShapePolicy.from_config(config).compile_plan(
        compile_blocks=config.training.compile_blocks,
        with_eval=bool(config.data.eval_paths),
        num_blocks=config.model.num_draft_layers,
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Short and long conversations, shared by every probe of this module."""
    return write_conversations(tmp_path_factory.mktemp("compile-data") / "conversations.jsonl")


@pytest.mark.distributed
@pytest.mark.parametrize("backend", ["fsdp1", "fsdp2"])
def test_the_length_x_anchor_grid_compiles_the_planned_graphs_before_step_one(
    tmp_path, data, backend
):
    config = write_config(tmp_path, data, eval_samples=2, **GRID)
    plan = compile_plan(load_config(config))
    # Per length: 2 widths x 1 training graph + the no-grad evaluation forward at num_anchors
    # slots = 3; 2 lengths = 6 graphs, all built by the warm-up. It covers several lengths with
    # evaluation on (FSDP1 once failed tracing the next shape after a warm-up backward left
    # sharded gradients on its flat parameter) and the anchor dimension, on both backends.
    assert (plan.num_shapes, plan.num_widths, plan.graphs_per_block) == (2, 2, 6)

    (run,) = run_probe(2, config, [[f"training.backend={backend}"]])

    assert "error" not in run, run
    assert run["compile_graphs"] == plan.graphs_per_block
    assert run["recompiles_after_warmup"] == 0
    assert run["compile_metrics"] == [[plan.graphs_per_block, 0]] * run["steps"]
    # Training really used both lengths and both widths, each micro-batch a planned cell.
    lengths = {n for step in run["pad_lengths"] for n in step}
    widths = {w for step in run["anchor_widths"] for w in step}
    assert lengths == {128, 256}
    assert widths == {72, 128}


def test_a_second_block_compiles_the_grad_variant_before_step_one(tmp_path, data):
    config = write_config(tmp_path, data, **VARIANTS)
    plan = compile_plan(load_config(config))
    assert (plan.num_shapes, plan.num_widths, plan.graphs_per_block) == (1, 1, 2)

    (run,) = run_probe(1, config, [[]])

    assert "error" not in run, run
    assert run["compile_graphs"] == plan.graphs_per_block
    assert run["recompiles_after_warmup"] == 0
    assert run["compile_metrics"] == [[plan.graphs_per_block, 0]] * run["steps"]
    assert {n for step in run["pad_lengths"] for n in step} == {256}


def test_a_limit_below_the_plan_fails_with_the_numbers(tmp_path, data):
    config = write_config(tmp_path, data, **VARIANTS)
    plan = compile_plan(load_config(config))

    # The warm-up builds the first block's graph; the second block's variant is past the limit.
    (run,) = run_probe(1, config, [[]], tweaks={"recompile_limit": 1})

    kind, message = run["error"]
    assert kind == "RecompileError"
    assert "torch._dynamo.config.recompile_limit = 1" in message
    assert f"needs {plan.graphs_per_block} graphs" in message
    assert f"recompile_limit = {plan.recompile_limit}" in message
    assert "training.static_shape_buckets" in message


def test_fail_on_recompile_stops_a_shape_the_warm_up_did_not_build(tmp_path, data):
    config = write_config(tmp_path, data, **VARIANTS)

    # The train loader pads to the longest sample instead of the run's single length.
    (run,) = run_probe(1, config, [[]], tweaks={"pad_to_longest": True})

    kind, message = run["error"]
    assert kind == "RecompileError"
    assert "training.fail_on_recompile = true" in message
    assert "pad policy" in message
