"""llama-server's acceptance counts, read two ways (no server needed here).

- From the responses' `timings` (`predicted_n`, `draft_n`, `draft_n_accepted`): each response's
  first token comes from the prompt's prefill without a draft, and every later target step
  yields its accepted draft tokens plus one, so the acceptance length as vLLM counts it (tokens
  per decoding step after the first) is (generated - prompts) / (generated - accepted - prompts).
  Steps that drafted nothing (the last token of a response, where llama-server leaves no room
  for a draft) count as steps here, as they do in vLLM, which drafts at every step.
- From `/metrics` (started with `--metrics`): `spec_decode_num_drafts_total` counts verification
  steps (steps with a draft), `spec_decode_num_accepted_tokens_total` the accepted draft tokens
  and `spec_decode_num_accepted_tokens_per_pos_total{position="k"}` the steps that accepted
  more than k; so 1 + accepted / steps per drafted step and the acceptance per position, which
  llama-server exposes nowhere else (its log prints them only at trace verbosity).
- From its log with `LLAMA_TRACE=1` (server-context.cpp): one line per verification step,
  "accepted A/D draft tokens", so position k is attempted when the step drafted more than k
  tokens and the k before were accepted, the count specdraft's estimate keeps. The /metrics
  ratio counts position k as attempted whenever k - 1 was accepted, also at the end of a
  response, where llama-server drafts fewer tokens (those left to generate, minus one): its
  last positions read lower there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

PREFIX = "llamacpp:"
DRAFTS = "spec_decode_num_drafts_total"
ACCEPTED = "spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "spec_decode_num_draft_tokens_total"
PER_POSITION = "spec_decode_num_accepted_tokens_per_pos_total"
_SAMPLE = re.compile(r'^llamacpp:(\w+)(?:\{position="(\d+)"\})?\s+(\S+)$')
_LAUNCH = re.compile(r"launch_slot_: id +\d+ \| task (\d+) \| processing task")
_STEP = re.compile(r"\| task (\d+) \| accepted +(\d+)/ *(\d+) draft tokens$", re.MULTILINE)


def parse_metrics(text: str) -> dict[str, Any]:
    """The counters of a /metrics answer by name (`llamacpp:` dropped); the per-position
    counter as a list indexed by position."""
    values: dict[str, Any] = {}
    positions: dict[int, float] = {}
    for line in text.splitlines():
        found = _SAMPLE.match(line.strip())
        if not found:
            continue
        name, position, value = found.group(1), found.group(2), float(found.group(3))
        if position is not None:
            positions[int(position)] = value
        else:
            values[name] = value
    values[PER_POSITION] = [positions.get(k, 0.0) for k in range(max(positions, default=-1) + 1)]
    return values


def metrics_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the counters grew by between two scrapes (the per-position list too)."""
    delta: dict[str, Any] = {}
    for name, value in after.items():
        if isinstance(value, list):
            old = list(before.get(name, []))
            old += [0.0] * (len(value) - len(old))
            delta[name] = [a - b for a, b in zip(value, old, strict=False)]
        else:
            delta[name] = value - before.get(name, 0.0)
    return delta


def acceptance_from_timings(responses: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Acceptance length (tokens per decoding step after the first, see module) and the sums
    it comes from, over /completion answers."""
    generated = accepted = drafted = prompts = 0
    for response in responses:
        timings = response.get("timings") or {}
        tokens = int(timings.get("predicted_n", 0))
        if tokens <= 0:
            continue
        prompts += 1
        generated += tokens
        drafted += int(timings.get("draft_n", 0))
        accepted += int(timings.get("draft_n_accepted", 0))
    steps = generated - accepted - prompts
    return {
        "prompts": prompts,
        "generated": generated,
        "draft_tokens": drafted,
        "accepted": accepted,
        "steps": steps,
        "acceptance_length": (generated - prompts) / steps if steps > 0 else None,
    }


def acceptance_from_metrics(delta: dict[str, Any]) -> dict[str, Any]:
    """Acceptance per verification step and per position from a /metrics delta (see module)."""
    drafts = float(delta.get(DRAFTS, 0.0))
    accepted = float(delta.get(ACCEPTED, 0.0))
    per_pos = [float(v) for v in delta.get(PER_POSITION, [])]
    given_previous = []
    for k, count in enumerate(per_pos):
        reached = drafts if k == 0 else per_pos[k - 1]
        given_previous.append(count / reached if reached else 0.0)
    return {
        "drafts": drafts,
        "draft_tokens": float(delta.get(DRAFT_TOKENS, 0.0)),
        "accepted": accepted,
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "accepted_per_position": per_pos,
        "per_position": [count / drafts if drafts else 0.0 for count in per_pos],
        "per_position_given_previous": given_previous,
    }


def steps_from_trace(log_text: str, *, skip_first_task: bool = True) -> list[tuple[int, int]]:
    """(accepted, drafted) of each verification step in a LLAMA_TRACE=1 log, in order; without
    the first task the server ran (the warm-up request) when `skip_first_task`."""
    launched = [int(found.group(1)) for found in _LAUNCH.finditer(log_text)]
    skipped = launched[0] if skip_first_task and launched else None
    return [
        (int(found.group(2)), int(found.group(3)))
        for found in _STEP.finditer(log_text)
        if int(found.group(1)) != skipped
    ]


def per_position_from_steps(steps: Sequence[tuple[int, int]], width: int) -> dict[str, Any]:
    """Acceptance per position given the one before, counted as specdraft counts it: position
    k is attempted when the step drafted more than k tokens and accepted the k before."""
    attempts, accepts = [0] * width, [0] * width
    for accepted, drafted in steps:
        for k in range(min(drafted, width)):
            attempts[k] += 1
            if accepted <= k:
                break
            accepts[k] += 1
    return {
        "steps": len(steps),
        "attempts": attempts,
        "accepts": accepts,
        "per_position_given_previous": [
            a / t if t else 0.0 for a, t in zip(accepts, attempts, strict=True)
        ],
    }


def count_identical(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> int:
    """How many of `other`'s token lists equal `reference`'s, prompt by prompt."""
    return sum(list(a) == list(b) for a, b in zip(reference, other, strict=True))


def acceptance_length_within(rates: Sequence[float], draft_tokens: int) -> float:
    """Acceptance length of a step that proposes only the first `draft_tokens` positions,
    from the acceptance per position given the one before (1 + sum of the survival rates)."""
    length, survive = 1.0, 1.0
    for rate in rates[:draft_tokens]:
        # Position k is accepted when every position before it was: the product of the rates.
        survive *= rate
        length += survive
    return length
