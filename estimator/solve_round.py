"""FedEnt online mode on the service: one scalar fixed point per round (fedent.meanfield.scalar_fixed_point).

The request carries c = ‖w(t)‖² and each participant's (a_i, b_i, θ_i or D_i, and η_i(t−1) with
``phi2_rate: used``); the reply is φ2(t+1) of φ2' = Σθ_i q_i(η_i(φ2')) (Eq. (phi_next_t_2)) with η*_i of
Eq. (eta_solve_t_1) at it, capped at ``eta_max``, and η_i its decayed rate (used) or η*_i itself (star),
exactly as the in-process ``OnlinePhi2Estimator`` (spec §5). Inputs that
cannot come from real vectors are rejected here with one-line messages (INVALID_ARGUMENT), instead of
being silently guarded, because a service caller with NaNs has a bug worth seeing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedent.meanfield.scalar_fixed_point import DEFAULT_MAX_ITER, DEFAULT_RTOL, solve_online
from fedent.strategies.options import FedEntOptions
from fedentrpc import mappers
from fedentrpc.v1 import estimator_pb2 as est_pb

THETA_SUM_TOL = 1e-6


@dataclass(frozen=True)
class OnlineInputs:
    cids: tuple[int, ...]
    c: float
    thetas: tuple[float, ...]
    a: tuple[float, ...]
    b: tuple[float, ...]
    eta_prev: tuple[float, ...] | None  # η_i(t−1) per client, with phi2_rate "used"
    options: FedEntOptions  # beta, gamma, variant, eta_max and phi2_rate are what the solver uses
    rtol: float
    max_iter: int


def _finite(name: str, v: float) -> float:
    if not math.isfinite(v):
        raise ValueError(f"{name} is not finite ({v})")
    return float(v)


def online_inputs(req: est_pb.SolveOnlineRequest) -> OnlineInputs:
    """Validate a SolveOnline request; ValueError with a one-line message when it is unusable."""
    if not req.clients:
        raise ValueError("no clients: a round needs at least one participant's scalars")
    c = _finite("c", req.c)
    if c < 0:
        raise ValueError(f"c = ‖w(t)‖² must be >= 0, got {c}")
    cids = tuple(int(x.cid) for x in req.clients)
    if len(set(cids)) != len(cids):
        raise ValueError("duplicate client ids in one round")
    a = tuple(_finite(f"a of client {x.cid}", x.a) for x in req.clients)
    b = tuple(_finite(f"b of client {x.cid}", x.b) for x in req.clients)
    if any(v < 0 for v in b):
        raise ValueError("b = ‖g‖² must be >= 0 for every client")
    thetas = tuple(_finite(f"theta of client {x.cid}", x.theta) for x in req.clients)
    if all(t == 0 for t in thetas):  # θ not sent: derive it from the sample counts D_i
        sizes = [int(x.num_samples) for x in req.clients]
        if any(n < 0 for n in sizes) or sum(sizes) <= 0:
            raise ValueError("give theta per client, or non-negative num_samples with a positive sum")
        thetas = tuple(n / sum(sizes) for n in sizes)
    if any(t < 0 for t in thetas):
        raise ValueError("theta must be >= 0 for every client")
    if abs(sum(thetas) - 1.0) > THETA_SUM_TOL:
        raise ValueError(f"thetas must sum to 1 over the round's participants, got {sum(thetas):.9g}")
    p = req.params
    options = mappers.fedent_options_from_msg(p)  # the run's FedEntOptions, checked by the class
    rtol = p.tol or DEFAULT_RTOL
    if not (math.isfinite(rtol) and 0 < rtol < 1):
        raise ValueError(f"tol must be in (0, 1), got {rtol}")
    max_iter = p.max_iter or DEFAULT_MAX_ITER
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    eta_prev = None
    if options.phi2_rate == "used":
        missing = [int(x.cid) for x in req.clients if not x.HasField("eta_prev")]
        if missing:
            raise ValueError(f"phi2_rate used needs eta_prev (η_i(t−1)) for every client; missing for {missing[:10]}")
        eta_prev = tuple(_finite(f"eta_prev of client {x.cid}", x.eta_prev) for x in req.clients)
        if any(v < 0 for v in eta_prev):
            raise ValueError("eta_prev must be >= 0 for every client")
    return OnlineInputs(cids, c, thetas, a, b, eta_prev, options, float(rtol), int(max_iter))


def solve_online_reply(req: est_pb.SolveOnlineRequest) -> est_pb.SolveOnlineResponse:
    """Solve the round's fixed point exactly as the in-process ``OnlinePhi2Estimator`` does."""
    x = online_inputs(req)
    o = x.options
    sol = solve_online(x.c, x.thetas, x.a, x.b, o.beta, o.variant, rtol=x.rtol, max_iter=x.max_iter,
                       eta_max=o.eta_max, eta_prev=x.eta_prev, gamma=o.gamma)
    report = {"mode": "online", "phi2_rate": o.phi2_rate, **sol.to_dict()}
    return est_pb.SolveOnlineResponse(
        phi2_next=sol.phi2_next,
        iterations=sol.iterations,
        converged=sol.bracketed,
        diagnostics={"residual": sol.residual, "guards": float(sol.guards), "bracket_lo": sol.bracket[0],
                     "bracket_hi": sol.bracket[1]},
        report=mappers.dict_to_struct(report, "report"),
    )
