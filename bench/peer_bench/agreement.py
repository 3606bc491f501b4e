"""Whether a peer's loss is specdraft's on the fixture, and what differs where it is not.

Each peer divides the same sum by its own normaliser: SpecForge by the sum of the decayed loss
weights, as specdraft does; speculators by the count of supervised slots (+ 1e-5). So the value
a peer should report is formed from specdraft's numerator, denominator and count.
"""

from __future__ import annotations

from dataclasses import dataclass

REL_TOLERANCE = 1e-4
SPECULATORS_EPS = 1e-5

# (peer, family) -> what the benchmark configures the peer's objective to, next to specdraft's.
OBJECTIVES = {
    ("specforge", "dflash"): "decayed CE on the data tokens / sum of decay weights (its only loss)",
    ("specforge", "dspark"): "0.1 CE + 0.9 L1 + 1.0 confidence BCE / sum of decay weights",
    ("speculators", "dflash"): (
        "loss_fn ce: hard labels = argmax of the verifier's logits (the fixture's tokens) / "
        "supervised slots; its default kl_div (KL to the verifier's softmax) is another objective"
    ),
    ("speculators", "dflash2"): (
        "unary ce + 0.1 selector CE over the top-16 with the gold inserted (specdraft "
        "selector_gold_policy insert) / supervised slots; default kl_div differs"
    ),
    ("speculators", "dspark"): (
        '{"ce": 0.1, "tv": 1.8} (TV = L1 / 2) + 1.0 confidence BCE / supervised slots; '
        "default kl_div + tv differs"
    ),
}


@dataclass(frozen=True)
class Agreement:
    """A peer's loss next to the value specdraft's sums give for its normalisation."""

    peer: str
    family: str
    peer_loss: float
    expected: float

    @property
    def relative(self) -> float:
        """|peer - expected| / |expected|."""
        return abs(self.peer_loss - self.expected) / max(abs(self.expected), 1e-30)

    @property
    def agrees(self) -> bool:
        """Within REL_TOLERANCE."""
        return self.relative <= REL_TOLERANCE

    def line(self) -> str:
        """One line for the report."""
        verdict = "agree" if self.agrees else "DIFFER"
        return (
            f"{self.peer} {self.family}: {verdict} (peer {self.peer_loss:.7g}, specdraft "
            f"{self.expected:.7g}, rel {self.relative:.1e}); objective: "
            f"{OBJECTIVES[(self.peer, self.family)]}"
        )


def expected_loss(peer: str, ours: dict) -> float:
    """The loss `peer` should report, from specdraft's check (numerator, denominator, count)."""
    if peer == "speculators":
        return ours["numerator"] / (ours["count"] + SPECULATORS_EPS)
    return ours["numerator"] / ours["denominator"]


def compare(peer: str, family: str, ours: dict, theirs: dict) -> Agreement:
    """The agreement of one peer's check with specdraft's on the same family and fixture."""
    return Agreement(peer, family, float(theirs["loss"]), expected_loss(peer, ours))
