"""Algorithm 1: the offline mean-field fixed point φ1(t), φ2(t), t = 0..T (spec §3 "offline").

Each sweep k runs forward over t (spec §3):

1. φ1ᵏ(0) = w(0);
2. at each t every client evaluates g_i at φ1ᵏ(t) (through a ``GradientOracle``: the estimator
   never sees data);
3. η*_i(t) solves Eq. (eta_solve_t_1) with φ2ᵏ⁻¹(t+1) from the previous sweep (‖w(0)‖² in sweep 1);
4. φ1ᵏ(t+1) = Σθ_i(φ1ᵏ(t) − η_i g_i) (Eq. (phi_1)) and φ2ᵏ(t+1) = Σθ_i q_i(η_i) (Eq. (phi_calc)).

Spec §5 revisions, each an argument: ``schedule`` — the clients of each round (client sampling is a pure
function of (seed, round), so they are known in advance); round t simulates exactly ``schedule[t]`` with
θ_i = D_i/ΣD over them, the θ that training uses (None: every client every round, the first reading).
``phi2_rate="used"`` — η_i is the rate the client trains with, γη_i(t−1) + (1 − γ)η*_i (Eq. (eta_deacy)),
η_i(−1) = ``base_lr``, carried per client from the last round it took part in; ``"star"``: η_i = η*_i (the
first reading). ``eta_max`` caps η* (the paper's domain [0, 1]).

The sweep stops when the largest relative change over t of φ1 (L2) is below ε1 *and* that of φ2 is
below ε2 (the paper's "simultaneously"), or after ``max_sweeps``. Sweep 1 is compared with the
initial guess φ1⁰(t) = w(0), φ2⁰(t) = ‖w(0)‖². Each sweep costs T·N gradient evaluations; only one
trajectory (T+1 models) is held in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from fedent.meanfield.decay import check_gamma, decayed_rate
from fedent.meanfield.lr import VARIANTS, q_value, solve_eta
from fedent.params import Params, clone, dot, norm_sq

_TINY = 1e-300


class GradientOracle(Protocol):
    """∇F_i at a point, for client ``cid`` at step ``t`` (a random batch fixed by (t, cid)). An oracle may also
    have ``gradients(t, cids, point) -> list[Params]``, the same gradients for several clients at once (the
    vectorised executor's, one vmapped pass); ``gradients_at`` uses it when present."""

    def gradient(self, t: int, cid: int, point: Sequence[Tensor]) -> Params: ...


def gradients_at(oracle: GradientOracle, t: int, cids: Sequence[int], point: Sequence[Tensor]) -> list[Params]:
    """Every client's gradient at ``point`` for step ``t``: batched when the oracle can, else one by one."""
    batched = getattr(oracle, "gradients", None)
    if batched is not None:
        return list(batched(t, list(cids), point))
    return [oracle.gradient(t, c, point) for c in cids]


@dataclass(frozen=True)
class FixedPointReport:
    """How Algorithm 1 ended: sweeps, final residuals, which test stopped it, per-sweep history."""

    sweeps: int
    stop_reason: str  # "converged" | "max_sweeps"
    stopped_by: str  # "eps1+eps2" when converged, else "max_sweeps"
    phi1_converged: bool  # state of the ε1 test at the last sweep
    phi2_converged: bool  # state of the ε2 test at the last sweep
    phi1_residual: float
    phi2_residual: float
    history: tuple[tuple[float, float], ...]  # (φ1 residual, φ2 residual) per sweep
    gradient_evaluations: int
    guards: int  # guarded η* solves over all sweeps
    eps1: float
    eps2: float

    @property
    def converged(self) -> bool:
        return self.stop_reason == "converged"

    def to_dict(self) -> dict[str, Any]:
        return {
            "sweeps": self.sweeps,
            "stop_reason": self.stop_reason,
            "stopped_by": self.stopped_by,
            "phi1_converged": self.phi1_converged,
            "phi2_converged": self.phi2_converged,
            "phi1_residual": self.phi1_residual,
            "phi2_residual": self.phi2_residual,
            "history": [list(h) for h in self.history],
            "gradient_evaluations": self.gradient_evaluations,
            "guards": self.guards,
            "eps1": self.eps1,
            "eps2": self.eps2,
        }


@dataclass(frozen=True, eq=False)
class FixedPointResult:
    phi1: list[Params]  # φ1(t), t = 0..T
    phi2: NDArray[np.float64]  # φ2(t), t = 0..T (φ2(0) = ‖w(0)‖²)
    eta_star: NDArray[np.float64]  # η*_i(t) of the last sweep, shape (T, N), clients in the given order
    report: FixedPointReport
    eta: NDArray[np.float64] | None = None  # the rate φ1 stepped with (η* or the decayed η); NaN: not sampled


def solve_fixed_point(
    oracle: GradientOracle,
    w0: Sequence[Tensor],
    client_ids: Sequence[int],
    thetas: Sequence[float],
    horizon: int,
    beta: float,
    variant: str = "exact",
    eps1: float = 1e-3,
    eps2: float = 1e-3,
    max_sweeps: int = 20,
    *,
    schedule: Sequence[Sequence[int]] | None = None,
    eta_max: float | None = None,
    phi2_rate: str = "star",
    gamma: float = 0.99,
    base_lr: float = 0.01,
) -> FixedPointResult:
    """Run Algorithm 1 over ``client_ids`` (θ ∝ ``thetas``, summing to 1) for t = 0..``horizon``.

    With ``schedule``, round t uses only ``schedule[t]`` (ids from ``client_ids``), θ renormalised over them.
    """
    _validate(client_ids, thetas, horizon, beta, variant, eps1, eps2, max_sweeps)
    if phi2_rate not in ("used", "star"):
        raise ValueError(f"phi2_rate must be 'used' or 'star', got {phi2_rate!r}")
    check_gamma(gamma)
    th = np.asarray(thetas, dtype=np.float64)
    n = len(client_ids)
    pos = {int(c): j for j, c in enumerate(client_ids)}
    if schedule is None:
        rounds_j = [np.arange(n)] * horizon
    else:
        if len(schedule) < horizon:
            raise ValueError(f"schedule names {len(schedule)} rounds, need {horizon}")
        try:
            rounds_j = [np.asarray(sorted(pos[int(c)] for c in schedule[t]), dtype=np.int64) for t in range(horizon)]
        except KeyError as e:
            raise ValueError(f"schedule names client {e} that is not among client_ids") from None
        if any(r.size == 0 for r in rounds_j):
            raise ValueError("every round of the schedule needs at least one client")
    start = clone(w0)
    c0 = norm_sq(start)
    phi1: list[Params] = [clone(start) for _ in range(horizon + 1)]  # φ1⁰(t) = w(0)
    phi2 = np.full(horizon + 1, c0)  # φ2⁰(t) = ‖w(0)‖²
    etas = np.zeros((horizon, n))
    used = np.full((horizon, n), np.nan)
    history: list[tuple[float, float]] = []
    evals = guards = 0
    ok1 = ok2 = False
    for _ in range(max_sweeps):
        res1 = res2 = 0.0
        point = phi1[0]
        new_phi2 = phi2.copy()
        prev = np.full(n, float(base_lr))  # η_i(−1), reset every sweep (each sweep replays the run)
        for t in range(horizon):
            c = norm_sq(point)
            step = [torch.zeros_like(p) for p in point]  # Σθ_i η_i g_i
            q_sum = 0.0
            part = rounds_j[t]
            th_t = th[part] / float(th[part].sum())
            grads = gradients_at(oracle, t, [int(client_ids[j]) for j in part.tolist()], point)
            for j, th_j, g in zip(part.tolist(), th_t.tolist(), grads, strict=True):
                evals += 1
                a, b = dot(point, g), norm_sq(g)
                sol = solve_eta(a, b, c, th_j, phi2[t + 1], beta, variant, eta_max=eta_max)
                eta_s = float(sol.eta_star[0])
                guards += sol.guards
                etas[t, j] = eta_s
                eta = decayed_rate(float(prev[j]), eta_s, gamma) if phi2_rate == "used" else eta_s
                prev[j] = eta
                used[t, j] = eta
                if eta != 0.0:
                    torch._foreach_add_(step, list(g), alpha=float(th_j * eta))
                q_sum += float(th_j * q_value(eta, a, b, c))
            nxt = list(torch._foreach_sub(list(point), step))
            old = phi1[t + 1]
            res1 = max(res1, _rel(norm_sq(torch._foreach_sub(nxt, old)) ** 0.5, norm_sq(old) ** 0.5))
            res2 = max(res2, _rel(abs(q_sum - phi2[t + 1]), abs(phi2[t + 1])))
            phi1[t + 1] = nxt
            new_phi2[t + 1] = q_sum
            point = nxt
        phi2 = new_phi2
        # plain Python floats and bools (φ2's entries are numpy scalars): the report goes into the checkpoint's
        # server state, which stores only plain data (fedent.checkpoint._check_storable)
        res1, res2 = float(res1), float(res2)
        history.append((res1, res2))
        ok1, ok2 = bool(res1 < eps1), bool(res2 < eps2)
        if ok1 and ok2:
            break
    converged = ok1 and ok2
    report = FixedPointReport(
        sweeps=len(history),
        stop_reason="converged" if converged else "max_sweeps",
        stopped_by="eps1+eps2" if converged else "max_sweeps",
        phi1_converged=ok1,
        phi2_converged=ok2,
        phi1_residual=history[-1][0],
        phi2_residual=history[-1][1],
        history=tuple(history),
        gradient_evaluations=evals,
        guards=guards,
        eps1=eps1,
        eps2=eps2,
    )
    return FixedPointResult(phi1=phi1, phi2=phi2, eta_star=etas, report=report, eta=used)


def _rel(diff: float, scale: float) -> float:
    return diff / max(scale, _TINY) if diff > 0 else 0.0


def _validate(
    client_ids: Sequence[int],
    thetas: Sequence[float],
    horizon: int,
    beta: float,
    variant: str,
    eps1: float,
    eps2: float,
    max_sweeps: int,
) -> None:
    if len(client_ids) == 0 or len(client_ids) != len(thetas):
        raise ValueError("need one theta per client and at least one client")
    th = np.asarray(thetas, dtype=np.float64)
    if not np.all(np.isfinite(th)) or np.any(th < 0) or abs(float(th.sum()) - 1.0) > 1e-9:
        raise ValueError("thetas must be finite, non-negative and sum to 1")
    if horizon < 1:
        raise ValueError(f"horizon T must be >= 1, got {horizon}")
    if not (0.0 < beta < 1.0):
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if not (eps1 > 0 and eps2 > 0):
        raise ValueError("eps1 and eps2 must be > 0")
    if max_sweeps < 1:
        raise ValueError(f"max_sweeps must be >= 1, got {max_sweeps}")
