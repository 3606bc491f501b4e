"""Loss formulas of every family against a naive per-token reference in float64."""

from __future__ import annotations

import math

import pytest
import torch

from specdraft.trainer.models import (
    DraftTrainSpec,
    build_draft,
    load_target_config,
    load_target_head,
)

GAMMA = 3.0


@pytest.fixture
def setup(tiny_qwen3_target, draft_model_config, make_draft_batch, random_samples):
    """Factory: (draft, head, batch, spec) in float64 for an algorithm and config overrides."""

    def make(algorithm: str, chunk: int = 2, **overrides):
        torch.manual_seed(5)
        cfg = draft_model_config(algorithm, **overrides)
        draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float64)
        head = load_target_head(cfg.target, torch.float64)
        batch = make_draft_batch(random_samples([23, 17], seed=3), 24, dtype=torch.float64)
        spec = DraftTrainSpec(num_anchors=6, loss_decay_gamma=GAMMA, logits_chunk_blocks=chunk)
        return draft, head, batch, spec

    return make


def _hidden(draft, batch, head, spec):
    targets = draft.place_blocks(batch, spec)
    hidden = draft.run_backbone(
        batch["input_ids"], batch["hidden_states"], targets.anchors, targets.keep, head, "sdpa"
    )
    return targets, hidden


def _ce(logits: torch.Tensor, label: int) -> torch.Tensor:
    return torch.logsumexp(logits, 0) - logits[label]


def _dflash2_reference(draft, batch, head, spec, policy):
    """DFlash2's per-token loss; for a plain DFlash draft (no selector) the DFlash CE alone."""
    targets, hidden = _hidden(draft, batch, head, spec)
    ids, mask = batch["input_ids"], batch["loss_mask"]
    selector, config = getattr(draft, "candidate_selector", None), draft.config
    length, block = ids.shape[1], config.block_size
    numerator = hidden.new_zeros(())
    denominator, count, hits, misses = 0.0, 0, 0, 0
    for b in range(ids.shape[0]):
        for n in range(targets.anchors.shape[1]):
            if not targets.keep[b, n]:
                continue
            anchor = int(targets.anchors[b, n])
            for k in range(1, block):
                pos = anchor + k
                if pos >= length or not mask[b, pos]:
                    continue
                weight = math.exp(-(k - 1) / GAMMA)
                h = hidden[b, n, k]
                logits = head.lm_head.weight @ h
                gold, prev = int(ids[b, pos]), int(ids[b, pos - 1])
                loss = _ce(logits, gold)
                numerator = numerator + weight * loss
                denominator += weight
                count += 1
                if selector is None:
                    continue
                cands = torch.argsort(logits.detach(), descending=True)[: config.selector_top_k]
                cands = cands.tolist()
                hit = gold in cands
                hits, misses = hits + hit, misses + (not hit)
                if not hit and policy == "insert":
                    cands[-1] = gold
                if hit or policy == "insert":
                    context = selector.predecessor_codebook[prev] * (
                        selector.hidden_projection.weight @ h
                    )
                    scores = torch.stack(
                        [
                            logits[c].detach() + context @ selector.successor_codebook[c]
                            for c in cands
                        ]
                    )
                    selector_ce = _ce(scores, cands.index(gold))
                    numerator = numerator + weight * config.selector_loss_weight * selector_ce
    assert selector is None or (hits > 0 and misses > 0), "the case must exercise hit and miss"
    return numerator, denominator, count, hits


