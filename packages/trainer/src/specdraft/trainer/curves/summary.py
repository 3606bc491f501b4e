"""What a curve is judged by: first, last and best tau, and when a tau is first reached."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .read import Curve, EvalPoint


@dataclass(frozen=True)
class Reach:
    """Where a run's held-out tau first reaches `tau` (step None: it never does).

    Between two evaluations tau is taken as linear in the step and in the training time, so
    `step` and `train_s` are interpolated there; `between` names the two evaluated steps (None
    when an evaluation met `tau` exactly or the first one already did).
    """

    tau: float
    step: float | None
    train_s: float | None
    between: tuple[int, int] | None = None

    @property
    def reached(self) -> bool:
        """Whether the run's tau ever reached `tau`."""
        return self.step is not None

    def as_dict(self) -> dict[str, Any]:
        """The reach as `--format json` prints it."""
        return {
            "tau": self.tau,
            "reached": self.reached,
            "step": self.step,
            "train_s": self.train_s,
            "interpolated_between": list(self.between) if self.between else None,
        }


def reach(curve: Curve, tau: float) -> Reach:
    """The first point where the curve's tau reaches `tau`, interpolated between evaluations."""
    previous: EvalPoint | None = None
    for point in curve.points:
        if point.tau >= tau:
            if previous is None or point.tau == tau:
                return Reach(tau, float(point.step), point.train_s)
            share = (tau - previous.tau) / (point.tau - previous.tau)
            step = previous.step + share * (point.step - previous.step)
            train_s = None
            if previous.train_s is not None and point.train_s is not None:
                train_s = previous.train_s + share * (point.train_s - previous.train_s)
            return Reach(tau, step, train_s, (previous.step, point.step))
        if math.isfinite(point.tau):
            previous = point
    return Reach(tau, None, None)


def tau_summary(curve: Curve) -> dict[str, Any]:
    """First, last and best evaluation of a run: {"first": {"step", "tau"}, ...}."""
    points = [p for p in curve.points if math.isfinite(p.tau)] or curve.points
    best = max(points, key=lambda p: p.tau)  # the earliest of equal bests
    return {
        name: {"step": p.step, "tau": p.tau, "train_s": p.train_s}
        for name, p in (("first", curve.points[0]), ("last", curve.points[-1]), ("best", best))
    }
