"""The resume contract: what a resumed run must agree on with its checkpoint, as one table.

Each row of RESUME_CONTRACT is one field: the name a user sees (in a refusal and in
`--allow-changed`), what it means, how to read it from the config, the value that checkpoints
written before the field existed had, whether it is *data order* (a change would repeat some
samples and skip others, so a resume refuses it unless the user names the field in
`--allow-changed`) or part of the draft's identity (a change makes the checkpoint meaningless:
always refused), and where a checkpoint records it:

- the run fingerprint (`trainer_state.json` "fingerprint"), checked by the trainer before it
  loads anything (`train/checkpoint.check_fingerprint`); a field with a default is written only
  when its value differs from it, so a run that does not use a newer option writes the
  fingerprint older versions wrote;
- the sampler's state (`trainer_state.json` "sampler", under `sampler_key`), checked by
  `MicroBatchSampler.load_state_dict`, which also rebuilds the saved plan from it.

Everything that checks a resume derives from this table: the run fingerprint
(`train/assembly.run_fingerprint`), the identity and data-order field lists of
`train/checkpoint`, the names `--allow-changed` accepts, and the sampler's saved state, its
defaults for older states and the config field a refused sampler setting is named by. A new
sampler option is one row here (and, if it selects a new kind of plan, one mode in
`sampler_mode`).

It lives in the config package because every side reads it: the sampler (specdraft.collate)
cannot import the trainer, the trainer and the CLI both import the config package, and the
table reads nothing but Config fields, so the config package stays torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .attention_layers import layer_causal, layer_windows
from .sampler_mode import MODE_FIELDS, MODE_SELECTING_FIELDS, SamplerMode, mode_of, sampler_mode

if TYPE_CHECKING:
    from .schema import Config


class _Required:
    """The default of a field every checkpoint has recorded since the first version."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class ResumeField:
    """One row of the resume contract (see the module docstring for the columns)."""

    name: str  # the run fingerprint's key; for data order also the config field users name
    meaning: str
    # How to read it from the config; None when the run supplies it (the data fingerprint).
    read: Callable[[Config], Any] | None
    data_order: bool = False
    # The value checkpoints written before the field existed had (REQUIRED: always recorded).
    default: Any = REQUIRED
    # Recorded in the run fingerprint (some fields only the sampler's state records).
    fingerprinted: bool = True
    # Its key in the sampler's saved state, or None when the sampler does not record it.
    sampler_key: str | None = None

    @property
    def has_default(self) -> bool:
        """True for fields that older checkpoints may lack."""
        return self.default is not REQUIRED

    @property
    def selects_mode(self) -> bool:
        """True for the fields that choose the sampler mode (`sampler_mode.MODE_FIELDS`)."""
        return self.name in MODE_SELECTING_FIELDS


def _layer_windows(config: Config) -> list[int | None] | None:
    """Each draft layer's window, or None when every layer attends to the whole context."""
    windows = list(layer_windows(config.model))
    return windows if any(w is not None for w in windows) else None


def _layer_causal(config: Config) -> list[bool] | None:
    """Which draft layers see their block causally, or None when none does."""
    causal = list(layer_causal(config.model))
    return causal if any(causal) else None


