"""Labels from the target's own predictions: the head on the last hidden state is the target's
logits, the shift to label positions, the CE against argmax labels and the soft labels' KL
against hand computations in float64, and every family training on them."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from specdraft.trainer.models import (
    DraftTrainSpec,
    TargetFeatureExtractor,
    build_draft,
    load_target_config,
    load_target_head,
)
from specdraft.trainer.models.target_labels import (
    SOFT_IDS,
    SOFT_LOGPROBS,
    TARGET_ARGMAX,
    TARGET_LABELS,
    TARGET_TOPK_IDS,
    TARGET_TOPK_LOGPROBS,
    LabelSettings,
    MissingPredictions,
    TargetLabeler,
    target_predictions,
    topk_kl,
)

GAMMA = 3.0
BLOCK = 4


@pytest.fixture
def setup(tiny_qwen3_target, draft_model_config, make_draft_batch, random_samples):
    """Factory: (draft, head, batch with the target's predictions, spec) in float64."""

    def make(algorithm: str, topk: int = 0, **spec_options):
        torch.manual_seed(5)
        cfg = draft_model_config(algorithm)
        draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float64)
        head = load_target_head(cfg.target, torch.float64)
        batch = make_draft_batch(random_samples([23, 17], seed=3), 24, dtype=torch.float64)
        predicted = target_predictions(
            batch["target_last_hidden_states"], head.lm_head.weight, topk
        )
        spec = DraftTrainSpec(
            num_anchors=6, loss_decay_gamma=GAMMA, logits_chunk_blocks=2, **spec_options
        )
        return draft, head, {**batch, **predicted}, spec

    return make


def labelled(batch, *, argmax=True, topk=0):
    """The batch with its label keys (unpacked rows: the shift runs along dim 1)."""
    return TargetLabeler(LabelSettings(argmax=argmax, soft_topk=topk)).from_predictions(batch)


