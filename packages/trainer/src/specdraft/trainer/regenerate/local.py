"""Greedy answers from the target in-process (transformers `generate`), a batch at a time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .replay import AnswerCallback, ChatPrompt


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


class LocalResponder:
    """Loads model.target and answers prompts greedily, stopping at its end-of-turn tokens."""

    def __init__(
        self,
        target: str | Path,
        tokenizer: Any,
        *,
        max_new_tokens: int,
        device: torch.device | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        # bf16 on GPU as in serving; fp32 on CPU, where bf16 matmuls are slow.
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.target = str(target)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.target, dtype=dtype, local_files_only=True
        ).to(self.device)
        self.model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        generation = getattr(self.model, "generation_config", None)
        eos = _as_list(getattr(generation, "eos_token_id", None))
        eos += [t for t in _as_list(tokenizer.eos_token_id) if t not in eos]
        if not eos:
            raise ValueError(
                f"{self.target}: neither generation_config.json nor the tokenizer names an eos "
                "token, so answers would never stop; add eos_token_id to generation_config.json"
            )
        self.eos_ids = eos
        pad = _as_list(getattr(generation, "pad_token_id", None)) or _as_list(
            tokenizer.pad_token_id
        )
        self.pad_id = pad[0] if pad else eos[0]

    def describe(self) -> dict[str, Any]:
        """The in-process target and the answer budget."""
        return {"kind": "in-process", "target": self.target, "max_new_tokens": self.max_new_tokens}

    @torch.no_grad()
    def answer(
        self, prompts: Sequence[ChatPrompt], on_answer: AnswerCallback | None = None
    ) -> list[str | None]:
        """Greedy answers for a batch, left-padded so every answer starts at the same column
        (one `generate`: the answers are finished together)."""
        if not prompts:
            return []
        width = max(len(p.token_ids) for p in prompts)
        budgets = [min(self.max_new_tokens, p.max_new_tokens) for p in prompts]
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            n = len(prompt.token_ids)
            ids[row, width - n :] = torch.tensor(prompt.token_ids, dtype=torch.long)
            mask[row, width - n :] = 1
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=max(budgets),
            do_sample=False,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
        )
        answers: list[str | None] = []
        for row, budget in zip(out[:, width:].tolist(), budgets, strict=True):
            row = row[:budget]
            cut = next((i for i, t in enumerate(row) if t in self.eos_ids), len(row))
            answers.append(self.tokenizer.decode(row[:cut], skip_special_tokens=True))
        if on_answer is not None:
            for index, answer in enumerate(answers):
                on_answer(index, answer)
        return answers
