"""The engine's side of secure aggregation: it drives one round's protocol through the executor's
``secure_exchange`` (requests to named clients, their responses back, as bytes) and unmasks the sum.

``begin`` runs advertise, share and route before the clients train (they do not depend on the model), and
returns the clients still in; the fit then uploads masked vectors; ``finish`` asks the survivors for the
shares and returns the ``SecureSum`` the strategy aggregates; under ``privacy.secagg_threat: malicious`` it
first runs the consistency check (the survivors sign the set U3 whose masked inputs the server holds), one more
round trip. Clients that drop at any step are failed
clients of the round like any other, with the protocol's reason; the quorum rule decides the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from torch import Tensor

from fedent.rng import derive_seed
from fedent.rounds.executor import Gathered
from fedent.secagg.fixedpoint import decode
from fedent.secagg.hosted import split_vector
from fedent.secagg.identity import SeededPKI
from fedent.secagg.protocol import ProtocolError, ServerSession, Setup
from fedent.strategies.base import ClientUpdate, SecureSum, Strategy, StrategyError

if TYPE_CHECKING:
    from fedent.config import PrivacyConfig

Exchange = Callable[[int, Mapping[int, bytes]], Gathered[bytes]]


class SecureAggregation:
    """One run's secure aggregation: its settings, and the current round's server session."""

    def __init__(self, privacy: PrivacyConfig, seed: int) -> None:
        self.privacy, self.seed = privacy, seed
        self.session: ServerSession | None = None
        self.round = -1

    def begin(self, rnd: int, cids: Sequence[int], strategy: Strategy,
              exchange: Exchange) -> tuple[list[int], dict[int, str]]:
        """Advertise, share, route; returns (the clients that finished them, the others and why)."""
        if strategy.secure_weighting is None:
            raise StrategyError(f"{strategy.name} cannot run under secure aggregation: {strategy.secure_blocker}")
        p = self.privacy
        setup = Setup(rnd, p.secagg_ring_bits, p.secagg_frac_bits, p.secagg_rounding, strategy.secure_weighting,
                      tuple(strategy.payload_spec.update_tensors), len(cids), p.secagg_threat)
        pki = SeededPKI.from_seed(self.seed) if setup.checked else None  # to drop a badly signed client early
        s = self.session = ServerSession(setup, cids, p.secagg_degree, p.secagg_threshold,
                                         derive_seed(self.seed, "secagg-graph", rnd), pki)
        self.round = rnd
        failed: dict[int, str] = {}

        def step(requests: Mapping[int, bytes]) -> dict[int, bytes]:
            got = exchange(rnd, requests)
            failed.update({c: f"secagg: {w}" for c, w in got.failed.items()})
            return got.results

        failed.update(s.take_advertise(step(s.advertise_requests())))
        requests, short = s.share_requests()
        failed.update(short)
        failed.update(s.take_share(step(requests)))
        live = sorted(step(s.route_requests()))
        return live, {c: w for c, w in failed.items() if c not in live}

    def finish(self, rnd: int, updates: Sequence[ClientUpdate], global_params: Sequence[Tensor],
               strategy: Strategy, exchange: Exchange) -> SecureSum:
        """Unmask the accepted masked updates' sum (``ProtocolError`` when too few shares came back)."""
        s = self.session
        if s is None or self.round != rnd:
            raise ProtocolError(f"secagg: round {rnd} was not set up")
        masked = {u.cid: u.masked for u in updates if u.masked is not None}
        if len(masked) != len(updates):
            raise ProtocolError("secagg: an accepted update is not masked")
        refused: dict[int, str] = {}
        if s.setup.checked:  # the consistency check: U3 signed by the survivors before any share is revealed
            checked = exchange(rnd, s.consistency_requests(sorted(masked)))
            refused.update(checked.failed)
            refused.update(s.take_consistency(checked.results))
        got = exchange(rnd, s.unmask_requests(sorted(masked)))
        refused.update(got.failed)
        try:
            ring = s.unmask(masked, got.results)
        except ProtocolError as e:
            if not refused:
                raise
            c = min(refused)
            raise ProtocolError(f"{e}; {len(refused)} client(s) refused or failed the consistency check or the "
                                f"unmask, e.g. client {c}: {refused[c]}") from None
        vec = decode(ring, s.setup.frac_bits, s.setup.ring_bits)
        params, groups = split_vector(vec, global_params, s.setup.groups)
        weight = float(sum(u.num_samples for u in updates)) if s.setup.weighting == "samples" else float(len(updates))
        clear = [ClientUpdate(u.cid, [], u.num_samples, u.train_loss, {}, dict(u.scalars)) for u in updates]
        return SecureSum(rnd, params, groups, weight, clear)
