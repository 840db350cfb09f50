"""The client half of a round, written once: what any place that hosts clients does for them.

A ``ClientHost`` owns, for a set of hosted client ids, everything a client needs between rounds and within
one: its data (sample indices into one trainer's tensors), its task parameters (rate, epochs, seed: from the
run's config only), its state (``ClientStates``: in memory, or persisted for a worker that may restart), and
the three client steps, probe, fit and evaluate, run one client after another here or vmapped together by
``VectorisedHost`` (fedent.rounds.vectorised). The simulator's executors wrap a host of all N clients; a
worker wraps a host of the clients it was started with. Whatever a host gathers goes to the engine, which
alone decides what it accepts (fedent.rounds.acceptance).

One client's exception is that client's failure (``Gathered.failed``, with the exception's one-line text;
the traceback is logged), never the others': the quorum rule then decides whether the round goes on, the
same in every world.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedent import compress
from fedent.meanfield.fixed_point import gradients_at
from fedent.meanfield.oracle import TrainerOracle
from fedent.params import Params
from fedent.privacy.dpsgd import DPSGD
from fedent.rounds.adversary import Adversary
from fedent.rounds.evaluation import ClientEval, evaluate_shards
from fedent.rounds.executor import Gathered
from fedent.secagg.hosted import HostedSecAgg
from fedent.strategies.base import ClientState, ClientTask, ClientUpdate, Probe, RoundPayload, Strategy

if TYPE_CHECKING:
    from fedent.client_store import ClientStateStore
    from fedent.config import ExperimentConfig
    from fedent.trainer import LocalTrainer

log = logging.getLogger("fedent.host")


@dataclass(frozen=True)
class ClientTraining:
    """The task parameters every hosted client trains with; taken from the run's config and nowhere else."""

    lr: float  # base learning rate (Table IV); a strategy's plan may change it per client
    epochs: int
    seed: int
    batch_size: int
    adversary: Adversary | None = None  # simulated attackers among the clients (fedent.rounds.adversary)
    dp: DPSGD | None = None  # privacy.dp local: every hosted client trains with DP-SGD
    upload: str = "none"  # train.upload_encoding (fedent.compress)
    topk_fraction: float = 0.01
    secagg_threat: str = "malicious"  # privacy.secagg_threat: the weakest secure-aggregation model clients accept

    @classmethod
    def from_config(cls, cfg: ExperimentConfig) -> ClientTraining:
        tr, pr = cfg.train, cfg.privacy
        dp = DPSGD(pr.clip_norm, pr.noise_multiplier) if pr.dp == "local" else None
        return cls(float(tr.lr), int(tr.local_epochs), int(tr.seed), int(tr.batch_size),
                   Adversary.from_config(cfg.adversary, int(tr.seed), int(cfg.data.num_clients)), dp,
                   tr.upload_encoding, float(tr.topk_fraction), pr.secagg_threat)

    def encode_upload(self, rnd: int, update: ClientUpdate, global_params: Sequence[Tensor],
                      state: ClientState) -> None:
        """The lossy upload encoding applied to ``update`` in place: its codes kept for the wire and its params
        replaced by w(t) + decode(codes), the values the aggregator will rebuild (simulator == cluster); top-k's
        error-feedback residual lives in the client's state."""
        if self.upload == "none":
            return
        delta = [p.detach() - g.detach().to(p.device) for p, g in zip(update.params, global_params, strict=True)]
        residual = state.tensors.get(compress.RESIDUAL)
        codes, left = compress.encode(delta, self.upload, self.seed, rnd, update.cid, self.topk_fraction, residual)
        if left is not None:
            state.tensors[compress.RESIDUAL] = left
        update.codes = codes
        update.params = [p.to(u.device) for p, u in zip(compress.decode(global_params, codes), update.params,
                                                         strict=True)]


class ClientStates:
    """Each hosted client's ``ClientState`` across rounds: a dict, or a ``ClientStateStore`` on disk.

    With a store, the state entering round t is the one saved after the client's last fit before t (a round
    replayed after an aggregator resume gets the state it had then), and a fit's state is saved under t."""

    def __init__(self, store: ClientStateStore | None = None, device: torch.device | None = None) -> None:
        self.store, self.device = store, device
        self.memory: dict[int, ClientState] = {}

    def get(self, strategy: Strategy, cid: int, num_samples: int, rnd: int) -> ClientState:
        if self.store is not None:
            saved = self.store.load(cid, before_round=rnd)
            if saved is None:
                return strategy.init_client_state(cid, num_samples)
            return ClientState({k: [x.to(self.device) if self.device is not None else x for x in v]
                                for k, v in saved.tensors.items()}, saved.scalars)
        st = self.memory.get(cid)
        if st is None:
            st = self.memory[cid] = strategy.init_client_state(cid, num_samples)
        return st

    def fitted(self, cid: int, state: ClientState, rnd: int) -> None:
        """``state`` is the client's after its fit of round ``rnd`` (kept in memory by reference already)."""
        if self.store is not None:
            self.store.save(cid, state, rnd)