@pytest.mark.parametrize("target", ["tiny_llama_target", "tiny_qwen3_target"])
def test_the_head_on_the_last_hidden_state_is_the_targets_logits(request, target):
    """HF's last_hidden_state is after the final norm (Llama and Qwen3), so the predictions
    need the head's matmul alone; checked against the causal LM's own logits."""
    tiny = request.getfixturevalue(target)
    extractor = TargetFeatureExtractor(tiny.model, list(tiny.layer_ids), dtype=torch.float32)
    ids = torch.randint(0, tiny.vocab_size, (2, 19), generator=torch.Generator().manual_seed(1))
    _, last = extractor(ids, torch.ones_like(ids))
    head = load_target_head(tiny.path, torch.float32)
    with torch.no_grad():
        logits = tiny.model(input_ids=ids).logits
    predicted = target_predictions(last, head.lm_head.weight, topk=5)
    torch.testing.assert_close(head.logits(last), logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(predicted[TARGET_ARGMAX].long(), logits.argmax(-1))
    assert predicted[TARGET_ARGMAX].dtype == predicted[TARGET_TOPK_IDS].dtype == torch.int32
    assert torch.equal(predicted[TARGET_TOPK_IDS].long(), logits.topk(5).indices)
    torch.testing.assert_close(
        predicted[TARGET_TOPK_LOGPROBS], logits.log_softmax(-1).topk(5).values
    )


def test_labels_sit_one_position_after_the_prediction_and_a_larger_k_serves_a_smaller(setup):
    _, _, batch, _ = setup("dflash", topk=6)
    out = labelled(batch, topk=4)
    argmax = batch[TARGET_ARGMAX].long()
    assert torch.equal(out[TARGET_LABELS][:, 1:], argmax[:, :-1])
    assert torch.equal(out[TARGET_LABELS][:, 0], batch["input_ids"][:, 0])
    assert torch.equal(out[SOFT_IDS][:, 1:], batch[TARGET_TOPK_IDS][:, :-1, :4].long())
    assert torch.equal(out[SOFT_LOGPROBS][:, 1:], batch[TARGET_TOPK_LOGPROBS][:, :-1, :4])
    assert out[SOFT_LOGPROBS].dtype == torch.float64  # never below fp32, never rounded down
    assert not {TARGET_ARGMAX, TARGET_TOPK_IDS, TARGET_TOPK_LOGPROBS} & set(out)
    # One sample ([S]) shifts the same way as a row.
    one = labelled({k: batch[k][0] for k in ("input_ids", TARGET_ARGMAX)})
    assert torch.equal(one[TARGET_LABELS], out[TARGET_LABELS][0])
    with pytest.raises(MissingPredictions, match="top 6 tokens, the run asks for 8"):
        labelled(batch, topk=8)
    with pytest.raises(MissingPredictions, match=r"'target_argmax'.*prepare-features"):
        labelled({"input_ids": batch["input_ids"]})


def _reference_ce(draft, batch, head, spec):
    """sum over kept blocks and offsets k of exp(-(k-1)/gamma) mask[a+k] CE(slot k, argmax at
    a+k-1), from the draft's own hidden states, one token at a time."""
    targets = draft.place_blocks(batch, spec)
    hidden = draft.run_backbone(
        batch["input_ids"], batch["hidden_states"], targets.anchors, targets.keep, head, "sdpa"
    )
    argmax, mask = batch[TARGET_ARGMAX].long(), batch["loss_mask"]
    numerator, denominator = hidden.new_zeros(()), 0.0
    for b in range(argmax.shape[0]):
        for n in range(targets.anchors.shape[1]):
            anchor = int(targets.anchors[b, n])
            if not targets.keep[b, n]:
                continue
            # The block's input is the anchor's own token, whatever the labels.
            assert int(targets.gold[b, n, 0]) == int(batch["input_ids"][b, anchor])
            for k in range(1, BLOCK):
                if anchor + k >= argmax.shape[1] or not mask[b, anchor + k]:
                    continue
                weight = math.exp(-(k - 1) / GAMMA)
                logits = head.logits(hidden[b, n, k])
                label = int(argmax[b, anchor + k - 1])
                numerator = numerator + weight * (torch.logsumexp(logits, 0) - logits[label])
                denominator += weight
    return numerator, denominator


def test_dflash_ce_against_argmax_labels_matches_a_hand_computation(setup):
    draft, head, batch, _ = setup("dflash")
    spec = DraftTrainSpec(
        num_anchors=6, loss_decay_gamma=GAMMA, logits_chunk_blocks=2, label_source="target_argmax"
    )
    loss = draft(labelled(batch), head, spec)
    numerator, denominator = _reference_ce(draft, batch, head, spec)
    torch.testing.assert_close(loss.numerator, numerator, rtol=1e-12, atol=1e-12)
    assert loss.denominator.item() == pytest.approx(denominator)
    # The labels differ from the tokens here (a random corpus), so the loss does too.
    # The same logit chunks as `spec`: another chunking sums the loss in another order, and
    # the last bit may differ (CI saw it with the default 64-block chunks).
    tokens = draft(batch, head, replace(spec, label_source="tokens"))
    assert not torch.allclose(tokens.numerator, loss.numerator)
    # Labels equal to the tokens give the tokens' loss exactly.
    same = {**batch, TARGET_LABELS: batch["input_ids"]}
    assert torch.equal(draft(same, head, spec).numerator, tokens.numerator)


def _reference_kl(draft, batch, head, spec):
    """sum of w_k KL(softmax(target at a+k-1) || softmax(draft slot k)) over the full vocab."""
    targets = draft.place_blocks(batch, spec)
    hidden = draft.run_backbone(
        batch["input_ids"], batch["hidden_states"], targets.anchors, targets.keep, head, "sdpa"
    )
    last, mask = batch["target_last_hidden_states"], batch["loss_mask"]
    total = hidden.new_zeros(())
    for b in range(mask.shape[0]):
        for n in range(targets.anchors.shape[1]):
            anchor = int(targets.anchors[b, n])
            if not targets.keep[b, n]:
                continue
            for k in range(1, BLOCK):
                if anchor + k >= mask.shape[1] or not mask[b, anchor + k]:
                    continue
                target = head.logits(last[b, anchor + k - 1]).log_softmax(0)
                draft_logp = head.logits(hidden[b, n, k]).log_softmax(0)
                kl = (target.exp() * (target - draft_logp)).sum()
                total = total + math.exp(-(k - 1) / GAMMA) * kl
    return total


def test_soft_labels_over_the_whole_vocabulary_are_the_kl(setup, tiny_qwen3_target):
    vocab = tiny_qwen3_target.vocab_size
    draft, head, batch, spec = setup("dflash", topk=vocab, soft_label_weight=1.0)
    loss = draft(labelled(batch, argmax=False, topk=vocab), head, spec)
    expected = _reference_kl(draft, batch, head, spec)
    torch.testing.assert_close(loss.numerator, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(loss.metrics["soft_weighted_kl"], expected.detach())
    # Half and half: the mean of the tokens' CE and the KL, under the same weights.
    half = DraftTrainSpec(
        num_anchors=6, loss_decay_gamma=GAMMA, logits_chunk_blocks=2, soft_label_weight=0.5
    )
    mixed = draft(labelled(batch, argmax=False, topk=vocab), head, half)
    tokens = draft(batch, head, DraftTrainSpec(num_anchors=6, loss_decay_gamma=GAMMA))
    torch.testing.assert_close(mixed.numerator, 0.5 * (tokens.numerator + expected))
    torch.testing.assert_close(mixed.metrics["weighted_ce"], tokens.metrics["weighted_ce"])


def test_topk_kl_is_the_kl_of_the_k_tokens_and_the_rest():
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(5, 12, dtype=torch.float64, generator=generator)
    target = torch.randn(5, 12, dtype=torch.float64, generator=generator).log_softmax(-1)
    logprobs, ids = target.topk(3)
    in_vocab = torch.ones_like(ids, dtype=torch.bool)
    in_vocab[0, 1] = False  # a token the draft cannot propose joins the rest
    draft = logits.log_softmax(-1)
    expected = []
    for row in range(5):
        keep = [k for k in range(3) if in_vocab[row, k]]
        q = logprobs[row, keep].exp()
        p = draft[row, ids[row, keep]].exp()
        q_rest, p_rest = 1 - q.sum(), 1 - p.sum()
        expected.append((q * (q / p).log()).sum() + q_rest * (q_rest / p_rest).log())
    kl = topk_kl(logits, ids, logprobs, in_vocab)
    torch.testing.assert_close(kl, torch.stack(expected), rtol=1e-10, atol=1e-12)
    assert (kl >= 0).all()
    # Padding (zero log-probabilities, repeated ids) and K covering the vocabulary stay finite,
    # gradients included, so a zero loss weight never meets a NaN.
    logits.requires_grad_(True)
    padding = torch.zeros(5, 3, dtype=torch.long)
    whole = torch.arange(12).expand(5, 12)
    values = topk_kl(logits, padding, torch.zeros(5, 3, dtype=torch.float64), in_vocab)
    values = values + topk_kl(logits, whole, target, torch.ones(5, 12, dtype=torch.bool))
    values.sum().backward()
    assert torch.isfinite(values).all() and torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("algorithm", ["dflash", "dflash2", "dspark"])
def test_every_family_trains_on_argmax_and_soft_labels(setup, algorithm):
    draft, head, batch, spec = setup(
        algorithm, topk=8, label_source="target_argmax", soft_label_weight=0.5
    )
    targets = draft.place_blocks(labelled(batch, topk=8), spec)
    # Every label is the target's argmax at the position before; slot 0 stays the anchor.
    positions, argmax = targets.positions, batch[TARGET_ARGMAX].long()
    before = argmax.gather(1, (positions[:, :, 1:] - 1).flatten(1)).view_as(positions[:, :, 1:])
    assert torch.equal(targets.gold[:, :, 1:], before)
    assert torch.equal(targets.gold[:, :, 0], batch["input_ids"].gather(1, targets.anchors))
    loss = draft(labelled(batch, topk=8), head, spec)
    loss.mean().backward()
    assert torch.isfinite(loss.numerator) and loss.metrics["soft_weighted_kl"] > 0
    grads = [p.grad for p in draft.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    # A spec that trains on the target's labels refuses a batch without them.
    with pytest.raises(KeyError, match="target_labels"):
        draft(batch, head, spec)


def test_soft_labels_outside_a_draft_vocabulary_join_the_rest(
    draft_model_config, make_draft_batch, random_samples
):
    torch.manual_seed(5)
    cfg = draft_model_config("dflash", draft_vocab_size=40)
    head = load_target_head(cfg.target, torch.float64)
    draft = build_draft(
        cfg, load_target_config(cfg.target), dtype=torch.float64, draft_vocab=list(range(0, 80, 2))
    )
    draft.init_draft_head(head)
    batch = make_draft_batch(random_samples([23, 17], seed=3), 24, dtype=torch.float64)
    predicted = target_predictions(batch["target_last_hidden_states"], head.lm_head.weight, 8)
    spec = DraftTrainSpec(num_anchors=6, loss_decay_gamma=GAMMA, soft_label_weight=1.0)
    loss = draft(labelled({**batch, **predicted}, argmax=False, topk=8), head, spec)
    loss.mean().backward()
    assert torch.isfinite(loss.numerator) and loss.numerator > 0


def _spans(loss_mask: torch.Tensor) -> list[tuple[int, int]]:
    """(start, stop) of each run of supervised positions."""
    spans, start = [], None
    for position, on in enumerate([*loss_mask.tolist(), 0]):
        if on and start is None:
            start = position
        elif not on and start is not None:
            spans.append((start, position))
            start = None
    return spans


def test_on_a_corpus_the_target_regenerated_argmax_labels_are_its_tokens(
    tiny_target_path, tmp_path
):
    """Where a position's prefix is the target's own greedy output, its argmax is the token
    there, so argmax labels train exactly like the tokens. The regenerated text is tokenised
    again for training, which can split a generated word otherwise; from there on in a turn
    the prefix is no longer the target's, and its argmax is what greedy decoding of that
    prefix gives (each turn's own greedy continuation, computed here, says which is which)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdraft.config import validate_config
    from specdraft.trainer.data import build_dataset
    from specdraft.trainer.regenerate.run import regenerate_from_config

    torch.manual_seed(0)
    target = str(tiny_target_path)
    settings = {
        "output_dir": str(tmp_path / "run"),
        "model": {
            "target": target,
            "algorithm": "dflash",
            "block_size": 8,
            "target_layer_ids": [0, 2],
            "mask_token_id": 4095,
        },
        "data": {"train_paths": ["pkg:sharegpt"], "max_length": 256},
    }
    settings["data"]["cache_dir"] = str(tmp_path / "cache")
    corpus = tmp_path / "regenerated.jsonl"
    regenerate_from_config(
        validate_config(settings), corpus, count=8, max_new_tokens=48, progress=False
    )
    settings["data"]["train_paths"] = [str(corpus)]
    config = validate_config(settings)
    dataset, _ = build_dataset(config, split="train", progress=False)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target)
    extractor = TargetFeatureExtractor(model, [0, 2], dtype=torch.float32)
    head = load_target_head(target, torch.float32)
    eos = model.generation_config.eos_token_id

    own_total = supervised_total = 0
    samples = []
    for index, row in enumerate(dataset):
        ids = torch.tensor(row["input_ids"])
        mask = torch.tensor(row["loss_mask"])
        features, last = extractor(ids[None], torch.ones(1, len(ids), dtype=torch.long))
        batch = {"input_ids": ids[None], **target_predictions(last, head.lm_head.weight)}
        labels = labelled(batch)[TARGET_LABELS][0]
        own = torch.zeros_like(mask)
        for start, stop in _spans(mask):
            with torch.no_grad():
                greedy = model.generate(
                    ids[None, :start],
                    attention_mask=torch.ones(1, start, dtype=torch.long),
                    max_new_tokens=stop - start,
                    do_sample=False,
                    eos_token_id=eos,
                    pad_token_id=eos,
                )[0, start:]
            # The run the training tokens share with the target's greedy answer.
            shared = 0
            while shared < min(len(greedy), stop - start) and greedy[shared] == ids[start + shared]:
                shared += 1
            assert torch.equal(labels[start : start + shared], ids[start : start + shared])
            if shared < min(len(greedy), stop - start):
                assert labels[start + shared] == greedy[shared] != ids[start + shared]
                # They part where the answer was cut (the end-of-turn token follows), where
                # the same text is split into other tokens, or where the target wrote a
                # special token inside its answer, which the regenerated text drops
                # (skip_special_tokens; CI once saw the tiny target write <|im_start|>).
                ours = tokenizer.decode(greedy[shared : shared + 4])
                theirs = tokenizer.decode(ids[start + shared : start + shared + 4])
                dropped = int(greedy[shared]) in tokenizer.all_special_ids
                assert ids[start + shared] == eos or dropped or ours[:2] == theirs[:2], (
                    ours,
                    theirs,
                )
            own[start : start + shared] = 1
        own_total, supervised_total = own_total + int(own.sum()), supervised_total + int(mask.sum())
        samples.append((ids, own, index, features[0], labels))
    # Much of what the target wrote survives the second tokenisation (291 of 636 here).
    assert own_total > supervised_total / 3

    # Supervised on those positions only, the argmax labels give the tokens' loss, bit for bit.
    width = max(len(s[0]) for s in samples)

    def padded(values, fill=0):
        return torch.stack(
            [torch.nn.functional.pad(v, (0, width - len(v)), value=fill) for v in values]
        )

    batch = {
        "input_ids": padded([s[0] for s in samples]),
        "loss_mask": padded([s[1] for s in samples]),
        "sample_id": torch.tensor([s[2] for s in samples]),
        "hidden_states": torch.stack(
            [torch.nn.functional.pad(s[3], (0, 0, 0, width - len(s[0]))) for s in samples]
        ),
        TARGET_LABELS: padded([s[4] for s in samples]),
    }
    draft = build_draft(config.model, load_target_config(target), dtype=torch.float32)
    tokens = DraftTrainSpec(num_anchors=16, loss_decay_gamma=4.0)
    argmax = DraftTrainSpec(num_anchors=16, loss_decay_gamma=4.0, label_source="target_argmax")
    with torch.no_grad():
        expected = draft({k: v for k, v in batch.items() if k != TARGET_LABELS}, head, tokens)
        loss = draft(batch, head, argmax)
    assert expected.denominator > 0
    assert torch.equal(loss.numerator, expected.numerator)
    assert torch.equal(loss.metrics["correct_per_pos"], expected.metrics["correct_per_pos"])
