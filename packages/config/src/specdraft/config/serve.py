"""`[serve]`: the engines a draft will be served with, which the linter checks the draft against.

`ENGINES` below names each engine and the export that feeds it. What an engine can load per
family lives with the family (`FamilyRules.draft_vocab_engines`, and the family's own checks in
`families/<name>.py`, such as DSpark's heads under llama.cpp), so this module stays a list of
names and imports nothing of the schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from .registry import listed
from .section import Section

# The engines, in the order docs list them, each with the export that feeds it.
ENGINES: dict[str, str] = {
    "sglang": "SGLang's DFLASH / DSPARK loaders, `specdraft export --format sglang`",
    "vllm": "vLLM 0.32's loaders, `--format vllm` or `--format speculators`",
    "llama.cpp": "`llama-server -md`, `--format gguf`",
}
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)
# What an empty `serve.engines` stands for where an engine matters (the draft vocabulary): the
# engines of the HF-folder exports. llama.cpp counts once a config names it.
DEFAULT_ENGINES: tuple[str, ...] = ("sglang", "vllm")
LLAMA_CPP = "llama.cpp"

if TYPE_CHECKING:
    EngineName = str
else:
    EngineName = Literal[ENGINE_NAMES]


class ServeConfig(Section):
    """`[serve]`: where the trained draft will be served; the linter checks it against them."""

    engines: list[EngineName] = Field(
        [],
        description="Engines the draft will be served with: "
        f"{listed(ENGINES, last=' and ')}. The linter checks the draft against each (a draft "
        "vocabulary it cannot read, a DSpark head llama.cpp cannot load); empty: SGLang and "
        "vLLM for the draft-vocabulary check, nothing else.",
    )

    def named(self, engine: str) -> bool:
        """Whether `engine` is one of the engines this config names."""
        return engine in self.engines
