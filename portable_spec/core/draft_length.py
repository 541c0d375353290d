"""How many drafts to verify each round, from measured pass costs and measured acceptance: the round that maximises
expected tokens per second, 0 (plain decoding) when no draft length pays.

Expected tokens of a round with k drafts, per request: 1 + sum_{i<=k} prod_{j<=i} a_j, with a_j the request's
conditional acceptance of slot j (a running estimate: counts of this request's rounds on top of a prior worth
PRIOR_ROUNDS rounds; the prior is what the policy measured over every request before it, DEFAULT_PRIOR at first, as
no checkpoint carries per-slot figures yet). Its cost: the target pass over k + 1 tokens per request plus, for k > 0,
the drafter's passes (`passes(k)`: 1 for a single-pass drafter, k for an autoregressive one), each measured on this
machine at this batch size while decoding (an exponential average of every round's timing). A length not yet timed is
estimated by a straight line through the nearest timed ones; until the ends and one draft are timed the policy times
them itself (a round at k_max, a plain round, a round with one draft). While plain decoding wins it still drafts one
token every PROBE_EVERY rounds, so acceptance that rises later is seen; while drafting wins, a plain round every
REFRESH_EVERY rounds times the one-token pass again. A round during which a matmul layout was being measured is not
timed. The rule only chooses how many drafts the target verifies, so output is unchanged whatever it chooses
(verification decides every token).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

PRIOR_ROUNDS = 8.0  # weight of the prior (every earlier request's acceptance), in rounds: a request's own few rounds
# move its estimate, a couple of unlucky ones do not switch it to plain decoding
DEFAULT_PRIOR = 0.5  # conditional acceptance per slot assumed before any round (no checkpoint carries its own)
PROBE_EVERY = 4  # plain rounds between probes with one draft
REFRESH_EVERY = 32  # drafting rounds between plain ones that time the one-token pass again (costs drift with load)
SMOOTHING = 0.3  # weight of the newest timing in the running average


@dataclass
class SlotAcceptance:
    """One request's conditional acceptance per draft slot: P(slot j accepted | slots < j accepted)."""

    prior: list[float]
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reached = self.reached or [0] * len(self.prior)
        self.accepted = self.accepted or [0] * len(self.prior)

    def rates(self) -> list[float]:
        return [
            (PRIOR_ROUNDS * prior + accepted) / (PRIOR_ROUNDS + reached)
            for prior, accepted, reached in zip(self.prior, self.accepted, self.reached)
        ]

    def observe(self, num_drafts: int, accepted_len: int) -> None:
        """A round that verified `num_drafts` drafts and accepted the first `accepted_len`: slots up to the first
        rejection were reached."""
        for slot in range(min(num_drafts, accepted_len + 1)):
            self.reached[slot] += 1
            self.accepted[slot] += slot < accepted_len

    def expected_tokens(self, num_drafts: int) -> float:
        """Tokens a round with `num_drafts` drafts emits on average: the bonus token plus each accepted draft."""
        total, reach = 1.0, 1.0
        for rate in self.rates()[:num_drafts]:
            reach *= rate
            total += reach
        return total


@dataclass
class PassCosts:
    """Running averages of measured seconds at one batch size: the target's pass per tokens per request, the
    drafter's pass."""

    verify: dict[int, float] = field(default_factory=dict)
    draft: float | None = None

    def observe_verify(self, tokens: int, seconds: float) -> None:
        old = self.verify.get(tokens)
        self.verify[tokens] = seconds if old is None else (1 - SMOOTHING) * old + SMOOTHING * seconds

    def observe_draft(self, seconds: float) -> None:
        self.draft = seconds if self.draft is None else (1 - SMOOTHING) * self.draft + SMOOTHING * seconds

    def verify_seconds(self, tokens: int) -> float | None:
        """Measured, or on the line through the two nearest measured lengths (None: fewer than two measured)."""
        if tokens in self.verify:
            return self.verify[tokens]
        known = sorted(self.verify.items())
        if len(known) < 2:
            return None
        below = [p for p in known if p[0] < tokens]
        above = [p for p in known if p[0] > tokens]
        (n0, s0), (n1, s1) = (
            (below[-1], above[0]) if below and above else (known[-2], known[-1]) if below else (known[0], known[1])
        )
        return max(s0 + (s1 - s0) * (tokens - n0) / (n1 - n0), 0.0)


