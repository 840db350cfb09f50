"""A run's privacy, as the round engine sees it: the central release, the ε so far, and the budget.

Everything here is a function of the config and of metrics.jsonl's records (the released rounds are the ones
not ``skipped``, their participants are ``clients``; the adaptive clip norm is the last record's
``privacy.next_clip_norm``), so a resumed run continues its ledger and its clip norm with no state of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from fedent.config import ExperimentConfig
from fedent.privacy.central import CentralDP
from fedent.rng import sample_clients
from fedent.strategies.base import ClientUpdate


def released_rounds(records: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """The participants of every logged round that released an aggregate (not skipped)."""
    return [list(r.get("clients") or []) for r in records
            if not (r.get("diagnostics") or {}).get("skipped") and r.get("clients")]


class RunPrivacy:
    """``privacy:`` of one run; with ``dp: none`` every method is a no-op and ``report`` is None."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg, self.pc = cfg, cfg.privacy
        tr = cfg.train
        self.sample_size = len(sample_clients(tr.seed, 0, cfg.data.num_clients, tr.fraction))
        self.central = CentralDP(self.pc, tr.seed, self.sample_size) if self.pc.dp == "central" else None

    @property
    def enabled(self) -> bool:
        return self.pc.enabled

    def clip_norm(self, records: Sequence[Mapping[str, Any]]) -> float:
        """The clip norm of the next round: the configured one, or where adaptive clipping has moved it."""
        for r in reversed(records):
            nxt = (r.get("privacy") or {}).get("next_clip_norm")
            if isinstance(nxt, (int, float)):
                return float(nxt)
        return self.pc.clip_norm

    def carried(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """What a round that released nothing logs beside ε: central DP's clip norm, unchanged."""
        return {"next_clip_norm": self.clip_norm(records)} if self.central is not None else {}

    def release(self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate],
                records: Sequence[Mapping[str, Any]]) -> tuple[list[ClientUpdate], dict[str, Any]]:
        """The updates the strategy aggregates (central: each the noised mean) and what the round logs."""
        if self.central is None:
            return list(updates), {}
        clip = self.clip_norm(records)
        out = self.central.release(rnd, global_params, updates, clip)
        return out.updates, {"next_clip_norm": clip, **out.info}

    def report(self, released: Sequence[Sequence[int]], sizes: Sequence[int]) -> dict[str, Any] | None:
        """``{epsilon, delta, accountant, event, ...}`` after the ``released`` rounds; None without DP."""
        pc, tr = self.pc, self.cfg.train
        if not self.enabled:
            return None
        from fedent.privacy import accountant  # dp-accounting (and scipy) load only for a run with DP

        if pc.dp == "central":
            return {**accountant.central_report(len(sizes), self.sample_size, pc.noise_multiplier, len(released),
                                                pc.delta), "dp": "central"}
        if pc.dp == "local":
            joined = Counter(c for cids in released for c in cids)
            return {**accountant.local_report(sizes, joined, tr.batch_size, tr.local_epochs, pc.noise_multiplier,
                                              pc.delta), "dp": "local"}
        return None

    def over_budget(self, rnd: int, released: Sequence[Sequence[int]], sizes: Sequence[int]) -> str | None:
        """Why round ``rnd`` (the loop's index, 0..R-1) must not run (it would take ε past ``target_epsilon``), or
        None; the message names it by its round number 1..R."""
        target = self.pc.target_epsilon
        if target is None or not self.enabled or rnd >= self.cfg.train.rounds:
            return None
        nxt = sample_clients(self.cfg.train.seed, rnd, len(sizes), self.cfg.train.fraction)
        rep = self.report([*released, nxt], sizes)
        eps = float("inf") if rep is None or rep["epsilon"] is None else float(rep["epsilon"])
        if eps <= target:
            return None
        return (f"privacy budget: round {rnd + 1} would take ε to {eps:.4g} > target_epsilon {target:g} "
                f"(δ={self.pc.delta:g})")
