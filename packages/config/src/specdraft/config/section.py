"""What every table of the schema shares: the section base, rule errors, registered sub-tables
(a family's options, a store's settings) and the size limits.

A module of its own so that the family option tables (`families/`) can build on the same base
as `schema.py`, which imports them: the schema composes the families, the families never import
the schema.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError


def rule(
    error_type: str, message: str, *, key: str | None = None, index: int | None = None
) -> PydanticCustomError:
    """Build a rule error; `key`/`index` tell the linter where the offending value sits."""
    ctx: dict[str, object] = {}
    if key is not None:
        ctx["key"] = key
    if index is not None:
        ctx["index"] = index
    # Braces in the message would be read as template fields by pydantic.
    safe = message.replace("{", "(").replace("}", ")")
    return PydanticCustomError(error_type, safe, ctx or None)


class Section(BaseModel):
    """Base for every table: unknown keys are errors, assignment is validated."""

    # No NaN or infinity anywhere: a non-finite rate, weight or timeout only fails later, and
    # far from its key.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _at_most_limit(cls, value: Any, info: ValidationInfo) -> Any:
        # Checked on the raw value, before int conversion: `1e23` must read as "too large", not
        # as pydantic's integer-parsing error, and no huge number reaches an allocation.
        field = cls.model_fields.get(info.field_name or "")
        metadata = field.metadata if field is not None else []
        limit = next((m.le for m in metadata if getattr(m, "le", None) is not None), None)
        if (
            limit is not None
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value > limit
        ):
            raise rule(
                "above_limit",
                f"above the largest allowed value {limit} (a larger value overflows, cannot be "
                f"allocated or, for a rate, diverges); use a value <= {limit}",
            )
        return value


def table(settings: type[Section], description: str) -> Any:
    """A registered entry's settings as a sub-table field, defaults unless a file sets it."""
    return Field(default_factory=settings, description=description)


def check_tables(tables: type[Section], expected: Mapping[str, type[Section] | None]) -> None:
    """Refuse a tables class that does not mount exactly the entries with settings, in order.

    The tables are declared by hand (`name: Settings = rules.table()`) so that type checkers see
    `cfg.model.dflash2`; this keeps that declaration equal to the registry it mirrors.
    """
    wanted = [(name, settings) for name, settings in expected.items() if settings is not None]
    mounted = [(name, field.annotation) for name, field in tables.model_fields.items()]
    if mounted != wanted:
        lines = "; ".join(f"{name}: {settings.__name__}" for name, settings in wanted)
        raise TypeError(
            f"{tables.__module__}.{tables.__name__} must declare one table per registered "
            f"entry with settings, in registry order: {lines or 'none'}"
        )


PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]

# Upper bounds far above any real run and far below what overflows a tensor size or an int64
# product of sizes, so an absurd value is a lint error instead of an allocation traceback or a
# hang. Documented in docs/config.md through each field's `<=` constraint.
MAX_SAMPLES_PER_BATCH = 4096
MAX_ACCUM_STEPS = 4096
MAX_TOKENS_PER_SAMPLE = 1 << 20
MAX_ANCHORS = 1 << 16
MAX_WIDTH = 1 << 20  # hidden widths and ranks
MAX_LAYERS = 1024
MAX_EPOCHS = 100_000
MAX_RANKS_PER_NODE = 1024
MAX_NODES = 65_536
