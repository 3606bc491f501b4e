"""DFlash2's pairwise path selector over the top-k candidates of each block position.

    S_t(a, b) = U_t(b) + < A(a) * H(h_t), B(b) >

U_t(b) is the draft's logit of candidate b at position t, A and B are rank-r token codebooks
(`predecessor_codebook`, `successor_codebook`) and H a projection of the draft hidden state h_t
(`hidden_projection`), named as in the published checkpoints. Training scores each position with
the gold previous token (teacher forcing) and adds a cross-entropy over the candidates; inference
walks one path from the anchor, each step conditioned on the token it chose before.

The unary term is detached: the DFlash loss alone trains the logits, and the selector learns to
re-rank them. When the gold token is not among the top-k, the configured policy decides:
'exclude' drops the position from the selector loss, 'insert' replaces the weakest candidate by
the gold token. Either way the miss is counted (candidate recall).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..losses import upcast

GOLD_POLICIES = ("exclude", "insert")


class Candidates(NamedTuple):
    """Top-k candidates of a position and where the gold token sits among them."""

    tokens: Tensor  # [.., K] int64
    unary: Tensor  # [.., K] float32, detached draft logits
    target: Tensor  # [.., K] -> index of the gold token in `tokens` (0 when absent)
    usable: Tensor  # [..] bool: the position takes part in the selector loss
    hit: Tensor  # [..] bool: the gold token was among the draft's own top-k


def candidate_set(logits: Tensor, gold: Tensor, top_k: int, policy: str) -> Candidates:
    """Top-k candidates of `logits` [.., V] for gold tokens [..] under a gold policy."""
    if policy not in GOLD_POLICIES:
        raise ValueError(f"selector_gold_policy must be 'exclude' or 'insert', got {policy!r}")
    logits = upcast(logits.detach())
    unary, tokens = torch.topk(logits, top_k, dim=-1)
    matches = tokens == gold[..., None]
    hit = matches.any(-1)
    if policy == "insert":
        # topk is sorted, so the last slot holds the weakest candidate.
        missing = ~hit
        last = torch.where(missing, gold, tokens[..., -1])
        last_logit = torch.where(
            missing, logits.gather(-1, gold[..., None]).squeeze(-1), unary[..., -1]
        )
        tokens = torch.cat([tokens[..., :-1], last[..., None]], dim=-1)
        unary = torch.cat([unary[..., :-1], last_logit[..., None]], dim=-1)
        matches = tokens == gold[..., None]
        usable = torch.ones_like(hit)
    else:
        usable = hit
    target = matches.to(torch.int64).argmax(-1)
    return Candidates(tokens, unary, target, usable, hit)


class CandidateSelector(nn.Module):
    """Scores adjacent (previous, candidate) pairs; see the module docstring."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        nn.init.normal_(self.predecessor_codebook, std=0.02)
        nn.init.normal_(self.successor_codebook, std=0.02)

    def score(self, hidden: Tensor, previous: Tensor, tokens: Tensor, unary: Tensor) -> Tensor:
        """Scores [.., K] (fp32) of candidates `tokens` [.., K] after `previous` [..]."""
        context = F.embedding(previous, self.predecessor_codebook) * self.hidden_projection(hidden)
        successors = F.embedding(tokens, self.successor_codebook)
        pair = (successors * context[..., None, :]).sum(-1)
        return upcast(unary) + upcast(pair)

    @torch.no_grad()
    def walk(
        self,
        hidden: Tensor,
        logits_of: Callable[[int], Tensor],
        anchor_tokens: Tensor,
        to_target: Callable[[Tensor], Tensor] = lambda ids: ids,
    ) -> Tensor:
        """Greedy path [.., P] of target ids from the anchor; hidden [.., P, H],
        logits_of(step) -> [.., D] over the draft vocabulary, `to_target` its ids' target ids."""
        previous = anchor_tokens
        chosen = []
        for step in range(hidden.shape[-2]):
            unary, candidates = torch.topk(upcast(logits_of(step)), self.top_k, dim=-1)
            tokens = to_target(candidates)
            scores = self.score(hidden[..., step, :], previous, tokens, unary)
            previous = tokens.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)
            chosen.append(previous)
        return torch.stack(chosen, dim=-1)
