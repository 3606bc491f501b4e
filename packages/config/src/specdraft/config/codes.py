"""The linter's code table: one stable code per kind of finding.

Codes never change meaning once released, so users can grep for them and tools can key on them.
Ranges: SD0xx the file itself (I/O, TOML syntax), SD1xx the schema (unknown, missing, wrong type
or value), SD2xx shape buckets, static shapes, compile and fp8, SD3xx the model and its target,
SD4xx deployment, SD5xx tracking. A schema rule error type (`schema.RULE_TYPES`) or a pydantic
error type maps to exactly one code through `code_for`. A family's own codes live with the
family (`FamilyRules.codes`) and join the table here.
"""

from __future__ import annotations

from .families import FAMILY_RULES
from .lint_code import Code, Severity

# The codes of the shared rules. A family's own codes are declared with the family
# (`families/<name>.py`, `FamilyRules.codes`) and merged into `CODES` below.
CORE_CODES: tuple[Code, ...] = (
    # ---- the file
    Code("SD001", "toml-syntax", "error", "The file is not valid TOML.", fatal=True),
    Code("SD002", "io", "error", "The file cannot be read (missing, a folder, not UTF-8).",
         fatal=True),
    Code("SD003", "internal", "error", "The linter failed on this file (please report it).",
         fatal=True),
    Code("SD004", "bad-override", "error", "A --set override is not of the form key.path=value.",
         fatal=True),
    # ---- the schema
    Code("SD101", "unknown-key", "error", "A key the schema does not know (did you mean ...?).",
         ("extra_forbidden",)),
    Code("SD102", "missing-key", "error", "A required key is missing.", ("missing",)),
    Code("SD103", "wrong-type", "error", "A value has the wrong type."),
    Code("SD104", "not-allowed", "error", "A value is not one of the allowed choices.",
         ("literal_error", "enum")),
    Code("SD105", "out-of-range", "error", "A number is outside its allowed range.",
         ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "multiple_of",
          "finite_number", "int_parsing_size")),
    Code("SD106", "bad-length", "error", "A list or string is too short or too long.",
         ("too_short", "too_long", "string_too_short", "string_too_long")),
    Code("SD107", "bad-pattern", "error", "A string does not match its required pattern.",
         ("string_pattern_mismatch",)),
    Code("SD108", "above-limit", "error",
         "A size, count or rate is above its largest allowed value (it would overflow, fail "
         "to allocate or diverge).", ("above_limit",)),
    Code("SD199", "invalid", "error", "Any other schema error."),
    # ---- shape buckets, static shapes, compile, fp8
    Code("SD201", "bucket-not-multiple", "error",
         "A shape bucket is not a positive multiple of 128.", ("bucket_not_multiple",)),
    Code("SD202", "bucket-not-increasing", "error",
         "Shape buckets are not strictly increasing.", ("bucket_not_increasing",)),
    Code("SD203", "buckets-without-static", "error",
         "static_shape_buckets is set but static_shapes is off.", ("buckets_without_static",)),
    Code("SD204", "bucket-above-max-length", "error",
         "A shape bucket is above data.max_length.", ("bucket_above_max_length",)),
    Code("SD205", "max-length-not-multiple", "error",
         "With static_shapes, data.max_length is not a multiple of 128.",
         ("max_length_not_multiple",)),
    Code("SD206", "bucket-sync-without-buckets", "error",
         "data.bucket_synchronized is set without shape buckets.",
         ("bucket_sync_without_buckets",)),
    Code("SD207", "recompile-check-without-compile", "error",
         "fail_on_recompile is set but compile_blocks is off.",
         ("recompile_check_without_compile",)),
    Code("SD208", "fp8-needs-fsdp2", "error", "fp8_linear is set with a backend other than fsdp2.",
         ("fp8_needs_fsdp2",)),
    Code("SD210", "max-length-appended", "note",
         "data.max_length is not the last shape bucket, so it is appended."),
    Code("SD211", "fp8-ragged-lengths", "warning",
         "fp8_linear without static_shapes: float8 matmuls see ragged token counts."),
    Code("SD212", "compile-dynamic-shapes", "warning",
         "compile_blocks without static_shapes: every new sequence length recompiles."),
    Code("SD213", "anchor-bucket-not-positive", "error",
         "An anchor bucket is not a positive anchor count.", ("anchor_bucket_not_positive",)),
    Code("SD214", "anchor-bucket-not-increasing", "error",
         "Anchor buckets are not strictly increasing.", ("anchor_bucket_not_increasing",)),
    Code("SD215", "anchor-bucket-above-num-anchors", "error",
         "An anchor bucket is above training.num_anchors.",
         ("anchor_bucket_above_num_anchors",)),
    Code("SD216", "anchor-buckets-without-static", "error",
         "static_anchor_buckets is set but static_shapes is off.",
         ("anchor_buckets_without_static",)),
    Code("SD217", "num-anchors-appended", "note",
         "training.num_anchors is not the last anchor bucket, so it is appended."),
    Code("SD218", "packing-without-static", "error",
         "training.packing is set but static_shapes is off.", ("packing_without_static",)),
    Code("SD219", "packing-ignores-grouping", "warning",
         "data.length_grouped, data.anchor_grouped or data.bucket_synchronized is set with "
         "training.packing, which ignores them."),
    Code("SD220", "anchor-grouped-with-bucket-sync", "error",
         "data.anchor_grouped is set with data.bucket_synchronized.",
         ("anchor_grouped_with_bucket_sync",)),
    Code("SD221", "anchor-grouped-without-effect", "warning",
         "data.anchor_grouped with static_shapes but no static_anchor_buckets: every "
         "micro-batch computes num_anchors blocks anyway."),
    Code("SD222", "anchor-grouped-replaces-length-grouped", "warning",
         "data.length_grouped is ignored: data.anchor_grouped sorts by shape bucket and "
         "anchor count."),
    Code("SD223", "keep-every-without-keep-last", "warning",
         "training.keep_every_n_steps is set without training.keep_last_checkpoints, so every "
         "checkpoint is kept anyway."),
    Code("SD224", "num-anchors-above-max-length", "warning",
         "training.num_anchors is above data.max_length - 1, the most anchors a sample can "
         "have: the extra anchor blocks are computed padding."),
    # ---- the model and its target
    Code("SD301", "layer-id-negative", "error", "A target layer id is negative.",
         ("layer_id_negative",)),
    Code("SD302", "layer-id-duplicate", "error", "A target layer id is listed twice.",
         ("layer_id_duplicate",)),
    Code("SD304", "loss-decay-gamma-missing", "error",
         "No published loss_decay_gamma for the block size, and none is set.",
         ("loss_decay_gamma_missing",)),
    Code("SD305", "block-too-small", "error", "model.block_size is below 2.",
         ("block_too_small",)),
    # The draft layers' attention (model.sliding_window, model.layer_types).
    Code("SD306", "layer-types-length", "error",
         "model.layer_types does not list one type per draft layer (num_draft_layers).",
         ("layer_types_length",)),
    Code("SD307", "window-below-block", "error",
         "model.sliding_window is smaller than model.block_size: the window must hold a whole "
         "draft block.", ("window_below_block",)),
    Code("SD308", "sliding-without-window", "error",
         "model.layer_types has a sliding_attention layer but model.sliding_window is unset.",
         ("sliding_without_window",)),
    Code("SD310", "layer-id-out-of-range", "error",
         "A target layer id is not a layer of the target model."),
    Code("SD311", "layer-id-last", "error", "A target layer id is the target's last layer."),
    Code("SD312", "mask-outside-vocab", "error",
         "mask_token_id is outside the target's vocabulary."),
    Code("SD313", "mask-is-pad", "error", "mask_token_id equals the target's pad token id."),
    Code("SD314", "mask-is-eos", "error",
         "mask_token_id equals one of the target's eos token ids."),
    Code("SD315", "target-unreadable", "warning",
         "The target's config could not be read, so the target checks were skipped."),
    Code("SD316", "fp8-needs-cuda", "note", "fp8_linear runs only on CUDA GPUs."),
    Code("SD318", "mask-is-bos", "warning", "mask_token_id equals the target's bos token id."),
    Code("SD319", "unused-algorithm-table", "warning",
         "Options of the algorithm that is not selected are ignored."),
    Code("SD320", "layer-ids-shallow", "note",
         "Every target layer id is in the first half of a deep target (8 layers or more)."),
    Code("SD321", "draft-vocab-too-large", "error",
         "model.draft_vocab_size is larger than the target's vocabulary."),
    Code("SD322", "draft-vocab-is-full", "warning",
         "model.draft_vocab_size equals the target's vocabulary: nothing is pruned."),
    Code("SD323", "draft-vocab-padded", "note",
         "model.draft_vocab_size is not a multiple of 64: vLLM pads its head to one anyway."),
    Code("SD324", "draft-vocab-not-served", "warning",
         "None of the engines the draft is served with (serve.engines; unset: SGLang and "
         "vLLM) reads a draft vocabulary for the selected algorithm."),
    Code("SD326", "engine-cannot-load", "error",
         "An engine in serve.engines cannot load the draft these model options train (for "
         "llama.cpp: a DSpark Markov head other than vanilla or a confidence head without the "
         "Markov features, a DFlash2 selector_top_k too large for the hidden size)."),
    Code("SD327", "draft-vocab-engine", "note",
         "An engine in serve.engines reads no draft vocabulary for the selected algorithm "
         "(another one there does)."),
    # A draft folder to start from (model.init_from).
    Code("SD330", "init-from-not-here", "note",
         "model.init_from is not a folder on this machine, so it was not checked (specdraft "
         "train refuses a missing folder)."),
    Code("SD331", "init-from-unreadable", "error",
         "model.init_from is not a draft folder specdraft reads (no config.json or safetensors, "
         "an unknown architecture or format)."),
    Code("SD332", "init-from-differs", "error",
         "A model field (or the target) disagrees with the draft folder of model.init_from."),
    Code("SD333", "init-from-untrainable", "error",
         "The draft folder of model.init_from uses attention specdraft cannot train "
         "(attention sinks, attention biases, other layer types)."),
    Code("SD334", "window-above-max-length", "warning",
         "model.sliding_window is at least data.max_length: in training the window cuts "
         "(almost) no key, while served contexts longer than the window are cut."),
    Code("SD335", "sliding-window-not-served", "error",
         "An engine in serve.engines does not serve sliding-window draft layers as specdraft "
         "trains them (SGLang 0.5.23's window mask is causal inside the block and one key "
         "wider)."),
    Code("SD336", "mixed-layers-v2-runner", "note",
         "vLLM serves a draft with both sliding-window and full-attention layers only under "
         "its V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1)."),
    Code("SD337", "window-unused", "warning",
         "model.sliding_window is set but model.layer_types has no sliding_attention layer."),
    Code("SD338", "causal-layers-unused", "warning",
         "model.causal_layers = \"sliding\" but no draft layer slides, so no layer is causal."),
    Code("SD339", "mixed-causality-not-served", "error",
         "The draft's layers differ in causality and serve.engines has llama.cpp, which reads "
         "one causality for the whole draft."),
    # Labels from the target's own predictions (data.labels, training.soft_label_*).
    Code("SD340", "soft-labels-without-topk", "error",
         "training.soft_label_weight is set but training.soft_label_topk is 0.",
         ("soft_labels_without_topk",)),
    Code("SD341", "soft-topk-unused", "note",
         "training.soft_label_topk is set but soft_label_weight is 0: training uses no soft "
         "labels (prepare-features still stores them)."),
    Code("SD342", "soft-topk-above-vocab", "error",
         "training.soft_label_topk is larger than the target's vocabulary."),
    Code("SD343", "draft-vocab-from-tokens", "warning",
         "model.draft_vocab_size with data.labels = 'target_argmax': the draft vocabulary is "
         "chosen from the corpus's tokens, not from the target's labels."),
    # ---- deployment
    Code("SD401", "features-with-disaggregated", "error",
         "Offline feature shards cannot feed the disaggregated mode.",
         ("features_with_disaggregated",)),
    Code("SD402", "watermark-below-window", "error",
         "The backpressure high watermark is smaller than one optimizer window.",
         ("watermark_below_window",)),
    Code("SD410", "target-labels-disaggregated", "error",
         "data.labels = 'target_argmax' or soft labels in the disaggregated mode, whose capture "
         "servers return no target predictions.", ("target_labels_disaggregated",)),
    Code("SD403", "unused-deployment-table", "warning",
         "Disaggregated or Mooncake settings that the chosen mode or store ignores."),
    # ---- tracking
    Code("SD501", "tracking-package-missing", "warning",
         "A selected tracking backend's package is not installed (specdraft train refuses to "
         "start)."),
)  # fmt: skip


