"""The draft families, trainer side: what each needs and builds, found in its own folder.

A family is a folder `models/<name>/` whose `family.py` holds one `DraftFamily` named `FAMILY`:
its HF config class and model class (named as the engines route, since `save_pretrained` writes
the class name into `architectures`), how the specdraft options become HF config keys, the
target features it reads, the rates its metric sums log as, how the vLLM and speculators
exports lay it out, and the FLOP terms it adds to the shared backbone's. Everything else asks
`family_of(config)` (or iterates over `FAMILIES`) instead of comparing `model.algorithm` to a
string.

The names come from the config package's registry (`specdraft.config.families`, where each
family's torch-free options and lint checks live): `FAMILIES` imports `models.<name>.family` for
each registered name, so the trainer has no list of its own to keep in step.
"""

from __future__ import annotations

from specdraft.config import Config, ModelConfig
from specdraft.config.families import FAMILY_NAMES
from specdraft.config.registry import load_one

from .config import DFlashDraftConfig
from .family_spec import DraftFamily
from .losses import COMMON_METRIC_RATIOS


def _no_folder(name: str, module_name: str) -> ImportError:
    """The error for a registered family whose trainer folder is missing: what to add."""
    return ImportError(
        f"draft family {name!r} is registered in specdraft.config.families but the trainer "
        f"has no {module_name}: add the folder models/{name}/ with a family.py that defines "
        "FAMILY (see docs/internals.md, 'Adding a draft family')"
    )


def _load_family(name: str) -> DraftFamily:
    """`models/<name>/family.py`'s FAMILY, with an error that says what a new family lacks."""
    return load_one(
        "specdraft.trainer.models",
        name,
        DraftFamily,
        attr="FAMILY",
        module="{name}.family",
        missing=_no_folder,
    )


# Every registered family, in the config registry's order.
FAMILIES: dict[str, DraftFamily] = {name: _load_family(name) for name in FAMILY_NAMES}


def metric_ratios() -> dict[str, tuple[str, str]]:
    """Every rate the trainer may log: the common ones, then each family's, in family order.

    Two families may share a rate (DFlash2 reports DFlash's CE) only with the same sums.
    """
    ratios: dict[str, tuple[str, str]] = dict(COMMON_METRIC_RATIOS)
    for family in FAMILIES.values():
        for name, sums in family.metric_ratios.items():
            if ratios.setdefault(name, sums) != sums:
                raise TypeError(
                    f"draft family {family.name!r} logs {name!r} from {sums}, another family "
                    f"from {ratios[name]}; give one of them another name"
                )
    return ratios


def family_for(algorithm: str) -> DraftFamily:
    """The family of a `model.algorithm` value."""
    try:
        return FAMILIES[algorithm]
    except KeyError:
        raise ValueError(
            f"model.algorithm = {algorithm!r} is not a draft family: use one of {sorted(FAMILIES)}"
        ) from None


def family_of(config: Config | ModelConfig) -> DraftFamily:
    """The family of a specdraft `Config` or its `ModelConfig` section."""
    model_cfg = config.model if isinstance(config, Config) else config
    return family_for(model_cfg.algorithm)


def family_of_architecture(architecture: str) -> DraftFamily:
    """The family whose config.json `architectures` entry is `architecture` (export, eval)."""
    for family in FAMILIES.values():
        if family.architecture == architecture:
            return family
    known = sorted(family.architecture for family in FAMILIES.values())
    raise ValueError(f"unknown draft architecture {architecture!r}; expected one of {known}")


def family_of_config(config: DFlashDraftConfig) -> DraftFamily:
    """The family whose HF config class `config` is (FLOP counts, from a built draft)."""
    for family in FAMILIES.values():
        if isinstance(config, family.config_class):
            return family
    known = sorted(family.config_class.__name__ for family in FAMILIES.values())
    raise ValueError(f"{type(config).__name__} is not a draft family's config; expected {known}")