RESUME_CONTRACT: tuple[ResumeField, ...] = (
    # The draft's identity: the checkpoint's weights mean nothing under other values.
    ResumeField("algorithm", "the draft family", lambda c: c.model.algorithm),
    ResumeField("block_size", "tokens per draft block", lambda c: c.model.block_size),
    ResumeField("num_anchors", "anchor blocks per sample", lambda c: c.training.num_anchors),
    ResumeField(
        "target_layer_ids",
        "the target layers the draft reads",
        lambda c: list(c.model.target_layer_ids),
    ),
    ResumeField("num_draft_layers", "draft decoder layers", lambda c: c.model.num_draft_layers),
    ResumeField("mask_token_id", "the mask token", lambda c: c.model.mask_token_id),
    ResumeField("max_length", "the longest sample", lambda c: c.data.max_length),
    ResumeField(
        "draft_vocab_size",
        "the tokens the draft can propose (its head's rows)",
        lambda c: c.model.draft_vocab_size,
        default=None,
    ),
    # Each layer's attention window (model.sliding_window and model.layer_types): the weights
    # learned under one window are another draft under another. Full attention everywhere is
    # the value checkpoints from before the option had.
    ResumeField(
        "model.layer_windows",
        "each draft layer's attention window (model.sliding_window, model.layer_types)",
        _layer_windows,
        default=None,
    ),
    # Each layer's causality inside its block (model.causal_layers), likewise: bidirectional
    # blocks everywhere is the value checkpoints from before the option had.
    ResumeField(
        "model.causal_layers",
        "which draft layers see their own block causally (model.causal_layers)",
        _layer_causal,
        default=None,
    ),
    # A sink logit per head in every layer (model.attention_sink_bias): other parameters.
    ResumeField(
        "model.attention_sink_bias",
        "the learned attention sink of every draft layer (model.attention_sink_bias)",
        lambda c: c.model.attention_sink_bias or None,
        default=None,
    ),
    # The weights the run started from (model.init_from): the sha256 of the folder's
    # safetensors, which the run computes; the same path with other weights is another run.
    ResumeField(
        "model.init_from",
        "the weights the draft started from (sha256 of model.init_from's safetensors)",
        None,
        default=None,
    ),
    # What the draft is trained to predict: a resume on other labels would mix two objectives
    # in one curve. Soft labels count by their top-K only when on (the weight may change, as
    # the learning rate may).
    ResumeField(
        "data.labels",
        "what each supervised position is trained to predict (tokens or the target's argmax)",
        lambda c: c.data.labels,
        default="tokens",
    ),
    ResumeField(
        "training.soft_label_topk",
        "the target's top tokens per position the soft labels keep (0: no soft labels)",
        lambda c: c.training.soft_label_topk if c.training.soft_label_weight > 0 else 0,
        default=0,
    ),
    # The data order: which samples the resumed run trains on, and in what order.
    ResumeField(
        "data",
        "the training data (data.train_paths, data.max_samples or the tokenizer)",
        None,
        data_order=True,
        sampler_key="num_samples",
    ),
    ResumeField(
        "training.micro_batch_size",
        "samples per micro-batch",
        lambda c: c.training.micro_batch_size,
        data_order=True,
        sampler_key="micro_batch_size",
    ),
    ResumeField(
        "training.grad_accum_steps",
        "micro-batches per optimizer step",
        lambda c: c.training.grad_accum_steps,
        data_order=True,
        sampler_key="grad_accum_steps",
    ),
    ResumeField(
        "training.seed",
        "the seed of the data order",
        lambda c: c.training.seed,
        data_order=True,
        sampler_key="seed",
    ),
    ResumeField(
        "deployment.world_size",
        "the number of trainer ranks (nproc_per_node x nnodes)",
        lambda c: c.deployment.world_size,
        data_order=True,
        sampler_key="num_replicas",
    ),
    ResumeField(
        "data.length_grouped",
        "length-grouped sampling",
        lambda c: c.data.length_grouped,
        data_order=True,
        sampler_key="length_grouped",
    ),
    ResumeField(
        "data.anchor_grouped",
        "anchor-grouped sampling",
        lambda c: sampler_mode(c) == "anchor_grouped",
        data_order=True,
        default=False,
        sampler_key="anchor_grouped",
    ),
    ResumeField(
        "data.bucket_synchronized",
        "bucket-synchronised sampling",
        lambda c: c.data.bucket_synchronized,
        data_order=True,
        sampler_key="bucket_synchronized",
    ),
    ResumeField(
        "data.mega_batch_multiplier",
        "the length-grouping window",
        lambda c: c.data.mega_batch_multiplier,
        data_order=True,
        sampler_key="mega_batch_multiplier",
    ),
    ResumeField(
        "training.static_shape_buckets",
        "the pad policy (bucket-synchronised plans depend on it)",
        lambda c: c.training.static_shape_buckets,
        data_order=True,
        fingerprinted=False,  # the sampler records the effective pad lengths instead
        sampler_key="pad_to",
    ),
    ResumeField(
        "training.packing",
        "sequence packing (which conversations share a row and a micro-batch)",
        lambda c: c.training.packing,
        data_order=True,
        default=False,
        sampler_key="packing",
    ),
)