@pytest.mark.parametrize(
    ("algorithm", "policy"), [("dflash2", "exclude"), ("dflash2", "insert"), ("dflash", None)]
)
def test_dflash_family_loss_matches_per_token_reference(setup, algorithm, policy):
    draft, head, batch, spec = setup(
        algorithm, dflash2={"selector_gold_policy": policy or "exclude", "selector_top_k": 40}
    )
    out = draft(batch, head, spec)
    numerator, denominator, count, hits = _dflash2_reference(draft, batch, head, spec, policy)
    torch.testing.assert_close(out.numerator, numerator, rtol=1e-10, atol=1e-10)
    assert out.denominator.item() == pytest.approx(denominator, rel=1e-12)
    assert out.metrics["count"].item() == count
    if policy is None:  # plain DFlash: the decayed CE is the whole loss, no selector metrics
        torch.testing.assert_close(out.metrics["weighted_ce"], numerator.detach())
        assert not [key for key in out.metrics if key.startswith("selector_")]
    else:
        assert out.metrics["selector_recall_hits"].item() == hits
    assert out.metrics["count_per_pos"].shape == (draft.config.block_size - 1,)
    # Gradients of the chunked, checkpointed sums equal those of the naive loop.
    grads = torch.autograd.grad(out.numerator, list(draft.parameters()), allow_unused=True)
    numerator2 = _dflash2_reference(draft, batch, head, spec, policy)[0]
    ref_grads = torch.autograd.grad(numerator2, list(draft.parameters()), allow_unused=True)
    for got, want in zip(grads, ref_grads, strict=True):
        if want is None:
            assert got is None or torch.count_nonzero(got) == 0
        else:
            torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)


def _markov_bias(markov, kind, h_block, prev_block):
    """Naive per-slot Markov biases of one block."""
    biases, state = [], torch.zeros(markov.rank, dtype=h_block.dtype)
    for k in range(h_block.shape[0]):
        e = markov.markov_w1.weight[prev_block[k]]
        if kind == "vanilla":
            biases.append(markov.markov_w2.weight @ e)
        elif kind == "gated":
            gate = torch.sigmoid(
                markov.gate_proj.weight @ torch.cat([h_block[k], e]) + markov.gate_proj.bias
            )
            biases.append(markov.markov_w2.weight @ (gate * e))
        else:
            z = (
                markov.joint_proj.weight @ torch.cat([state, e, h_block[k]])
                + markov.joint_proj.bias
            )
            g, c, o = z.chunk(3)
            g = torch.sigmoid(g)
            state = g * state + (1 - g) * torch.tanh(c)
            biases.append(markov.markov_w2.weight @ torch.tanh(o))
    return biases


def _dspark_reference(draft, batch, head, spec):
    targets, hidden = _hidden(draft, batch, head, spec)
    ids, mask = batch["input_ids"], batch["loss_mask"]
    last = batch["target_last_hidden_states"]
    config = draft.config
    length, block = ids.shape[1], config.block_size
    numerator = hidden.new_zeros(())
    denominator, count, l1_sum = 0.0, 0, 0.0
    for b in range(ids.shape[0]):
        for n in range(targets.anchors.shape[1]):
            if not targets.keep[b, n]:
                continue
            anchor = int(targets.anchors[b, n])
            prev_block = [int(ids[b, min(anchor + k, length - 1)]) for k in range(block)]
            biases = _markov_bias(
                draft.markov_head, config.markov_head_type, hidden[b, n], prev_block
            )
            for k in range(block):
                label_pos = anchor + k + 1
                # Contiguous supervision: every label up to this one must be supervised.
                if any(p >= length or not mask[b, p] for p in range(anchor + 1, label_pos + 1)):
                    break
                h = hidden[b, n, k]
                logits = head.lm_head.weight @ h + biases[k]
                p_draft = torch.softmax(logits, 0)
                p_target = torch.softmax(head.lm_head.weight @ last[b, anchor + k], 0)
                l1 = (p_draft - p_target).abs().sum()
                loss = (
                    config.ce_weight * _ce(logits, int(ids[b, label_pos])) + config.l1_weight * l1
                )
                if config.enable_confidence_head:
                    accept = (1 - l1.detach() / 2).clamp(0, 1)
                    features = h
                    if config.confidence_head_with_markov:
                        features = torch.cat([h, draft.markov_head.markov_w1.weight[prev_block[k]]])
                    proj = draft.confidence_head.proj
                    conf = torch.sigmoid(proj.weight[0] @ features + proj.bias[0])
                    bce = -(accept * torch.log(conf) + (1 - accept) * torch.log(1 - conf))
                    loss = loss + config.confidence_weight * bce
                weight = math.exp(-k / GAMMA)
                numerator = numerator + weight * loss
                denominator += weight
                count += 1
                l1_sum += float(l1.detach())
    return numerator, denominator, count, l1_sum


