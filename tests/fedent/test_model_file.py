"""model_final.pt: the state_dict form with name and config hash, and the old bare list still read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedent.model_file import FORMAT, load_model_file, model_bytes
from fedent.models import build_model


def test_the_file_is_a_state_dict_that_plain_torch_and_the_model_load(tmp_path: Path) -> None:
    model = build_model("mnist-cnn", 10, 1, 28)
    names = [n for n, _ in model.named_parameters()]
    params = [torch.full_like(p, float(i)) for i, p in enumerate(model.parameters())]
    path = tmp_path / "model_final.pt"
    path.write_bytes(model_bytes(params, names, "mnist-cnn", "abc123"))
    raw = torch.load(path, weights_only=True)  # no pickled code: only str and tensors
    assert (raw["format"], raw["model"], raw["config_hash"]) == (FORMAT, "mnist-cnn", "abc123")
    model.load_state_dict(raw["state_dict"])
    assert [float(p.detach().flatten()[0]) for p in model.parameters()] == [float(i) for i in range(len(names))]
    got = load_model_file(path)
    assert (got.model, got.config_hash) == ("mnist-cnn", "abc123") and got.state_dict is not None
    assert list(got.state_dict) == names and all(torch.equal(a, b) for a, b in zip(got.params, params, strict=True))


def test_the_old_bare_list_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "model_final.pt"
    torch.save([torch.ones(2), torch.zeros(3)], path)
    got = load_model_file(path)
    assert (got.model, got.config_hash, got.state_dict) == (None, None, None)
    assert [t.tolist() for t in got.params] == [[1.0, 1.0], [0.0, 0.0, 0.0]]


def test_names_must_match_and_other_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="1 parameter names for 2 tensors"):
        model_bytes([torch.ones(1), torch.ones(1)], ["a"], "m", "h")
    path = tmp_path / "x.pt"
    torch.save({"w": torch.zeros(3)}, path)
    with pytest.raises(ValueError, match="not a fedent model file"):
        load_model_file(path)
