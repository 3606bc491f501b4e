"""Trainer ranks refuse a producer whose plan belongs to another run or another rank count."""

from __future__ import annotations

import pytest
import torch
from disagg_runs import EXAMPLE

from specdraft.config import load_config
from specdraft.trainer.disagg.consumer.assembly import PlanMismatch, check_plan
from specdraft.trainer.runtime import DistContext


def _ctx(world_size: int) -> DistContext:
    return DistContext(rank=0, world_size=world_size, local_rank=0, device=torch.device("cpu"))


def test_a_plan_for_this_run_and_rank_count_is_accepted():
    config = load_config(EXAMPLE)
    check_plan({"run": config.run_id, "world_size": 2}, config, _ctx(2), "http://127.0.0.1:1")


@pytest.mark.parametrize(
    ("plan", "ranks", "message"),
    [
        ({"run": "quickstart-disaggregated", "world_size": 4}, 2, r"4 trainer ranks.*has 2"),
        ({"run": "another-run", "world_size": 2}, 2, r"serves run 'another-run'.*run_id"),
    ],
)
def test_a_plan_of_another_run_or_rank_count_is_refused_with_the_fix(plan, ranks, message):
    config = load_config(EXAMPLE)
    with pytest.raises(PlanMismatch, match=message) as error:
        check_plan(plan, config, _ctx(ranks), "http://127.0.0.1:1")
    assert "http://127.0.0.1:1" in str(error.value)
