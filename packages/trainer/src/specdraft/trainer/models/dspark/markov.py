"""DSpark's heads: the Markov previous-token bias on the logits and the confidence head.

Parameter names follow SGLang's DSpark loader (`markov_head.markov_w1` / `markov_w2`,
`gate_proj`, `joint_proj`, `confidence_head.proj`) so a trained draft loads there unchanged.

- vanilla: bias = W2(E1[prev]), a rank-r bigram correction.
- gated:   bias = W2(sigmoid(G([h, E1[prev]])) * E1[prev]), the draft state gates the bigram.
- rnn:     a gated recurrent state runs along the block: z = [s, E1[prev], h] -> gate, candidate,
           output; s' = g * s + (1 - g) * tanh(candidate); bias = W2(tanh(output)).
Training teacher-forces `prev` (the gold previous token); inference feeds back its own choice.
E1 embeds the previous token by its target id (V rows); W2 projects to the logits' vocabulary:
the target's, or the draft vocabulary's D ids (models/draft_vocab.py), as vLLM and speculators
build it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

MARKOV_TYPES = ("vanilla", "gated", "rnn")


class VanillaMarkov(nn.Module):
    """bias = W2(E1[prev]) (rank-r previous-token bias)."""

    def __init__(
        self, vocab_size: int, rank: int, hidden_size: int, logits_size: int | None = None
    ) -> None:
        super().__init__()
        del hidden_size  # the vanilla head does not look at the draft state
        self.rank = rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, logits_size or vocab_size, bias=False)

    def embed(self, previous: Tensor) -> Tensor:
        """E1[prev]: [..] -> [.., r]."""
        return self.markov_w1(previous)

    def initial_state(self, like: Tensor) -> Tensor:
        """Recurrent state before a block's first slot (empty for stateless heads)."""
        return like.new_zeros((*like.shape[:-1], 0))

    def step(self, state: Tensor, hidden: Tensor, previous: Tensor) -> tuple[Tensor, Tensor]:
        """One slot: (state, hidden [.., H], prev [..]) -> (next state, bias [.., V])."""
        del hidden
        return state, self.markov_w2(self.embed(previous))

    def block_bias(self, hidden: Tensor, previous: Tensor) -> Tensor:
        """Biases [.., bs, V] of a whole block, teacher-forced (no recurrence: one shot)."""
        del hidden
        return self.markov_w2(self.embed(previous))


class GatedMarkov(VanillaMarkov):
    """bias = W2(sigmoid(gate_proj([h, E1[prev]])) * E1[prev])."""

    def __init__(
        self, vocab_size: int, rank: int, hidden_size: int, logits_size: int | None = None
    ) -> None:
        super().__init__(vocab_size, rank, hidden_size, logits_size)
        self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def block_bias(self, hidden: Tensor, previous: Tensor) -> Tensor:
        """Biases [.., bs, V]; the gate reads the draft state of the same slot."""
        embedded = self.embed(previous)
        gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, embedded], dim=-1)))
        return self.markov_w2(gate * embedded)

    def step(self, state: Tensor, hidden: Tensor, previous: Tensor) -> tuple[Tensor, Tensor]:
        """One slot of the gated head (stateless)."""
        return state, self.block_bias(hidden, previous)


class RNNMarkov(VanillaMarkov):
    """A gated recurrent state along the block (see module docstring)."""

    def __init__(
        self, vocab_size: int, rank: int, hidden_size: int, logits_size: int | None = None
    ) -> None:
        super().__init__(vocab_size, rank, hidden_size, logits_size)
        self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def initial_state(self, like: Tensor) -> Tensor:
        """Zero state [.., r] for a batch of slots shaped like `like` [.., H]."""
        return like.new_zeros((*like.shape[:-1], self.rank))

    def step(self, state: Tensor, hidden: Tensor, previous: Tensor) -> tuple[Tensor, Tensor]:
        """Advance the state by one slot and return its bias."""
        joint = self.joint_proj(torch.cat([state, self.embed(previous), hidden], dim=-1))
        gate, candidate, output = joint.chunk(3, dim=-1)
        gate = torch.sigmoid(gate)
        state = gate * state + (1.0 - gate) * torch.tanh(candidate)
        return state, self.markov_w2(torch.tanh(output))

    def block_bias(self, hidden: Tensor, previous: Tensor) -> Tensor:
        """Biases [.., bs, V], running the state over the block's slots in order."""
        state = self.initial_state(hidden[..., 0, :])
        biases = []
        for slot in range(hidden.shape[-2]):
            state, bias = self.step(state, hidden[..., slot, :], previous[..., slot])
            biases.append(bias)
        return torch.stack(biases, dim=-2)


def build_markov_head(
    kind: str, vocab_size: int, rank: int, hidden_size: int, logits_size: int | None = None
) -> VanillaMarkov:
    """The Markov head of type `kind` ('vanilla' | 'gated' | 'rnn'); its bias has
    `logits_size` entries (the draft vocabulary's; default the target's `vocab_size`)."""
    heads = {"vanilla": VanillaMarkov, "gated": GatedMarkov, "rnn": RNNMarkov}
    if kind not in heads:
        raise ValueError(
            f"model.dspark.markov_type = {kind!r} is not one of {', '.join(MARKOV_TYPES)}"
        )
    return heads[kind](vocab_size, rank, hidden_size, logits_size)


class ConfidenceHead(nn.Module):
    """Acceptance-probability logit of each slot from the draft state (+ E1[prev] optionally)."""

    def __init__(self, hidden_size: int, rank: int, with_markov: bool) -> None:
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(hidden_size + (rank if with_markov else 0), 1)

    def forward(self, hidden: Tensor, markov_embedding: Tensor) -> Tensor:
        """Logits [..] for hidden [.., H] and the Markov embedding of the previous token."""
        features = torch.cat([hidden, markov_embedding], dim=-1) if self.with_markov else hidden
        return self.proj(features).squeeze(-1)
