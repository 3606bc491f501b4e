"""The draft vocabulary of a run: supervised-token counts, the choice, its record and report."""

from .choice import DraftVocab, choose_draft_vocab, coverage, smallest_covering
from .frequencies import corpus_token_counts, supervised_token_counts
from .record import draft_vocab_for_run, write_vocab_record

__all__ = [
    "DraftVocab",
    "choose_draft_vocab",
    "corpus_token_counts",
    "coverage",
    "draft_vocab_for_run",
    "smallest_covering",
    "supervised_token_counts",
    "write_vocab_record",
]
