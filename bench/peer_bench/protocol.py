"""The line protocol between the peer benchmark and one worker process (one side, one family).

A worker builds its side's training step from the fixture, prints `{"ready": ...}`, then answers
one JSON line per command read from stdin:

    check  -> {"loss": float, ...}  one forward (with grad, as in training), no backward
    step   -> {"ms": float, "loss": float}  forward + backward of one step, timed
    profile PATH -> {"ms": float, "path": PATH}  one step under torch.profiler; the operators
           by self CPU time written to PATH
    quit   -> exits

Only the standard library, torch and safetensors are imported here: the peers' venvs run it.
Gradients are dropped (set to None) before each step, outside the timed region, as an optimizer's
`zero_grad()` does, so every step allocates its gradients the same way.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import torch

# A forward: the loss tensor to backpropagate under "loss", plus floats the check reports.
Forward = Callable[[], dict]


def emit(record: dict) -> None:
    """One JSON line on stdout."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def as_floats(out: dict) -> dict:
    """The forward's outputs as plain floats."""
    return {key: float(value.detach()) for key, value in out.items()}


def step(params: list[torch.nn.Parameter], forward: Forward) -> dict:
    """One timed forward + backward, gradients dropped before it."""
    for param in params:
        param.grad = None
    start = time.perf_counter()
    loss = forward()["loss"]
    loss.backward()
    elapsed = time.perf_counter() - start
    return {"ms": elapsed * 1e3, "loss": float(loss.detach())}


def serve(model: torch.nn.Module, forward: Forward, threads: int, side: str) -> None:
    """Answer the benchmark's commands until `quit` or end of input."""
    torch.set_num_threads(threads)
    params = [p for p in model.parameters() if p.requires_grad]
    emit({"ready": side, "threads": torch.get_num_threads(), "torch": torch.__version__})
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            return
        if command == "check":
            emit(as_floats(forward()))
        elif command == "step":
            emit(step(params, forward))
        elif command.startswith("profile "):
            from torch.profiler import profile

            path = command.split(" ", 1)[1]
            with profile() as prof:
                record = step(params, forward)
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
            with open(path, "w") as out:
                out.write(f"{side}: one step, {record['ms']:.1f} ms\n{table}\n")
            emit({**record, "path": path})
        else:
            emit({"error": f"unknown command {command!r}"})
