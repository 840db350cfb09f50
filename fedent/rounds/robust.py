"""Robust aggregation and bounded trust: what the engine does to a round's accepted updates before the strategy's
server step (docs/algorithm.md, "Robust aggregation"; docs/security.md).

Why a pre-step and not a rule inside each strategy: every built-in server step is an affine function of the
(weighted) mean of the uploaded models plus strategy state, so one transformation of the updates composes with all
of them and with plug-ins, and the simulator and the cluster (one ``RoundEngine``) apply it identically.

Three parts, in this order, all pure functions of (w(t), the updates in cid order):

1. **Weight cap** (``max_weight_share``, on by default): sample-count shares θ_i are capped by water-filling and
   the updates' ``num_samples`` rewritten so any strategy's θ-weighted mean uses the capped shares. A client that
   reports an inflated count gets at most the cap.
2. **Norm bounding** (``clip_norm``): each delta Δ_i = w_i − w(t) is scaled to at most that L2 norm.
3. **Robust rule** (``aggregator``): ``median`` / ``trimmed-mean`` compute w̃ = w(t) + R(Δ_1..Δ_m) coordinate-wise
   (and the same rule on every model-shaped tensor group, e.g. SCAFFOLD's Δc_i) and substitute it for every
   participant's upload, so the strategy's mean of identical models is w̃; ``krum`` / ``multi-krum`` keep the
   selected update(s) and drop the rest, and the strategy aggregates those with its own weights.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedent.config import RobustConfig
from fedent.params import Params, norm_sq, sub
from fedent.rounds.acceptance import REJECTED
from fedent.strategies.base import ClientUpdate, Probe, StrategyError

if TYPE_CHECKING:
    from fedent.rounds.evaluation import ClientEval


def capped_shares(counts: Sequence[float], cap: float | None) -> list[float]:
    """θ_i = n_i / Σ n_j with no θ_i above ``cap`` (water-filling: the excess of capped clients is shared among
    the others in proportion to their counts); uniform when m·cap < 1 or every count is 0."""
    m = len(counts)
    if m == 0:
        return []
    total = float(sum(counts))
    if total <= 0:
        return [1.0 / m] * m
    shares = [float(n) / total for n in counts]
    if cap is None or max(shares) <= cap:
        return shares
    if m * cap <= 1.0:
        return [1.0 / m] * m
    capped: set[int] = set()
    while True:
        free = [i for i in range(m) if i not in capped]
        left = 1.0 - cap * len(capped)
        free_total = float(sum(counts[i] for i in free))
        out = [cap if i in capped else (left * counts[i] / free_total if free_total > 0 else left / len(free))
               for i in range(m)]
        over = [i for i in free if out[i] > cap * (1 + 1e-12)]
        if not over:
            return out
        capped.update(over)


def cap_counts(counts: Sequence[int], cap: float | None) -> list[int] | None:
    """Integer counts in the capped proportions, or None when the cap does not bind (the counts stay as they are,
    so an uncapped run is bit-for-bit the plain one). Water-filling keeps the uncapped clients' shares in
    proportion to their counts, so their counts stay exact and each capped client counts cap/(1 − Σ capped shares)
    times their sum; a round weighted uniformly (m·cap < 1) counts every client as its smallest count."""
    if not counts or cap is None:
        return None
    shares = capped_shares([float(n) for n in counts], cap)
    total = float(sum(counts))
    if total <= 0 or all(abs(s - n / total) <= 1e-15 for s, n in zip(shares, counts, strict=True)):
        return None
    free = [i for i, (s, n) in enumerate(zip(shares, counts, strict=True)) if s >= n / total - 1e-15]
    if cap is not None and len(counts) * cap <= 1.0:  # uniform
        return [max(1, min(counts))] * len(counts)
    left = sum(shares[i] for i in free)
    free_total = float(sum(counts[i] for i in free))
    return [counts[i] if i in free else max(1, round(shares[i] * free_total / left)) for i in range(len(counts))]


def clip_delta(delta: Params, clip_norm: float) -> tuple[Params, bool]:
    """``delta`` scaled to L2 norm at most ``clip_norm``; whether it was scaled."""
    norm = math.sqrt(norm_sq(delta))
    if norm <= clip_norm:
        return delta, False
    return [d * (clip_norm / norm) for d in delta], True


def coordinatewise(x: Tensor, rule: str, trim: float) -> Tensor:
    """``rule`` over dim 0 of a stack (m, ...): the median (the mean of the two middle values for even m) or the
    mean after cutting floor(trim·m) values from each end (at least one value kept)."""
    m = int(x.shape[0])
    srt = torch.sort(x, dim=0).values
    if rule == "median":
        lo, hi = (m - 1) // 2, m // 2
        return srt[lo] if lo == hi else (srt[lo] + srt[hi]) / 2
    k = min(int(math.floor(trim * m)), (m - 1) // 2)
    return srt[k:m - k].mean(dim=0)


def robust_combine(deltas: Sequence[Params], rule: str, trim: float) -> Params:
    """R(Δ_1..Δ_m) tensor by tensor."""
    return [coordinatewise(torch.stack([d[j] for d in deltas]), rule, trim) for j in range(len(deltas[0]))]


def krum_select(deltas: Sequence[Params], f: int | None, keep: int | None, multi: bool) -> list[int]:
    """Krum (Blanchard et al. 2017): score_i = Σ of the m−f−2 smallest squared distances from Δ_i to the others;
    Krum keeps the lowest score, Multi-Krum the ``keep`` (default m−f) lowest; ties by position (cid order)."""
    m = len(deltas)
    if m <= 2:
        return list(range(m))
    f_eff = max(0, (m - 3) // 2) if f is None else max(0, min(f, m - 3))
    flat = torch.stack([torch.cat([t.reshape(-1).double() for t in d]) for d in deltas])
    dist = torch.cdist(flat, flat).square()
    n_near = max(1, m - f_eff - 2)
    scores = []
    for i in range(m):
        others = torch.cat([dist[i, :i], dist[i, i + 1:]])
        scores.append(float(torch.sort(others).values[:n_near].sum()))
    order = sorted(range(m), key=lambda i: (scores[i], i))
    k = 1 if not multi else min(m, keep if keep is not None else m - f_eff)
    return sorted(order[:k])


def _with_params(u: ClientUpdate, params: Params, tensors: dict[str, Params] | None = None) -> ClientUpdate:
    return dataclasses.replace(u, params=params, tensors=dict(u.tensors) if tensors is None else tensors)


def report_problem(cid: int, num_samples: object, num_test: object, max_samples: int) -> str | None:
    """Why a client's reported counts (worker-local data, at Ready) are out of bounds, or None: a sample count in
    [1, max_samples] and a test count in [0, max_samples], both integers."""
    for what, v, lo in (("sample count", num_samples, 1), ("test count", num_test, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= max_samples:
            return f"{REJECTED}client {cid}: reported {what} {v!r} is outside [{lo}, {max_samples}]"
    return None


def check_reports(sizes: Sequence[int], test_sizes: Sequence[int] | None, cfg: RobustConfig) -> dict[int, str]:
    """The clients whose reported counts are out of bounds, and why (``report_problem``)."""
    tests = list(test_sizes or [])
    out = {}
    for cid, n in enumerate(sizes):
        why = report_problem(cid, int(n), int(tests[cid]) if cid < len(tests) else 0, cfg.max_client_samples)
        if why is not None:
            out[cid] = why
    return out


def eval_problem(cid: int, r: ClientEval, max_samples: int | None) -> str | None:
    """Why a client's federated evaluation is not believed, or None: its own, a finite loss >= 0, an accuracy in
    [0, 1] and a test count in [0, max_samples]."""
    if r.cid != cid:
        return f"{REJECTED}evaluation of client {r.cid} gathered for client {cid}"
    if not (math.isfinite(r.loss) and r.loss >= 0):
        return f"{REJECTED}evaluation of client {cid}: loss {r.loss!r} is not a finite number >= 0"
    if not 0.0 <= r.accuracy <= 1.0:
        return f"{REJECTED}evaluation of client {cid}: accuracy {r.accuracy!r} is outside [0, 1]"
    if r.num_samples < 0 or (max_samples is not None and r.num_samples > max_samples):
        return f"{REJECTED}evaluation of client {cid}: test count {r.num_samples} is outside [0, {max_samples}]"
    return None


def cap_probes(cfg: RobustConfig, probes: Sequence[Probe]) -> list[Probe]:
    """The probes with their counts in the capped proportions (FedEnt's θ_i in ``round_payload``)."""
    capped = cap_counts([p.num_samples for p in probes], cfg.max_weight_share)
    if capped is None:
        return list(probes)
    return [dataclasses.replace(p, num_samples=n) for p, n in zip(probes, capped, strict=True)]


def apply(cfg: RobustConfig, global_params: Sequence[Tensor],
          updates: Sequence[ClientUpdate]) -> tuple[list[ClientUpdate], dict[str, Any]]:
    """The updates the strategy aggregates, and a ``robust`` diagnostics entry (empty when nothing changed).

    The input updates are never modified (the engine still records the originals on the dashboard)."""
    ups = list(updates)
    diag: dict[str, Any] = {}
    if not ups:
        return ups, diag
    capped = cap_counts([u.num_samples for u in ups], cfg.max_weight_share)
    if capped is not None:
        diag["capped_weights"] = [u.cid for u, n in zip(ups, capped, strict=True) if n < u.num_samples]
        ups = [dataclasses.replace(u, num_samples=n) for u, n in zip(ups, capped, strict=True)]
    w = [p.detach() for p in global_params]
    if cfg.clip_norm is None and cfg.aggregator == "mean":
        return ups, ({"robust": diag} if diag else {})
    deltas = [sub([p.to(w[0].device) for p in u.params], w) for u in ups]
    if cfg.clip_norm is not None:
        clipped = []
        for i, d in enumerate(deltas):
            deltas[i], was = clip_delta(d, cfg.clip_norm)
            if was:
                clipped.append(ups[i].cid)
                ups[i] = _with_params(ups[i], [a + b for a, b in zip(w, deltas[i], strict=True)])
        if clipped:
            diag["clipped"] = clipped
    if cfg.aggregator in ("krum", "multi-krum"):
        kept = krum_select(deltas, cfg.krum_f, cfg.multi_krum_m, cfg.aggregator == "multi-krum")
        diag["kept"] = [ups[i].cid for i in kept]
        ups = [ups[i] for i in kept]
    elif cfg.aggregator in ("median", "trimmed-mean"):
        new = [a + b for a, b in zip(w, robust_combine(deltas, cfg.aggregator, cfg.trim), strict=True)]
        groups = {}
        for name in ups[0].tensors:
            if any(name not in u.tensors for u in ups):
                raise StrategyError(f"robust: tensor group {name!r} is missing from some updates")
            groups[name] = robust_combine([u.tensors[name] for u in ups], cfg.aggregator, cfg.trim)
        ups = [_with_params(u, [p.clone() for p in new], {k: [t.clone() for t in v] for k, v in groups.items()})
               for u in ups]
        diag["rule"] = cfg.aggregator
    return ups, {"robust": diag} if diag else {}