@dataclass
class DraftLengthPolicy:
    """Chooses each round's draft count for one batch size (one count per round: the chain is [B, k + 1]); its costs
    are that batch size's."""

    max_drafts: int
    passes: Callable[[int], int] = lambda k: 1  # drafter passes a round with k drafts costs
    costs: PassCosts = field(default_factory=PassCosts)
    probe_every: int = PROBE_EVERY
    refresh_every: int = REFRESH_EVERY
    plain_rounds: int = 0  # consecutive rounds that chose 0
    drafting_rounds: int = 0  # consecutive rounds that chose k > 0
    chosen: list[int] = field(default_factory=list)  # every round's choice, for the report
    population: SlotAcceptance | None = None  # every request's rounds so far: the next request's prior

    def __post_init__(self) -> None:
        self.population = self.population or SlotAcceptance([DEFAULT_PRIOR] * self.max_drafts)

    def new_request(self) -> SlotAcceptance:
        return SlotAcceptance(self.population.rates())

    def observe(self, request: SlotAcceptance, num_drafts: int, accepted_len: int) -> None:
        """A request's round: its own estimate and the population's."""
        request.observe(num_drafts, accepted_len)
        self.population.observe(num_drafts, accepted_len)

    def choose(self, requests: list[SlotAcceptance]) -> int:
        k = self._choose(requests)
        self.plain_rounds = self.plain_rounds + 1 if k == 0 else 0
        self.drafting_rounds = self.drafting_rounds + 1 if k > 0 else 0
        self.chosen.append(k)
        return k

    def _choose(self, requests: list[SlotAcceptance]) -> int:
        top = self.max_drafts
        if top + 1 not in self.costs.verify or self.costs.draft is None:
            return top  # time the longest round first
        if 1 not in self.costs.verify:
            return 0  # then a plain one: the two ends of the line
        if top > 1 and 2 not in self.costs.verify:
            return 1  # and one draft: the bend a short chain makes on a CPU
        if self.plain_rounds >= self.probe_every:
            return 1  # plain rounds observe no acceptance: look again now and then, at the cheapest draft
        if self.drafting_rounds >= self.refresh_every:
            return 0  # and drafting rounds do not time the one-token pass
        return max(range(top + 1), key=lambda k: (self.rate(requests, k), -k))

    def rate(self, requests: list[SlotAcceptance], k: int) -> float:
        """Expected tokens per second of a round with k drafts for these requests."""
        seconds = self.costs.verify_seconds(k + 1)
        if k > 0:
            seconds += self.passes(k) * self.costs.draft
        tokens = sum(request.expected_tokens(k) for request in requests)
        return tokens / seconds if seconds > 0 else math.inf

    def summary(self) -> str:
        """How the draft length was chosen: the distribution of k and how often it was 0 (speculation off)."""
        if not self.chosen:
            return "no rounds"
        counts = {k: self.chosen.count(k) for k in sorted(set(self.chosen))}
        off = counts.get(0, 0) / len(self.chosen)
        spread = ", ".join(f"k={k}: {n}" for k, n in counts.items())
        verify = " / ".join(f"{self.costs.verify[n] * 1e3:.0f}" for n in sorted(self.costs.verify))
        tokens = "/".join(str(n) for n in sorted(self.costs.verify))
        draft = f", drafter pass {self.costs.draft * 1e3:.0f} ms" if self.costs.draft is not None else ""
        rates = " ".join(f"{rate:.2f}" for rate in self.population.rates())
        return (
            f"draft length per round {spread} ({off:.0%} of {len(self.chosen)} rounds plain); measured: target pass "
            f"{verify} ms for {tokens} tokens{draft}, acceptance per slot {rates}"
        )
