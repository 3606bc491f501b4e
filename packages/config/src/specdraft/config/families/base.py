"""What the config package knows of one draft family (torch-free): `FamilyRules`.

A family's torch-free half lives in `specdraft/config/families/<family>.py`: its options table
(a pydantic model the schema mounts at `[model.<table>]`), the hard rules on those options that
make a config invalid, and the soft checks the linter runs against the target's files. The
half that needs torch (the model, its HF config, metric names, export layouts, FLOP terms) is
the trainer's folder `specdraft/trainer/models/<family>/`, found by the family's name.

Why two halves: the config package must never import torch (pre-commit runs `specdraft lint`)
and cannot import the trainer, yet a config-only install (`pip install specdraft-config`) must
still validate `[model.dflash2]`; so the options and their rules ship with the config package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..finding import Problem
from ..lint_code import Code
from ..section import Section, table
from ..serve import DEFAULT_ENGINES
from ..target_info import TargetInfo

if TYPE_CHECKING:
    from ..schema import Config


def no_target_checks(config: Config, info: TargetInfo) -> list[Problem]:
    """A family without checks against the target."""
    return []


def no_config_checks(config: Config) -> list[Problem]:
    """A family without checks of its options against the rest of the config."""
    return []


def no_option_rules(model: Any) -> None:
    """A family whose options need no rule beyond their own fields."""
    return None


@dataclass(frozen=True)
class FamilyRules:
    """One draft family as the schema and the linter see it."""

    # The `model.algorithm` value, also the trainer's folder `models/<name>/`.
    name: str
    # How docs and messages name it ("DFlash2"), and its clause in `model.algorithm`'s help.
    title: str
    summary: str
    # The family's options as a `[model.<name>]` table, or None (plain DFlash has none).
    options: type[Section] | None = None
    # Hard rules across the family's options when the family is chosen: raise `section.rule`
    # errors (their types listed in `rule_types`, each with a code in codes.py).
    option_rules: Callable[[Any], None] = no_option_rules
    rule_types: tuple[str, ...] = ()
    # Soft findings about the family's options against the target's facts (lint only).
    target_checks: Callable[[Config, TargetInfo], list[Problem]] = no_target_checks
    # Soft findings about the family's options against the rest of the config (lint only).
    config_checks: Callable[[Config], list[Problem]] = no_config_checks
    # The lint codes of the family's own rules and checks; `codes.CODES` lists them with the
    # shared ones (a code's number must still be unique across the table).
    codes: tuple[Code, ...] = ()
    # The engines (`serve.ENGINES`) that read a draft vocabulary (`model.draft_vocab_size`) for
    # this family's drafts; the linter warns when none of the config's engines is one (SD324)
    # and the exports for the others refuse it.
    draft_vocab_engines: tuple[str, ...] = ()
    # How exported draft folders name the family, so that `model.init_from` reads one back: the
    # `architectures` entry of its sglang / vllm config.json and speculators' model type.
    architecture: str = ""
    speculators_type: str | None = None
    # The family's options as the exports write them: (HF config key, option field).
    folder_keys: tuple[tuple[str, str], ...] = ()

    @property
    def draft_vocab_served(self) -> bool:
        """Whether an engine of an unconfigured `[serve]` (SGLang, vLLM) reads a draft
        vocabulary for this family."""
        return any(engine in DEFAULT_ENGINES for engine in self.draft_vocab_engines)

    @property
    def options_table(self) -> str | None:
        """The `[model.*]` table of this family's options (named after it), or None."""
        return self.name if self.options is not None else None

    def table(self) -> Any:
        """The `[model.<name>]` field of this family's options (`families.FamilyTables`)."""
        if self.options is None:
            raise TypeError(f"family {self.name!r} has no options table")
        return table(self.options, f"{self.title} options (used when algorithm = '{self.name}').")

    def options_of(self, model: Any) -> Any:
        """This family's options object of a `ModelConfig` (None without options)."""
        return getattr(model, self.name) if self.options is not None else None
