"""backends.compile: what configure_dynamo sets, in-place block compile, and the two errors.

Dynamo runs with the "eager" backend here (tracing and guards, no Inductor), so these are fast;
the real compiled runs are in tests/integration/test_distributed_compile.py.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn

from specdraft.config import compile_plan_from
from specdraft.trainer.backends import (
    RecompileError,
    apply_compile,
    configure_dynamo,
    explain_recompile_limit,
    forbid_recompiles,
)

pytestmark = pytest.mark.compile

LIMITS = (
    "recompile_limit",
    "accumulated_recompile_limit",
    "fail_on_recompile_limit_hit",
    "automatic_dynamic_shapes",
    "error_on_recompile",
)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Dynamo's limits and caches as the test found them."""
    saved = {name: getattr(torch._dynamo.config, name) for name in LIMITS}
    torch._dynamo.reset()
    yield
    for name, value in saved.items():
        setattr(torch._dynamo.config, name, value)
    torch._dynamo.reset()


def plan(shapes: int, *, with_eval: bool = False, blocks: int = 2):
    return compile_plan_from(
        compile_blocks=True, num_shapes=shapes, with_eval=with_eval, num_blocks=blocks
    )


def test_configure_dynamo_sets_the_plans_limits():
    torch._dynamo.config.recompile_limit = 8
    big = plan(5, with_eval=True)  # 15 graphs per block
    configure_dynamo(big)
    config = torch._dynamo.config
    assert config.recompile_limit == big.recompile_limit > big.graphs_per_block
    assert config.accumulated_recompile_limit >= big.accumulated_recompile_limit
    assert config.fail_on_recompile_limit_hit is True


def test_configure_dynamo_keeps_a_higher_limit_and_the_dynamic_shapes_default():
    torch._dynamo.config.recompile_limit = 100
    torch._dynamo.config.automatic_dynamic_shapes = True
    configure_dynamo(plan(2))
    assert torch._dynamo.config.recompile_limit == 100
    # dynamic=False turns automatic dynamic shapes off for the blocks alone.
    assert torch._dynamo.config.automatic_dynamic_shapes is True


def test_without_static_shapes_nothing_is_configured():
    torch._dynamo.config.recompile_limit = 8
    configure_dynamo(compile_plan_from(compile_blocks=True, num_shapes=None, with_eval=False))
    assert torch._dynamo.config.recompile_limit == 8
    assert torch._dynamo.config.fail_on_recompile_limit_hit is False


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])


def test_blocks_are_compiled_in_place_with_unchanged_names():
    model = Blocks()
    before = list(model.state_dict())
    assert apply_compile(model, plan(1)) == 2
    assert list(model.state_dict()) == before
    assert all(isinstance(block, nn.Linear) for block in model.layers)
    assert all(block._compiled_call_impl is not None for block in model.layers)


def test_compile_off_leaves_blocks_alone():
    model = Blocks()
    off = compile_plan_from(compile_blocks=False, num_shapes=3, with_eval=False)
    assert apply_compile(model, off) == 0
    assert all(block._compiled_call_impl is None for block in model.layers)


def step(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sum(-1)


def test_a_limit_hit_names_the_limit_and_the_plan():
    configure_dynamo(plan(3))  # 3 shapes x 2 graphs
    torch._dynamo.config.recompile_limit = 2  # lowered behind the plan's back
    compiled = torch.compile(step, backend="eager", dynamic=False)
    with pytest.raises(RecompileError) as raised, explain_recompile_limit():
        for length in (128, 256, 384):
            compiled(torch.ones(2, length))
    message = str(raised.value)
    assert "torch._dynamo.config.recompile_limit = 2" in message
    assert "needs 6 graphs per block class (3 length(s) x 2 = 6)" in message
    assert "training.static_shape_buckets" in message


def test_other_errors_pass_through_unchanged():
    with pytest.raises(ValueError, match="not about compiling"), explain_recompile_limit():
        raise ValueError("not about compiling")


def test_fail_on_recompile_stops_the_first_unplanned_shape():
    compiled = torch.compile(step, backend="eager", dynamic=False)
    compiled(torch.ones(2, 128))  # the warm-up
    with forbid_recompiles(True):
        compiled(torch.ones(2, 128))  # a planned shape runs
    with (
        pytest.raises(RecompileError, match=r"training\.fail_on_recompile = true"),
        forbid_recompiles(True),
    ):
        compiled(torch.ones(2, 200))
    assert torch._dynamo.config.error_on_recompile is False


def test_without_fail_on_recompile_a_new_shape_compiles():
    compiled = torch.compile(step, backend="eager", dynamic=False)
    compiled(torch.ones(2, 128))
    with forbid_recompiles(False):
        assert compiled(torch.ones(2, 200)).shape == (2,)
