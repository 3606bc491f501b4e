"""Lint findings on `model.draft_vocab_size`: against the target's vocabulary and the engines.

What the engines read (vLLM 0.32, speculators 0.9.0, SGLang 0.5.23, llama.cpp build 11434, read
in their sources): vLLM's qwen3_dflash and qwen3_dspark build the draft head with
`draft_vocab_size` rows and map draft ids to target ids through `d2t` offsets; its
ParallelLMHead pads the rows to a multiple of 64, so any size loads. vLLM's DFlash2 speculator
takes its candidates from the draft head without that mapping, speculators' DFlash2 requires
the full vocabulary and SGLang's DFlash loaders project through the target's head. llama.cpp's
dflash.cpp reads `d2t` (absolute target ids) and a head of D rows for every family and scatters
the draft logits to the target vocabulary before the DSpark Markov bias and the DFlash2
selector read them, so it serves all three (`specdraft export --format gguf`).

Which engines count: those `serve.engines` names, else SGLang and vLLM (`serve.DEFAULT_ENGINES`).
Which engine reads a family's draft vocabulary: `FamilyRules.draft_vocab_engines`.
"""

from __future__ import annotations

from .families import FAMILY_RULES
from .finding import Problem
from .schema import Config
from .serve import DEFAULT_ENGINES
from .target_info import TargetInfo

_KEY = ("model", "draft_vocab_size")
# vLLM's vocabulary padding (DEFAULT_VOCAB_PADDING_SIZE).
_VLLM_PADDING = 64
# Why an engine reads no draft vocabulary of a family (today only SGLang's loaders, for every
# family, and vLLM's, for DFlash2, read none).
_WHY_NOT = {
    "sglang": "SGLang's loaders project through the target's head",
    "vllm": "vLLM's DFlash2 speculator takes its candidates from the head without the d2t "
    "mapping, and speculators 0.9.0's DFlash2 requires the full vocabulary",
}
_ENGINE_TITLES = {"sglang": "SGLang", "vllm": "vLLM", "llama.cpp": "llama.cpp"}


def served_with_draft_vocab(engines: tuple[str, ...] = DEFAULT_ENGINES) -> tuple[str, ...]:
    """The families one of `engines` serves with a draft vocabulary (`draft_vocab_engines`)."""
    return tuple(
        name
        for name, rules in FAMILY_RULES.items()
        if any(engine in engines for engine in rules.draft_vocab_engines)
    )


def draft_vocab_problems(config: Config) -> list[Problem]:
    """Findings that need only the config: padding, and whether the engines serve it."""
    size = config.model.draft_vocab_size
    if size is None:
        return []
    problems = []
    engines = tuple(config.serve.engines) or DEFAULT_ENGINES
    if size % _VLLM_PADDING and "vllm" in engines:
        rounded = -(-size // _VLLM_PADDING) * _VLLM_PADDING
        problems.append(
            Problem(
                "SD323",
                _KEY,
                f"draft_vocab_size {size} is not a multiple of {_VLLM_PADDING}: vLLM pads the "
                f"draft head to {rounded} rows anyway, so {rounded} costs the same when served",
            )
        )
    return problems + engine_problems(config, engines)


def engine_problems(config: Config, engines: tuple[str, ...]) -> list[Problem]:
    """SD324 when none of `engines` reads the family's draft vocabulary; SD327 for each named
    engine that does not while another named one does."""
    algorithm = config.model.algorithm
    serving = FAMILY_RULES[algorithm].draft_vocab_engines
    if not any(engine in serving for engine in engines):
        whose = "serve.engines" if config.serve.engines else "what an empty serve.engines means"
        verb = "reads" if len(engines) == 1 else "read"
        if serving:
            engines_line = f"[serve] engines = [{_quoted(serving)}]"
            fix = f"serve it with {_titles(serving)}, and say so: {engines_line}"
        else:
            fix = f"use {' or '.join(served_with_draft_vocab(tuple(_ENGINE_TITLES)))}"
        why = "; ".join(_WHY_NOT.get(engine, f"{engine} reads none") for engine in engines)
        return [
            Problem(
                "SD324",
                _KEY,
                f"{_titles(engines)} ({whose}) {verb} no draft vocabulary for algorithm = "
                f"{algorithm!r} ({why}): the draft trains but `specdraft export` refuses it for "
                f"{_titles(engines)}; drop draft_vocab_size, or {fix}",
            )
        ]
    usable = tuple(engine for engine in engines if engine in serving)
    return [
        Problem(
            "SD327",
            ("serve", "engines", index),
            f"{_titles((engine,))} reads no draft vocabulary for algorithm = {algorithm!r} "
            f"({_WHY_NOT.get(engine, 'it reads none')}): with draft_vocab_size this draft "
            f"serves with {_titles(usable)} only",
        )
        for index, engine in enumerate(config.serve.engines)
        if engine not in serving
    ]


def _titles(engines: tuple[str, ...]) -> str:
    """Engine names as prose: 'SGLang and vLLM'."""
    names = [_ENGINE_TITLES.get(engine, engine) for engine in engines]
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]


def _quoted(engines: tuple[str, ...]) -> str:
    """Engine names as TOML strings: '"llama.cpp"'."""
    return ", ".join(f'"{engine}"' for engine in engines)


def draft_vocab_target_problems(config: Config, info: TargetInfo) -> list[Problem]:
    """The draft vocabulary against the target's own vocabulary size."""
    size, vocab = config.model.draft_vocab_size, info.vocab_size
    if size is None or vocab is None:
        return []
    if size > vocab:
        return [
            Problem(
                "SD321",
                _KEY,
                f"draft_vocab_size {size} is larger than the vocabulary of the target "
                f"({info.folder}: vocab_size {vocab}); use at most {vocab}, or drop it for the "
                "full vocabulary (`specdraft explain-vocab` suggests a size)",
            )
        ]
    if size == vocab:
        return [
            Problem(
                "SD322",
                _KEY,
                f"draft_vocab_size {size} is the target's whole vocabulary ({info.folder}): "
                "nothing is pruned; drop it, or pick a smaller size (`specdraft explain-vocab`)",
            )
        ]
    return []
