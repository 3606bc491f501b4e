"""The acceptance length tau: a draft that proposes the target's own next tokens reaches the
maximum (every step but the last advances a whole block), no draft does better, and a random
draft stays near 1 (only the bonus token)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from train_support import single_thread

from specdraft.config import ShapePolicy
from specdraft.trainer.runtime import DistContext
from specdraft.trainer.train.evaluation import (
    build_eval_records,
    evaluate_acceptance,
    simulate_acceptance,
)


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


CPU = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def oracle_predictions(tokens: list[int], prompt_len: int, block_size: int) -> torch.Tensor:
    """For each anchor, the tokens that really follow it (-1 past the end)."""
    rows = []
    for anchor in range(prompt_len, len(tokens) - 1):
        follow = tokens[anchor + 1 : anchor + block_size]
        rows.append(follow + [-1] * (block_size - 1 - len(follow)))
    return torch.tensor(rows, dtype=torch.long).reshape(-1, block_size - 1)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=2, max_size=60),
    prompt=st.integers(1, 10),
    block_size=st.integers(2, 9),
    seed=st.integers(0, 2**16),
)
def test_the_oracle_walk_advances_whole_blocks_and_nothing_beats_it(
    tokens, prompt, block_size, seed
):
    prompt = min(prompt, len(tokens) - 1)
    oracle = simulate_acceptance(
        tokens, prompt, oracle_predictions(tokens, prompt, block_size), block_size
    )
    remaining = len(tokens) - 1 - prompt
    assert oracle.steps == -(-remaining // block_size)
    assert oracle.accepts == oracle.attempts
    if oracle.steps:
        # Every step but the last advances a whole block.
        assert oracle.advanced > (oracle.steps - 1) * block_size
        assert oracle.tau <= block_size
    # A draft that guesses from a 4-token vocabulary, right some of the time, does no better.
    generator = torch.Generator().manual_seed(seed)
    guesses = torch.randint(0, 4, (max(0, remaining), block_size - 1), generator=generator)
    other = simulate_acceptance(tokens, prompt, guesses, block_size)
    assert other.tau <= oracle.tau + 1e-12
    assert other.steps >= oracle.steps


@pytest.fixture(scope="module")
def records(tiny_target_path):
    """The tiny target's greedy continuations of a few ShareGPT prompts, with its features."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdraft.trainer.assets.corpus import sharegpt_conversations

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_target_path))
    target = AutoModelForCausalLM.from_pretrained(str(tiny_target_path), dtype=torch.float32)
    target.eval()
    prompts = []
    for messages in sharegpt_conversations(12000, 20):
        first = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
        if first is None:
            continue
        text = tokenizer.apply_chat_template(
            messages[: first + 1], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
        if len(ids) <= 96:
            prompts.append(ids)
        if len(prompts) == 4:
            break
    eos = target.generation_config.eos_token_id
    built = build_eval_records(
        target,
        lambda ids: torch.zeros(ids.shape[0], ids.shape[1], 8),  # the oracle needs no features
        prompts,
        max_new_tokens=40,
        eos_token_ids=[eos],
        pad_token_id=target.generation_config.pad_token_id,
    )
    return target, built


def target_as_draft(target):
    """A predict function that proposes the target's own next-token predictions."""

    def predict(ids, feats, anchors, keep):
        with torch.no_grad():
            following = target(input_ids=ids).logits.argmax(-1)[0]  # [S]: token after each
        span = anchors.shape[1], 7
        out = torch.zeros(1, *span, dtype=torch.long)
        for n, anchor in enumerate(anchors[0].tolist()):
            for k in range(1, 8):
                # Offset k: the target's prediction given everything up to anchor + k - 1, which
                # on the target's own greedy continuation is the token that follows.
                position = min(anchor + k - 1, ids.shape[1] - 1)
                out[0, n, k - 1] = following[position]
        return out

    return predict


def random_draft(vocab: int):
    generator = torch.Generator().manual_seed(0)

    def predict(ids, feats, anchors, keep):
        return torch.randint(0, vocab, (1, anchors.shape[1], 7), generator=generator)

    return predict


def test_tau_of_the_target_as_its_own_draft_is_maximal(records):
    target, built = records
    assert sum(int(r.input_ids.shape[0]) - r.prompt_len for r in built) > 60
    result = evaluate_acceptance(
        built,
        target_as_draft(target),
        block_size=8,
        num_anchors=16,
        shapes=ShapePolicy(pad_to=None),
        ctx=CPU,
    )
    best = [
        simulate_acceptance(
            r.input_ids.tolist(),
            r.prompt_len,
            oracle_predictions(r.input_ids.tolist(), r.prompt_len, 8),
            8,
        )
        for r in built
    ]
    steps = sum(s.steps for s in best)
    assert result["steps"] == steps
    assert result["tau"] == pytest.approx(sum(s.advanced for s in best) / steps)
    assert result["tau"] > 6.5  # block 8: whole blocks except at each record's end
    assert all(rate == 1.0 for rate in result["accept_rate_per_pos"])


def test_tau_of_a_random_draft_is_near_one(records):
    target, built = records
    vocab = int(target.config.vocab_size)
    result = evaluate_acceptance(
        built,
        random_draft(vocab),
        block_size=8,
        num_anchors=16,
        shapes=ShapePolicy(pad_to=(128,)),
        ctx=CPU,
    )
    assert 1.0 <= result["tau"] < 1.05
    assert result["accept_rate_per_pos"][0] < 0.05
