"""The draft blocks' compile backend: Inductor unless SPECDRAFT_COMPILE_BACKEND names another."""

from __future__ import annotations

import torch
from torch import nn

from specdraft.config import CompilePlan
from specdraft.trainer.backends.compile import COMPILE_BACKEND_ENV, apply_compile, compile_backend


def test_inductor_unless_the_environment_names_another(monkeypatch):
    monkeypatch.delenv(COMPILE_BACKEND_ENV, raising=False)
    assert compile_backend() == "inductor"
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "  ")
    assert compile_backend() == "inductor"
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "aot_eager")
    assert compile_backend() == "aot_eager"


def test_apply_compile_hands_the_backend_to_every_block(monkeypatch):
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "eager")
    seen: list[tuple] = []
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    for block in model.layers:
        block.compile = lambda *args, **kwargs: seen.append((args, kwargs))  # type: ignore[method-assign]
    plan = CompilePlan(
        enabled=True,
        dynamic=False,
        num_shapes=1,
        graphs_per_shape=1,
        graphs_per_block=1,
        recompile_limit=None,
        accumulated_recompile_limit=None,
    )
    assert apply_compile(model, plan) == 2
    assert seen == [((), {"dynamic": False, "backend": "eager"})] * 2
    assert torch.is_tensor(model.layers[0].weight)
