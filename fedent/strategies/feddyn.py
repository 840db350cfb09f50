"""FedDyn (Acar et al. 2021), as the official implementation does it (alpacar/FedDyn, train_FedDyn).

Client k keeps a state λ_k (the official ``local_param_list[clnt]``, initially 0) and its own
coefficient α_k = α / (n_k / n̄), with n̄ the mean sample count over all N clients (paper: α = 0.001).
Starting from the server model w_srv it runs local SGD on the gradient

    ∇CE(w) + α_k (w − w_srv + λ_k)

(the official code gets the α_k w part from SGD's weight_decay and the rest from the linear penalty
α_k <w, −w_srv + λ_k>), then sets λ_k ← λ_k + (w_k − w_srv). The server forms

    w_srv(t+1) = (1/|S|) Σ_{k∈S} w_k  +  (1/N) Σ_{k=1..N} λ_k.

The second term needs every client's λ_k, not only the participants'. The server keeps Σ_k λ_k as
server state and adds each participant's increment Δλ_k = w_k − w_srv(t). That increment is derived
from the model the client uploads anyway, so FedDyn costs no extra upload bytes. Consequence: if an
upload is lost after the client has updated λ_k, the server's sum misses that increment (as in any
deployment of FedDyn with dropped uploads).

The official code reports the accuracy of the plain participant mean; here the model that is
evaluated is the model that is broadcast, w_srv(t+1), because a strategy returns one model per round.
n̄ travels to the clients in ``payload.scalars["mean_samples"]``; N and n̄ come from ``setup``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fedent.params import Params, clone, sub, weighted_sum, zeros_like
from fedent.strategies.base import (
    AggregateResult,
    ClientState,
    ClientTask,
    ClientUpdate,
    LocalFit,
    PayloadSpec,
    Probe,
    RoundPayload,
    SecureSum,
    Strategy,
    StrategyError,
    align_state,
    tensor_lists_from_state,
)
from fedent.strategies.options import FedDynOptions
from fedent.trainer import LocalTrainer, TrainResult

LAMBDA = "lambda"  # ClientState.tensors key of λ_k
MEAN_SAMPLES = "mean_samples"  # RoundPayload.scalars key of n̄


def client_alpha(alpha: float, num_samples: int, mean_samples: float) -> float:
    """α_k = α / (n_k / n̄): clients with fewer samples are regularised more.

    A client without samples takes no SGD step, so its α_k is never used; it is reported as 0.
    """
    if not mean_samples > 0 or num_samples < 0:
        raise StrategyError(f"feddyn: bad sample counts n_k={num_samples}, n̄={mean_samples}")
    return 0.0 if num_samples == 0 else alpha * mean_samples / num_samples


class FedDyn(Strategy):
    name = "feddyn"
    keeps_client_state = True
    payload_spec = PayloadSpec(update_scalars=("alpha_k",), ranges=(("alpha_k", 0.0, 1e15),))
    Options = FedDynOptions
    secure_weighting = "uniform"  # the mean of w_k and Σλ's increment Σ w_k − |S| w_srv need only Σ w_k and |S|

    def __init__(self, options: FedDynOptions | None = None) -> None:
        self.options = options or FedDynOptions()
        self._num_clients = 0
        self._mean_samples = 0.0
        self._lambda_sum: Params | None = None  # Σ over all N clients of λ_k

    # ---- server side -----------------------------------------------------------------------------
    def setup(self, global_params: Sequence[Tensor], client_sizes: Sequence[int]) -> None:
        if not client_sizes or sum(int(n) for n in client_sizes) <= 0:
            raise StrategyError("feddyn: setup needs at least one client with samples")
        self._num_clients = len(client_sizes)
        self._mean_samples = float(sum(int(n) for n in client_sizes)) / len(client_sizes)

    def _require_setup(self) -> None:
        if self._num_clients <= 0:
            raise StrategyError("feddyn: setup(global_params, client_sizes) must be called before round 0")

    def round_payload(
        self, rnd: int, global_params: Sequence[Tensor], probes: Sequence[Probe]
    ) -> RoundPayload:
        self._require_setup()
        return RoundPayload(round=rnd, scalars={MEAN_SAMPLES: self._mean_samples})

    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult:
        self._require_setup()
        if not updates:
            raise StrategyError("cannot aggregate zero updates")
        w_srv = list(global_params)
        if self._lambda_sum is None:
            self._lambda_sum = zeros_like(w_srv)
        self._lambda_sum = align_state(self._lambda_sum, w_srv, "feddyn: the server's Σλ")
        models = [u.params for u in updates]
        # Σλ += Σ_{k∈S} (w_k − w_srv): the participants' λ increments, derived from their uploads
        # exactly as each client computes its own (so server and client sums agree bit for bit).
        for w_k in models:
            torch._foreach_add_(self._lambda_sum, sub(w_k, w_srv))
        new = weighted_sum(models, [1.0 / len(models)] * len(models))
        torch._foreach_add_(new, self._lambda_sum, alpha=1.0 / self._num_clients)
        return AggregateResult(new)

    def aggregate_sum(self, rnd: int, global_params: Sequence[Tensor], total: SecureSum) -> AggregateResult:
        """The same update from Σ w_k and |S| (``total.weight``); Σλ's increment Σ (w_k − w_srv) from
        ``total.deltas`` where the sum brought it (Σ w_k − |S| w_srv in float32 loses the small difference)."""
        self._require_setup()
        w_srv = list(global_params)
        if self._lambda_sum is None:
            self._lambda_sum = zeros_like(w_srv)
        self._lambda_sum = align_state(self._lambda_sum, w_srv, "feddyn: the server's Σλ")
        if total.deltas is not None:
            torch._foreach_add_(self._lambda_sum, list(total.deltas))
        else:
            torch._foreach_add_(self._lambda_sum, list(total.params))
            torch._foreach_add_(self._lambda_sum, w_srv, alpha=-total.weight)
        new = total.mean()
        torch._foreach_add_(new, self._lambda_sum, alpha=1.0 / self._num_clients)
        return AggregateResult(new)

    def server_state(self) -> dict[str, Any]:
        return {} if self._lambda_sum is None else {"lambda_sum": clone(self._lambda_sum)}

    def load_server_state(self, state: dict[str, Any]) -> None:
        if not state:
            self._lambda_sum = None
            return
        self._lambda_sum = tensor_lists_from_state(state, ("lambda_sum",), self.name)["lambda_sum"]

    # ---- client side -----------------------------------------------------------------------------
    def plan_fit(
        self,
        trainer: LocalTrainer,
        global_params: Sequence[Tensor],
        payload: RoundPayload,
        task: ClientTask,
        state: ClientState,
    ) -> LocalFit:
        """grad += α_k (w − w_srv + λ_k); finishing sets λ_k ← λ_k + (w_k − w_srv)."""
        if MEAN_SAMPLES not in payload.scalars:
            raise StrategyError(f"feddyn: the round payload lacks scalars[{MEAN_SAMPLES!r}]")
        alpha_k = client_alpha(self.options.alpha, task.num_samples, float(payload.scalars[MEAN_SAMPLES]))
        trainer.load(global_params)
        w_srv = clone(trainer.params)  # on the trainer's device
        lam = state.tensors.get(LAMBDA)
        lam = zeros_like(w_srv) if lam is None else align_state(lam, w_srv, f"feddyn: client {task.cid}'s λ")
        linear = sub(lam, w_srv)
        torch._foreach_mul_(linear, alpha_k)

        def finish(w_k: Params, res: TrainResult) -> ClientUpdate:
            torch._foreach_add_(lam, sub(w_k, w_srv))  # λ_k ← λ_k + (w_k − w_srv)
            state.tensors[LAMBDA] = lam
            return ClientUpdate(task.cid, w_k, task.num_samples, res.loss, scalars={"alpha_k": alpha_k})

        return LocalFit(task.lr, finish, weight_coef=alpha_k, linear=linear)


STRATEGY = FedDyn