# Every code in code order, the families' own included; a number declared twice fails here.
CODES: tuple[Code, ...] = tuple(
    sorted(
        CORE_CODES + tuple(code for rules in FAMILY_RULES.values() for code in rules.codes),
        key=lambda entry: entry.code,
    )
)
BY_CODE: dict[str, Code] = {entry.code: entry for entry in CODES}
if len(BY_CODE) != len(CODES):
    _twice = sorted({c.code for c in CODES if sum(o.code == c.code for o in CODES) > 1})
    raise ValueError(f"lint codes declared twice: {', '.join(_twice)}")
_BY_TYPE: dict[str, Code] = {t: entry for entry in CODES for t in entry.types}


def code_for(error_type: str) -> Code:
    """The code that reports a schema rule type or pydantic error type."""
    if error_type in _BY_TYPE:
        return _BY_TYPE[error_type]
    # pydantic's type errors are all named `<type>_type` or `<type>_parsing` (plus a few
    # conversions such as `int_from_float`).
    if error_type.endswith(("_type", "_parsing", "_from_float")):
        return BY_CODE["SD103"]
    return BY_CODE["SD199"]


def get(code: str) -> Code:
    """The entry of a code such as 'SD201'."""
    return BY_CODE[code]


__all__ = ["BY_CODE", "CODES", "CORE_CODES", "Code", "Severity", "code_for", "get"]
