"""The seam between the round loop and the place where clients run (this process, a GPU, remote workers).

An executor answers for the client side of a round (probe, fit), for the one step before round 0 that
needs the clients' data (Algorithm 1's gradient oracle), and for what the run's files should say about
where clients run. The engine never asks *how*; the executor never decides *what* (sampling, quorum,
aggregation and records stay in the engine).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from torch import Tensor

from fedent.strategies.base import ClientUpdate, Probe, RoundPayload, Strategy

if TYPE_CHECKING:
    from fedent.rounds.engine import RoundEngine

T = TypeVar("T")


@dataclass
class Gathered(Generic[T]):
    """One phase's outcome: the results by cid (sorted) and, for the clients that gave none, why not."""

    results: dict[int, T] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.results = dict(sorted(self.results.items()))


class ClientExecutor(Protocol):
    """Runs the client side of the rounds that a ``RoundEngine`` drives."""

    def status_fields(self) -> dict[str, Any]:
        """Extra keys for status.json's ``state`` (e.g. ``mode`` and live ``workers`` in the cluster)."""
        ...

    def bind(self, engine: RoundEngine) -> None:
        """Called once before anything runs; the executor may keep the engine (its clients book, stop flag)."""
        ...

    def start(self) -> None:
        """Block until every client can be asked (the cluster waits for its workers)."""
        ...

    def prepare(self, strategy: Strategy, global_params: Sequence[Tensor], sizes: Sequence[int],
                rounds: int) -> tuple[Strategy, dict[str, Any]]:
        """For a strategy with ``capabilities.oracle``: run its preparation over every client (Algorithm 1)
        and return the strategy to use from now on (maybe a new one) and the preparation's report."""
        ...

    def resumed(self, first: int | None, error: BaseException | None) -> None:
        """The run starts at round ``first`` (its resume's, 0 when fresh), or its resume failed here with ``error``
        (``first`` None; the engine re-raises it). Where the run is several processes, they agree on both here, so a
        rank whose checkpoint is unreadable is named to its peers instead of leaving them waiting for it."""
        ...

    def begin_round(self, rnd: int, global_params: Sequence[Tensor]) -> None:
        """w(t) is fixed for the round: publish it (the cluster encodes it once for every download)."""
        ...

    def probe(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor],
              strategy: Strategy) -> Gathered[Probe]:
        ...

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        ...

    def secure_exchange(self, rnd: int, requests: Mapping[int, bytes]) -> Gathered[bytes]:
        """Secure aggregation (fedent.secagg): deliver each client its protocol message, gather the answers."""
        ...

    def replacements(self, rnd: int, attempt: int, k: int, exclude: set[int]) -> list[int]:
        """Up to ``k`` clients for retry ``attempt`` of a round that missed its quorum (those in ``exclude``
        failed this round and come last)."""
        ...

    def finish(self, ok: bool, reason: str) -> None:
        """The run ended (``ok`` or failed with ``reason``): release workers, close streams."""
        ...
