"""The gradient oracle that Algorithm 1 calls, backed by the local trainer.

g_i at a point is computed on one random batch of client i drawn from
``fedent.rng.torch_generator(seed, "oracle", t, cid)``: the same batch in every sweep for a given
(t, i), so the sweeps converge to a well-defined fixed point, and the same batch in the simulator and
in a cluster worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor

from fedent.params import Params
from fedent.rng import torch_generator
from fedent.trainer import LocalTrainer


class TrainerOracle:
    """``GradientOracle`` over the clients whose sample indices are in ``client_indices``."""

    def __init__(
        self,
        trainer: LocalTrainer,
        client_indices: Mapping[int, Tensor] | Sequence[Tensor],
        seed: int,
        batch_size: int | None = None,
    ) -> None:
        self.trainer = trainer
        self.client_indices = client_indices
        self.seed = int(seed)
        self.batch_size = batch_size

    def gradient(self, t: int, cid: int, point: Sequence[Tensor]) -> Params:
        """∇F_cid(point) on one batch; loads ``point`` into the trainer's model (overwrites it)."""
        indices = self.client_indices[cid]
        if int(indices.numel()) == 0:
            raise ValueError(f"client {cid} has no samples; cannot compute its gradient")
        self.trainer.load(point)
        gen = torch_generator(self.seed, "oracle", t, cid)
        return self.trainer.gradient(indices, gen, self.batch_size)
