"""The speculative settings llama-server is started with, one server each (its flags are
server-wide: a request cannot change them), read from llama.cpp build 11434's common/arg.cpp
and common/speculative.cpp.

- the target alone (no flags);
- the draft: `--spec-type draft-dflash` (DFlash, DFlash2: llama.cpp tells them apart by the
  draft's selector) or `draft-dspark`, `-md DRAFT.gguf`, `--spec-draft-n-max N` (default 3;
  llama.cpp clamps it to block_size - 1, DSpark block_size);
- n-gram speculation over the prompt and the output so far, with the same number of draft
  tokens where llama.cpp has a flag for it: ngram-simple (`--spec-ngram-simple-size-m`),
  ngram-map-k (`--spec-ngram-map-k-size-m`), ngram-mod (`--spec-ngram-mod-n-max`; its n-min of
  48 is capped at N, so it drafts only whole runs as by default); ngram-cache drafts a fixed 8
  (`n_draft = 8` in create_state_ngram_cache, no flag);
- the ceiling: the draft with `--spec-synth-len L`, where each draft position is accepted at
  random so that the mean acceptance per drafted step is L while the draft and the
  verification still run (outputs are not the target's): at the draft's measured acceptance,
  and at N + 1 (every draft token accepted).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

NGRAM_CACHE_TOKENS = 8  # fixed in llama.cpp (create_state_ngram_cache)
NGRAM_MOD_MIN = 48  # llama.cpp's default --spec-ngram-mod-n-min
# Every setting's name, in the tokens/s table's order ("none" is the target alone).
SPEED_SETTINGS = (
    "none",
    "draft",
    "ngram-simple",
    "ngram-map-k",
    "ngram-mod",
    "ngram-cache",
    "synth-measured",
    "synth-full",
)


@dataclass(frozen=True)
class Setting:
    """One server configuration measured: its name, table label and llama-server flags."""

    name: str
    label: str
    args: tuple[str, ...] = ()
    # --spec-synth-len: acceptance drawn at random, outputs not the target's.
    synthetic: bool = False


def spec_type(family: str) -> str:
    """llama.cpp's --spec-type of a draft family."""
    return "draft-dspark" if family == "dspark" else "draft-dflash"


def draft_setting(family: str, draft: Path, draft_tokens: int) -> Setting:
    """The draft served as llama.cpp's speculative model."""
    return Setting(
        "draft",
        f"{family} draft",
        (
            *("--spec-type", spec_type(family)),
            *("-md", str(draft)),
            *("--spec-draft-n-max", str(draft_tokens)),
        ),
    )


def ngram_settings(draft_tokens: int) -> list[Setting]:
    """llama.cpp's n-gram modes, each drafting `draft_tokens` where it has a flag for it."""
    n = str(draft_tokens)
    return [
        Setting(
            "ngram-simple",
            "ngram-simple",
            ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", n),
        ),
        Setting(
            "ngram-map-k",
            "ngram-map-k",
            ("--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-m", n),
        ),
        Setting(
            "ngram-mod",
            "ngram-mod",
            (
                *("--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", n),
                *("--spec-ngram-mod-n-min", str(min(NGRAM_MOD_MIN, draft_tokens))),
            ),
        ),
        Setting(
            "ngram-cache",
            f"ngram-cache ({NGRAM_CACHE_TOKENS} fixed)",
            ("--spec-type", "ngram-cache"),
        ),
    ]


def ceiling_settings(draft: Setting, measured: float | None, draft_tokens: int) -> list[Setting]:
    """The draft at a synthetic acceptance: its measured one (when it is in llama.cpp's range
    [1, N + 1]) and N + 1."""
    full = draft_tokens + 1
    settings = []
    if measured is not None and 1.0 <= measured < full:
        settings.append(
            Setting(
                "synth-measured",
                f"  at accept {measured:.2f} (synth)",
                (*draft.args, "--spec-synth-len", f"{measured:.6f}"),
                synthetic=True,
            )
        )
    settings.append(
        Setting(
            "synth-full",
            f"  at accept {full} (synth)",
            (*draft.args, "--spec-synth-len", str(full)),
            synthetic=True,
        )
    )
    return settings


def check_speed_settings(names: Collection[str]) -> None:
    """Raise ValueError naming any of `names` that is not a setting of SPEED_SETTINGS."""
    unknown = sorted(set(names) - set(SPEED_SETTINGS))
    if unknown:
        raise ValueError(
            f"unknown llama.cpp speed setting(s) {', '.join(unknown)}: "
            f"choose from {', '.join(SPEED_SETTINGS)}"
        )
