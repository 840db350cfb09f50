"""model_final.pt: the final global model as a state_dict, with the model's name and the config's hash.

A run used to save ``torch.save(list of tensors)``: loadable, but nothing said which model the tensors belong
to, and ``model.load_state_dict`` could not take it. Now the file is a plain dict that
``torch.load(path, weights_only=True)`` reads (only str, int and tensors inside)::

    {"format": "fedent.model/1", "model": "mnist-cnn", "config_hash": "<sha256 of the run's config>",
     "state_dict": {"conv1.weight": tensor, ...}}

so ``model.load_state_dict(torch.load(p, weights_only=True)["state_dict"])`` restores it.
``load_model_file`` reads both that and the old bare list (from run directories written before).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

FORMAT = "fedent.model/1"


def model_bytes(params: Sequence[Tensor], names: Sequence[str], model: str, config_hash: str) -> bytes:
    """The file's bytes: ``params`` keyed by ``names`` (the model's ``named_parameters`` order), on the CPU."""
    if len(names) != len(params):
        raise ValueError(f"{len(names)} parameter names for {len(params)} tensors")
    state = {str(n): p.detach().cpu().clone() for n, p in zip(names, params, strict=True)}
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "model": str(model), "config_hash": str(config_hash), "state_dict": state}, buf)
    return buf.getvalue()


@dataclass(frozen=True)
class ModelFile:
    """What a model_final.pt holds; ``model`` and ``config_hash`` are None for the old bare-list form."""

    params: list[Tensor]
    state_dict: dict[str, Tensor] | None
    model: str | None
    config_hash: str | None


def load_model_file(path: str | Path) -> ModelFile:
    """Either form of model_final.pt, read with ``weights_only=True`` (no code runs from the file)."""
    raw = torch.load(Path(path), map_location="cpu", weights_only=True)
    if isinstance(raw, list) and all(isinstance(t, Tensor) for t in raw):  # before the state_dict form
        return ModelFile(list(raw), None, None, None)
    if isinstance(raw, dict) and raw.get("format") == FORMAT and isinstance(raw.get("state_dict"), dict):
        state = {str(k): v for k, v in raw["state_dict"].items()}
        if not all(isinstance(v, Tensor) for v in state.values()):
            raise ValueError(f"{path}: state_dict holds something other than tensors")
        return ModelFile(list(state.values()), state, str(raw.get("model")), str(raw.get("config_hash")))
    raise ValueError(f"{path} is not a fedent model file (expected {FORMAT!r} or a list of tensors)")