@pytest.mark.parametrize(
    ("markov_type", "confidence", "with_markov"),
    [
        ("vanilla", True, False),
        ("vanilla", True, True),
        ("vanilla", False, False),
        ("gated", True, True),
        ("rnn", True, False),
    ],
)
def test_dspark_loss_matches_per_token_reference(setup, markov_type, confidence, with_markov):
    draft, head, batch, spec = setup(
        "dspark",
        dspark={
            "markov_type": markov_type,
            "confidence_head": confidence,
            "confidence_uses_markov": with_markov,
        },
    )
    out = draft(batch, head, spec)
    numerator, denominator, count, l1_sum = _dspark_reference(draft, batch, head, spec)
    torch.testing.assert_close(out.numerator, numerator, rtol=1e-10, atol=1e-10)
    assert out.denominator.item() == pytest.approx(denominator, rel=1e-12)
    assert out.metrics["count"].item() == count
    assert out.metrics["l1_sum"].item() == pytest.approx(l1_sum, rel=1e-9)
    assert out.metrics["count_per_pos"].shape == (draft.config.block_size,)
    grads = torch.autograd.grad(out.numerator, list(draft.parameters()), allow_unused=True)
    ref_grads = torch.autograd.grad(
        _dspark_reference(draft, batch, head, spec)[0], list(draft.parameters()), allow_unused=True
    )
    for got, want in zip(grads, ref_grads, strict=True):
        if want is None:
            assert got is None or torch.count_nonzero(got) == 0
        else:
            torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)


def test_dspark_supervision_stops_at_the_first_unsupervised_label(setup):
    draft, head, batch, spec = setup("dspark")
    # One long supervised run with a single hole: blocks crossing the hole lose every slot after.
    batch["loss_mask"][:] = 0
    batch["loss_mask"][0, 2:16] = 1
    batch["loss_mask"][0, 9] = 0
    out = draft(batch, head, spec)
    _, denominator, count, _ = _dspark_reference(draft, batch, head, spec)
    assert out.metrics["count"].item() == count
    assert out.denominator.item() == pytest.approx(denominator)
    targets = draft.place_blocks(batch, spec)
    assert targets.keep[0].any()
    # Any anchor at 7 or 8 reaches the hole at position 9 on its 2nd or 1st slot.
    per_pos = out.metrics["count_per_pos"]
    assert per_pos[0] == targets.keep.sum()  # the anchor slot is always supervised


