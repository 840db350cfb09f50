"""Baseline strategies against hand computations, plus a 2-round smoke test of every registered strategy.

Hand checks use a linear softmax model in float64 with full-batch steps, whose cross-entropy gradient
is written out here ((softmax − onehot)/n times the inputs), independently of autograd and the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch
from torch import Tensor, nn

from fedent.config import AlgorithmConfig, ConfigError
from fedent.meanfield.oracle import TrainerOracle
from fedent.params import Params, clone
from fedent.rng import sample_clients
from fedent.strategies.base import (
    ClientState,
    ClientTask,
    ClientUpdate,
    RoundPayload,
    Strategy,
    StrategyError,
)
from fedent.strategies.fedadam import FedAdam, FedAdamOptions
from fedent.strategies.fedavg import FedAvg
from fedent.strategies.fedcos import FedCos, cosine_weights
from fedent.strategies.feddyn import FedDyn, FedDynOptions
from fedent.strategies.fedprox import FedProx, FedProxOptions
from fedent.strategies.fedyogi import FedYogi, FedYogiOptions
from fedent.strategies.registry import STRATEGIES, build_strategy
from fedent.strategies.scaffold import Scaffold, ScaffoldOptions
from fedent.trainer import LocalTrainer

# ---- helpers ---------------------------------------------------------------------------------------


def linear_trainer(
    n: int = 12, batch_size: int = 64, dtype: torch.dtype = torch.float64, seed: int = 0
) -> LocalTrainer:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 2, 2, generator=g, dtype=dtype)
    y = torch.randint(0, 3, (n,), generator=g)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3)).to(dtype)
    return LocalTrainer(model, x, y, batch_size=batch_size, device=torch.device("cpu"))


def ce_grad(trainer: LocalTrainer, w: Sequence[Tensor], idx: Tensor) -> Params:
    """Full-batch gradient of mean cross-entropy for logits = X Wᵀ + b, written out by hand."""
    weight, bias = w
    xs = trainer.x[idx].flatten(1)
    ys = trainer.y[idx]
    p = torch.softmax(xs @ weight.T + bias, dim=1)
    p[torch.arange(len(ys)), ys] -= 1.0
    p /= len(ys)
    return [p.T @ xs, p.sum(0)]


def axpy(a: float, x: Sequence[Tensor], y: Sequence[Tensor]) -> Params:
    """a x + y."""
    return [a * xi + yi for xi, yi in zip(x, y, strict=True)]


def close(a: Sequence[Tensor], b: Sequence[Tensor], tol: float = 1e-12) -> bool:
    return all(torch.allclose(x, y, atol=tol, rtol=0) for x, y in zip(a, b, strict=True))


def equal(a: Sequence[Tensor], b: Sequence[Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def upd(cid: int, values: Sequence[float], n: int = 1, **tensors: Sequence[float]) -> ClientUpdate:
    return ClientUpdate(
        cid,
        [torch.tensor(list(values), dtype=torch.float64)],
        n,
        0.0,
        tensors={k: [torch.tensor(list(v), dtype=torch.float64)] for k, v in tensors.items()},
    )


def vec(*values: float) -> Params:
    return [torch.tensor(list(values), dtype=torch.float64)]


# ---- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, options, needle",
    [
        ("fedadam", {"beta1": 1.0}, "beta1"),
        ("fedadam", {"tau": 0}, "tau"),
        ("fedadam", {"server_lr": -1}, "server_lr"),
        ("fedyogi", {"beta2": -0.1}, "beta2"),
        ("fedprox", {"mu": -0.01}, "mu"),
        ("feddyn", {"alpha": 0}, "alpha"),
        ("scaffold", {"global_lr": 0}, "global_lr"),
        ("fedcos", {"anything": 1}, "unknown"),
        ("fedprox", {"mew": 0.1}, "unknown"),
    ],
)
def test_bad_options_are_config_errors(name: str, options: dict[str, float], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        AlgorithmConfig(name=name, options=options)


def test_defaults_are_the_papers() -> None:
    adam = FedAdamOptions()
    assert (adam.beta1, adam.beta2, adam.tau, adam.server_lr) == (0.9, 0.99, 1e-3, 0.01)
    assert AlgorithmConfig(name="fedadam").options == adam
    assert AlgorithmConfig(name="fedprox").options == FedProxOptions(mu=0.01)
    assert AlgorithmConfig(name="feddyn").options == FedDynOptions(alpha=0.001)
    assert AlgorithmConfig(name="scaffold").options == ScaffoldOptions(global_lr=1.0)
    assert AlgorithmConfig(name="fedyogi", options={"server_lr": 0.1}).options == FedYogiOptions(server_lr=0.1)


# ---- FedAdam / FedYogi -----------------------------------------------------------------------------


def _adam_rounds(strategy: FedAdam) -> tuple[Params, Params]:
    w0 = vec(1.0, -2.0)
    # round 0: θ = (1/4, 3/4) -> mean [1.25, -0.5], Δ = [0.25, 1.5]
    w1 = strategy.aggregate(0, w0, [upd(0, [2.0, -2.0], 1), upd(1, [1.0, 0.0], 3)]).params
    # round 1: both clients return w1 exactly in coordinate 1 (Δ = 0 there), +0.5 in coordinate 0
    a, b = float(w1[0][0]), float(w1[0][1])
    w2 = strategy.aggregate(1, w1, [upd(0, [a + 0.5, b], 2), upd(1, [a + 0.5, b], 2)]).params
    return w1, w2


def _hand_adaptive(yogi: bool) -> tuple[list[float], list[float]]:
    lr, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    w, m, v = [1.0, -2.0], [0.0, 0.0], [tau**2, tau**2]
    out = []
    for deltas in ([0.25, 1.5], [0.5, 0.0]):
        for j, d in enumerate(deltas):
            m[j] = b1 * m[j] + (1 - b1) * d
            if yogi:
                s = 0.0 if v[j] == d * d else math.copysign(1.0, v[j] - d * d)
                v[j] = v[j] - (1 - b2) * d * d * s
            else:
                v[j] = b2 * v[j] + (1 - b2) * d * d
            w[j] = w[j] + lr * m[j] / (math.sqrt(v[j]) + tau)
        out.append(list(w))
    return out[0], out[1]


@pytest.mark.parametrize("yogi", [False, True])
def test_adaptive_server_update_matches_hand_computation(yogi: bool) -> None:
    strategy = FedYogi(FedYogiOptions(server_lr=0.1)) if yogi else FedAdam(FedAdamOptions(server_lr=0.1))
    w1, w2 = _adam_rounds(strategy)
    e1, e2 = _hand_adaptive(yogi)
    assert close(w1, vec(*e1)) and close(w2, vec(*e2))
    # the other rule gives a different second round (coordinate 1 has Δ = 0: Adam decays v, Yogi keeps it)
    o1, o2 = _hand_adaptive(not yogi)
    assert not close(w2, vec(*o2), tol=1e-9)


def test_fedadam_first_step_hand_numbers() -> None:
    """Δ = 0.25: m = 0.025, v = 0.99e-6 + 6.25e-4, w = 1 + 0.1 * 0.025 / (√v + 1e-3)."""
    w1, _ = _adam_rounds(FedAdam(FedAdamOptions(server_lr=0.1)))
    assert abs(float(w1[0][0]) - (1.0 + 0.1 * 0.025 / (math.sqrt(0.99e-6 + 6.25e-4) + 1e-3))) < 1e-12


def test_fedadam_rejects_bad_server_state() -> None:
    with pytest.raises(StrategyError):
        FedAdam().load_server_state({"m": vec(0.0)})
    with pytest.raises(StrategyError):
        FedAdam().load_server_state({"m": vec(0.0), "v": "nope"})


# ---- FedProx ---------------------------------------------------------------------------------------


def test_fedprox_with_mu_zero_is_fedavg_bit_for_bit() -> None:
    results = []
    for strategy in (FedAvg(), FedProx(FedProxOptions(mu=0.0))):
        trainer = linear_trainer(n=20, batch_size=3, dtype=torch.float32)
        w = clone(trainer.params)
        for rnd in range(2):
            ups = [
                strategy.fit(
                    trainer,
                    w,
                    RoundPayload(rnd),
                    ClientTask(c, rnd, torch.arange(c, 20, 2), 0.1, 2, 3),
                    ClientState(),
                )
                for c in (0, 1)
            ]
            w = strategy.aggregate(rnd, w, ups).params
        results.append(w)
    assert equal(results[0], results[1])


def test_fedprox_proximal_gradient_matches_hand_computation() -> None:
    trainer = linear_trainer()
    w0 = clone(trainer.params)
    idx = torch.arange(12)
    lr, mu = 0.5, 0.7
    task = ClientTask(cid=0, round=0, indices=idx, lr=lr, epochs=2, seed=1)
    out = FedProx(FedProxOptions(mu=mu)).fit(trainer, w0, RoundPayload(0), task, ClientState()).params
    # two full-batch steps: w1 = w0 − η g(w0);  w2 = w1 − η (g(w1) + μ (w1 − w0))
    w1 = axpy(-lr, ce_grad(trainer, w0, idx), w0)
    prox = [g + mu * (a - b) for g, a, b in zip(ce_grad(trainer, w1, idx), w1, w0, strict=True)]
    w2 = axpy(-lr, prox, w1)
    assert close(out, w2)
    plain = axpy(-lr, ce_grad(trainer, w1, idx), w1)
    assert not close(out, plain, tol=1e-6)


# ---- FedDyn ----------------------------------------------------------------------------------------


def test_feddyn_client_gradient_and_state_update_by_hand() -> None:
    trainer = linear_trainer()
    w_srv = clone(trainer.params)
    idx = torch.arange(12)  # n_k = 12
    lr, alpha, mean_n = 0.5, 0.3, 24.0
    alpha_k = alpha / (12 / mean_n)  # = 0.6
    g = torch.Generator().manual_seed(5)
    lam0 = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in w_srv]
    state = ClientState(tensors={"lambda": clone(lam0)})
    payload = RoundPayload(0, scalars={"mean_samples": mean_n})
    up = FedDyn(FedDynOptions(alpha=alpha)).fit(
        trainer, w_srv, payload, ClientTask(0, 0, idx, lr, 2, 1), state
    )

    def step(w: Params) -> Params:  # w − η (∇CE(w) + α_k (w − w_srv + λ_k))
        grad = [
            gc + alpha_k * (a - s + l)
            for gc, a, s, l in zip(ce_grad(trainer, w, idx), w, w_srv, lam0, strict=True)
        ]
        return axpy(-lr, grad, w)

    w2 = step(step(w_srv))
    assert close(up.params, w2)
    assert close(state.tensors["lambda"], [l + a - s for l, a, s in zip(lam0, w2, w_srv, strict=True)])
    assert up.scalars["alpha_k"] == pytest.approx(0.6)


def test_feddyn_server_correction_by_hand() -> None:
    s = FedDyn()
    s.setup(vec(1.0), [1, 1, 1, 1])  # N = 4
    assert s.round_payload(0, vec(1.0), []).scalars["mean_samples"] == 1.0
    # round 0 from w = 1: uploads 3 and 2 -> λ increments 2 and 1, Σλ = 3; mean 2.5 + 3/4 = 3.25
    w1 = s.aggregate(0, vec(1.0), [upd(0, [3.0]), upd(2, [2.0])]).params
    assert close(w1, vec(3.25))
    # round 1 from 3.25: uploads 4.25 and 3.25 -> increments 1 and 0, Σλ = 4; mean 3.75 + 4/4 = 4.75
    w2 = s.aggregate(1, w1, [upd(1, [4.25]), upd(3, [3.25])]).params
    assert close(w2, vec(4.75))
    assert close(s.server_state()["lambda_sum"], vec(4.0))


def test_feddyn_needs_setup_and_payload() -> None:
    with pytest.raises(StrategyError, match="setup"):
        FedDyn().aggregate(0, vec(1.0), [upd(0, [1.0])])
    trainer = linear_trainer()
    with pytest.raises(StrategyError, match="mean_samples"):
        FedDyn().fit(
            trainer,
            clone(trainer.params),
            RoundPayload(0),
            ClientTask(0, 0, torch.arange(4), 0.1, 1, 0),
            ClientState(),
        )


# ---- FedCos ----------------------------------------------------------------------------------------


def test_fedcos_weights_by_hand() -> None:
    w = vec(1.0, 0.0)
    ups = [upd(0, [2.0, 0.0], 5), upd(1, [0.0, 1.0], 5), upd(2, [-1.0, 0.0], 5), upd(3, [1.0, 1.0], 5)]
    # cosines: 1, 0, −1 -> 0, 1/√2; normalised by 1 + 1/√2
    r = 1.0 / math.sqrt(2.0)
    weights, fallback = cosine_weights(w, ups)
    assert not fallback
    assert weights == pytest.approx([1 / (1 + r), 0.0, 0.0, r / (1 + r)])
    out = FedCos().aggregate(0, w, ups)
    assert close(out.params, vec((2.0 + r) / (1 + r), r / (1 + r)))
    assert out.diagnostics["cos_weights"] == pytest.approx(weights)


def test_fedcos_falls_back_to_fedavg_weights_when_all_zero() -> None:
    w = vec(1.0, 0.0)
    ups = [upd(0, [0.0, 2.0], 1), upd(1, [-1.0, 1.0], 3), upd(2, [0.0, 0.0], 4)]  # cos 0, <0, zero-norm
    out = FedCos().aggregate(0, w, ups)
    assert out.diagnostics["cos_fallback"] is True
    assert close(out.params, FedAvg().aggregate(0, w, ups).params)


# ---- SCAFFOLD --------------------------------------------------------------------------------------


def _scaffold_fit(
    epochs: int,
) -> tuple[LocalTrainer, Params, Params, Params, Params, ClientUpdate, ClientState]:
    trainer = linear_trainer()
    x = clone(trainer.params)
    g = torch.Generator().manual_seed(9)
    c = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in x]
    c_i = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in x]
    state = ClientState(tensors={"c": clone(c_i)})
    task = ClientTask(0, 0, torch.arange(12), 0.3, epochs, 2)
    up = Scaffold().fit(trainer, x, RoundPayload(0, tensors={"c": clone(c)}), task, state)
    return trainer, x, c, c_i, up.params, up, state


def test_scaffold_one_step_control_variate_is_the_full_gradient() -> None:
    """K = 1: y = x − η(∇f(x) + c − c_i), so c_i⁺ = c_i − c + (x − y)/η = ∇f(x)."""
    trainer, x, c, c_i, y, up, state = _scaffold_fit(epochs=1)
    idx = torch.arange(12)
    gx = ce_grad(trainer, x, idx)
    assert close(y, axpy(-0.3, [a + b - d for a, b, d in zip(gx, c, c_i, strict=True)], x))
    assert close(state.tensors["c"], gx)
    assert close(up.tensors["delta_c"], [a - b for a, b in zip(gx, c_i, strict=True)])


def test_scaffold_uses_the_number_of_steps_taken() -> None:
    """K = 2 full-batch steps: c_i⁺ = (∇f(x) + ∇f(y1)) / 2, the mean gradient along the path."""
    trainer, x, c, c_i, y, up, state = _scaffold_fit(epochs=2)
    idx = torch.arange(12)
    corr = [a - b for a, b in zip(c, c_i, strict=True)]
    g0 = ce_grad(trainer, x, idx)
    y1 = axpy(-0.3, [a + b for a, b in zip(g0, corr, strict=True)], x)
    g1 = ce_grad(trainer, y1, idx)
    assert close(state.tensors["c"], [(a + b) / 2 for a, b in zip(g0, g1, strict=True)])


def test_scaffold_server_update_by_hand() -> None:
    s = Scaffold(ScaffoldOptions(global_lr=0.5))
    s.setup(vec(1.0), [3, 3, 3, 3])  # N = 4
    assert close(s.round_payload(0, vec(1.0), []).tensors["c"], vec(0.0))
    # x + 0.5 * mean(3 − 1, 1 − 1) = 1.5;  c + (0.4 + 0.8) / 4 = 0.3
    out = s.aggregate(0, vec(1.0), [upd(0, [3.0], delta_c=[0.4]), upd(1, [1.0], delta_c=[0.8])]).params
    assert close(out, vec(1.5))
    assert close(s.round_payload(1, out, []).tensors["c"], vec(0.3))
    with pytest.raises(StrategyError, match="Δc"):
        s.aggregate(1, out, [upd(0, [1.0])])


def test_scaffold_fit_needs_the_server_control_variate() -> None:
    trainer = linear_trainer()
    with pytest.raises(StrategyError, match="'c'"):
        Scaffold().fit(
            trainer,
            clone(trainer.params),
            RoundPayload(0),
            ClientTask(0, 0, torch.arange(4), 0.1, 1, 0),
            ClientState(),
        )


# ---- every registered strategy: 2 rounds through the interface, server-state round trip ------------

N_CLIENTS, FRACTION, SEED = 6, 0.5, 11


def _build(name: str) -> Strategy:
    """As the simulator does: options from the registry, collaborators (FedEnt's estimator) by default."""
    return build_strategy(AlgorithmConfig(name=name))


def _round(
    strategy: Strategy,
    trainer: LocalTrainer,
    w: Params,
    rnd: int,
    states: dict[int, ClientState],
    shards: list[Tensor],
) -> tuple[RoundPayload, list[ClientUpdate], list]:
    cids = sample_clients(SEED, rnd, N_CLIENTS, FRACTION)
    tasks = {c: ClientTask(c, rnd, shards[c], 0.05, 1, SEED) for c in cids}
    probes = [strategy.probe(trainer, w, tasks[c], states[c]) for c in cids] if strategy.needs_probe else []
    payload = strategy.round_payload(rnd, w, probes)
    ups = [strategy.fit(trainer, w, payload, tasks[c], states[c]) for c in cids]
    return payload, ups, probes


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_runs_two_rounds_and_resumes_identically(name: str) -> None:
    trainer = linear_trainer(n=60, batch_size=8, dtype=torch.float32, seed=3)
    shards = [torch.arange(c, 60, N_CLIENTS) for c in range(N_CLIENTS)]
    sizes = [int(s.numel()) for s in shards]
    strategy = _build(name)
    w0 = clone(trainer.params)
    strategy.setup(w0, sizes)
    strategy.prepare(TrainerOracle(trainer, shards, SEED, 8), w0, sizes, 2)  # a no-op unless overridden
    states = {c: strategy.init_client_state(c, sizes[c]) for c in range(N_CLIENTS)}

    _, ups, _ = _round(strategy, trainer, w0, 0, states, shards)
    w1 = strategy.aggregate(0, w0, ups).params
    assert not equal(w1, w0) and all(bool(torch.isfinite(p).all()) for p in w1)

    saved = strategy.server_state()
    restored = _build(name)  # a resumed server: setup, then the checkpointed state (no second prepare)
    restored.setup(w0, sizes)
    restored.load_server_state(saved)

    w1_copy = clone(w1)
    payload, ups, probes = _round(strategy, trainer, w1, 1, states, shards)
    assert equal(w1, w1_copy)  # fit never mutates the global model
    payload_r = restored.round_payload(1, w1, probes)
    assert payload_r.scalars == payload.scalars
    assert payload_r.tensors.keys() == payload.tensors.keys()
    assert all(equal(payload.tensors[k], payload_r.tensors[k]) for k in payload.tensors)
    w2 = strategy.aggregate(1, w1, ups).params
    w2_r = restored.aggregate(1, w1, ups).params
    assert not equal(w2, w1)
    assert equal(w2, w2_r)


def test_feddyn_server_sum_tracks_every_clients_state() -> None:
    """The server's Σλ (from uploads only) equals the sum of the λ_k the clients keep themselves."""
    trainer = linear_trainer(n=60, batch_size=8, dtype=torch.float64, seed=3)
    shards = [torch.arange(c, 60, N_CLIENTS) for c in range(N_CLIENTS)]
    s = FedDyn(FedDynOptions(alpha=0.1))
    w = clone(trainer.params)
    s.setup(w, [int(x.numel()) for x in shards])
    states = {c: ClientState() for c in range(N_CLIENTS)}
    for rnd in range(3):
        _, ups, _ = _round(s, trainer, w, rnd, states, shards)
        w = s.aggregate(rnd, w, ups).params
    client_sum = [
        sum(st.tensors["lambda"][j] for st in states.values() if "lambda" in st.tensors) for j in range(2)
    ]
    assert close(s.server_state()["lambda_sum"], client_sum, tol=1e-12)
    assert any(not torch.equal(t, torch.zeros_like(t)) for t in client_sum)


def test_feddyn_client_without_samples_keeps_its_state() -> None:
    trainer = linear_trainer()
    w = clone(trainer.params)
    state = ClientState(tensors={"lambda": [torch.ones_like(p) for p in w]})
    task = ClientTask(0, 0, torch.arange(0), 0.1, 1, 0)
    up = FedDyn().fit(trainer, w, RoundPayload(0, scalars={"mean_samples": 5.0}), task, state)
    assert equal(up.params, w) and up.scalars["alpha_k"] == 0.0
    assert equal(state.tensors["lambda"], [torch.ones_like(p) for p in w])
