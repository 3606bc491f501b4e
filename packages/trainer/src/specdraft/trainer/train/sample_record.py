"""The record of which samples each optimizer step trained, and its audit.

A local run appends one line per optimizer step to `<output_dir>/trained-samples.jsonl`:
`{"step": 12, "epoch": 0, "of": 217, "ids": [...]}` (the dataset indices every rank trained in
that step, and the epoch's sample count). Rank 0 writes it: every rank computes the same plan,
so no rank sends anything. A resumed run cuts the lines after its checkpoint (it trains those
steps again), as it does for metrics, so the file always tells what the weights saw.
`specdraft audit RUN_DIR` reads it back: per epoch, how many samples were trained once, more
than once, or not at all. (Disaggregated runs have the producer's ledger for the same check.)
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

RECORD_NAME = "trained-samples.jsonl"


class SampleRecord:
    """Appends each optimizer step's sample ids (rank 0 only); never fatal on a write error."""

    def __init__(self, path: Path, *, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled
        self._failed = False

    def append(self, step: int, epoch: int, num_samples: int, ids: list[int]) -> None:
        """Record that optimizer step `step` of `epoch` trained the samples `ids`."""
        if not self.enabled:
            return
        line = json.dumps({"step": step, "epoch": epoch, "of": num_samples, "ids": ids})
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                size = os.fstat(fd).st_size
                try:
                    os.write(fd, (line + "\n").encode())
                except OSError:
                    os.ftruncate(fd, size)  # never a torn line
                    raise
            finally:
                os.close(fd)
        except OSError as exc:
            if not self._failed:
                log.warning("%s: cannot record the trained samples (%s)", self.path, exc)
            self._failed = True

    def truncate_after(self, step: int) -> None:
        """Cut the lines of steps after `step` (a resumed run trains them again), in place."""
        if not self.enabled or not self.path.is_file():
            return
        offset, cut = 0, None
        with self.path.open("rb") as handle:
            for line in handle:
                try:
                    row_step = json.loads(line)["step"]
                    torn = not line.endswith(b"\n")
                except (ValueError, KeyError, TypeError):
                    row_step, torn = None, True
                if cut is None and (torn or (isinstance(row_step, int) and row_step > step)):
                    cut = offset
                offset += len(line)
        if cut is not None:
            os.truncate(self.path, cut)


@dataclass
class EpochAudit:
    """How one epoch's samples were trained."""

    epoch: int
    num_samples: int
    counts: Counter[int] = field(default_factory=Counter)
    steps: int = 0

    @property
    def repeated(self) -> list[int]:
        """Samples trained more than once in the epoch."""
        return sorted(i for i, n in self.counts.items() if n > 1)

    @property
    def missing(self) -> int:
        """Samples of the epoch not trained (yet)."""
        return self.num_samples - len(self.counts)


def audit_record(path: Path) -> list[EpochAudit]:
    """Read a run's sample record into one audit per epoch (torn lines are skipped)."""
    epochs: dict[int, EpochAudit] = {}
    with path.open("rb") as handle:
        for line in handle:
            try:
                row = json.loads(line)
                epoch, ids, of = int(row["epoch"]), row["ids"], int(row["of"])
            except (ValueError, KeyError, TypeError):
                continue
            audit = epochs.setdefault(epoch, EpochAudit(epoch, of))
            audit.num_samples = of
            audit.counts.update(int(i) for i in ids)
            audit.steps += 1
    return [epochs[e] for e in sorted(epochs)]


def audit_lines(audits: list[EpochAudit], *, finished: bool) -> tuple[list[str], bool]:
    """The audit in words, one line per epoch, and whether every finished epoch trained each
    sample exactly once. The last epoch is in progress unless `finished` or it is complete."""
    lines, ok = [], True
    for index, audit in enumerate(audits):
        last = index == len(audits) - 1
        repeated = audit.repeated
        once = len(audit.counts) - len(repeated)
        complete = not last or finished or audit.missing == 0
        extra = f" (e.g. {repeated[:5]})" if repeated else ""
        if complete:
            ok = ok and not repeated and audit.missing == 0
            lines.append(
                f"epoch {audit.epoch}: {once} of {audit.num_samples} samples trained once, "
                f"{len(repeated)} more than once{extra}, {audit.missing} never "
                f"({audit.steps} steps)"
            )
        else:
            ok = ok and not repeated
            lines.append(
                f"epoch {audit.epoch} (in progress): {len(audit.counts)} of "
                f"{audit.num_samples} samples trained so far, {len(repeated)} more than "
                f"once{extra} ({audit.steps} steps)"
            )
    return lines, ok
