"""The client half of secure aggregation on a host (fedent.rounds.host): the hosted clients' protocol sessions,
and the step that turns a finished update into its masked ring vector.

The same code runs in the simulator's in-process host and on a worker, so the simulator pays the real cost of
quantising and masking and its model carries the real rounding. The vector a client masks is
s_i · [w_i, extra tensor groups...] flattened, with s_i = n_i (``samples`` weighting: the server divides the sum
by Σ n_i) or 1 (``uniform``); only the model-free parts of the update (sample count, train loss, scalars) stay
in the clear.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from fedent.rng import numpy_rng
from fedent.secagg.fixedpoint import encode, limit_for
from fedent.secagg.identity import SeededPKI
from fedent.secagg.protocol import ClientSession, ProtocolError, Setup
from fedent.strategies.base import ClientUpdate


def update_vector(update: ClientUpdate, weighting: str, groups: Sequence[str]) -> np.ndarray:
    """s_i · [params, groups...] as one float64 vector (s_i = n_i or 1)."""
    scale = float(update.num_samples) if weighting == "samples" else 1.0
    tensors = [*update.params, *(t for g in groups for t in update.tensors[g])]
    flat = torch.cat([t.detach().reshape(-1).to("cpu", torch.float64) for t in tensors])
    return flat.numpy() * scale


def split_vector(vec: np.ndarray, like: Sequence[Tensor], groups: Sequence[str]) -> tuple[list[Tensor],
                                                                                           dict[str, list[Tensor]]]:
    """The inverse of ``update_vector``'s layout: the model's tensors, then each group's, shaped like ``like``."""
    want = sum(p.numel() for p in like) * (1 + len(groups))
    if vec.size != want:
        raise ProtocolError(f"secagg: the sum has {vec.size} elements, the model and groups {want}")
    parts: list[list[Tensor]] = []
    off = 0
    for _ in range(1 + len(groups)):
        one = []
        for p in like:
            n = p.numel()
            one.append(torch.from_numpy(vec[off:off + n].copy()).to(p.dtype).reshape(p.shape).to(p.device))
            off += n
        parts.append(one)
    return parts[0], dict(zip(groups, parts[1:], strict=True))


class HostedSecAgg:
    """The sessions of the hosted clients in the current round (a new advertise starts a client's new session).
    ``threat``: the weakest threat model the hosted clients accept; ``pki``: their identities (by default the
    run seed's ``SeededPKI``)."""

    def __init__(self, seed: int, threat: str = "malicious", pki: SeededPKI | None = None) -> None:
        self.seed, self.threat = seed, threat
        self.pki = pki if pki is not None else SeededPKI.from_seed(seed)
        self.sessions: dict[tuple[int, int], ClientSession] = {}
        self.lock = threading.Lock()

    def handle(self, rnd: int, cid: int, request: bytes) -> bytes:
        try:
            step = json.loads(request).get("step")
        except (ValueError, AttributeError, UnicodeDecodeError):
            raise ProtocolError("secagg: not a protocol message") from None
        with self.lock:
            if step == "advertise":
                self.sessions = {k: s for k, s in self.sessions.items() if k[0] >= rnd}  # older rounds are over
                self.sessions[(rnd, cid)] = ClientSession(cid, self.pki, self.threat)
            session = self.sessions.get((rnd, cid))
        if session is None:
            raise ProtocolError(f"secagg: client {cid} has no session in round {rnd}")
        return session.handle(request)

    def active(self, rnd: int, cid: int) -> bool:
        s = self.sessions.get((rnd, cid))
        return s is not None and s.step == "routed"

    def mask(self, rnd: int, update: ClientUpdate) -> ClientUpdate:
        """The upload that leaves the client: its masked vector, the clear scalars, no model."""
        session = self.sessions[(rnd, update.cid)]
        setup: Setup | None = session.setup
        assert setup is not None
        vec = update_vector(update, setup.weighting, setup.groups)
        rng = numpy_rng(self.seed, "secagg-rounding", rnd, update.cid)  # stochastic rounding, seeded
        ring = encode(vec, setup.frac_bits, setup.ring_bits, limit_for(setup.ring_bits, setup.participants),
                      "stochastic" if setup.rounding == "stochastic" else "nearest", rng)
        return ClientUpdate(update.cid, [], update.num_samples, update.train_loss, {}, dict(update.scalars),
                            masked=session.mask(ring))
