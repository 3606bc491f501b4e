"""`specdraft regenerate`: a corpus's assistant turns rewritten with the target's greedy answers.

A drafter learns to predict its target, so it trains on what the target says. `replay` selects
the source records and replays each conversation turn by turn through a `Responder`: the target
in-process (`local`) or an OpenAI-compatible chat endpoint such as an SGLang server (`endpoint`,
its HTTP from the neutral `runtime.http_client`; it waits out a server that goes away for
`--retry-for`). `output` appends the rows to a resumable JSONL file with its settings alongside,
and keeps the finished answers of an unfinished chunk in a pending file that the next run reads;
`run` wires a config and the command's options together.
The CLI calls `regenerate_from_config`; tests drive `regenerate` with their own responder.
"""

from .output import OutputMismatch, RegeneratedFile
from .replay import ChatPrompt, RegenerateError, RegenerateResult, Responder, regenerate
from .run import regenerate_from_config

__all__ = [
    "ChatPrompt",
    "OutputMismatch",
    "RegenerateError",
    "RegenerateResult",
    "RegeneratedFile",
    "Responder",
    "regenerate",
    "regenerate_from_config",
]
