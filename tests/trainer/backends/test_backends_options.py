"""BackendOptions from the config: the backend holds the run's one ShapePolicy, its compile plan
counts the (length x anchor width) grid the `--dry-run` prints, dtypes, and where fp8 is refused."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.config import ShapePolicy, validate_config
from specdraft.trainer.backends import (
    Fp8Unavailable,
    backend_options_from_config,
    check_fp8_supported,
    resolve_param_dtype,
)
from specdraft.trainer.train.preflight import runtime_check_errors

CPU = torch.device("cpu")


def make_config(
    *,
    max_length: int = 1024,
    static_shapes: bool = True,
    buckets: list[int] | None = None,
    anchor_buckets: list[int] | None = None,
    compile_blocks: bool = False,
    layers: int = 2,
    with_eval: bool = False,
    **training,
):
    data = {"train_paths": ["t.jsonl"], "max_length": max_length}
    if with_eval:
        data["eval_paths"] = ["e.jsonl"]
    return validate_config(
        {
            "model": {
                "target": "/nonexistent/target",
                "algorithm": "dflash2",
                "num_draft_layers": layers,
                "target_layer_ids": [1, 2],
                "mask_token_id": 100,
                "dflash2": {"selector_gold_policy": "insert"},
            },
            "data": data,
            "training": {
                "static_shapes": static_shapes,
                "static_shape_buckets": buckets,
                "static_anchor_buckets": anchor_buckets,
                "num_anchors": 64,
                "compile_blocks": compile_blocks,
                **training,
            },
        }
    )


@st.composite
def run_settings(draw):
    """Valid static-shape settings: max_length, buckets below it, compile, layers, eval."""
    max_length = 128 * draw(st.integers(1, 16))
    static = draw(st.booleans())
    below = [128 * k for k in range(1, max_length // 128)]
    buckets = sorted(draw(st.sets(st.sampled_from(below), max_size=4))) if static and below else []
    anchors = sorted(draw(st.sets(st.integers(1, 64), max_size=3))) if static else []
    return {
        "max_length": max_length,
        "static_shapes": static,
        "buckets": buckets or None,
        "anchor_buckets": anchors or None,
        "compile_blocks": draw(st.booleans()),
        "layers": draw(st.integers(1, 4)),
        "with_eval": draw(st.booleans()),
    }


@settings(max_examples=60, deadline=None)
@given(run_settings())
def test_the_backend_holds_the_runs_one_shape_policy(case):
    config = make_config(**case)
    shapes = ShapePolicy.from_config(config)
    options = backend_options_from_config(config, CPU, shapes=shapes)
    assert options.shapes is shapes
    assert options.compile_blocks == case["compile_blocks"]
    plan = options.compile_plan(case["layers"])
    if case["compile_blocks"] and case["static_shapes"]:
        # Graphs = lengths x (widths x grad variants + eval): the grid, counted exactly.
        train = 2 if case["layers"] > 1 else 1
        per_length = len(shapes.anchor_widths) * train + int(case["with_eval"])
        assert plan.graphs_per_block == len(shapes.lengths) * per_length
        assert plan.num_cells == len(shapes.grid)
    else:
        # Bucket padding alone needs nothing from the backend.
        assert plan.graphs_per_block == 0


@settings(max_examples=60, deadline=None)
@given(run_settings())
def test_the_backend_compiles_with_the_plan_dry_run_prints(case):
    config = make_config(**case)
    shapes = ShapePolicy.from_config(config)
    options = backend_options_from_config(config, CPU, shapes=shapes)
    printed = shapes.compile_plan(
        compile_blocks=config.training.compile_blocks,
        with_eval=bool(config.data.eval_paths),
        num_blocks=config.model.num_draft_layers,
    )
    assert options.compile_plan(case["layers"]) == printed


@pytest.mark.parametrize("buckets", [1, 2, 3, 4, 5, 8])
def test_the_recompile_limit_covers_every_graph_the_run_builds(buckets):
    # Training alone reproduces the reference note's 2 x buckets + 4; evaluation adds one no-grad
    # graph per shape, which 2 x buckets + 4 would not cover from 5 buckets on.
    lengths = [128 * k for k in range(1, buckets)]
    train = plan_of(
        make_config(max_length=128 * buckets, buckets=lengths or None, compile_blocks=True)
    )
    assert train.num_shapes == buckets
    assert train.recompile_limit == 2 * buckets + 4
    evaluated = plan_of(
        make_config(
            max_length=128 * buckets, buckets=lengths or None, compile_blocks=True, with_eval=True
        )
    )
    assert evaluated.graphs_per_block == 3 * buckets
    assert evaluated.recompile_limit > evaluated.graphs_per_block


def test_one_block_drafts_trace_once_per_shape_in_training():
    plan = plan_of(make_config(buckets=[256, 512], compile_blocks=True, layers=1))
    assert (plan.num_shapes, plan.graphs_per_shape) == (3, 1)


def test_anchor_widths_multiply_the_training_graphs_but_not_evaluation():
    config = make_config(
        buckets=[512], anchor_buckets=[16], compile_blocks=True, layers=2, with_eval=True
    )
    plan = plan_of(config)
    # 2 lengths x (2 widths x 2 grad variants + 1 eval forward at num_anchors) = 10.
    assert (plan.num_shapes, plan.num_widths, plan.graphs_per_block) == (2, 2, 10)
    assert plan.recompile_limit == 14
    assert "2 length(s) x (2 width(s) x 2 + 1) = 10" in plan.describe()


def plan_of(config):
    """The compile plan of a config's own shape policy and settings."""
    return ShapePolicy.from_config(config).compile_plan(
        compile_blocks=config.training.compile_blocks,
        with_eval=bool(config.data.eval_paths),
        num_blocks=config.model.num_draft_layers,
    )


