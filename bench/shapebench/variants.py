"""The variants of a table, in the reference note's row order, as config overrides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Variant:
    """One row of a table: a backend and the static-shape options."""

    key: str  # what --variants takes
    label: str  # the row name in the tables
    backend: str
    static_shapes: bool
    buckets: bool
    compile_blocks: bool
    anchor_buckets: bool = False  # the second static dimension (training.static_anchor_buckets)
    packing: bool = False  # whole conversations packed into rows (training.packing)
    anchor_grouped: bool = False  # micro-batches of similar anchor counts (data.anchor_grouped)

    def training_overrides(
        self, buckets: tuple[int, ...], anchor_buckets: tuple[int, ...] = ()
    ) -> dict[str, Any]:
        """The [training] keys this variant sets on top of the preset's base config."""
        out: dict[str, Any] = {
            "backend": self.backend,
            "static_shapes": self.static_shapes,
            "compile_blocks": self.compile_blocks,
        }
        if self.buckets:
            out["static_shape_buckets"] = list(buckets)
        if self.anchor_buckets:
            out["static_anchor_buckets"] = list(anchor_buckets)
        if self.packing:
            out["packing"] = True
        if self.compile_blocks:
            # A recompile after warm-up is what the tables count; do not turn it into an error.
            out["fail_on_recompile"] = False
        return out


VARIANTS: tuple[Variant, ...] = (
    Variant("fsdp1", "fsdp1 (pad to longest)", "fsdp1", False, False, False),
    Variant("fsdp2", "fsdp2 (pad to longest)", "fsdp2", False, False, False),
    Variant("static", "fsdp2 + static_shapes", "fsdp2", True, False, False),
    Variant("buckets", "fsdp2 + static_shape_buckets", "fsdp2", True, True, False),
    Variant("static-compile", "fsdp2 + static_shapes + compile_blocks", "fsdp2", True, False, True),
    Variant(
        "buckets-compile",
        "fsdp2 + static_shape_buckets + compile_blocks",
        "fsdp2",
        True,
        True,
        True,
    ),
    # Anchor-count buckets on top of each static stack.
    Variant("static-anchors", "fsdp2 + static_shapes + anchor buckets", "fsdp2", True, False,
            False, True),
    Variant("buckets-anchors", "fsdp2 + static_shape_buckets + anchor buckets", "fsdp2", True,
            True, False, True),
    Variant("static-anchors-compile", "fsdp2 + static_shapes + anchor buckets + compile_blocks",
            "fsdp2", True, False, True, True),
    Variant("buckets-anchors-compile",
            "fsdp2 + static_shape_buckets + anchor buckets + compile_blocks", "fsdp2", True, True,
            True, True),
    # The same stacks in anchor-grouped order (data.anchor_grouped).
    Variant("fsdp2-grouped", "fsdp2 (pad to longest) + anchor_grouped", "fsdp2", False, False,
            False, anchor_grouped=True),
    Variant("static-anchors-grouped", "fsdp2 + static_shapes + anchor buckets + anchor_grouped",
            "fsdp2", True, False, False, True, anchor_grouped=True),
    Variant("buckets-anchors-grouped",
            "fsdp2 + static_shape_buckets + anchor buckets + anchor_grouped", "fsdp2", True, True,
            False, True, anchor_grouped=True),
    # Whole conversations packed into rows of max_length, one static shape.
    Variant("packed", "fsdp2 + static_shapes + packing", "fsdp2", True, False, False,
            packing=True),
    Variant("packed-compile", "fsdp2 + static_shapes + packing + compile_blocks", "fsdp2", True,
            False, True, packing=True),
)  # fmt: skip

BY_KEY = {variant.key: variant for variant in VARIANTS}


def parse_variants(text: str) -> list[Variant]:
    """Variants named in a comma list ('all' = every one), in the order given."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return list(VARIANTS)
    unknown = [name for name in names if name not in BY_KEY]
    if unknown or not names:
        raise ValueError(
            f"--variants: unknown {', '.join(unknown) or '(empty)'}; choose from "
            f"{', '.join(BY_KEY)} or 'all'"
        )
    return [BY_KEY[name] for name in names]
