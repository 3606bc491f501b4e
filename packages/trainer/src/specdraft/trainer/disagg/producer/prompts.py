"""Prompts the producer leases, and the screen that keeps bad ones out of the epoch plan.

A bad prompt (empty, longer than data.max_length, no supervised assistant token) is counted
by reason and left out of the plan before windows are cut, so it can neither stall a window
nor make the trained set differ from the published one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    """One tokenised conversation: what a capture request carries."""

    sample_id: int
    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]


def prompts_from_rows(rows: Iterable[dict]) -> list[Prompt]:
    """Prompts from dataset rows with input_ids, loss_mask and sample_id columns."""
    return [
        Prompt(
            int(r["sample_id"]), tuple(map(int, r["input_ids"])), tuple(map(int, r["loss_mask"]))
        )
        for r in rows
    ]


def bad_prompt_reason(prompt: Prompt, *, max_length: int) -> str | None:
    """Why a prompt cannot be trained on ('empty', 'over_long', 'no_assistant_turn'), or None."""
    if not prompt.input_ids:
        return "empty"
    if len(prompt.input_ids) > max_length:
        return "over_long"
    if len(prompt.loss_mask) != len(prompt.input_ids) or not any(prompt.loss_mask):
        return "no_assistant_turn"
    return None


def screen_prompts(
    prompts: Sequence[Prompt], *, max_length: int
) -> tuple[list[Prompt], dict[int, str]]:
    """Split prompts into the good ones and {sample_id: reason} for the bad ones."""
    good, bad = [], {}
    seen: set[int] = set()
    for prompt in prompts:
        if prompt.sample_id in seen:
            # Store keys are built from the sample id: two rows with one id would overwrite.
            raise ValueError(
                f"sample_id {prompt.sample_id} appears twice in the training data; sample ids "
                f"must be unique (they key the feature store)"
            )
        seen.add(prompt.sample_id)
        reason = bad_prompt_reason(prompt, max_length=max_length)
        if reason is None:
            good.append(prompt)
        else:
            bad[prompt.sample_id] = reason
    return good, bad


def count_reasons(bad: dict[int, str]) -> dict[str, int]:
    """Bad prompts per reason."""
    return dict(Counter(bad.values()))
