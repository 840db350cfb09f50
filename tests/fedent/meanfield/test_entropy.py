"""Definition 1's entropy term, the decay Eq. (eta_deacy), FedNorm's rate and the round record."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedent.meanfield.decay import decayed_rate, decayed_rates, previous_rate
from fedent.meanfield.diagnostics import CLIENT_FIELDS, ParticipantReport, fedent_round_record
from fedent.meanfield.entropy import entropy_term
from fedent.meanfield.fednorm import fednorm_objective, fednorm_rate


def test_entropy_by_hand() -> None:
    th, s = [0.25, 0.75], [4.0, 1.0]  # weighted norms 1 and 0.75 -> p = 4/7, 3/7
    p = np.array([4 / 7, 3 / 7])
    assert entropy_term(th, s) == pytest.approx(float(np.sum(p * np.log(p))))
    assert entropy_term([0.5, 0.5], [1.0, 0.0]) == 0.0  # 0 log 0 = 0, p = (1, 0)
    assert entropy_term([0.5, 0.5], [0.0, 0.0]) == 0.0
    assert entropy_term([0.25] * 4, [1.0] * 4) == pytest.approx(-math.log(4))
    with pytest.raises(ValueError):
        entropy_term([0.5, 0.5], [1.0, math.nan])


def test_decay_uses_previous_rate_or_base() -> None:
    assert previous_rate({}, 0.01) == 0.01
    assert previous_rate({"eta": 0.3}, 0.01) == 0.3
    assert decayed_rate(0.01, 1.0, 0.99) == pytest.approx(0.99 * 0.01 + 0.01 * 1.0)
    np.testing.assert_allclose(decayed_rates([1.0, 2.0], [0.0, 4.0], 0.5), [0.5, 3.0])
    with pytest.raises(ValueError):
        decayed_rate(0.1, 0.1, 1.5)


def test_fednorm_rate_minimises_its_objective() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        g, delta = rng.normal(size=5) * 10 ** rng.uniform(-2, 2), rng.normal(size=5) * 10 ** rng.uniform(-3, 1)
        beta = float(rng.uniform(0.05, 0.999))
        gd, b, dsq = float(g @ delta), float(g @ g), float(delta @ delta)
        eta, guarded = fednorm_rate(gd, b, beta)
        assert not guarded and eta >= 0
        grid = np.linspace(0, max(2 * eta, 1e-6), 4001)
        j = fednorm_objective(grid, gd, b, dsq, beta)
        # J evaluated literally as (1−β)η² + β‖Δ − ηg‖²
        direct = (1 - beta) * eta**2 + beta * float(np.sum((delta - eta * g) ** 2))
        assert fednorm_objective(eta, gd, b, dsq, beta) == pytest.approx(direct, rel=1e-9, abs=1e-12)
        assert direct <= float(j.min()) + 1e-9 * max(1.0, abs(direct))
    assert fednorm_rate(math.nan, 1.0, 0.9) == (0.0, True)
    assert fednorm_rate(-1.0, 1.0, 0.9) == (0.0, False)


def test_round_record_fields() -> None:
    scal = {"eta_star": 0.2, "eta": 0.1, "eta_prev": 0.09, "a": -1.0, "b": 2.0, "c": 3.0, "theta": 0.25,
            "phi2_next": 4.0, "guarded": 0.0}
    parts = [ParticipantReport(3, 10, 2.0, scal), ParticipantReport(7, 30, 4.0, {**scal, "guarded": 1.0})]
    rec = fedent_round_record(parts, 0.99, 0.98, "exact")
    assert rec["phi2_pred"] == 4.0
    assert rec["phi2_actual"] == pytest.approx(0.25 * 2.0 + 0.75 * 4.0)
    assert rec["entropy"] == pytest.approx(entropy_term([0.25, 0.75], [2.0, 4.0]))
    assert rec["guards"] == 1
    assert [c["client"] for c in rec["clients"]] == [3, 7]
    assert tuple(rec["clients"][0]) == CLIENT_FIELDS
    assert rec["clients"][1]["gamma"] == 0.98 and rec["clients"][1]["variant"] == "exact"
    assert rec["eta_max"] is None and rec["phi2_rate"] == "star" and rec["clients"][0]["eta_prev"] == 0.09
    capped = fedent_round_record(parts, 0.99, 0.98, "exact", 1.0, "used")
    assert capped["eta_max"] == 1.0 and capped["clients"][1]["eta_max"] == 1.0
    assert capped["clients"][0]["phi2_rate"] == "used"