FIELDS_BY_NAME: dict[str, ResumeField] = {f.name: f for f in RESUME_CONTRACT}
# Fields whose change makes a checkpoint meaningless for this run: resume refuses, naming them.
IDENTITY_FIELDS: tuple[str, ...] = tuple(f.name for f in RESUME_CONTRACT if not f.data_order)
# Data-order fields -> what they mean: the names `--allow-changed` accepts.
DATA_ORDER_FIELDS: dict[str, str] = {f.name: f.meaning for f in RESUME_CONTRACT if f.data_order}
# The sampler's saved settings, in the order it saves them, and their keys in its state.
SAMPLER_FIELDS: tuple[ResumeField, ...] = tuple(f for f in RESUME_CONTRACT if f.sampler_key)
SAMPLER_KEYS: dict[str, ResumeField] = {str(f.sampler_key): f for f in SAMPLER_FIELDS}
# Sampler setting -> the config field it comes from: how a refused resume names it.
SAMPLER_CONFIG_FIELDS: dict[str, str] = {key: f.name for key, f in SAMPLER_KEYS.items()}
# Sampler settings older states lack, with the value those plans had.
SAMPLER_DEFAULTS: dict[str, Any] = {
    key: f.default for key, f in SAMPLER_KEYS.items() if f.has_default
}
# The sampler-state keys that together record the sampler mode.
MODE_KEYS: dict[str, str] = {key: f.name for key, f in SAMPLER_KEYS.items() if f.selects_mode}


def run_fingerprint(
    config: Config, *, data: str, init_weights: str | None = None
) -> dict[str, Any]:
    """What a checkpoint must agree on with the config that resumes it (`data`: the data's
    fingerprint, `init_weights`: the sha256 of model.init_from's weights); fields at their
    default are left out, as older checkpoints have them."""
    supplied = {"data": data, "model.init_from": init_weights}
    fingerprint: dict[str, Any] = {}
    for row in RESUME_CONTRACT:
        if not row.fingerprinted:
            continue
        value = supplied[row.name] if row.read is None else row.read(config)
        if row.has_default and value == row.default:
            continue
        fingerprint[row.name] = value
    return fingerprint


def with_defaults(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A saved run fingerprint with the defaults filled in for the fields it predates."""
    filled = {r.name: r.default for r in RESUME_CONTRACT if r.fingerprinted and r.has_default}
    return {**filled, **saved}


def check_allow_changed(names: Iterable[str]) -> tuple[str, ...]:
    """Validate `--allow-changed` names against the data-order fields; return them as a tuple."""
    names = tuple(n.strip() for n in names if n.strip())
    unknown = [n for n in names if n not in DATA_ORDER_FIELDS]
    if unknown:
        raise ValueError(
            f"--allow-changed: {', '.join(map(repr, unknown))} cannot be allowed to change on "
            f"resume; the fields that can: {', '.join(DATA_ORDER_FIELDS)}"
        )
    return names


def mode_settings(mode: SamplerMode) -> dict[str, bool]:
    """The sampler's saved mode entries (`length_grouped`, `packing`, ...) for `mode`."""
    on = MODE_FIELDS[mode]
    return {key: name in on for key, name in MODE_KEYS.items()}


def saved_mode(state: Mapping[str, Any]) -> SamplerMode:
    """The mode of a saved sampler state (older states may hold overridden flags too)."""
    state = {**SAMPLER_DEFAULTS, **state}
    return mode_of(name for key, name in MODE_KEYS.items() if state.get(key))
