"""Reconnect backoff, one formula for every link that retries (worker -> aggregator, worker -> estimator's
Oracle stream, aggregator -> estimator's offline job): full-jitter exponential.

Full jitter spreads the retries of many peers over the whole window instead of sending them in lockstep
at a restarted service (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015).
"""

from __future__ import annotations

import random

MAX_DOUBLINGS = 30  # 2**30 * base is past any cap; bounds the float for huge attempt numbers


def backoff_delay(attempt: int, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Seconds to sleep before retry ``attempt`` (0-based): uniform in [0, min(cap, base * 2**attempt)].

    One ``rng.uniform`` draw per call, so a seeded ``rng`` gives a reproducible sequence.
    """
    return rng.uniform(0.0, min(cap_s, base_s * 2.0 ** min(attempt, MAX_DOUBLINGS)))