@pytest.mark.parametrize(
    ("setting", "device", "expected"),
    [
        ("auto", "cpu", torch.float32),
        ("auto", "cuda", torch.bfloat16),
        ("bf16", "cpu", torch.bfloat16),
        ("fp32", "cuda", torch.float32),
    ],
)
def test_parameter_dtype(setting, device, expected):
    assert resolve_param_dtype(setting, torch.device(device)) == expected


def test_gradients_are_reduced_in_fp32_whatever_the_compute_dtype():
    config = make_config(mixed_precision="bf16")
    options = backend_options_from_config(config, CPU, shapes=ShapePolicy.from_config(config))
    assert (options.param_dtype, options.reduce_dtype) == (torch.bfloat16, torch.float32)


def test_fp8_is_refused_on_cpu_with_the_fix():
    config = make_config(backend="fsdp2", fp8_linear=True)
    options = backend_options_from_config(config, CPU, shapes=ShapePolicy.from_config(config))
    with pytest.raises(Fp8Unavailable, match=r"needs a CUDA device.*set fp8_linear = false"):
        check_fp8_supported(options)


def test_fp8_is_refused_off_fsdp2_even_on_cuda():
    config = make_config(backend="fsdp2", fp8_linear=True)
    options = backend_options_from_config(
        config, torch.device("cuda"), shapes=ShapePolicy.from_config(config)
    )
    fsdp1 = type(options)(**{**options.__dict__, "backend": "fsdp1"})
    with pytest.raises(Fp8Unavailable, match=r"training\.backend = 'fsdp2'"):
        check_fp8_supported(fsdp1)


def test_train_checks_fp8_before_starting_ranks():
    assert runtime_check_errors(make_config()) == []
    if torch.cuda.is_available():
        pytest.skip("this machine could run fp8")
    (error,) = runtime_check_errors(make_config(backend="fsdp2", fp8_linear=True))
    assert error.startswith("training.fp8_linear = true:")
    assert "CUDA" in error
