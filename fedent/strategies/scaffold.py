"""SCAFFOLD (Karimireddy et al. 2020) with option II control variates.

Server control variate c (server state, initially 0) goes to the round's clients in
``payload.tensors["c"]``. Client i (control variate c_i in its ClientState, initially 0) starts from
x = w(t) and runs local SGD with rate η_l on the corrected gradient ∇F_i(y) − c_i + c. After K steps
(K = the SGD steps actually taken, TrainResult.steps) it sets

    c_i⁺ = c_i − c + (x − y_i) / (K η_l)                                     (option II)

and uploads y_i (as ClientUpdate.params, from which Δy_i = y_i − x) and Δc_i = c_i⁺ − c_i in
``ClientUpdate.tensors["delta_c"]``. The server, with S the participants and N all clients, applies

    x ← x + η_g (1/|S|) Σ Δy_i,        c ← c + (|S|/N) (1/|S|) Σ Δc_i.

Averages are unweighted, as in the SCAFFOLD paper. N comes from ``setup``. A client whose upload is lost
after it updated c_i leaves the server's c without that Δc_i, as in any SCAFFOLD deployment.
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
from fedent.strategies.options import ScaffoldOptions
from fedent.trainer import LocalTrainer, TrainResult

C = "c"  # payload.tensors key of the server's c, and ClientState.tensors key of c_i
DELTA_C = "delta_c"  # ClientUpdate.tensors key of Δc_i


def control_variate_delta(
    x: Sequence[Tensor], y: Sequence[Tensor], c: Sequence[Tensor], steps: int, lr: float
) -> Params:
    """Δc_i = c_i⁺ − c_i = −c + (x − y) / (K η_l) (option II); zero when no step was taken."""
    if steps <= 0:
        return zeros_like(c)
    delta = sub(x, y)
    torch._foreach_mul_(delta, 1.0 / (steps * lr))
    torch._foreach_sub_(delta, list(c))
    return delta


class Scaffold(Strategy):
    name = "scaffold"
    keeps_client_state = True
    payload_spec = PayloadSpec(update_tensors=(DELTA_C,))
    Options = ScaffoldOptions
    secure_weighting = "uniform"  # both server averages are unweighted sums: Σ y_i and Σ Δc_i, masked together

    def __init__(self, options: ScaffoldOptions | None = None) -> None:
        self.options = options or ScaffoldOptions()
        self._num_clients = 0
        self._c: Params | None = None

    # ---- server side -----------------------------------------------------------------------------
    def setup(self, global_params: Sequence[Tensor], client_sizes: Sequence[int]) -> None:
        if not client_sizes:
            raise StrategyError("scaffold: setup needs at least one client")
        self._num_clients = len(client_sizes)

    def _server_c(self, global_params: Sequence[Tensor]) -> Params:
        if self._c is None:
            self._c = zeros_like(global_params)
        self._c = align_state(self._c, global_params, "scaffold: the server control variate c")
        return self._c

    def round_payload(
        self, rnd: int, global_params: Sequence[Tensor], probes: Sequence[Probe]
    ) -> RoundPayload:
        return RoundPayload(round=rnd, tensors={C: clone(self._server_c(global_params))})

    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult:
        if self._num_clients <= 0:
            raise StrategyError("scaffold: setup(global_params, client_sizes) must be called before round 0")
        if not updates:
            raise StrategyError("cannot aggregate zero updates")
        x = list(global_params)
        c = self._server_c(x)
        ups = list(updates)
        deltas = [align_state(u.tensors.get(DELTA_C, []), x, f"scaffold: client {u.cid}'s Δc") for u in ups]
        s = len(updates)
        # x + η_g · mean(y_i − x)
        new = sub(weighted_sum([u.params for u in updates], [1.0 / s] * s), x)
        torch._foreach_mul_(new, self.options.global_lr)
        torch._foreach_add_(new, x)
        # c + (|S|/N) · mean(Δc_i) = c + (1/N) Σ Δc_i
        inv_n = 1.0 / self._num_clients
        torch._foreach_add_(c, weighted_sum(deltas, [inv_n] * s))
        return AggregateResult(new)

    def aggregate_sum(self, rnd: int, global_params: Sequence[Tensor], total: SecureSum) -> AggregateResult:
        """The same two steps from Σ y_i, Σ Δc_i and |S| (the survivors' count, ``total.weight``)."""
        if self._num_clients <= 0:
            raise StrategyError("scaffold: setup(global_params, client_sizes) must be called before round 0")
        x = list(global_params)
        c = self._server_c(x)
        new = sub(total.mean(), x)
        torch._foreach_mul_(new, self.options.global_lr)
        torch._foreach_add_(new, x)
        deltas = align_state(total.tensors[DELTA_C], x, "scaffold: the summed Δc")
        torch._foreach_add_(c, deltas, alpha=1.0 / self._num_clients)
        return AggregateResult(new)

    def server_state(self) -> dict[str, Any]:
        return {} if self._c is None else {C: clone(self._c)}

    def load_server_state(self, state: dict[str, Any]) -> None:
        self._c = tensor_lists_from_state(state, (C,), self.name)[C] if state else None

    # ---- client side -----------------------------------------------------------------------------
    def plan_fit(
        self,
        trainer: LocalTrainer,
        global_params: Sequence[Tensor],
        payload: RoundPayload,
        task: ClientTask,
        state: ClientState,
    ) -> LocalFit:
        """grad += c − c_i; finishing forms Δc_i from the steps actually taken and updates c_i."""
        trainer.load(global_params)
        x = clone(trainer.params)  # on the trainer's device
        c = align_state(payload.tensors.get(C, []), x, f"scaffold: the round payload's tensors[{C!r}]")
        c_i = state.tensors.get(C)
        c_i = zeros_like(x) if c_i is None else align_state(c_i, x, f"scaffold: client {task.cid}'s c_i")

        def finish(y: Params, res: TrainResult) -> ClientUpdate:
            delta_c = control_variate_delta(x, y, c, res.steps, task.lr)
            state.tensors[C] = list(torch._foreach_add(c_i, delta_c))
            return ClientUpdate(task.cid, y, task.num_samples, res.loss, tensors={DELTA_C: delta_c})

        return LocalFit(task.lr, finish, linear=sub(c, c_i))


STRATEGY = Scaffold