@pytest.mark.parametrize("algorithm", ["dflash", "dflash2", "dspark"])
def test_chunk_size_does_not_change_sums_or_gradients(setup, algorithm):
    results = []
    for chunk in (1, 4, 100):
        draft, head, batch, spec = setup(algorithm, chunk=chunk)
        out = draft(batch, head, spec)
        out.numerator.backward()
        results.append((out, [p.grad.clone() for p in draft.parameters() if p.grad is not None]))
    (first, first_grads), *others = results
    for out, grads in others:
        torch.testing.assert_close(out.numerator, first.numerator, rtol=1e-12, atol=1e-12)
        for key, value in first.metrics.items():
            torch.testing.assert_close(out.metrics[key], value)
        for got, want in zip(grads, first_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_decay_weights_follow_each_family(setup):
    # With every position supervised, the denominator is kept blocks x the sum of the decays.
    for algorithm, exponents in (("dflash", range(3)), ("dflash2", range(3)), ("dspark", range(4))):
        draft, head, batch, spec = setup(algorithm)
        batch["loss_mask"][:] = 1
        out = draft(batch, head, spec)
        targets = draft.place_blocks(batch, spec)
        length = batch["input_ids"].shape[1]
        expected = 0.0
        for b, n in targets.keep.nonzero().tolist():
            anchor = int(targets.anchors[b, n])
            first = 1  # every family: the first supervised label is at anchor + 1
            for j in exponents:
                if anchor + first + j < length:
                    expected += math.exp(-j / GAMMA)
        assert out.denominator.item() == pytest.approx(expected)


def _assert_grads_match(out, reference_numerator, draft, skipped=()):
    """Gradients of the model's sums equal the reference's; skipped modules get none at all."""
    names = [name for name, _ in draft.named_parameters()]
    params = list(draft.parameters())
    grads = torch.autograd.grad(out.numerator, params, allow_unused=True)
    ref_grads = torch.autograd.grad(reference_numerator, params, allow_unused=True)
    for name, got, want in zip(names, grads, ref_grads, strict=True):
        if name.startswith(skipped):
            assert got is None, name
            assert want is None or torch.count_nonzero(want) == 0, name
        elif want is None:
            assert got is None or torch.count_nonzero(got) == 0, name
        else:
            torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10, msg=name)


def test_dflash2_zero_selector_weight_matches_the_reference_that_does_the_work(setup):
    # The reference still scores the selector (times 0); the model skips it entirely.
    draft, head, batch, spec = setup(
        "dflash2",
        dflash2={
            "selector_gold_policy": "insert",
            "selector_top_k": 40,
            "selector_loss_weight": 0.0,
        },
    )
    out = draft(batch, head, spec)
    numerator, denominator, count, _ = _dflash2_reference(draft, batch, head, spec, "insert")
    torch.testing.assert_close(out.numerator, numerator, rtol=1e-10, atol=1e-10)
    assert out.denominator.item() == pytest.approx(denominator, rel=1e-12)
    assert out.metrics["count"].item() == count
    assert not [key for key in out.metrics if key.startswith("selector_")]
    _assert_grads_match(out, numerator, draft, skipped=("candidate_selector.",))


def test_dspark_zero_l1_weight_without_confidence_matches_the_reference(setup):
    draft, head, batch, spec = setup(
        "dspark", dspark={"l1_weight": 0.0, "confidence_head": False, "markov_type": "gated"}
    )
    out = draft(batch, head, spec)
    numerator, denominator, count, _ = _dspark_reference(draft, batch, head, spec)
    torch.testing.assert_close(out.numerator, numerator, rtol=1e-10, atol=1e-10)
    assert out.denominator.item() == pytest.approx(denominator, rel=1e-12)
    assert out.metrics["count"].item() == count
    assert "l1_sum" not in out.metrics and "accept_sum" not in out.metrics
    _assert_grads_match(out, numerator, draft)


def test_dflash_is_dflash2_with_identity_convs_and_no_selector(setup):
    # The backbone tensors are shared by name: a plain DFlash draft holding a fresh DFlash2
    # draft's backbone (convs at identity) computes DFlash2's loss without the selector term.
    dflash2, head, batch, spec = setup(
        "dflash2", dflash2={"selector_gold_policy": "insert", "selector_loss_weight": 0.0}
    )
    dflash = setup("dflash")[0]
    extra = set(dflash2.state_dict()) - set(dflash.state_dict())
    assert extra and all(
        ".attention_conv." in k or ".mlp_conv." in k or k.startswith("candidate_selector.")
        for k in extra
    )
    dflash.load_state_dict({k: v for k, v in dflash2.state_dict().items() if k not in extra})
    want, got = dflash2(batch, head, spec), dflash(batch, head, spec)
    torch.testing.assert_close(got.numerator, want.numerator, rtol=1e-12, atol=1e-12)
    assert got.metrics.keys() == want.metrics.keys()
    for key, value in want.metrics.items():
        torch.testing.assert_close(got.metrics[key], value, msg=key)