@dataclass(frozen=True)
class TestShards:
    """The hosted clients' local test splits: index arrays into ``x``/``y`` (federated evaluation)."""

    __test__ = False  # not a pytest class

    x: Tensor
    y: Tensor
    shards: Mapping[int, np.ndarray]


class ClientHost:
    """The hosted clients' probe, fit and evaluate, one client after another on ``trainer``'s device."""

    kind = "sequential"

    def __init__(self, trainer: LocalTrainer, indices: Mapping[int, Tensor] | Sequence[np.ndarray | Tensor],
                 training: ClientTraining, states: ClientStates | None = None, test: TestShards | None = None,
                 on_update: Callable[[ClientUpdate], None] | None = None) -> None:
        pairs = indices.items() if isinstance(indices, Mapping) else enumerate(indices)
        self.indices: dict[int, Tensor] = {
            int(c): ix.to(torch.int64) if isinstance(ix, Tensor) else torch.tensor(np.asarray(ix), dtype=torch.int64)
            for c, ix in pairs}
        self.trainer, self.training, self.test = trainer, training, test
        trainer.use_dp(training.dp)
        self.states = states or ClientStates(device=trainer.device)
        self.on_update = on_update  # each accepted-or-not update as it is made (uploads overlap the next client)
        self.lock = threading.Lock()  # one model: the round's steps and Algorithm 1's oracle take turns
        adv = training.adversary
        if adv is not None and adv.cfg.attack == "label-flip" and any(adv.attacks(c) for c in self.indices):
            with torch.no_grad():
                num_classes = int(trainer.model(trainer.x[:1]).shape[-1])
            trainer.y = trainer.y.clone()  # never the caller's tensor (the CPU's .to() does not copy)
            adv.poison_labels(trainer.y, self.indices, num_classes)
        # secure aggregation: the hosted clients' protocol sessions
        self.secagg = HostedSecAgg(training.seed, training.secagg_threat)
        self.coalition: list[tuple[ClientUpdate, ClientState]] = []  # ALIE: honest fits held back within a fit call

    @property
    def hosted(self) -> list[int]:
        return sorted(self.indices)

    def num_samples(self, cid: int) -> int:
        return int(self.indices[cid].numel())

    def reported_samples(self, cid: int) -> int:
        """The count this host reports for ``cid`` (a simulated inflate-count attacker lies)."""
        adv = self.training.adversary
        return self.num_samples(cid) if adv is None else adv.reported_samples(cid, self.num_samples(cid))

    def check_hosted(self, cids: Sequence[int]) -> None:
        unknown = [c for c in cids if c not in self.indices]
        if unknown:
            raise KeyError(f"clients {unknown[:5]} are not hosted here")

    def task(self, rnd: int, cid: int) -> ClientTask:
        t = self.training
        return ClientTask(cid, rnd, self.indices[cid], t.lr, t.epochs, t.seed)

    def state(self, strategy: Strategy, cid: int, rnd: int) -> ClientState:
        return self.states.get(strategy, cid, self.num_samples(cid), rnd)

    def _failed(self, out: Gathered[Any], cid: int, step: str, rnd: int, e: Exception) -> None:
        """One client's exception: its failure with a one-line reason; the others go on."""
        from fedent.client_store import ClientStoreError

        if isinstance(e, ClientStoreError):  # a known condition (a damaged state file): one line
            log.error("client %d failed its %s in round %d: %s", cid, step, rnd + 1, e)
        else:
            log.exception("client %d failed its %s in round %d", cid, step, rnd + 1)
        out.failed[cid] = f"{step} failed: {type(e).__name__}: {e}"[:500]

    # ---- the three client steps --------------------------------------------------------------------------
    def probe(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor],
              strategy: Strategy) -> Gathered[Probe]:
        self.check_hosted(cids)
        out: Gathered[Probe] = Gathered()
        with self.lock:
            for c in cids:
                try:
                    out.results[c] = strategy.probe(self.trainer, global_params, self.task(rnd, c),
                                                    self.state(strategy, c, rnd))
                except Exception as e:
                    self._failed(out, c, "probe", rnd, e)
        return Gathered(out.results, out.failed)

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        self.check_hosted(cids)
        out: Gathered[ClientUpdate] = Gathered()
        with self.lock:
            self.coalition = []
            for c in cids:
                def one(c: int = c) -> tuple[ClientUpdate, ClientState]:
                    state = self.state(strategy, c, rnd)
                    return strategy.fit(self.trainer, global_params, payload, self.task(rnd, c), state), state

                self._keep(out, c, rnd, one, global_params)
            self._collude(out, rnd, global_params)
        return Gathered(out.results, out.failed)

    def _keep(self, out: Gathered[ClientUpdate], cid: int, rnd: int,
              fit: Callable[[], tuple[ClientUpdate, ClientState]], global_params: Sequence[Tensor]) -> None:
        """A client's fit ends here: a simulated attacker's upload tampered with (after its honest fit,
        fedent.rounds.adversary; a colluding one's held back for ``_collude``), the update encoded for upload
        (``train.upload_encoding``), masked under secure aggregation, kept (and handed to ``on_update`` at once, so
        an upload can overlap the next client) and its state saved; or its exception recorded as its failure."""
        adv = self.training.adversary
        try:
            update, state = fit()
            if adv is not None and adv.colludes and adv.attacks(cid):
                self.coalition.append((update, state))
                return
            if adv is not None:
                update = adv.tamper(rnd, update, global_params)
        except Exception as e:
            self._failed(out, cid, "fit", rnd, e)
            return
        self._upload(out, cid, rnd, update, state, global_params)

    def _collude(self, out: Gathered[ClientUpdate], rnd: int, global_params: Sequence[Tensor]) -> None:
        """ALIE, after a fit call's last client: the held-back attackers' forged updates, uploaded as any other
        (the coalition is the attackers this call fitted: fedent.rounds.adversary)."""
        held, self.coalition = self.coalition, []
        adv = self.training.adversary
        if not held or adv is None:
            return
        try:
            forged = adv.collude([u for u, _ in held], global_params)
        except Exception as e:
            for u, _ in held:
                self._failed(out, u.cid, "fit", rnd, e)
            return
        for f, (_, state) in zip(forged, held, strict=True):
            self._upload(out, f.cid, rnd, f, state, global_params)

    def _upload(self, out: Gathered[ClientUpdate], cid: int, rnd: int, update: ClientUpdate, state: ClientState,
                global_params: Sequence[Tensor]) -> None:
        """The upload as it leaves the client: encoded, its state saved, masked under secure aggregation."""
        try:
            self.training.encode_upload(rnd, update, global_params, state)
            self.states.fitted(cid, state, rnd)
            if self.secagg.active(rnd, cid):  # secure aggregation: only the masked vector leaves the client
                update = self.secagg.mask(rnd, update)
        except Exception as e:
            self._failed(out, cid, "fit", rnd, e)
            return
        out.results[cid] = update
        if self.on_update is not None:
            self.on_update(update)

    def secure_exchange(self, rnd: int, requests: Mapping[int, bytes]) -> Gathered[bytes]:
        """One secure-aggregation step: each named hosted client answers its protocol message (fedent.secagg)."""
        self.check_hosted(list(requests))
        out: Gathered[bytes] = Gathered()
        for c, req in requests.items():
            try:
                out.results[c] = self.secagg.handle(rnd, c, req)
            except Exception as e:
                self._failed(out, c, "secure aggregation", rnd, e)
        return Gathered(out.results, out.failed)

    def evaluate(self, cids: Sequence[int], params: Sequence[Tensor], batch_size: int) -> Gathered[ClientEval]:
        """Federated evaluation: ``params`` on each named client's local test split."""
        self.check_hosted(cids)
        if self.test is None:
            raise ValueError("this host has no local test splits")
        with self.lock:
            got = evaluate_shards(self.trainer, self.test.x, self.test.y, dict(self.test.shards), cids, params,
                                  batch_size)
        return Gathered(got)

    # ---- Algorithm 1 -------------------------------------------------------------------------------------
    def oracle(self, seed: int | None = None, batch_size: int | None = None) -> TrainerOracle:
        """Algorithm 1's gradient oracle over the hosted clients (``seed``/``batch_size``: the run's unless
        the estimator asks for others)."""
        return TrainerOracle(self.trainer, self.indices, self.training.seed if seed is None else seed,
                             self.training.batch_size if batch_size is None else batch_size)

    def gradients(self, t: int, cids: Sequence[int], point: Sequence[Tensor], seed: int | None = None,
                  batch_size: int | None = None) -> list[Params]:
        """Each client's oracle gradient at ``point`` (the worker's answer to the estimator's request)."""
        self.check_hosted(cids)
        with self.lock:
            oracle = self.oracle(seed, batch_size)
            return [[g.detach().cpu() for g in grads] for grads in gradients_at(oracle, t, cids, point)]

    def status_fields(self) -> dict[str, Any]:
        return {"executor": self.kind}
